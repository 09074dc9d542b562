// Loading NCCL with dlopen, checking its calls, and the NCCL communicator of
// runtime/cuda/nccl.h.
#include "runtime/cuda/nccl.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <set>
#include <thread>

#include "ir/error.h"
#include "runtime/comm/tcp_store.h"

namespace flowjit::runtime::cuda {

const char* const kNoNcclMessage =
    "no NCCL: no usable libnccl.so.2 was found; collectives between GPUs need NCCL 2 (pip "
    "install nvidia-nccl-cu12, or set FLOWJIT_NCCL_LIBRARY to the library's path)";

std::string nccl_version_text(int code) {
  // NCCL_VERSION(X, Y, Z) is X*1000 + Y*100 + Z up to 2.8 and X*10000 + Y*100 + Z after.
  int major = code >= 10000 ? code / 10000 : code / 1000;
  int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return str(major, ".", minor, ".", code % 100);
}

std::string nccl_error_text(const NcclApi& api, ncclResult_t r) {
  static const char* const names[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  std::string s = r >= 0 && r < 8 ? names[r] : str("NCCL error ", r);
  const char* text = api.ncclGetErrorString ? api.ncclGetErrorString(r) : nullptr;
  if (text && *text) s += str(": ", text);
  return s;
}

void nccl_check(const NcclApi& api, ncclResult_t r, const char* call, const std::string& context) {
  if (r == kNcclSuccess) return;
  std::string msg = str("NCCL call ", call, " failed: ", nccl_error_text(api, r));
  // The code alone rarely says what went wrong ("unhandled cuda error");
  // NCCL keeps the detail, per thread, behind ncclGetLastError.
  const char* last = api.ncclGetLastError ? api.ncclGetLastError(nullptr) : nullptr;
  if (last && *last) msg += str("; NCCL's last error: ", last);
  if (!context.empty()) msg += str(" (", context, ")");
  throw UserError(ErrorKind::Runtime, msg);
}

// ---------------------------------------------------------------- loading

namespace {

// Loads `library` into *api, or says why not: dlerror's text, or the symbols
// it lacks. Never throws.
bool try_load(const std::string& library, NcclApi* api, std::string* why, bool* found) {
  *found = false;
  void* h = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    *why = e ? e : "cannot be loaded";
    return false;
  }
  *found = true;
  NcclApi a;
  a.library = library;
  a.handle = h;
  std::string missing;
#define FLOWJIT_NCCL_RESOLVE(member, ret, params)                  \
  a.member = reinterpret_cast<ret(*) params>(::dlsym(h, #member)); \
  if (!a.member) missing += std::string(missing.empty() ? "" : ", ") + #member;
  FLOWJIT_NCCL_FUNCTIONS(FLOWJIT_NCCL_RESOLVE)
#undef FLOWJIT_NCCL_RESOLVE
#define FLOWJIT_NCCL_RESOLVE_OPTIONAL(member, ret, params) \
  a.member = reinterpret_cast<ret(*) params>(::dlsym(h, #member));
  FLOWJIT_NCCL_OPTIONAL_FUNCTIONS(FLOWJIT_NCCL_RESOLVE_OPTIONAL)
#undef FLOWJIT_NCCL_RESOLVE_OPTIONAL
  if (!missing.empty()) {
    ::dlclose(h);
    *why = str("lacks ", missing, " (flowjit needs NCCL 2.4 or newer)");
    return false;
  }
  if (a.ncclGetVersion(&a.version) != kNcclSuccess || a.version < 2000) {
    ::dlclose(h);
    *why = str("is not NCCL 2 (ncclGetVersion says ", a.version, ")");
    return false;
  }
  *api = std::move(a);
  return true;
}

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string parent(const std::string& p) {
  size_t slash = p.find_last_of('/');
  return slash == std::string::npos || slash == 0 ? "/" : p.substr(0, slash);
}

// The lib/python3.*/site-packages folders of an installation prefix.
std::vector<std::string> site_packages(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = ::opendir((prefix + "/lib").c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("python3", 0) == 0) out.push_back(prefix + "/lib/" + name + "/site-packages");
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

NcclApi load_nccl(const std::string& library) {
  NcclApi api;
  std::string why;
  bool found = false;
  if (try_load(library, &api, &why, &found)) return api;
  if (found) throw_user(ErrorKind::Runtime, "the NCCL library ", library, " ", why);
  throw_user(ErrorKind::Runtime, kNoNcclMessage, " (tried ", library, " [", why, "])");
}

std::vector<std::string> nccl_library_candidates() {
  std::vector<std::string> out = {"libnccl.so.2"};
  auto add = [&](const std::string& path) {
    if (is_file(path) && std::find(out.begin(), out.end(), path) == out.end()) out.push_back(path);
  };
  // pip's nvidia-nccl-cu* wheels put it in <site-packages>/nvidia/nccl/lib.
  // Which site-packages: those of the running interpreter (<prefix>/bin/python3.x),
  // of the active virtual or conda environment, and the user's own; and the
  // one flowjit itself is installed in (its extension module sits in
  // <site-packages>/flowjit/), found from this code's address.
  std::vector<std::string> prefixes;
  char exe[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) prefixes.push_back(parent(parent(std::string(exe, static_cast<size_t>(n)))));
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (!env(var).empty()) prefixes.push_back(env(var));
  if (!env("HOME").empty()) prefixes.push_back(env("HOME") + "/.local");
  const std::string wheel = "/nvidia/nccl/lib/libnccl.so.2";
  for (const std::string& prefix : prefixes)
    for (const std::string& site : site_packages(prefix)) add(site + wheel);
  Dl_info info;
  if (::dladdr(reinterpret_cast<void*>(&nccl_library_candidates), &info) && info.dli_fname) {
    std::string dir = parent(info.dli_fname);
    for (int up = 0; up < 3 && dir != "/"; ++up, dir = parent(dir)) add(dir + wheel);
  }
  // CUDA toolkits that ship NCCL.
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (!env(var).empty()) roots.push_back(env(var));
  roots.push_back("/usr/local/cuda");
  for (const std::string& root : roots) {
    add(root + "/lib64/libnccl.so.2");
    add(root + "/lib/libnccl.so.2");
  }
  return out;
}

NcclApi find_nccl() {
  std::string chosen = env("FLOWJIT_NCCL_LIBRARY");
  if (!chosen.empty()) {
    try {
      return load_nccl(chosen);
    } catch (const UserError& e) {
      throw UserError(e.kind(), str(e.what(), " (from FLOWJIT_NCCL_LIBRARY)"));
    }
  }
  std::string tried;
  for (const std::string& library : nccl_library_candidates()) {
    NcclApi api;
    std::string why;
    bool found = false;
    if (try_load(library, &api, &why, &found)) return api;
    tried += str(tried.empty() ? "" : "; ", library, " [", found ? "it " : "", why, "]");
  }
  throw_user(ErrorKind::Runtime, kNoNcclMessage, " (tried ", tried, ")");
}

namespace {
struct Loaded {
  std::unique_ptr<NcclApi> api;
  std::string error;
};
Loaded& loaded() {
  static Loaded l = [] {
    Loaded r;
    try {
      r.api = std::make_unique<NcclApi>(find_nccl());
    } catch (const UserError& e) {
      r.error = e.what();
    }
    return r;
  }();
  return l;
}
}  // namespace

const NcclApi& nccl() {
  Loaded& l = loaded();
  if (!l.api) throw UserError(ErrorKind::Runtime, l.error);
  return *l.api;
}

bool nccl_available(std::string* why) {
  Loaded& l = loaded();
  if (why) *why = l.error;
  return l.api != nullptr;
}

NcclReduction nccl_reduction(ir::DType dtype) {
  using ir::DType;
  switch (dtype) {
    case DType::Bool:
      return {kNcclUint8, kNcclMax};  // OR of 0/1 bytes
    case DType::Int8:
      return {kNcclInt8, kNcclSum};
    case DType::UInt8:
      return {kNcclUint8, kNcclSum};
    case DType::Int32:
      return {kNcclInt32, kNcclSum};
    case DType::Int64:
      return {kNcclInt64, kNcclSum};
    case DType::Float32:
      return {kNcclFloat32, kNcclSum};
    case DType::Float64:
      return {kNcclFloat64, kNcclSum};
    case DType::Float16:
      return {kNcclFloat16, kNcclSum};
    case DType::BFloat16:
      return {kNcclBfloat16, kNcclSum};
  }
  throw_user(ErrorKind::NotImplemented, "nccl: no NCCL reduction for dtype ",
             static_cast<int>(dtype));
}

// ---------------------------------------------------------------- copies

void strided_copy(const Device& device, CUdeviceptr dst, size_t dst_pitch, CUdeviceptr src,
                  size_t src_pitch, size_t width, size_t rows, CUstream stream) {
  if (rows == 0 || width == 0) return;
  FJ_CHECK(width <= dst_pitch && width <= src_pitch, "strided_copy: rows wider than their pitch");
  const DriverApi& a = device.api();
  CUstream s = stream ? stream : device.stream();
  if (rows == 1 || (width == src_pitch && width == dst_pitch)) {
    check(a, a.cuMemcpyDtoDAsync(dst, src, width * rows, s), "cuMemcpyDtoDAsync");
    return;
  }
  // cuMemcpy2D rejects pitches above the device's maximum
  // (CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2^31 - 1 on the GPUs of today); rows that
  // long are few, so copying them one by one costs nothing that matters.
  constexpr size_t kMaxPitch = INT_MAX;
  if (!a.cuMemcpy2DAsync || src_pitch > kMaxPitch || dst_pitch > kMaxPitch) {
    for (size_t i = 0; i < rows; ++i)
      check(a, a.cuMemcpyDtoDAsync(dst + i * dst_pitch, src + i * src_pitch, width, s),
            "cuMemcpyDtoDAsync");
    return;
  }
  CUDA_MEMCPY2D c;
  c.srcMemoryType = kMemoryTypeDevice;
  c.srcDevice = src;
  c.srcPitch = src_pitch;
  c.dstMemoryType = kMemoryTypeDevice;
  c.dstDevice = dst;
  c.dstPitch = dst_pitch;
  c.WidthInBytes = width;
  c.Height = rows;
  check(a, a.cuMemcpy2DAsync(&c, s), "cuMemcpy2DAsync",
        str("copying ", rows, " rows of ", width, " bytes"));
}

// ---------------------------------------------------------------- the communicator

namespace {

CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }
void* vptr(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

bool overlap(CUdeviceptr a, uint64_t a_bytes, CUdeviceptr b, uint64_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

std::string count_text(size_t n, const char* one, const char* many) {
  return str(n, " ", n == 1 ? one : many);
}

std::string gpu_list(const std::vector<int>& ordinals) {
  std::string s = ordinals.size() == 1 ? "GPU " : "GPUs ";
  for (size_t i = 0; i < ordinals.size(); ++i) s += str(i ? ", " : "", ordinals[i]);
  return s;
}

constexpr uint64_t kStagingGrain = 1ull << 20;

}  // namespace

struct NcclCommunicator::Rank {
  std::shared_ptr<Device> device;
  int index = 0;              // the global rank
  ncclComm_t comm = nullptr;  // null once aborted; used by the rank's own thread only
  CUevent done = nullptr;     // recorded after each collective, polled until complete
  DeviceBuffer staging;       // layout changes and overlapping buffers; grows
  // Enqueued (overlap): the stream collectives go on, and staging outgrown
  // while collectives that use it may still be in flight, kept until wait_event.
  CUstream stream = nullptr;  // null: the device's stream, waited for by each call
  std::vector<DeviceBuffer> retired;
  CUstream on() const { return stream ? stream : device->stream(); }
};

NcclCommunicator::NcclCommunicator(const NcclApi& api, int world, int first,
                                   std::vector<std::shared_ptr<Device>> devices,
                                   const NcclOptions& options)
    : api_(api), world_(world), first_(first) {
  FJ_USER_CHECK(!devices.empty(), ErrorKind::Value, "nccl: a communicator needs at least one GPU");
  FJ_USER_CHECK(options.timeout_seconds >= 0 && std::isfinite(options.timeout_seconds),
                ErrorKind::Value, "nccl: timeout_seconds must be 0 (none) or positive, not ",
                options.timeout_seconds);
  // Capped at about 30 years, so that the nanoseconds fit.
  timeout_ = std::chrono::nanoseconds(std::llround(std::min(options.timeout_seconds, 1e9) * 1e9));
  std::set<int> seen;
  for (size_t i = 0; i < devices.size(); ++i) {
    FJ_USER_CHECK(devices[i] != nullptr, ErrorKind::Value, "nccl: device ", i, " is null");
    int ordinal = devices[i]->info().ordinal;
    // NCCL does not support two ranks on one GPU (it hangs or fails late).
    FJ_USER_CHECK(seen.insert(ordinal).second, ErrorKind::Value, "nccl: GPU ", ordinal,
                  " is given twice; a communicator has one rank per GPU");
    auto r = std::make_unique<Rank>();
    r->device = std::move(devices[i]);
    r->index = first + static_cast<int>(i);
    ranks_.push_back(std::move(r));
  }
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(
    std::vector<std::shared_ptr<Device>> devices, const NcclOptions& options) {
  const NcclApi& api = options.nccl ? *options.nccl : nccl();
  int n = static_cast<int>(devices.size());
  std::shared_ptr<NcclCommunicator> c(new NcclCommunicator(api, n, 0, std::move(devices), options));
  std::vector<int> ordinals;
  for (auto& r : c->ranks_) ordinals.push_back(r->device->info().ordinal);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  nccl_check(api, api.ncclCommInitAll(comms.data(), n, ordinals.data()), "ncclCommInitAll",
             str("creating a communicator of ", gpu_list(ordinals)));
  for (int i = 0; i < n; ++i)
    c->ranks_[static_cast<size_t>(i)]->comm = comms[static_cast<size_t>(i)];
  c->finish_setup();
  return c;
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(
    const ncclUniqueId& id, int world_size, int first_rank,
    std::vector<std::shared_ptr<Device>> devices, const NcclOptions& options) {
  const NcclApi& api = options.nccl ? *options.nccl : nccl();
  int n = static_cast<int>(devices.size());
  FJ_USER_CHECK(world_size >= 1 && first_rank >= 0 && first_rank + n <= world_size,
                ErrorKind::Value, "nccl: ranks ", first_rank, "..", first_rank + n - 1,
                " are not all ranks of a world of ", world_size);
  std::shared_ptr<NcclCommunicator> c(
      new NcclCommunicator(api, world_size, first_rank, std::move(devices), options));
  std::string context =
      str("joining a communicator of ", world_size, " ranks as ",
          n == 1 ? str("rank ", first_rank) : str("ranks ", first_rank, "..", first_rank + n - 1));
  // NCCL takes each rank's GPU from the context current at ncclCommInitRank.
  // Several ranks of one thread must join inside one group, or the first
  // would wait for the others forever.
  if (n > 1) nccl_check(api, api.ncclGroupStart(), "ncclGroupStart", context);
  ncclResult_t failed = kNcclSuccess;
  for (auto& r : c->ranks_) {
    Device::Scope scope(*r->device);
    ncclResult_t res = api.ncclCommInitRank(&r->comm, world_size, id, r->index);
    if (res != kNcclSuccess && failed == kNcclSuccess) failed = res;
  }
  ncclResult_t ended = n > 1 ? api.ncclGroupEnd() : kNcclSuccess;
  if (failed != kNcclSuccess || ended != kNcclSuccess) {
    // What a failed join leaves in the handles is not defined: leaking them
    // is safer than destroying something that may not exist.
    for (auto& r : c->ranks_) r->comm = nullptr;
  }
  nccl_check(api, failed, "ncclCommInitRank", context);
  nccl_check(api, ended, "ncclGroupEnd", context);
  c->finish_setup();
  return c;
}

void NcclCommunicator::finish_setup() {
  for (auto& r : ranks_) {
    Device::Scope scope(*r->device);
    FLOWJIT_CU(r->device->api(), cuEventCreate, &r->done, kEventDisableTiming);
  }
}

NcclCommunicator::~NcclCommunicator() {
  // Errors are ignored here: a destructor cannot report them, and the
  // process may be exiting with NCCL or the driver already torn down.
  const bool healthy = !aborted_.load();
  auto finish = [&](Rank& r) {
    try {
      Device::Scope scope(*r.device);
      if (r.comm) {
        // An aborted communicator's peers may be gone: destroying would
        // wait for them, aborting does not.
        if (healthy)
          api_.ncclCommDestroy(r.comm);
        else
          api_.ncclCommAbort(r.comm);
        r.comm = nullptr;
      }
      if (r.done) r.device->api().cuEventDestroy(r.done);
      r.done = nullptr;
    } catch (...) {
    }
  };
  // ncclCommDestroy waits for the other ranks on this machine (NCCL 2.14 and
  // newer), so the local ranks are destroyed concurrently, one thread each.
  size_t live = 0;
  for (auto& r : ranks_) live += r->comm != nullptr;
  if (healthy && live > 1) {
    std::vector<std::thread> threads;
    try {
      for (auto& r : ranks_) threads.emplace_back([&finish, rank = r.get()] { finish(*rank); });
    } catch (...) {
    }
    for (auto& t : threads) t.join();
  }
  for (auto& r : ranks_) finish(*r);  // those left (all of them when not threaded)
}

std::string NcclCommunicator::describe() const {
  std::string version = api_.version ? nccl_version_text(api_.version) : "(hand-made table)";
  size_t n = ranks_.size();
  std::string who;
  if (static_cast<int>(n) == world_)
    who = count_text(n, "GPU", "GPUs");
  else if (n == 1)
    who = str("rank ", first_, " of ", world_);
  else
    who = str("ranks ", first_, "..", first_ + static_cast<int>(n) - 1, " of ", world_);
  return str("nccl ", version, ": ", who);
}

Device& NcclCommunicator::device(int rank) {
  int l = rank - first_;
  FJ_USER_CHECK(l >= 0 && l < local_ranks(), ErrorKind::Value, "nccl: rank ", rank,
                " is not a GPU of this process");
  return *ranks_[static_cast<size_t>(l)]->device;
}

std::string NcclCommunicator::where(const Rank& r) const {
  return str("rank ", r.index, " (GPU ", r.device->info().ordinal, ")");
}

std::string NcclCommunicator::abort_reason() {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_reason_;
}

void NcclCommunicator::abort(const std::string& why) {
  // Only the flag: each rank's NCCL communicator is its own thread's to
  // abort, which it does on seeing the flag while it waits or as it enters
  // its next collective (NCCL calls on one communicator from two threads at
  // once are not allowed).
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_reason_.empty()) abort_reason_ = why.empty() ? "a device failed" : why;
  }
  aborted_.store(true, std::memory_order_release);
}

void NcclCommunicator::abort_comm(Rank& r) {
  if (!r.comm) return;
  ncclComm_t comm = r.comm;
  r.comm = nullptr;
  // ncclCommAbort stops the rank's kernels that wait for peers, so its
  // stream drains; its own failure has no better place to go than this one.
  try {
    Device::Scope scope(*r.device);
    api_.ncclCommAbort(comm);
  } catch (const UserError&) {
    api_.ncclCommAbort(comm);
  }
}

NcclCommunicator::Rank& NcclCommunicator::enter(int rank) {
  int l = rank - first_;
  FJ_USER_CHECK(l >= 0 && l < local_ranks(), ErrorKind::Value, "nccl: rank ", rank,
                " is not a GPU of this process (its ranks are ", first_, "..",
                first_ + local_ranks() - 1, ")");
  Rank& r = *ranks_[static_cast<size_t>(l)];
  if (aborted_.load(std::memory_order_acquire)) {
    abort_comm(r);
    throw_user(ErrorKind::Runtime, "a collective was aborted: ", abort_reason());
  }
  return r;
}

CUdeviceptr NcclCommunicator::staging(Rank& r, uint64_t bytes) {
  if (r.staging.bytes() < bytes) {
    if (r.stream)  // collectives enqueued before may still read or write it
      r.retired.push_back(std::move(r.staging));
    r.staging = DeviceBuffer();  // return the old one to the arena first
    r.staging = DeviceBuffer(r.device, (bytes + kStagingGrain - 1) / kStagingGrain * kStagingGrain);
  }
  return r.staging.ptr();
}

template <class F>
void NcclCommunicator::run(Rank& r, const std::string& what, F&& enqueue) {
  std::string failed;
  try {
    Device::Scope scope(*r.device);
    enqueue();
    if (!r.stream) wait(r, what);  // enqueued: the caller waits, with wait_event
    return;
  } catch (const UserError& e) {
    failed = e.what();
  } catch (const std::exception& e) {
    failed = str("nccl: ", what, " on ", where(r), " failed: ", e.what());
  }
  abort(failed);  // the first reason stays
  abort_comm(r);
  throw UserError(ErrorKind::Runtime, failed);
}

void NcclCommunicator::wait(Rank& r, const std::string& what) {
  const DriverApi& d = r.device->api();
  check(d, d.cuEventRecord(r.done, r.on()), "cuEventRecord", str(what, " on ", where(r)));
  poll(r, r.done, what);
}

NcclCommunicator::Enqueued::Enqueued(NcclCommunicator& c, int rank, CUstream stream)
    : r_(c.enter(rank)) {
  FJ_CHECK(r_.stream == nullptr, "nccl: ", c.where(r_), " is already enqueuing on a stream");
  r_.stream = stream;
}

NcclCommunicator::Enqueued::~Enqueued() { r_.stream = nullptr; }

void NcclCommunicator::wait_event(int rank, CUevent event, const std::string& what) {
  int l = rank - first_;
  FJ_CHECK(l >= 0 && l < local_ranks(), "nccl: rank ", rank, " is not a GPU of this process");
  Rank& r = *ranks_[static_cast<size_t>(l)];
  std::string failed;
  try {
    Device::Scope scope(*r.device);
    poll(r, event, what);
    r.retired.clear();
    return;
  } catch (const UserError& e) {
    failed = e.what();
  } catch (const std::exception& e) {
    failed = str("nccl: ", what, " on ", where(r), " failed: ", e.what());
  }
  abort(failed);  // the first reason stays
  abort_comm(r);
  throw UserError(ErrorKind::Runtime, failed);
}

void NcclCommunicator::poll(Rank& r, CUevent event, const std::string& what) {
  const DriverApi& d = r.device->api();
  auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  for (int spin = 0;; ++spin) {
    CUresult q = d.cuEventQuery(event);
    if (q == kCudaSuccess) return;
    if (q != kCudaErrorNotReady)
      check(d, q, "cuEventQuery", str("waiting for ", what, " on ", where(r)));
    if (!r.comm) throw_user(ErrorKind::Runtime, "a collective was aborted: ", abort_reason());
    ncclResult_t async = kNcclSuccess;
    nccl_check(api_, api_.ncclCommGetAsyncError(r.comm, &async), "ncclCommGetAsyncError",
               str("waiting for ", what, " on ", where(r)));
    if (async != kNcclSuccess && async != kNcclInProgress)
      throw_user(ErrorKind::Runtime, "nccl: ", what, " on ", where(r), " failed: NCCL reports ",
                 nccl_error_text(api_, async));
    if (aborted_.load(std::memory_order_acquire))
      throw_user(ErrorKind::Runtime, "a collective was aborted: ", abort_reason());
    if (timeout_.count() > 0 && std::chrono::steady_clock::now() - start >= timeout_)
      throw_user(ErrorKind::Runtime, "nccl: ", what, " on ", where(r), " did not complete within ",
                 timeout_.count() / 1e9, " s (did a rank stall, die or skip the call?)");
    // A small collective takes some microseconds: yield at first, then back
    // off to sleeps of at most a millisecond for long ones.
    if (spin < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
}

void NcclCommunicator::all_reduce(int rank, const void* in, void* out, int64_t count,
                                  ir::DType dtype) {
  FJ_USER_CHECK(count >= 0, ErrorKind::Value, "nccl: all_reduce of ", count, " elements");
  Rank& r = enter(rank);
  if (count == 0) return;
  const NcclReduction red = nccl_reduction(dtype);
  const uint64_t bytes = static_cast<uint64_t>(count) * ir::dtype_bytes(dtype);
  const std::string what = str("all_reduce of ", count, " x ", ir::dtype_name(dtype));
  run(r, what, [&] {
    CUdeviceptr src = dptr(in), dst = dptr(out);
    // NCCL works in place when in == out, not for buffers that partly overlap.
    if (src != dst && overlap(src, bytes, dst, bytes)) {
      CUdeviceptr s = staging(r, bytes);
      check(r.device->api(), r.device->api().cuMemcpyDtoDAsync(s, src, bytes, r.on()),
            "cuMemcpyDtoDAsync");
      src = s;
    }
    nccl_check(api_,
               api_.ncclAllReduce(vptr(src), vptr(dst), static_cast<size_t>(count), red.type,
                                  red.op, r.comm, r.on()),
               "ncclAllReduce", str(what, " on ", where(r)));
  });
}

void NcclCommunicator::all_gather(int rank, const void* in, void* out, int64_t outer,
                                  int64_t inner_bytes) {
  FJ_USER_CHECK(outer >= 0 && inner_bytes >= 0, ErrorKind::Value, "nccl: all_gather of ", outer,
                " x ", inner_bytes, " bytes");
  Rank& r = enter(rank);
  if (outer == 0 || inner_bytes == 0) return;
  const uint64_t n = static_cast<uint64_t>(world_), inner = static_cast<uint64_t>(inner_bytes);
  const uint64_t block = static_cast<uint64_t>(outer) * inner;  // what each rank contributes
  const uint64_t total = n * block;
  const std::string what = str("all_gather of ", outer, " x ", inner_bytes, " bytes");
  run(r, what, [&] {
    const Device& dev = *r.device;
    CUdeviceptr src = dptr(in), dst = dptr(out);
    auto gather = [&](CUdeviceptr from, CUdeviceptr to) {
      nccl_check(api_, api_.ncclAllGather(vptr(from), vptr(to), block, kNcclInt8, r.comm, r.on()),
                 "ncclAllGather", str(what, " on ", where(r)));
    };
    if (outer == 1 || n == 1) {
      // [outer][ranks][inner] is NCCL's rank-major layout already. In place
      // means in is this rank's block of out; another overlap is staged.
      CUdeviceptr own = dst + static_cast<uint64_t>(r.index) * block;
      if (src != own && overlap(src, block, dst, total)) {
        CUdeviceptr s = staging(r, block);
        check(dev.api(), dev.api().cuMemcpyDtoDAsync(s, src, block, r.on()), "cuMemcpyDtoDAsync");
        src = s;
      }
      gather(src, dst);
      return;
    }
    // Gather into staging as [ranks][outer][inner], then move rank q's rows
    // to column q of out. `in` is read before out is written, so they may overlap.
    CUdeviceptr s = staging(r, total);
    gather(src, s);
    for (uint64_t q = 0; q < n; ++q)
      strided_copy(dev, dst + q * inner, n * inner, s + q * block, inner, inner,
                   static_cast<size_t>(outer), r.on());
  });
}

void NcclCommunicator::reduce_scatter(int rank, const void* in, void* out, int64_t outer,
                                      int64_t inner, ir::DType dtype) {
  FJ_USER_CHECK(outer >= 0 && inner >= 0, ErrorKind::Value, "nccl: reduce_scatter of ", outer,
                " x ", inner, " elements");
  Rank& r = enter(rank);
  if (outer == 0 || inner == 0) return;
  const NcclReduction red = nccl_reduction(dtype);
  const uint64_t n = static_cast<uint64_t>(world_);
  const uint64_t row = static_cast<uint64_t>(inner) * ir::dtype_bytes(dtype);
  const uint64_t block =
      static_cast<uint64_t>(outer) * static_cast<uint64_t>(inner);  // elements out
  const uint64_t block_bytes = static_cast<uint64_t>(outer) * row;
  const uint64_t total_bytes = n * block_bytes;
  const std::string what =
      str("reduce_scatter of ", outer, " x ", inner, " x ", ir::dtype_name(dtype));
  run(r, what, [&] {
    const Device& dev = *r.device;
    CUdeviceptr src = dptr(in), dst = dptr(out);
    auto scatter = [&](CUdeviceptr from, CUdeviceptr to) {
      nccl_check(
          api_,
          api_.ncclReduceScatter(vptr(from), vptr(to), block, red.type, red.op, r.comm, r.on()),
          "ncclReduceScatter", str(what, " on ", where(r)));
    };
    if (outer == 1 || n == 1) {
      // In place means out is this rank's block of in; another overlap
      // (out == in, say) reduces into staging and copies from there.
      CUdeviceptr own = src + static_cast<uint64_t>(r.index) * block_bytes;
      if (dst != own && overlap(src, total_bytes, dst, block_bytes)) {
        CUdeviceptr s = staging(r, block_bytes);
        scatter(src, s);
        check(dev.api(), dev.api().cuMemcpyDtoDAsync(dst, s, block_bytes, r.on()),
              "cuMemcpyDtoDAsync");
      } else {
        scatter(src, dst);
      }
      return;
    }
    // Move column q of in ([outer][ranks][inner]) to block q of staging,
    // then reduce-scatter the blocks. Out is written after in is read.
    CUdeviceptr s = staging(r, total_bytes);
    for (uint64_t q = 0; q < n; ++q)
      strided_copy(dev, s + q * block_bytes, row, src + q * row, n * row, row,
                   static_cast<size_t>(outer), r.on());
    scatter(s, dst);
  });
}

void NcclCommunicator::all_reduce_many(int rank, const std::vector<Buffer>& buffers,
                                       ir::DType dtype) {
  int64_t total = 0;
  for (const Buffer& b : buffers) {
    FJ_USER_CHECK(b.count >= 0, ErrorKind::Value, "nccl: all_reduce of ", b.count, " elements");
    total += b.count;
  }
  Rank& r = enter(rank);
  if (total == 0) return;
  const NcclReduction red = nccl_reduction(dtype);
  const uint64_t es = static_cast<uint64_t>(ir::dtype_bytes(dtype));
  // Inputs that partly overlap their outputs are copied to staging first,
  // each at its own offset, so that the group stays one launch.
  std::vector<uint64_t> at(buffers.size(), UINT64_MAX);
  uint64_t staged = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    uint64_t bytes = static_cast<uint64_t>(b.count) * es;
    if (b.count > 0 && dptr(b.in) != dptr(b.out) &&
        overlap(dptr(b.in), bytes, dptr(b.out), bytes)) {
      at[i] = staged;
      staged += (bytes + 255) / 256 * 256;
    }
  }
  const std::string what =
      str("all_reduce_many of ", count_text(buffers.size(), "buffer", "buffers"), ", ", total,
          " x ", ir::dtype_name(dtype));
  run(r, what, [&] {
    const Device& dev = *r.device;
    CUdeviceptr s = staged ? staging(r, staged) : 0;
    for (size_t i = 0; i < buffers.size(); ++i)
      if (at[i] != UINT64_MAX)
        check(dev.api(),
              dev.api().cuMemcpyDtoDAsync(s + at[i], dptr(buffers[i].in),
                                          static_cast<uint64_t>(buffers[i].count) * es, r.on()),
              "cuMemcpyDtoDAsync");
    const std::string context = str(what, " on ", where(r));
    nccl_check(api_, api_.ncclGroupStart(), "ncclGroupStart", context);
    // A group that was started must be ended, also when a call in it failed.
    ncclResult_t failed = kNcclSuccess;
    for (size_t i = 0; i < buffers.size() && failed == kNcclSuccess; ++i) {
      const Buffer& b = buffers[i];
      if (b.count == 0) continue;
      CUdeviceptr src = at[i] != UINT64_MAX ? s + at[i] : dptr(b.in);
      failed = api_.ncclAllReduce(vptr(src), b.out, static_cast<size_t>(b.count), red.type, red.op,
                                  r.comm, r.on());
    }
    ncclResult_t ended = api_.ncclGroupEnd();
    nccl_check(api_, failed, "ncclAllReduce", context);
    nccl_check(api_, ended, "ncclGroupEnd", context);
  });
}

void NcclCommunicator::barrier(int rank) {
  Rank& r = enter(rank);
  run(r, "barrier", [&] {
    // The value is of no interest: the all_reduce completes on a rank only
    // once every rank has entered it.
    CUdeviceptr s = staging(r, 4);
    nccl_check(api_, api_.ncclAllReduce(vptr(s), vptr(s), 1, kNcclInt32, kNcclSum, r.comm, r.on()),
               "ncclAllReduce", str("barrier on ", where(r)));
  });
}

// ---------------------------------------------------------------- factories

std::shared_ptr<NcclCommunicator> make_nccl_communicator(const std::vector<int>& ordinals,
                                                         const NcclOptions& options,
                                                         const DriverApi* driver) {
  FJ_USER_CHECK(!ordinals.empty(), ErrorKind::Value, "nccl: a communicator needs at least one GPU");
  // The driver first: without one there is no GPU, whether or not NCCL is installed.
  const DriverApi& d = driver ? *driver : cuda::driver();
  NcclOptions o = options;
  if (!o.nccl) o.nccl = &nccl();
  std::vector<std::shared_ptr<Device>> devices;
  for (int ordinal : ordinals) devices.push_back(Device::open(ordinal, &d));
  return NcclCommunicator::create(std::move(devices), o);
}

ncclUniqueId nccl_unique_id(const NcclApi* api) {
  const NcclApi& a = api ? *api : nccl();
  ncclUniqueId id{};
  nccl_check(a, a.ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

ncclUniqueId share_nccl_unique_id(RendezvousStore& store, const std::string& key, bool create,
                                  const NcclApi* api) {
  if (create) {
    ncclUniqueId id = nccl_unique_id(api);
    store.set(key, std::vector<char>(id.internal, id.internal + kNcclUniqueIdBytes));
    return id;
  }
  std::vector<char> value = store.get(key);
  FJ_USER_CHECK(value.size() == static_cast<size_t>(kNcclUniqueIdBytes), ErrorKind::Runtime,
                "nccl: the value of ", key, " at ", store.where(), " has ", value.size(),
                " bytes, not the ", kNcclUniqueIdBytes, " of an NCCL unique id");
  ncclUniqueId id;
  std::copy(value.begin(), value.end(), id.internal);
  return id;
}

}  // namespace flowjit::runtime::cuda
