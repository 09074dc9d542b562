// Fuzzes disk-cache entry loading (jit/cache.h: DiskCache::lookup) in three
// ways, chosen by the first byte:
//   0: an entry written by a stranger: meta.json, plan.txt and object.o are
//      the input's parts, as they are (JSON parser, field checks, sizes,
//      checksums, the MAC);
//   1: an authentic entry (DiskCache::store) whose plan and object are the
//      input's parts: it must come back byte for byte;
//   2: an authentic entry whose meta.json is then edited at the offsets the
//      input gives: a lookup must find it damaged, or whole if unchanged.
// A lookup never crashes, hangs or returns bytes other than those stored.
// Before each lookup the cache tool's DiskCache::inspect sees the entry: it
// never crashes, never removes it, never calls a stranger's entry
// authentic, and finds nothing wrong with an unedited authentic one.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "jit/cache.h"

namespace jit = flowjit::jit;

namespace {

const std::string kKey(64, 'a');

const std::string& cache_dir() {
  static std::string dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "flowjit-fuzz-cache-XXXXXX").string();
    if (!::mkdtemp(t.data())) std::abort();
    return t;
  }();
  return dir;
}

std::vector<std::string> split(const uint8_t* p, size_t n, size_t parts) {
  std::vector<std::string> out(1);
  for (size_t i = 0; i < n; ++i) {
    if (out.size() < parts && i + 1 < n && p[i] == 0xff && p[i + 1] == 0xfe) {
      out.emplace_back();
      ++i;
      continue;
    }
    out.back() += static_cast<char>(p[i]);
  }
  out.resize(parts);
  return out;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  ::chmod(path.c_str(), 0600);
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

jit::CacheEntry entry(const std::string& plan, const std::string& object) {
  jit::CacheEntry e;
  e.key = kKey;
  e.object.assign(object.begin(), object.end());
  e.plan = plan;
  e.job_name = "fuzz";
  e.target = "x86_64";
  e.ir_traced = e.ir_optimized = "graph fuzz {\n}\n";
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  jit::DiskCache cache(cache_dir(), 1 << 26);
  cache.remove(kKey);
  std::vector<std::string> parts = split(data + 1, size - 1, 3);
  jit::CacheHit hit;
  std::string why;
  int mode = data[0] % 3;
  if (mode == 0) {
    std::string dir = cache.entry_dir(kKey);
    std::filesystem::create_directories(dir);
    ::chmod(dir.c_str(), 0700);
    ::chmod(std::filesystem::path(dir).parent_path().c_str(), 0700);
    write(dir + "/meta.json", parts[0]);
    write(dir + "/plan.txt", parts[1]);
    write(dir + "/object.o", parts[2]);
    if (cache.inspect(kKey).authenticated || !std::filesystem::exists(dir)) std::abort();
    // A stranger cannot know this cache's key: never a hit.
    if (cache.lookup(kKey, false, hit, why) == jit::DiskCache::Found::Hit) std::abort();
  } else {
    std::string stored_why;
    if (cache.store(entry(parts[0], parts[1]), stored_why) != jit::DiskCache::Stored::Published)
      return 0;  // e.g. text that is not UTF-8 is refused at store time
    std::string meta_path = cache.entry_dir(kKey) + "/meta.json";
    std::string meta = read(meta_path), edited = meta;
    if (mode == 2) {
      for (size_t i = 0; i + 2 < parts[2].size(); i += 3) {
        size_t at =
            (static_cast<uint8_t>(parts[2][i]) << 8 | static_cast<uint8_t>(parts[2][i + 1])) %
            (edited.size() + 1);
        if (at == edited.size())
          edited += parts[2][i + 2];
        else
          edited[at] = parts[2][i + 2];
      }
      write(meta_path, edited);
    }
    jit::EntryReport report = cache.inspect(kKey);
    if (!std::filesystem::exists(meta_path)) std::abort();  // inspect removes nothing
    if (edited == meta && (!report.error.empty() || !report.problems.empty())) {
      std::fprintf(stderr, "inspect found fault with an authentic entry: %s%s\n",
                   report.error.c_str(), report.problems.empty() ? "" : report.problems[0].c_str());
      std::abort();
    }
    auto found = cache.lookup(kKey, false, hit, why);
    if (edited == meta) {
      if (found != jit::DiskCache::Found::Hit) {
        std::fprintf(stderr, "an authentic entry was not found: %s\n", why.c_str());
        std::abort();
      }
      if (hit.plan != parts[0] || std::string(hit.object.begin(), hit.object.end()) != parts[1])
        std::abort();
    } else if (found == jit::DiskCache::Found::Hit) {
      // Edits that leave the JSON meaning the same (spaces) may still be a
      // hit; the bytes must then be the authentic ones.
      if (hit.plan != parts[0] || std::string(hit.object.begin(), hit.object.end()) != parts[1])
        std::abort();
    }
  }
  cache.remove(kKey);
  return 0;
}
