// cache: the on-disk kernel cache (layout and contracts in jit/cache.h).
#include "jit/cache.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <utility>

#include <llvm/Support/FormatVariadic.h>
#include <llvm/Support/JSON.h>
#include <llvm/Support/raw_ostream.h>

#include "ir/error.h"
#include "runtime/sha256.h"

namespace flowjit::jit {

namespace fs = std::filesystem;
using runtime::constant_time_equal;
using runtime::hmac_sha256_hex;
using runtime::Sha256;
using runtime::sha256_hex;

// ---------------------------------------------------------------- key

std::string cache_key(const CacheKeyParts& p) {
  Sha256 h;
  auto part = [&](const char* name, const std::string& s) {
    std::string head = std::string(name) + " " + std::to_string(s.size()) + "\n";
    h.update(head);
    h.update(s);
  };
  h.update(std::string_view("flowjit-cache-key 1\n"));
  part("version", p.version);
  part("build", p.build_id);
  part("llvm", p.llvm_version);
  part("target", p.target);
  part("ir", p.ir_optimized);
  part("fusion", p.fusion_plan);
  part("kernels", p.kernels);
  part("plan", p.plan);
  return h.hex_digest();
}

// ---------------------------------------------------------------- settings

std::string default_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/flowjit";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/flowjit";
}

int64_t default_cache_max_bytes() { return int64_t{1} << 30; }

int64_t parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t start = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == start) return -1;
  double value = std::atof(text.substr(start, i - start).c_str());
  std::string unit;
  for (; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i])))
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  static const std::map<std::string, double> units = {{"", 1},
                                                      {"b", 1},
                                                      {"k", 1024.0},
                                                      {"kb", 1024.0},
                                                      {"kib", 1024.0},
                                                      {"m", 1048576.0},
                                                      {"mb", 1048576.0},
                                                      {"mib", 1048576.0},
                                                      {"g", 1073741824.0},
                                                      {"gb", 1073741824.0},
                                                      {"gib", 1073741824.0},
                                                      {"t", 1099511627776.0},
                                                      {"tb", 1099511627776.0},
                                                      {"tib", 1099511627776.0}};
  auto it = units.find(unit);
  if (it == units.end()) return -1;
  double bytes = value * it->second;
  if (!(bytes >= 0) || bytes > 9.0e18) return -1;
  return static_cast<int64_t>(std::llround(bytes));
}

namespace {
std::mutex g_unwritable_mu;
std::set<std::string> g_unwritable;
}  // namespace

bool note_unwritable_cache(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_unwritable_mu);
  return g_unwritable.insert(dir).second;
}

bool is_unwritable_cache(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_unwritable_mu);
  return g_unwritable.count(dir) > 0;
}

namespace {
// The length of the well-formed UTF-8 sequence at s[i] (as Python's strict
// decoder accepts it: no overlongs, surrogates or code points past U+10FFFF),
// or 0.
size_t utf8_sequence(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  return n;
}
}  // namespace

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string printable_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_sequence(s, i);
    if (n == 0) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(s[i]));
      out += buf;
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

// ---------------------------------------------------------------- JSON
//
// meta.json through llvm/Support/JSON.h. Objects print with sorted keys, so
// an entry's files are listed in the order its MAC covers them.

namespace {

namespace json = llvm::json;

// meta.json nests two levels; llvm::json's parser recurses once per level,
// so a file nested deeper than this is damaged before it is parsed.
bool nested_deeper_than(std::string_view s, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

// The object meta.json holds, or nothing when it is not one (or not UTF-8,
// or too deep).
std::optional<json::Object> parse_object(const std::string& text) {
  if (!valid_utf8(text) || nested_deeper_than(text, 32)) return std::nullopt;
  llvm::Expected<json::Value> v = json::parse(text);
  if (!v) {
    llvm::consumeError(v.takeError());
    return std::nullopt;
  }
  if (json::Object* o = v->getAsObject()) return std::move(*o);
  return std::nullopt;
}

std::string json_text(json::Object o) {
  std::string out;
  llvm::raw_string_ostream os(out);
  os << llvm::formatv("{0:2}", json::Value(std::move(o))) << "\n";
  return out;
}

std::optional<std::string> string_of(const json::Object& o, llvm::StringRef key) {
  if (auto s = o.getString(key)) return s->str();
  return std::nullopt;
}

// ---------------------------------------------------------------- files

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Writes and (optionally) fsyncs a whole file. On failure `why` says why.
bool write_file(const std::string& path, const char* data, size_t size, bool sync,
                std::string& why) {
  // Exclusive and without following links: every name written is fresh (a
  // private staging directory, or a temporary that was unlinked first).
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = errno_text("cannot create", path);
    return false;
  }
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      why = errno_text("cannot write", path);
      ::close(fd);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  if (sync && ::fsync(fd) != 0) {
    why = errno_text("cannot fsync", path);
    ::close(fd);
    return false;
  }
  if (::close(fd) != 0) {
    why = errno_text("cannot close", path);
    return false;
  }
  return true;
}

// Reads a whole file. Sets `missing` when it does not exist.
bool read_file(const std::string& path, std::string& out, bool* missing = nullptr) {
  if (missing) *missing = false;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (missing) *missing = errno == ENOENT || errno == ENOTDIR;
    return false;
  }
  out.clear();
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

// Why a file or directory of the cache may not be trusted ("" when it may):
// it must be owned by this user and writable by nobody else. Anyone else who
// can write it could have replaced what this process is about to run.
std::string untrusted_why(const struct stat& st, const std::string& path) {
  if (st.st_uid != ::geteuid())
    return path + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
           std::to_string(::geteuid()) + ")";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return path + " is writable by " + ((st.st_mode & S_IWOTH) ? "others" : "its group") +
           " (mode " + mode + ")";
  }
  return "";
}

enum class Read { Ok, Missing, Untrusted, Error };

// Reads a file of the cache: without following a link, only a regular file
// (a FIFO or device is opened non-blocking and refused, never waited on),
// only one this user owns and nobody else can write. `why` says what was
// wrong for Untrusted and Error.
Read read_entry_file(const std::string& path, std::string& out, std::string& why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Read::Missing;
    if (errno == ELOOP) {
      why = path + " is a symbolic link";
      return Read::Untrusted;
    }
    why = errno_text("cannot open", path);
    return Read::Error;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    why = errno_text("cannot stat", path);
    ::close(fd);
    return Read::Error;
  }
  if (!S_ISREG(st.st_mode)) {
    why = path + " is not a regular file";
    ::close(fd);
    return Read::Untrusted;
  }
  if (!(why = untrusted_why(st, path)).empty()) {
    ::close(fd);
    return Read::Untrusted;
  }
  out.clear();
  if (st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      why = errno_text("cannot read", path);
      ::close(fd);
      return Read::Error;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return Read::Ok;
}

// A directory of the cache, not followed if it is a link: Missing, Ok, or
// Untrusted with `why`.
Read check_dir(const std::string& path, bool follow, std::string& why) {
  struct stat st;
  if ((follow ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Read::Missing;
    why = errno_text("cannot stat", path);
    return Read::Error;
  }
  if (!S_ISDIR(st.st_mode)) {
    why = path + (S_ISLNK(st.st_mode) ? " is a symbolic link" : " is not a directory");
    return Read::Untrusted;
  }
  why = untrusted_why(st, path);
  return why.empty() ? Read::Ok : Read::Untrusted;
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Creates `path` and its missing parents, each 0700 whatever the umask (the
// cache is private; a group- or world-writable directory would let others
// plant entries).
bool make_dirs(const std::string& path, std::string& why) {
  if (is_dir(path)) return true;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    std::string part = path.substr(0, pos);
    if (part.empty() || is_dir(part)) continue;
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      why = errno_text("cannot create", part);
      return false;
    }
    ::chmod(part.c_str(), 0700);  // the umask may have cleared bits, never added any
  }
  if (!is_dir(path)) {
    why = "cannot create " + path + ": not a directory";
    return false;
  }
  return true;
}

bool is_key(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// An flock held for the lifetime of the object (none when open fails).
class FileLock {
 public:
  FileLock(const std::string& path, bool directory) {
    fd_ = directory
              ? ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
              : ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    struct stat st;
    if (fd_ >= 0 && (::fstat(fd_, &st) != 0 || (!directory && !S_ISREG(st.st_mode)))) {
      ::close(fd_);
      fd_ = -1;
    }
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// The files every entry holds, in the order they are written (then the
// target's extra files).
const char* const kEntryFiles[] = {"object.o",   "plan.txt",    "ir_traced.txt", "ir_optimized.txt",
                                   "fusion.txt", "kernels.txt", "llvm.ll"};

// The payload files of an entry, in the order they are written.
std::vector<std::pair<const char*, std::string_view>> payload(const CacheEntry& e) {
  const std::string_view data[] = {std::string_view(e.object.data(), e.object.size()),
                                   e.plan,
                                   e.ir_traced,
                                   e.ir_optimized,
                                   e.fusion_plan,
                                   e.kernels,
                                   e.llvm_ir};
  static_assert(std::size(data) == std::size(kEntryFiles));
  std::vector<std::pair<const char*, std::string_view>> files;
  for (size_t i = 0; i < std::size(data); ++i) files.emplace_back(kEntryFiles[i], data[i]);
  for (auto& [name, data] : e.extra_files) files.emplace_back(name.c_str(), data);
  return files;
}

// Extra file names stay plain file names inside the entry directory.
bool is_extra_name(const std::string& name) {
  if (name.empty() || name[0] == '.' || name == "meta.json") return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

json::Array string_array(const std::vector<std::string>& v) {
  json::Array a;
  for (auto& s : v) a.push_back(s);
  return a;
}

double number_or(const json::Object* o, llvm::StringRef key, double fallback) {
  if (o == nullptr) return fallback;
  if (auto n = o->getNumber(key)) return *n;
  return fallback;
}

// An entry as evict() sees it.
struct EntryInfo {
  std::string key;
  double last_used = 0;
  int64_t bytes = 0;
};

int64_t dir_bytes(const std::string& path) {
  int64_t total = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(path, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::error_code ec2;
    auto n = it->file_size(ec2);
    if (!ec2) total += static_cast<int64_t>(n);
  }
  return total;
}

std::vector<EntryInfo> list_entries(const std::string& dir) {
  std::vector<EntryInfo> out;
  std::error_code ec;
  for (auto top = fs::directory_iterator(dir, ec); !ec && top != fs::directory_iterator();
       top.increment(ec)) {
    std::string prefix = top->path().filename().string();
    if (prefix.size() != 2 || top->is_symlink() || !top->is_directory()) continue;
    std::error_code ec2;
    for (auto it = fs::directory_iterator(top->path(), ec2); !ec2 && it != fs::directory_iterator();
         it.increment(ec2)) {
      std::string key = it->path().filename().string();
      if (!is_key(key) || key.compare(0, 2, prefix) != 0) continue;
      EntryInfo info;
      info.key = key;
      std::string path = it->path().string();
      std::string text, why;
      std::optional<json::Object> meta;
      if (read_entry_file(path + "/meta.json", text, why) == Read::Ok &&
          (meta = parse_object(text))) {
        info.last_used = number_or(&*meta, "last_used", 0);
        info.bytes = static_cast<int64_t>(number_or(&*meta, "total_bytes", 0)) +
                     static_cast<int64_t>(text.size());
      } else {
        info.bytes = dir_bytes(path);  // damaged: oldest of all
      }
      out.push_back(info);
    }
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- binary identity

namespace {

// The NT_GNU_BUILD_ID note of the loaded object that contains `addr`, as hex
// ("" when the object has none).
struct BuildIdSearch {
  uintptr_t addr;
  std::string hex;
};

int find_build_id(struct dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<BuildIdSearch*>(data);
  bool contains = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && search->addr >= start && search->addr < start + ph.p_memsz)
      contains = true;
  }
  if (!contains) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* nh = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((nh->n_namesz + 3) & ~3u);
      if (desc + nh->n_descsz > end) break;
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        static const char* digits = "0123456789abcdef";
        for (uint32_t k = 0; k < nh->n_descsz; ++k) {
          auto b = static_cast<unsigned char>(desc[k]);
          search->hex += digits[b >> 4];
          search->hex += digits[b & 15];
        }
        return 1;
      }
      p = desc + ((nh->n_descsz + 3) & ~3u);
    }
  }
  return 1;  // the right object, without a build id
}

}  // namespace

const std::string& loaded_binary_id() {
  static const std::string id = [] {
    // The linker's build id identifies the linked code exactly and costs
    // nothing to read; without one, hash the file.
    BuildIdSearch search{reinterpret_cast<uintptr_t>(&cache_key), ""};
    ::dl_iterate_phdr(find_build_id, &search);
    if (!search.hex.empty()) return search.hex.substr(0, 16);
    std::string data;
    Dl_info info;
    bool ok = ::dladdr(reinterpret_cast<void*>(&cache_key), &info) != 0 && info.dli_fname &&
              *info.dli_fname && read_file(info.dli_fname, data);
    if (!ok && !read_file("/proc/self/exe", data)) return std::string("unknown");
    return sha256_hex(data).substr(0, 16);
  }();
  return id;
}

// ---------------------------------------------------------------- DiskCache

DiskCache::DiskCache(std::string dir, int64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes > 0 ? max_bytes : default_cache_max_bytes()) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
}

std::string DiskCache::entry_dir(const std::string& key) const {
  return dir_ + "/" + key.substr(0, 2) + "/" + key;
}

std::string DiskCache::unique_tmp_name(const std::string& what) const {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s-%d-%llu-%llx", what.c_str(), static_cast<int>(::getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)),
                static_cast<unsigned long long>(salt & 0xffffffffu));
  return dir_ + "/tmp/" + buf;
}

namespace {

constexpr const char* kSecretFile = "hmac.key";

// What an entry's MAC covers: its key and each listed file's name, size and
// checksum, in meta.json's order, which is sorted by name.
std::string mac_message(const std::string& key, const json::Object& files) {
  std::vector<std::string> names;
  for (const auto& kv : files) names.push_back(kv.first.str());
  std::sort(names.begin(), names.end());
  std::string m = "flowjit-cache-mac 1\n" + key + "\n";
  for (const std::string& name : names) {
    const json::Object* f = files.getObject(name);
    std::optional<std::string> sha = f ? string_of(*f, "sha256") : std::nullopt;
    m += name + " " + std::to_string(static_cast<long long>(number_or(f, "bytes", -1))) + " " +
         sha.value_or("-") + "\n";
  }
  return m;
}

// Reads the listed file `name` of the entry at `path` into `out` and checks
// it against meta.json's `files`: "" when it is the file meta.json
// describes, else what is wrong; `untrusted` is set when the file itself is
// not to be trusted (a link, someone else's, a FIFO).
std::string read_listed_file(const std::string& path, const json::Object& files,
                             const std::string& name, bool text, std::string& out,
                             bool& untrusted) {
  const json::Object* f = files.getObject(name);
  std::optional<std::string> sha = f ? string_of(*f, "sha256") : std::nullopt;
  if (!sha) return name + " is not listed in meta.json";
  std::string problem;
  Read got = read_entry_file(path + "/" + name, out, problem);
  if (got == Read::Untrusted) untrusted = true;
  if (got == Read::Missing) return name + " is missing";
  if (got != Read::Ok) return problem;
  auto want_bytes = static_cast<int64_t>(number_or(f, "bytes", -1));
  if (static_cast<int64_t>(out.size()) != want_bytes)
    return name + " has " + std::to_string(out.size()) + " bytes, meta.json says " +
           std::to_string(want_bytes) + " (truncated?)";
  if (sha256_hex(out) != *sha) return name + " fails its SHA-256 checksum";
  if (text && !valid_utf8(out)) return name + " is not UTF-8 text";
  return "";
}

// meta.json's fields as store() writes them, and what each must be: a
// field of another type makes the entry unusable to show, so no reader
// meets a list where it reads a string.
enum class Field { String, Int, Number, List, Object };
constexpr std::pair<const char*, Field> kMetaFields[] = {{"key", Field::String},
                                                         {"format", Field::Int},
                                                         {"mac", Field::String},
                                                         {"job", Field::String},
                                                         {"source", Field::String},
                                                         {"signature", Field::String},
                                                         {"target", Field::String},
                                                         {"flowjit_version", Field::String},
                                                         {"build_id", Field::String},
                                                         {"llvm_version", Field::String},
                                                         {"num_kernels", Field::Int},
                                                         {"arena_bytes", Field::Int},
                                                         {"total_bytes", Field::Int},
                                                         {"hits", Field::Int},
                                                         {"compile_seconds", Field::Number},
                                                         {"codegen_seconds", Field::Number},
                                                         {"created", Field::Number},
                                                         {"last_used", Field::Number},
                                                         {"inputs", Field::List},
                                                         {"outputs", Field::List},
                                                         {"files", Field::Object}};

const char* json_kind(const json::Value& v) {
  switch (v.kind()) {
    case json::Value::Null:
      return "null";
    case json::Value::Boolean:
      return "true/false";
    case json::Value::Number:
      return v.getAsInteger() ? "an integer" : "a number";
    case json::Value::String:
      return "a string";
    case json::Value::Array:
      return "a list";
    case json::Value::Object:
      return "an object";
  }
  return "?";
}

// Why meta.json's fields cannot be shown ("" when each known one has its
// type, numbers in [0, 2^63), lists hold strings, files {bytes, sha256}).
std::string meta_fields_problem(const json::Object& meta) {
  for (const auto& [name, want] : kMetaFields) {
    const json::Value* v = meta.get(name);
    if (v == nullptr) continue;
    bool ok = false;
    const char* wanted = "";
    switch (want) {
      case Field::String:
        ok = v->getAsString().has_value(), wanted = "a string";
        break;
      case Field::Int:
        ok = v->getAsInteger().has_value(), wanted = "an integer";
        break;
      case Field::Number:
        ok = v->getAsNumber().has_value(), wanted = "an integer or a number";
        break;
      case Field::List:
        ok = v->getAsArray() != nullptr, wanted = "a list";
        break;
      case Field::Object:
        ok = v->getAsObject() != nullptr, wanted = "an object";
        break;
    }
    if (!ok)
      return std::string("meta.json field '") + name + "' is " + json_kind(*v) + ", expected " +
             wanted;
    if (auto n = v->getAsNumber(); n && !(*n >= 0 && *n < 9.2233720368547758e18))
      return std::string("meta.json field '") + name + "' is out of range";
  }
  for (const char* name : {"inputs", "outputs"})
    if (const json::Array* a = meta.getArray(name))
      for (const json::Value& x : *a)
        if (!x.getAsString())
          return std::string("meta.json field '") + name + "' holds a non-string";
  if (const json::Object* files = meta.getObject("files"))
    for (const auto& [name, info] : *files) {
      const json::Object* o = info.getAsObject();
      if (o == nullptr || !o->getInteger("bytes") || !o->getString("sha256"))
        return "meta.json lists file '" + printable_text(name.str()) +
               "' without an integer 'bytes' and a string 'sha256'";
    }
  return "";
}

bool random_bytes(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::getrandom(out + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

}  // namespace

std::string DiskCache::untrusted_root() const {
  std::string why;
  Read r = check_dir(dir_, /*follow=*/true, why);
  return r == Read::Untrusted ? why : "";
}

bool DiskCache::load_secret(std::string& why) {
  if (!secret_.empty()) return true;
  const std::string path = dir_ + "/" + kSecretFile;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::string text;
    Read r = read_entry_file(path, text, why);
    if (r == Read::Ok) {
      // (Made 0600; a user who makes a populated cache read-only with 0444
      // files keeps it usable: others can read the key but not write entries.)
      if (text.size() != 64 || !is_key(text)) {
        why = path + " is not a key (64 hex digits)";
        return false;
      }
      secret_ = text;
      return true;
    }
    if (r != Read::Missing) return false;
    uint8_t raw[32];
    if (!random_bytes(raw, sizeof raw)) {
      why = "no random bytes for " + path;
      return false;
    }
    static const char* digits = "0123456789abcdef";
    std::string hex;
    for (uint8_t b : raw) {
      hex += digits[b >> 4];
      hex += digits[b & 15];
    }
    if (!make_dirs(dir_, why)) return false;
    static std::atomic<uint64_t> counter{0};
    std::string tmp =
        path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
    ::unlink(tmp.c_str());
    if (!write_file(tmp, hex.data(), hex.size(), /*sync=*/true, why)) {
      ::unlink(tmp.c_str());
      return false;
    }
    int rc = ::link(tmp.c_str(), path.c_str());  // fails if another process made one first
    int err = errno;
    ::unlink(tmp.c_str());
    if (rc != 0 && err != EEXIST) {
      why = "cannot create " + path + ": " + std::strerror(err);
      return false;
    }
  }
  why = "cannot read or create " + path;
  return false;
}

DiskCache::Found DiskCache::lookup(const std::string& key, bool want_llvm_ir, CacheHit& hit,
                                   std::string& why, const std::vector<std::string>& extra) {
  const std::string path = entry_dir(key);
  auto damaged = [&](const std::string& what) {
    // A directory that vanished meanwhile was evicted by someone else.
    if (!is_dir(path)) return Found::Miss;
    why = what;
    remove(key);
    return Found::Damaged;
  };
  // 1. Every directory on the way is ours and private (a link is refused).
  Read r = check_dir(dir_, /*follow=*/true, why);
  if (r == Read::Missing) return Found::Miss;
  if (r != Read::Ok) return Found::Untrusted;
  r = check_dir(dir_ + "/" + key.substr(0, 2), /*follow=*/false, why);
  if (r == Read::Missing) return Found::Miss;
  if (r != Read::Ok) return Found::Untrusted;
  r = check_dir(path, /*follow=*/false, why);
  if (r == Read::Missing) return Found::Miss;
  if (r != Read::Ok) return Found::Untrusted;

  // 2. meta.json parses and is authentic.
  std::string text;
  r = read_entry_file(path + "/meta.json", text, why);
  if (r == Read::Untrusted) return Found::Untrusted;
  if (r == Read::Missing && !is_dir(path)) return Found::Miss;
  if (r != Read::Ok) return damaged("meta.json is missing or unreadable");
  std::optional<json::Object> meta = parse_object(text);
  if (!meta) return damaged("meta.json does not parse");
  if (string_of(*meta, "key") != key) return damaged("meta.json names another key");
  if (number_or(&*meta, "format", 0) != 1) return damaged("meta.json has an unknown format");
  const json::Object* files = meta->getObject("files");
  if (files == nullptr) return damaged("meta.json lists no files");
  if (!load_secret(why)) return Found::Untrusted;
  std::optional<std::string> mac = string_of(*meta, "mac");
  if (!mac || !constant_time_equal(*mac, hmac_sha256_hex(secret_, mac_message(key, *files))))
    return damaged(
        "it is not authenticated by this cache's key (copied from another cache, planted, or "
        "written by an older flowjit)");

  // 3. Each file read is the one meta.json describes.
  bool untrusted_file = false;
  auto read_checked = [&](const std::string& name, std::string& out, bool text) {
    return read_listed_file(path, *files, name, text, out, untrusted_file);
  };
  auto bad = [&](const std::string& problem) {
    if (!untrusted_file) return damaged(problem);
    why = problem;
    return Found::Untrusted;
  };
  std::string object, problem;
  if (!(problem = read_checked("object.o", object, false)).empty()) return bad(problem);
  if (!(problem = read_checked("plan.txt", hit.plan, true)).empty()) return bad(problem);
  if (want_llvm_ir && !(problem = read_checked("llvm.ll", hit.llvm_ir, true)).empty())
    return bad(problem);
  hit.extra.clear();
  for (const std::string& name : extra) {
    hit.extra.emplace_back();
    if (!(problem = read_checked(name, hit.extra.back(), true)).empty()) return bad(problem);
  }
  hit.object.assign(object.begin(), object.end());
  hit.hits = static_cast<int64_t>(number_or(&*meta, "hits", 0));
  return Found::Hit;
}

EntryReport DiskCache::inspect(
    const std::string& key,
    const std::function<std::vector<std::string>(const std::string&)>& extra_for_target) const {
  EntryReport r;
  if (!is_key(key)) {  // never a path elsewhere
    r.error = "'" + printable_text(key) + "' is not a cache key (64 hex digits)";
    return r;
  }
  const std::string path = entry_dir(key);
  std::string why;
  // Who owns and can write each directory on the way.
  for (const auto& [dir, follow] : {std::pair<std::string, bool>{dir_, true},
                                    {dir_ + "/" + key.substr(0, 2), false},
                                    {path, false}}) {
    Read d = check_dir(dir, follow, why);
    if (d == Read::Missing) {
      r.error = "the entry is missing";
      return r;
    }
    if (d != Read::Ok) r.problems.push_back(why);
  }
  // meta.json, as lookup() reads it, and fit to show.
  std::string text;
  Read m = read_entry_file(path + "/meta.json", text, why);
  if (m == Read::Missing) r.error = "meta.json is missing";
  if (m != Read::Ok) {
    if (r.error.empty()) r.error = why;
    return r;
  }
  r.meta_bytes = static_cast<int64_t>(text.size());
  std::optional<json::Object> meta = parse_object(text);
  if (!meta) {
    r.error = !valid_utf8(text)              ? "meta.json is not UTF-8"
              : nested_deeper_than(text, 32) ? "meta.json does not parse (nested too deeply)"
                                             : "meta.json does not parse as a JSON object";
    return r;
  }
  r.error = meta_fields_problem(*meta);
  if (r.error.empty() && string_of(*meta, "key") != key) r.error = "meta.json names another key";
  const json::Object* files = meta->getObject("files");
  if (r.error.empty() && files == nullptr) r.error = "meta.json lists no files";
  if (!r.error.empty()) return r;
  r.meta = text;
  r.target = string_of(*meta, "target").value_or("");
  r.num_kernels = static_cast<int64_t>(number_or(&*meta, "num_kernels", -1));
  // Authentic under this cache's key, which is read, never made.
  std::string secret;
  Read k = read_entry_file(dir_ + "/" + kSecretFile, secret, why);
  std::optional<std::string> mac = string_of(*meta, "mac");
  r.authenticated = k == Read::Ok && is_key(secret) && mac &&
                    constant_time_equal(*mac, hmac_sha256_hex(secret, mac_message(key, *files)));
  if (k != Read::Ok || !is_key(secret))
    r.problems.push_back("the cache has no usable key (hmac.key) to authenticate it");
  else if (!r.authenticated)
    r.problems.push_back(
        "it is not authenticated by this cache's key (copied from another cache, planted, or "
        "written by an older flowjit)");
  if (number_or(&*meta, "format", 0) != 1) r.problems.push_back("meta.json has an unknown format");
  // Every file there must be, and each one as meta.json describes it.
  std::vector<std::string> wanted(std::begin(kEntryFiles), std::end(kEntryFiles));
  std::vector<std::string> extra;
  if (extra_for_target) extra = extra_for_target(r.target);
  wanted.insert(wanted.end(), extra.begin(), extra.end());
  for (const std::string& name : wanted)
    if (files->getObject(name) == nullptr)
      r.problems.push_back(name + " is not listed in meta.json");
  for (const auto& kv : *files) {
    const std::string name = kv.first.str();
    if (!is_extra_name(name)) {  // never a path out of the entry
      r.problems.push_back("meta.json lists '" + printable_text(name) + "', not a file name");
      continue;
    }
    // what lookup() reads as text
    bool text = name == "plan.txt" || name == "llvm.ll" ||
                std::find(extra.begin(), extra.end(), name) != extra.end();
    std::string data;
    bool untrusted = false;
    std::string problem = read_listed_file(path, *files, name, text, data, untrusted);
    if (!problem.empty()) r.problems.push_back(problem);
  }
  return r;
}

bool DiskCache::read_listed(const std::string& key, const std::string& name, bool verify,
                            std::string& out, std::string& why) const {
  if (!is_key(key) || !is_extra_name(name)) {
    why = "'" + printable_text(name) + "' is not a file of entry " + key.substr(0, 12);
    return false;
  }
  const std::string path = entry_dir(key);
  if (!verify) {
    Read r = read_entry_file(path + "/" + name, out, why);
    if (r == Read::Missing) why = name + " is missing";
    return r == Read::Ok;
  }
  std::string text;
  std::optional<json::Object> meta;
  const json::Object* files = nullptr;
  if (read_entry_file(path + "/meta.json", text, why) != Read::Ok || !(meta = parse_object(text)) ||
      !(files = meta->getObject("files"))) {
    why = "meta.json is missing or unusable, so " + name + " cannot be checked";
    return false;
  }
  bool untrusted = false;
  why = read_listed_file(path, *files, name, false, out, untrusted);
  return why.empty();
}

void DiskCache::touch(const std::string& key) {
  const std::string path = entry_dir(key);
  std::string why;
  if (check_dir(path, /*follow=*/false, why) != Read::Ok) return;
  FileLock lock(path, /*directory=*/true);
  if (!lock.held()) return;
  std::string text;
  std::optional<json::Object> meta;
  if (read_entry_file(path + "/meta.json", text, why) != Read::Ok || !(meta = parse_object(text)))
    return;
  (*meta)["hits"] = static_cast<int64_t>(number_or(&*meta, "hits", 0)) + 1;
  (*meta)["last_used"] = now_seconds();
  std::string out = json_text(std::move(*meta));
  std::string tmp = path + "/meta.json.tmp-" + std::to_string(::getpid());
  ::unlink(tmp.c_str());  // a crashed toucher's; write_file creates exclusively
  if (!write_file(tmp, out.data(), out.size(), /*sync=*/false, why)) {
    ::unlink(tmp.c_str());
    return;
  }
  if (::rename(tmp.c_str(), (path + "/meta.json").c_str()) != 0) ::unlink(tmp.c_str());
}

DiskCache::Stored DiskCache::store(const CacheEntry& e, std::string& why) {
  FJ_CHECK(is_key(e.key), "bad cache key '", e.key, "'");
  for (auto& [name, data] : e.extra_files)
    FJ_CHECK(is_extra_name(name), "bad extra cache file name '", name, "'");
  // lookup() reads these as text and calls an entry with bytes that are not
  // UTF-8 damaged: such an entry is not worth writing (found by the fuzzer).
  std::vector<std::pair<std::string, const std::string*>> texts = {{"plan.txt", &e.plan},
                                                                   {"llvm.ll", &e.llvm_ir}};
  for (auto& [name, data] : e.extra_files) texts.emplace_back(name, &data);
  for (auto& [name, text] : texts) {
    if (!valid_utf8(*text)) {
      why = name + " is not UTF-8 text; not stored";
      return Stored::Failed;
    }
  }
  const std::string final_dir = entry_dir(e.key);
  if (is_dir(final_dir)) return Stored::AlreadyPresent;
  if (!make_dirs(dir_ + "/tmp", why) || !make_dirs(dir_ + "/" + e.key.substr(0, 2), why))
    return Stored::Failed;
  // Nobody else may be able to swap the staging directory or the entry.
  for (const std::string& d : {dir_, dir_ + "/tmp", dir_ + "/" + e.key.substr(0, 2)})
    if (check_dir(d, /*follow=*/d == dir_, why) != Read::Ok) return Stored::Failed;
  if (!load_secret(why)) return Stored::Failed;
  const std::string stage = unique_tmp_name("stage-" + e.key.substr(0, 16));
  if (::mkdir(stage.c_str(), 0700) != 0) {
    why = errno_text("cannot create", stage);
    return Stored::Failed;
  }
  auto fail = [&]() {
    std::error_code ec;
    fs::remove_all(stage, ec);
    return Stored::Failed;
  };

  // 1. The payload, each file's size and checksum noted. Nothing is fsynced:
  // a cache needs integrity, not durability, and every reader checks each
  // file against meta.json (so an entry a crash left short is damaged, dropped
  // and recompiled), while the fsyncs cost the cold call 10-150 ms of waiting
  // on a busy disk (0.5 s once under load 12).
  json::Object files;
  int64_t total = 0;
  for (auto& [name, data] : payload(e)) {
    if (!write_file(stage + "/" + name, data.data(), data.size(), /*sync=*/false, why))
      return fail();
    files[name] =
        json::Object{{"bytes", static_cast<int64_t>(data.size())}, {"sha256", sha256_hex(data)}};
    total += static_cast<int64_t>(data.size());
  }
  // 2. The metadata, last: an entry with a meta.json is complete.
  double now = now_seconds();
  std::string mac = hmac_sha256_hex(secret_, mac_message(e.key, files));
  json::Object meta{
      {"format", 1},
      {"key", e.key},
      {"job", e.job_name},
      {"signature", e.signature},
      {"source", e.source},
      {"inputs", string_array(e.inputs)},
      {"outputs", string_array(e.outputs)},
      {"target", e.target},
      {"llvm_version", e.llvm_version},
      {"flowjit_version", e.version},
      {"build_id", e.build_id},
      {"created", now},
      {"last_used", now},
      {"hits", 0},
      {"compile_seconds", e.compile_seconds},
      {"codegen_seconds", e.codegen_seconds},
      {"arena_bytes", static_cast<int64_t>(e.arena_bytes)},
      {"num_kernels", static_cast<int64_t>(e.num_kernels)},
      {"object_bytes", static_cast<int64_t>(e.object.size())},
      {"total_bytes", total},
      {"mac", std::move(mac)},
      {"files", std::move(files)},
  };
  std::string text = json_text(std::move(meta));
  if (!write_file(stage + "/meta.json", text.data(), text.size(), /*sync=*/false, why))
    return fail();
  // 3. Publication: one rename. A present key wins over ours. A prefix
  // directory removed meanwhile (flowjit-cache clear) is made again, once.
  int rc = ::rename(stage.c_str(), final_dir.c_str());
  if (rc != 0 && errno == ENOENT && make_dirs(dir_ + "/" + e.key.substr(0, 2), why))
    rc = ::rename(stage.c_str(), final_dir.c_str());
  if (rc != 0) {
    int err = errno;
    if (err == ENOTEMPTY || err == EEXIST) {
      std::error_code ec;
      fs::remove_all(stage, ec);
      return Stored::AlreadyPresent;
    }
    why = "cannot publish " + final_dir + ": " + std::strerror(err);
    return fail();
  }
  return Stored::Published;
}

bool DiskCache::remove(const std::string& key) {
  const std::string path = entry_dir(key);
  std::string why;
  if (!make_dirs(dir_ + "/tmp", why)) return false;
  const std::string dead = unique_tmp_name("dead-" + key.substr(0, 16));
  if (::rename(path.c_str(), dead.c_str()) != 0) return false;
  std::error_code ec;
  fs::remove_all(dead, ec);
  return true;
}

int64_t DiskCache::total_bytes() const {
  int64_t total = 0;
  for (auto& e : list_entries(dir_)) total += e.bytes;
  return total;
}

int DiskCache::evict(const std::string& keep) {
  FileLock lock(dir_ + "/lock", /*directory=*/false);
  if (!lock.held()) return 0;
  // Staging directories of crashed writers (older than an hour) and entries
  // whose deletion was interrupted.
  std::error_code ec;
  auto now = fs::file_time_type::clock::now();
  for (auto it = fs::directory_iterator(dir_ + "/tmp", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::error_code ec2;
    auto age = now - fs::last_write_time(it->path(), ec2);
    if (!ec2 && (name.rfind("dead-", 0) == 0 || age > std::chrono::hours(1))) {
      std::error_code ec3;
      fs::remove_all(it->path(), ec3);
    }
  }
  std::vector<EntryInfo> entries = list_entries(dir_);
  int64_t total = 0;
  for (auto& e : entries) total += e.bytes;
  if (total <= max_bytes_) return 0;
  std::sort(entries.begin(), entries.end(),
            [](const EntryInfo& a, const EntryInfo& b) { return a.last_used < b.last_used; });
  int removed = 0;
  for (auto& e : entries) {
    if (total <= max_bytes_) break;
    if (e.key == keep) continue;
    if (remove(e.key)) {
      total -= e.bytes;
      ++removed;
    }
  }
  return removed;
}

}  // namespace flowjit::jit
