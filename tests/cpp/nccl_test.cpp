// NCCL support (runtime/cuda/nccl.h). Without a GPU: loading the library
// (missing, overridden, wrong), the error texts, the dtype mapping, the ABI
// check having been compiled against nccl.h, the missing-driver path, and
// the NcclCommunicator's logic against a fake driver and a fake NCCL that
// run on host memory: every collective, layout and aliasing case compared
// with make_thread_communicator, the multi-process set-up through a store,
// and abort, timeout and error propagation. With a GPU and NCCL (skipped
// visibly otherwise; FLOWJIT_REQUIRE_GPU=1 turns a missing GPU into a
// failure, FLOWJIT_REQUIRE_NCCL=1 a missing NCCL): the same cases on real
// device buffers with one rank, and two ranks where two GPUs are present.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ir/error.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/tcp_store.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/driver_api.h"
#include "runtime/cuda/nccl.h"
#include "tests/cpp/fake_nccl.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
namespace rc = flowjit::runtime::cuda;
namespace fs = std::filesystem;
using ir::DType;

namespace {

const DType kDTypes[] = {DType::Bool,  DType::Int8,    DType::UInt8,  DType::Int32,
                         DType::Int64, DType::Float32, DType::Float64};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Runs fn, expects a UserError of `kind` whose message has every part.
void expect_user_error(const std::function<void()>& fn, ErrorKind kind,
                       const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one with: " << (parts.empty() ? "" : parts[0]);
  } catch (const UserError& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    for (const std::string& p : parts)
      EXPECT_TRUE(contains(e.what(), p)) << e.what() << "\nlacks: " << p;
  }
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

using TempDir = flowjit::testing::TempDir;

// Runs body(rank) on a thread per rank, as the communicators want; returns
// each rank's error message ("" where it succeeded).
std::vector<std::string> on_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int q = 0; q < n; ++q)
    threads.emplace_back([&, q] {
      try {
        body(q);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(q)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors, const std::string& what) {
  for (size_t q = 0; q < errors.size(); ++q) EXPECT_EQ(errors[q], "") << what << ": rank " << q;
}

// ---------------------------------------------------------------- a fake driver

// Device memory is host memory; every stream operation happens at once. The
// fake checks that operations run with their stream's device current and on
// memory it allocated, and that copies do not overlap.
namespace fake {

using rc::CUresult;

struct Gpu {
  std::mutex mu;
  int devices = 4;
  std::map<uintptr_t, size_t> blocks;
  std::map<uintptr_t, int> events;  // event -> device
  uintptr_t next_event = 1;
  int retained = 0;
  std::atomic<int> copies_2d{0}, copies_1d{0};
  // Collectives enqueue nothing that ever completes: their events stay not
  // ready until the device's NCCL communicator is aborted.
  std::atomic<bool> hang{false};
  std::set<int> aborted_devices;
};
Gpu& gpu() {
  static Gpu g;
  return g;
}

thread_local std::vector<int> t_context;  // device ordinals pushed on this thread

int current_device() { return t_context.empty() ? -1 : t_context.back(); }
rc::CUstream stream_of(int device) {
  return reinterpret_cast<rc::CUstream>(uintptr_t{0x1000} + device);
}
int device_of(rc::CUstream s) { return static_cast<int>(reinterpret_cast<uintptr_t>(s) - 0x1000); }

bool is_device_memory(uintptr_t p, size_t n) {
  std::lock_guard<std::mutex> lock(gpu().mu);
  auto it = gpu().blocks.upper_bound(p);
  if (it == gpu().blocks.begin()) return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second;
}

// An operation on `stream` is valid with its device's context current.
bool on_own_device(rc::CUstream s) { return current_device() == device_of(s); }

CUresult ok() { return rc::kCudaSuccess; }
CUresult bad() { return rc::kCudaErrorInvalidValue; }
CUresult init(unsigned) { return ok(); }
CUresult error_string(CUresult e, const char** s) {
  *s = e == rc::kCudaErrorInvalidValue ? "invalid argument" : "unknown error";
  return ok();
}
CUresult error_name(CUresult e, const char** s) {
  *s = e == rc::kCudaErrorInvalidValue ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_UNKNOWN";
  return ok();
}
CUresult driver_version(int* v) {
  *v = 13000;
  return ok();
}
CUresult device_count(int* n) {
  *n = gpu().devices;
  return ok();
}
CUresult device_get(rc::CUdevice* d, int ordinal) {
  *d = ordinal;
  return ordinal >= 0 && ordinal < gpu().devices ? ok() : bad();
}
CUresult device_name(char* name, int len, rc::CUdevice d) {
  std::snprintf(name, static_cast<size_t>(len), "Fake GPU %d", d);
  return ok();
}
CUresult device_attribute(int* v, int attr, rc::CUdevice) {
  *v = attr == rc::kAttrComputeCapabilityMajor ? 9 : attr == rc::kAttrMultiprocessorCount ? 4 : 0;
  return ok();
}
CUresult total_mem(size_t* b, rc::CUdevice) {
  *b = size_t{1} << 30;
  return ok();
}
CUresult retain(rc::CUcontext* c, rc::CUdevice d) {
  std::lock_guard<std::mutex> lock(gpu().mu);
  ++gpu().retained;
  *c = reinterpret_cast<rc::CUcontext>(static_cast<uintptr_t>(d) + 1);
  return ok();
}
CUresult release(rc::CUdevice) {
  std::lock_guard<std::mutex> lock(gpu().mu);
  --gpu().retained;
  return ok();
}
CUresult push(rc::CUcontext c) {
  t_context.push_back(static_cast<int>(reinterpret_cast<uintptr_t>(c) - 1));
  return ok();
}
CUresult pop(rc::CUcontext* c) {
  if (t_context.empty()) return bad();
  t_context.pop_back();
  if (c) *c = nullptr;
  return ok();
}
CUresult ctx_sync() { return ok(); }
CUresult stream_create(rc::CUstream* s, unsigned) {
  if (current_device() < 0) return bad();
  *s = stream_of(current_device());
  return ok();
}
CUresult stream_destroy(rc::CUstream s) { return on_own_device(s) ? ok() : bad(); }
CUresult stream_sync(rc::CUstream s) { return on_own_device(s) ? ok() : bad(); }
CUresult mem_alloc(rc::CUdeviceptr* p, size_t bytes) {
  void* m = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  std::memset(m, 0xab, bytes);  // device memory starts as garbage, not zeros
  std::lock_guard<std::mutex> lock(gpu().mu);
  gpu().blocks[reinterpret_cast<uintptr_t>(m)] = bytes;
  *p = reinterpret_cast<rc::CUdeviceptr>(m);
  return ok();
}
CUresult mem_free(rc::CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(gpu().mu);
  if (!gpu().blocks.erase(p)) return bad();
  std::free(reinterpret_cast<void*>(p));
  return ok();
}
CUresult host_alloc(void** p, size_t bytes) {
  *p = std::malloc(bytes);
  return ok();
}
CUresult host_free(void* p) {
  std::free(p);
  return ok();
}
CUresult h2d(rc::CUdeviceptr d, const void* s, size_t n, rc::CUstream st) {
  if (!on_own_device(st) || !is_device_memory(d, n)) return bad();
  std::memcpy(reinterpret_cast<void*>(d), s, n);
  return ok();
}
CUresult d2h(void* d, rc::CUdeviceptr s, size_t n, rc::CUstream st) {
  if (!on_own_device(st) || !is_device_memory(s, n)) return bad();
  std::memcpy(d, reinterpret_cast<void*>(s), n);
  return ok();
}
CUresult d2d(rc::CUdeviceptr d, rc::CUdeviceptr s, size_t n, rc::CUstream st) {
  if (!on_own_device(st) || !is_device_memory(d, n) || !is_device_memory(s, n)) return bad();
  if (d < s + n && s < d + n) return bad();  // overlapping copies are undefined
  std::memcpy(reinterpret_cast<void*>(d), reinterpret_cast<void*>(s), n);
  ++gpu().copies_1d;
  return ok();
}
CUresult copy_2d(const rc::CUDA_MEMCPY2D* c, rc::CUstream st) {
  if (!on_own_device(st) || c->srcMemoryType != rc::kMemoryTypeDevice ||
      c->dstMemoryType != rc::kMemoryTypeDevice || c->srcXInBytes || c->srcY || c->dstXInBytes ||
      c->dstY || c->WidthInBytes > c->srcPitch || c->WidthInBytes > c->dstPitch)
    return bad();
  for (size_t i = 0; i < c->Height; ++i) {
    uintptr_t d = c->dstDevice + i * c->dstPitch, s = c->srcDevice + i * c->srcPitch;
    if (!is_device_memory(d, c->WidthInBytes) || !is_device_memory(s, c->WidthInBytes))
      return bad();
    std::memcpy(reinterpret_cast<void*>(d), reinterpret_cast<void*>(s), c->WidthInBytes);
  }
  ++gpu().copies_2d;
  return ok();
}
CUresult event_create(rc::CUevent* e, unsigned) {
  std::lock_guard<std::mutex> lock(gpu().mu);
  uintptr_t id = gpu().next_event++;
  gpu().events[id] = current_device();
  *e = reinterpret_cast<rc::CUevent>(id);
  return ok();
}
CUresult event_destroy(rc::CUevent e) {
  std::lock_guard<std::mutex> lock(gpu().mu);
  return gpu().events.erase(reinterpret_cast<uintptr_t>(e)) ? ok() : bad();
}
CUresult event_record(rc::CUevent, rc::CUstream s) { return on_own_device(s) ? ok() : bad(); }
CUresult event_query(rc::CUevent e) {
  std::lock_guard<std::mutex> lock(gpu().mu);
  int device = gpu().events.at(reinterpret_cast<uintptr_t>(e));
  if (gpu().hang && !gpu().aborted_devices.count(device)) return rc::kCudaErrorNotReady;
  return ok();
}
CUresult event_sync(rc::CUevent) { return ok(); }

rc::DriverApi make_driver() {
  rc::DriverApi d;
  d.cuInit = init;
  d.cuGetErrorString = error_string;
  d.cuGetErrorName = error_name;
  d.cuDriverGetVersion = driver_version;
  d.cuDeviceGetCount = device_count;
  d.cuDeviceGet = device_get;
  d.cuDeviceGetName = device_name;
  d.cuDeviceGetAttribute = device_attribute;
  d.cuDeviceTotalMem = total_mem;
  d.cuDevicePrimaryCtxRetain = retain;
  d.cuDevicePrimaryCtxRelease = release;
  d.cuCtxPushCurrent = push;
  d.cuCtxPopCurrent = pop;
  d.cuCtxSynchronize = ctx_sync;
  d.cuStreamCreate = stream_create;
  d.cuStreamDestroy = stream_destroy;
  d.cuStreamSynchronize = stream_sync;
  d.cuMemAlloc = mem_alloc;
  d.cuMemFree = mem_free;
  d.cuMemAllocHost = host_alloc;
  d.cuMemFreeHost = host_free;
  d.cuMemcpyHtoDAsync = h2d;
  d.cuMemcpyDtoHAsync = d2h;
  d.cuMemcpyDtoDAsync = d2d;
  d.cuMemcpy2DAsync = copy_2d;
  d.cuEventCreate = event_create;
  d.cuEventDestroy = event_destroy;
  d.cuEventRecord = event_record;
  d.cuEventQuery = event_query;
  d.cuEventSynchronize = event_sync;
  d.library = "fake";
  return d;
}
const rc::DriverApi& driver() {
  static const rc::DriverApi d = make_driver();
  return d;
}
// The same driver without cuMemcpy2DAsync (strided copies go row by row).
const rc::DriverApi& driver_without_2d() {
  static const rc::DriverApi d = [] {
    rc::DriverApi a = make_driver();
    a.cuMemcpy2DAsync = nullptr;
    return a;
  }();
  return d;
}

// ---------------------------------------------------------------- a fake NCCL

// tests/cpp/fake_nccl.h, beside this file's fake driver.
using namespace flowjit::testing::fake_nccl;
void use_this_driver() {
  Hooks& h = hooks();
  h.device_of_stream = device_of;
  h.current_device = current_device;
  h.is_device_memory = is_device_memory;
  h.hang = [] { return gpu().hang.load(); };
  h.aborted = [](int device) {
    std::lock_guard<std::mutex> lock(gpu().mu);
    gpu().aborted_devices.insert(device);
  };
}

// A fresh fake (the tests of one binary run one after another).
void reset() {
  use_this_driver();
  {
    std::lock_guard<std::mutex> lock(gpu().mu);
    gpu().hang = false;
    gpu().aborted_devices.clear();
    gpu().copies_2d = 0;
    gpu().copies_1d = 0;
  }
  std::lock_guard<std::mutex> lock(nccl().mu);
  nccl().calls.clear();
  nccl().fail_rank = -1;
  nccl().async_rank = -1;
  nccl().async_error = rc::kNcclSuccess;
}

std::vector<std::shared_ptr<rc::Device>> devices(int n, const rc::DriverApi& d = driver()) {
  std::vector<std::shared_ptr<rc::Device>> out;
  for (int i = 0; i < n; ++i) out.push_back(rc::Device::open(i, &d));
  return out;
}

rc::NcclOptions options(double timeout = 0) {
  use_this_driver();
  rc::NcclOptions o;
  o.nccl = &api();
  o.timeout_seconds = timeout;
  return o;
}

}  // namespace fake

// ---------------------------------------------------------------- device buffers

void upload(rc::Device& d, rc::CUdeviceptr dst, const std::vector<char>& host) {
  if (host.empty()) return;
  rc::Device::Scope s(d);
  FLOWJIT_CU(d.api(), cuMemcpyHtoDAsync, dst, host.data(), host.size(), d.stream());
  FLOWJIT_CU(d.api(), cuStreamSynchronize, d.stream());
}

std::vector<char> download(rc::Device& d, rc::CUdeviceptr src, size_t bytes) {
  std::vector<char> host(bytes);
  if (bytes == 0) return host;
  rc::Device::Scope s(d);
  FLOWJIT_CU(d.api(), cuMemcpyDtoHAsync, host.data(), src, bytes, d.stream());
  FLOWJIT_CU(d.api(), cuStreamSynchronize, d.stream());
  return host;
}

// ---------------------------------------------------------------- the cases

// Values whose sums are exact in any order (small integers for floats), so
// that any NCCL agrees with the thread communicator bit for bit; int8 and
// uint8 overflow, so that wrap-around is compared too.
std::vector<char> values(DType t, int64_t count, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<char> out(static_cast<size_t>(count * ir::dtype_bytes(t)));
  auto fill = [&](auto* p, int lo, int hi) {
    std::uniform_int_distribution<int> dist(lo, hi);
    for (int64_t i = 0; i < count; ++i)
      p[i] = static_cast<std::remove_pointer_t<decltype(p)>>(dist(g));
  };
  switch (t) {
    case DType::Bool:
      fill(reinterpret_cast<uint8_t*>(out.data()), 0, 1);
      break;
    case DType::Int8:
      fill(reinterpret_cast<int8_t*>(out.data()), -100, 100);
      break;
    case DType::UInt8:
      fill(reinterpret_cast<uint8_t*>(out.data()), 0, 255);
      break;
    case DType::Int32:
      fill(reinterpret_cast<int32_t*>(out.data()), -1000000, 1000000);
      break;
    case DType::Int64:
      fill(reinterpret_cast<int64_t*>(out.data()), -1000000, 1000000);
      break;
    case DType::Float32:
      fill(reinterpret_cast<float*>(out.data()), -8, 8);
      break;
    case DType::Float64:
      fill(reinterpret_cast<double*>(out.data()), -8, 8);
      break;
  }
  return out;
}

enum class Op { AllReduce, AllGather, ReduceScatter };
// Where out lies relative to in, in the rank's device memory.
enum class Alias {
  Separate,
  Same,         // out == in
  NcclInPlace,  // all_gather: in is the rank's block of out; reduce_scatter: out is its block of in
  Shifted,      // they overlap, in neither of those ways
};

struct Case {
  Op op;
  int64_t outer, inner;  // all_reduce: inner elements
  Alias alias;
};

const Case kCases[] = {
    {Op::AllReduce, 1, 37, Alias::Separate},    {Op::AllReduce, 1, 37, Alias::Same},
    {Op::AllReduce, 1, 37, Alias::Shifted},     {Op::AllGather, 1, 5, Alias::Separate},
    {Op::AllGather, 1, 5, Alias::NcclInPlace},  {Op::AllGather, 1, 5, Alias::Shifted},
    {Op::AllGather, 3, 2, Alias::Separate},     {Op::AllGather, 4, 3, Alias::Shifted},
    {Op::ReduceScatter, 1, 4, Alias::Separate}, {Op::ReduceScatter, 1, 4, Alias::NcclInPlace},
    {Op::ReduceScatter, 1, 4, Alias::Same},     {Op::ReduceScatter, 3, 2, Alias::Separate},
    {Op::ReduceScatter, 3, 5, Alias::Same},
};

std::string case_name(const Case& c, DType t, int n) {
  const char* op = c.op == Op::AllReduce   ? "all_reduce"
                   : c.op == Op::AllGather ? "all_gather"
                                           : "reduce_scatter";
  const char* alias[] = {"separate", "same", "nccl in-place", "shifted"};
  return str(op, " ", c.outer, "x", c.inner, " ", ir::dtype_name(t), " ",
             alias[static_cast<int>(c.alias)], " on ", n, n == 1 ? " rank" : " ranks");
}

// Runs `c` once on make_thread_communicator with host buffers (the
// reference) and once on the NCCL communicators with device buffers laid out
// as c.alias says, and compares every rank's output.
void check_case(const Case& c, DType t, int n,
                const std::function<runtime::Communicator&(int)>& comm_of,
                const std::function<rc::Device&(int)>& device_of, uint32_t seed) {
  const std::string name = case_name(c, t, n);
  const size_t es = static_cast<size_t>(ir::dtype_bytes(t));
  const int64_t in_count = c.op == Op::ReduceScatter ? c.outer * n * c.inner : c.outer * c.inner;
  const int64_t out_count = c.op == Op::AllGather       ? c.outer * n * c.inner
                            : c.op == Op::ReduceScatter ? c.outer * c.inner
                                                        : c.inner;
  const size_t in_bytes = static_cast<size_t>(in_count) * es,
               out_bytes = static_cast<size_t>(out_count) * es;
  std::vector<std::vector<char>> in(static_cast<size_t>(n)), expected(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    in[static_cast<size_t>(q)] = values(t, in_count, seed * 31 + static_cast<uint32_t>(q));
    expected[static_cast<size_t>(q)].assign(out_bytes, 0);
  }
  auto call = [&](runtime::Communicator& comm, int q, const void* i, void* o) {
    switch (c.op) {
      case Op::AllReduce:
        return comm.all_reduce(q, i, o, c.inner, t);
      case Op::AllGather:
        return comm.all_gather(q, i, o, c.outer, c.inner * static_cast<int64_t>(es));
      case Op::ReduceScatter:
        return comm.reduce_scatter(q, i, o, c.outer, c.inner, t);
    }
  };
  auto reference = runtime::make_thread_communicator(n);
  expect_no_errors(on_ranks(n,
                            [&](int q) {
                              call(*reference, q, in[static_cast<size_t>(q)].data(),
                                   expected[static_cast<size_t>(q)].data());
                            }),
                   name + " (reference)");

  std::vector<std::string> mismatch(static_cast<size_t>(n));
  auto errors = on_ranks(n, [&](int q) {
    size_t in_off = 0, out_off = 0;
    switch (c.alias) {
      case Alias::Separate:
        out_off = (in_bytes + 255) / 256 * 256;
        break;
      case Alias::Same:
        break;
      case Alias::NcclInPlace:
        if (c.op == Op::AllGather) in_off = static_cast<size_t>(q) * in_bytes;
        if (c.op == Op::ReduceScatter) out_off = static_cast<size_t>(q) * out_bytes;
        break;
      case Alias::Shifted:
        if (c.op == Op::AllGather)
          in_off = es;
        else
          out_off = es;
        break;
    }
    rc::Device& dev = device_of(q);
    size_t space = std::max(in_off + in_bytes, out_off + out_bytes);
    rc::DeviceBuffer work(std::shared_ptr<rc::Device>(&dev, [](rc::Device*) {}), space);
    upload(dev, work.ptr(), std::vector<char>(space, 0x5a));
    upload(dev, work.ptr() + in_off, in[static_cast<size_t>(q)]);
    call(comm_of(q), q, reinterpret_cast<const void*>(work.ptr() + in_off),
         reinterpret_cast<void*>(work.ptr() + out_off));
    if (download(dev, work.ptr() + out_off, out_bytes) != expected[static_cast<size_t>(q)])
      mismatch[static_cast<size_t>(q)] = "differs from the thread communicator";
  });
  expect_no_errors(errors, name);
  expect_no_errors(mismatch, name);
}

// all_reduce_many over buffers of several sizes, one empty, one in place,
// one partly overlapping its output; then a barrier.
void check_many(DType t, int n, const std::function<runtime::Communicator&(int)>& comm_of,
                const std::function<rc::Device&(int)>& device_of, uint32_t seed) {
  const std::string name = str("all_reduce_many ", ir::dtype_name(t), " on ", n, " ranks");
  const size_t es = static_cast<size_t>(ir::dtype_bytes(t));
  const std::vector<int64_t> counts = {5, 0, 11, 3};
  const std::vector<Alias> alias = {Alias::Separate, Alias::Separate, Alias::Same, Alias::Shifted};
  std::vector<std::vector<std::vector<char>>> in(static_cast<size_t>(n)),
      expected(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q)
    for (size_t b = 0; b < counts.size(); ++b) {
      in[static_cast<size_t>(q)].push_back(
          values(t, counts[b], seed + static_cast<uint32_t>(q * 7 + b)));
      expected[static_cast<size_t>(q)].emplace_back(static_cast<size_t>(counts[b]) * es);
    }
  auto reference = runtime::make_thread_communicator(n);
  expect_no_errors(on_ranks(n,
                            [&](int q) {
                              for (size_t b = 0; b < counts.size(); ++b)
                                reference->all_reduce(q, in[static_cast<size_t>(q)][b].data(),
                                                      expected[static_cast<size_t>(q)][b].data(),
                                                      counts[b], t);
                            }),
                   name + " (reference)");
  std::vector<std::string> mismatch(static_cast<size_t>(n));
  auto errors = on_ranks(n, [&](int q) {
    rc::Device& dev = device_of(q);
    auto shared = std::shared_ptr<rc::Device>(&dev, [](rc::Device*) {});
    std::vector<rc::DeviceBuffer> work;
    std::vector<runtime::Communicator::Buffer> buffers;
    for (size_t b = 0; b < counts.size(); ++b) {
      size_t bytes = static_cast<size_t>(counts[b]) * es;
      size_t out_off = alias[b] == Alias::Separate  ? (bytes + 255) / 256 * 256
                       : alias[b] == Alias::Shifted ? es
                                                    : 0;
      work.emplace_back(shared, out_off + bytes + 1);
      upload(dev, work.back().ptr(), in[static_cast<size_t>(q)][b]);
      buffers.push_back({reinterpret_cast<const void*>(work.back().ptr()),
                         reinterpret_cast<void*>(work.back().ptr() + out_off), counts[b]});
    }
    comm_of(q).all_reduce_many(q, buffers, t);
    for (size_t b = 0; b < counts.size(); ++b)
      if (download(dev, reinterpret_cast<rc::CUdeviceptr>(buffers[b].out),
                   static_cast<size_t>(counts[b]) * es) != expected[static_cast<size_t>(q)][b])
        mismatch[static_cast<size_t>(q)] += str("buffer ", b, " differs; ");
    comm_of(q).barrier(q);
  });
  expect_no_errors(errors, name);
  expect_no_errors(mismatch, name);
}

void check_everything(int n, const std::function<runtime::Communicator&(int)>& comm_of,
                      const std::function<rc::Device&(int)>& device_of) {
  uint32_t seed = 1;
  for (DType t : kDTypes) {
    for (const Case& c : kCases) check_case(c, t, n, comm_of, device_of, seed++);
    check_many(t, n, comm_of, device_of, seed++);
  }
}

// ---------------------------------------------------------------- library, errors, mapping

TEST(NcclLibrary, MissingLibraryIsAClearErrorNamingIt) {
  expect_user_error(
      [] { rc::load_nccl("/nonexistent/dir/libnccl.so.2"); }, ErrorKind::Runtime,
      {"no NCCL", "/nonexistent/dir/libnccl.so.2", "FLOWJIT_NCCL_LIBRARY", "No such file"});
}

TEST(NcclLibrary, EnvironmentOverrideIsTheOnlyOneTried) {
  ScopedEnv env("FLOWJIT_NCCL_LIBRARY", "/nonexistent/dir/libnccl.so.2");
  // Even where a real NCCL is installed: a wrong override is an error, not a fallback.
  expect_user_error([] { rc::find_nccl(); }, ErrorKind::Runtime,
                    {"no NCCL", "/nonexistent/dir/libnccl.so.2", "(from FLOWJIT_NCCL_LIBRARY)"});
}

TEST(NcclLibrary, LibraryWithoutNcclIsRejectedNamingWhatItLacks) {
  expect_user_error([] { rc::load_nccl("libm.so.6"); }, ErrorKind::Runtime,
                    {"the NCCL library libm.so.6 lacks ncclGetVersion, ncclGetUniqueId",
                     "ncclGroupEnd", "NCCL 2.4 or newer"});
}

TEST(NcclLibrary, CandidatesIncludeThePipPackageOfAnEnvironment) {
  TempDir dir;
  fs::path lib = fs::path(dir.path) / "lib/python3.99/site-packages/nvidia/nccl/lib/libnccl.so.2";
  fs::create_directories(lib.parent_path());
  std::ofstream(lib.string()) << "not a library";
  ScopedEnv env("VIRTUAL_ENV", dir.path);
  auto c = rc::nccl_library_candidates();
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], "libnccl.so.2") << "the dynamic loader's search comes first";
  EXPECT_NE(std::find(c.begin(), c.end(), lib.string()), c.end());
  // A file that is not a library is named with the loader's reason.
  ScopedEnv chosen("FLOWJIT_NCCL_LIBRARY", lib.string());
  expect_user_error([] { rc::find_nccl(); }, ErrorKind::Runtime, {"no NCCL", lib.string()});
}

TEST(NcclLibrary, VersionTexts) {
  EXPECT_EQ(rc::nccl_version_text(22809), "2.28.9");
  EXPECT_EQ(rc::nccl_version_text(21803), "2.18.3");
  EXPECT_EQ(rc::nccl_version_text(2708), "2.7.8");  // the encoding up to 2.8
}

TEST(NcclLibrary, FailedCallsNameTheCallTheCodeAndNcclsDetail) {
  const rc::NcclApi& api = fake::api();
  EXPECT_EQ(rc::nccl_error_text(api, rc::kNcclInvalidArgument),
            "ncclInvalidArgument: fake invalid argument");
  EXPECT_EQ(rc::nccl_error_text(rc::NcclApi{}, 42), "NCCL error 42");
  EXPECT_NO_THROW(rc::nccl_check(api, rc::kNcclSuccess, "ncclAllReduce"));
  fake::t_last_error = "AllReduce : comm argument is NULL";
  expect_user_error(
      [&] {
        rc::nccl_check(api, rc::kNcclInvalidArgument, "ncclAllReduce", "all_reduce on rank 0");
      },
      ErrorKind::Runtime,
      {"NCCL call ncclAllReduce failed: ncclInvalidArgument: fake invalid argument; "
       "NCCL's last error: AllReduce : comm argument is NULL (all_reduce on rank 0)"});
  fake::t_last_error.clear();
}

TEST(NcclLibrary, RealLibraryLoadsAndItsErrorsNameTheCall) {
  std::string why;
  if (!rc::nccl_available(&why)) {
    if (std::getenv("FLOWJIT_REQUIRE_NCCL")) FAIL() << "FLOWJIT_REQUIRE_NCCL is set: " << why;
    GTEST_SKIP() << "no NCCL here: " << why;
  }
  const rc::NcclApi& api = rc::nccl();
  std::printf("[nccl] NCCL %s from %s\n", rc::nccl_version_text(api.version).c_str(),
              api.library.c_str());
  EXPECT_GE(api.version, 2400);
  EXPECT_TRUE(contains(rc::nccl_error_text(api, rc::kNcclInvalidArgument),
                       "ncclInvalidArgument: invalid argument"));
  // A call NCCL rejects before touching any GPU: safe with or without one.
  expect_user_error(
      [&] {
        rc::nccl_check(api,
                       api.ncclAllReduce(nullptr, nullptr, 1, rc::kNcclFloat32, rc::kNcclSum,
                                         nullptr, nullptr),
                       "ncclAllReduce");
      },
      ErrorKind::Runtime, {"NCCL call ncclAllReduce failed: ncclInvalidArgument"});
}

TEST(NcclLibrary, RealLibraryWithoutDriverFailsNamingTheCall) {
  std::string why;
  if (!rc::nccl_available(&why)) GTEST_SKIP() << "no NCCL here: " << why;
  if (rc::driver_available(&why))
    GTEST_SKIP() << "a CUDA driver is installed here: " << rc::driver().library;
  const rc::NcclApi& api = rc::nccl();
  rc::ncclComm_t comm = nullptr;
  int device = 0;
  expect_user_error(
      [&] { rc::nccl_check(api, api.ncclCommInitAll(&comm, 1, &device), "ncclCommInitAll"); },
      ErrorKind::Runtime, {"NCCL call ncclCommInitAll failed: ncclUnhandledCudaError"});
}

TEST(NcclDriver, MissingDriverIsAClearError) {
  std::string why;
  if (rc::driver_available(&why))
    GTEST_SKIP() << "a CUDA driver is installed here: " << rc::driver().library;
  // The driver is checked first, so the message is the same whether or not NCCL is installed.
  expect_user_error([] { rc::make_nccl_communicator({0}, fake::options()); }, ErrorKind::Runtime,
                    {rc::kNoDriverMessage});
  expect_user_error([] { rc::make_nccl_communicator({0}); }, ErrorKind::Runtime,
                    {rc::kNoDriverMessage});
}

TEST(NcclDtypes, MappingTable) {
  struct Row {
    DType dtype;
    rc::ncclDataType_t type;
    rc::ncclRedOp_t op;
  };
  // NCCL's numbers, spelled out: ncclInt8 0, ncclUint8 1, ncclInt32 2,
  // ncclInt64 4, ncclFloat16 6, ncclFloat32 7, ncclFloat64 8, ncclBfloat16 9;
  // ncclSum 0, ncclMax 2.
  const Row rows[] = {{DType::Bool, 1, 2},    {DType::Int8, 0, 0},    {DType::UInt8, 1, 0},
                      {DType::Int32, 2, 0},   {DType::Int64, 4, 0},   {DType::Float32, 7, 0},
                      {DType::Float64, 8, 0}, {DType::Float16, 6, 0}, {DType::BFloat16, 9, 0}};
  static_assert(sizeof(rows) / sizeof(rows[0]) == ir::kNumDTypes, "a row for every dtype");
  for (const Row& r : rows) {
    rc::NcclReduction red = rc::nccl_reduction(r.dtype);
    EXPECT_EQ(red.type, r.type) << ir::dtype_name(r.dtype);
    EXPECT_EQ(red.op, r.op) << ir::dtype_name(r.dtype);
  }
  expect_user_error([] { rc::nccl_reduction(static_cast<DType>(200)); }, ErrorKind::NotImplemented,
                    {"no NCCL reduction"});
}

TEST(NcclAbi, CheckedAgainstTheInstalledHeader) {
  // The runtime is compiled with /usr/local/cuda/include on its path.
  if (!fs::exists("/usr/local/cuda/include/nccl.h"))
    GTEST_SKIP() << "no nccl.h in /usr/local/cuda/include: the declarations were not checked";
  EXPECT_GE(rc::nccl_abi_header_version(), 2400);
  std::printf("[nccl] declarations checked against nccl.h %s\n",
              rc::nccl_version_text(rc::nccl_abi_header_version()).c_str());
}

// ---------------------------------------------------------------- the communicator, faked

TEST(NcclFake, EveryCollectiveMatchesTheThreadCommunicator) {
  for (int n : {1, 2, 3}) {
    fake::reset();
    auto devs = fake::devices(n);
    auto comm = rc::NcclCommunicator::create(devs, fake::options());
    EXPECT_EQ(comm->size(), n);
    check_everything(
        n, [&](int) -> runtime::Communicator& { return *comm; },
        [&](int q) -> rc::Device& { return *devs[static_cast<size_t>(q)]; });
  }
}

TEST(NcclFake, LayoutsUseOneGatherAndStridedCopies) {
  fake::reset();
  auto devs = fake::devices(2);
  auto comm = rc::NcclCommunicator::create(devs, fake::options());
  EXPECT_EQ(comm->describe(), "nccl 2.28.9: 2 GPUs");
  std::vector<rc::DeviceBuffer> in, out;
  for (auto& d : devs) {
    in.emplace_back(d, 3 * 16);
    out.emplace_back(d, 3 * 2 * 16);
  }
  expect_no_errors(on_ranks(2,
                            [&](int q) {
                              comm->all_gather(q, reinterpret_cast<void*>(in[q].ptr()),
                                               reinterpret_cast<void*>(out[q].ptr()), 3, 16);
                            }),
                   "all_gather");
  std::lock_guard<std::mutex> lock(fake::nccl().mu);
  int gathers = 0;
  for (auto& c : fake::nccl().calls) gathers += c == "ncclAllGather 48";
  EXPECT_EQ(gathers, 2) << "one gather of the whole [outer][inner] block per rank";
  EXPECT_EQ(fake::gpu().copies_2d.load(), 4) << "a strided copy per source rank, on each rank";
}

TEST(NcclFake, StridedCopyWithAndWithout2DCopies) {
  for (const rc::DriverApi* d : {&fake::driver(), &fake::driver_without_2d()}) {
    fake::reset();
    auto dev = rc::Device::open(0, d);
    rc::DeviceBuffer src(dev, 4 * 10), dst(dev, 4 * 16);
    std::vector<char> host(40);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<char>(i);
    upload(*dev, src.ptr(), host);
    upload(*dev, dst.ptr(), std::vector<char>(64, 0));
    {
      rc::Device::Scope s(*dev);
      rc::strided_copy(*dev, dst.ptr() + 2, 16, src.ptr(), 10, 6, 4);  // 4 rows of 6 bytes
    }
    auto got = download(*dev, dst.ptr(), 64);
    for (size_t r = 0; r < 4; ++r)
      for (size_t b = 0; b < 16; ++b) {
        char want = b >= 2 && b < 8 ? static_cast<char>(r * 10 + b - 2) : 0;
        EXPECT_EQ(got[r * 16 + b], want) << "row " << r << " byte " << b;
      }
    EXPECT_EQ(fake::gpu().copies_2d.load(), d->cuMemcpy2DAsync ? 1 : 0);
  }
}

TEST(NcclFake, ProcessesJoinThroughAStoreAndTheirRanksAgree) {
  fake::reset();
  TempDir dir;
  auto devs = fake::devices(4);
  // Two "processes" of two GPUs each: ranks 0..1 and 2..3 of 4.
  std::vector<std::shared_ptr<rc::NcclCommunicator>> comms(2);
  expect_no_errors(
      on_ranks(2,
               [&](int p) {
                 runtime::FileStore store(dir.path, std::chrono::milliseconds(10000));
                 rc::ncclUniqueId id =
                     rc::share_nccl_unique_id(store, "nccl-id", p == 0, &fake::api());
                 comms[static_cast<size_t>(p)] = rc::NcclCommunicator::create(
                     id, 4, 2 * p,
                     {devs[static_cast<size_t>(2 * p)], devs[static_cast<size_t>(2 * p + 1)]},
                     fake::options());
               }),
      "joining");
  ASSERT_TRUE(comms[0] && comms[1]);
  EXPECT_EQ(comms[1]->describe(), "nccl 2.28.9: ranks 2..3 of 4");
  EXPECT_EQ(comms[1]->size(), 4);
  {
    std::lock_guard<std::mutex> lock(fake::nccl().mu);
    int ids = 0, grouped = 0;
    for (auto& c : fake::nccl().calls) {
      ids += c == "ncclGetUniqueId";
      grouped += contains(c, "ncclCommInitRank") && contains(c, "(grouped)");
    }
    EXPECT_EQ(ids, 1) << "one process makes the id, the other reads it";
    EXPECT_EQ(grouped, 4) << "a process's ranks join inside one group";
  }
  check_everything(
      4, [&](int q) -> runtime::Communicator& { return *comms[static_cast<size_t>(q / 2)]; },
      [&](int q) -> rc::Device& { return *devs[static_cast<size_t>(q)]; });
  // A rank of the other process is refused.
  expect_user_error([&] { comms[0]->barrier(2); }, ErrorKind::Value,
                    {"rank 2 is not a GPU of this process (its ranks are 0..1)"});
}

TEST(NcclFake, AbortWakesTheWaitingRanks) {
  fake::reset();
  auto devs = fake::devices(2);
  auto comm = rc::NcclCommunicator::create(devs, fake::options());
  std::vector<rc::DeviceBuffer> bufs;
  for (auto& d : devs) bufs.emplace_back(d, 64);
  const int aborted = fake::nccl().aborted;
  fake::gpu().hang = true;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    comm->abort("stopped by the test");
  });
  auto errors = on_ranks(2, [&](int q) {
    void* p = reinterpret_cast<void*>(bufs[static_cast<size_t>(q)].ptr());
    comm->all_reduce(q, p, p, 16, DType::Float32);
  });
  stopper.join();
  for (auto& e : errors) EXPECT_EQ(e, "a collective was aborted: stopped by the test");
  EXPECT_EQ(fake::nccl().aborted - aborted, 2) << "each rank aborted its NCCL communicator";
  // Later calls fail at once.
  fake::gpu().hang = false;
  expect_user_error([&] { comm->barrier(0); }, ErrorKind::Runtime,
                    {"a collective was aborted: stopped by the test"});
  int destroyed = fake::nccl().destroyed;
  comm.reset();
  EXPECT_EQ(fake::nccl().destroyed, destroyed) << "aborted communicators are not destroyed";
}

TEST(NcclFake, FailedCallOnOneRankAbortsThePeers) {
  fake::reset();
  auto devs = fake::devices(2);
  auto comm = rc::NcclCommunicator::create(devs, fake::options());
  std::vector<rc::DeviceBuffer> bufs;
  for (auto& d : devs) bufs.emplace_back(d, 64);
  const int aborted = fake::nccl().aborted;
  fake::gpu().hang = true;  // rank 0's collective waits for rank 1, which never comes
  fake::nccl().fail_rank = 1;
  auto errors = on_ranks(2, [&](int q) {
    void* p = reinterpret_cast<void*>(bufs[static_cast<size_t>(q)].ptr());
    comm->all_reduce(q, p, p, 16, DType::Int32);
  });
  EXPECT_TRUE(contains(
      errors[1],
      "NCCL call ncclAllReduce failed: ncclInvalidArgument: fake invalid argument; "
      "NCCL's last error: fake: rank 1 refuses (all_reduce of 16 x int32 on rank 1 (GPU 1))"))
      << errors[1];
  EXPECT_EQ(errors[0], "a collective was aborted: " + errors[1]);
  EXPECT_EQ(fake::nccl().aborted - aborted, 2) << "both ranks aborted their NCCL communicators";
  comm.reset();
  EXPECT_EQ(fake::nccl().aborted - aborted, 2);
}

TEST(NcclFake, ErrorsNcclReportsWhileWaitingAreRaised) {
  fake::reset();
  auto devs = fake::devices(1);
  auto comm = rc::NcclCommunicator::create(devs, fake::options());
  rc::DeviceBuffer buf(devs[0], 64);
  fake::gpu().hang = true;
  fake::nccl().async_error = rc::kNcclRemoteError;
  fake::nccl().async_rank = 0;
  expect_user_error([&] { comm->barrier(0); }, ErrorKind::Runtime,
                    {"nccl: barrier on rank 0 (GPU 0) failed: NCCL reports ncclRemoteError: fake "
                     "remote process exited"});
}

TEST(NcclFake, TimeoutGivesUp) {
  fake::reset();
  auto devs = fake::devices(1);
  auto comm = rc::NcclCommunicator::create(devs, fake::options(0.05));
  rc::DeviceBuffer buf(devs[0], 4 * 8);
  fake::gpu().hang = true;
  auto t0 = std::chrono::steady_clock::now();
  expect_user_error(
      [&] {
        comm->all_gather(0, reinterpret_cast<void*>(buf.ptr()),
                         reinterpret_cast<void*>(buf.ptr() + 16), 1, 16);
      },
      ErrorKind::Runtime,
      {"nccl: all_gather of 1 x 16 bytes on rank 0 (GPU 0) did not complete within 0.05 s"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(NcclFake, DestroyReleasesEverything) {
  fake::reset();
  int created = fake::nccl().created, destroyed = fake::nccl().destroyed;
  {
    auto devs = fake::devices(3);
    auto comm = rc::NcclCommunicator::create(devs, fake::options());
    check_many(
        DType::Float32, 3, [&](int) -> runtime::Communicator& { return *comm; },
        [&](int q) -> rc::Device& { return *devs[static_cast<size_t>(q)]; }, 7);
  }
  EXPECT_EQ(fake::nccl().created - created, 3);
  EXPECT_EQ(fake::nccl().destroyed - destroyed, 3);
  std::lock_guard<std::mutex> lock(fake::gpu().mu);
  EXPECT_TRUE(fake::gpu().blocks.empty()) << "staging and arenas returned to the driver";
  EXPECT_TRUE(fake::gpu().events.empty());
  EXPECT_EQ(fake::gpu().retained, 0);
  EXPECT_TRUE(fake::t_context.empty());
}

TEST(NcclFake, BadArgumentsAreValueErrors) {
  fake::reset();
  auto devs = fake::devices(2);
  expect_user_error([&] { rc::NcclCommunicator::create({devs[0], devs[0]}, fake::options()); },
                    ErrorKind::Value, {"GPU 0 is given twice"});
  expect_user_error([&] { rc::NcclCommunicator::create({}, fake::options()); }, ErrorKind::Value,
                    {"at least one GPU"});
  expect_user_error([&] { rc::NcclCommunicator::create(devs, fake::options(-1)); },
                    ErrorKind::Value, {"timeout_seconds"});
  rc::ncclUniqueId id{};
  expect_user_error([&] { rc::NcclCommunicator::create(id, 2, 1, devs, fake::options()); },
                    ErrorKind::Value, {"ranks 1..2 are not all ranks of a world of 2"});
  auto comm = rc::NcclCommunicator::create({devs[0]}, fake::options());
  expect_user_error([&] { comm->all_reduce(1, nullptr, nullptr, 1, DType::Float32); },
                    ErrorKind::Value, {"rank 1 is not a GPU of this process"});
  expect_user_error([&] { comm->all_reduce(0, nullptr, nullptr, -1, DType::Float32); },
                    ErrorKind::Value, {"all_reduce of -1 elements"});
  // Empty collectives do nothing (and touch no memory).
  EXPECT_NO_THROW(comm->all_reduce(0, nullptr, nullptr, 0, DType::Float32));
  EXPECT_NO_THROW(comm->all_gather(0, nullptr, nullptr, 0, 8));
  EXPECT_NO_THROW(comm->reduce_scatter(0, nullptr, nullptr, 2, 0, DType::Int8));
  EXPECT_EQ(comm->describe(), "nccl 2.28.9: 1 GPU");
}

// ---------------------------------------------------------------- on a GPU

bool required(const char* var) {
  const char* v = std::getenv(var);
  return v && *v && std::string(v) != "0";
}

// How many GPUs there are, or -1 with the reason when this cannot run here.
int real_gpus(std::string* why) {
  if (!rc::driver_available(why)) return -1;
  int n = 0;
  try {
    n = rc::device_count();
  } catch (const UserError& e) {
    *why = e.what();
    return -1;
  }
  if (n == 0) {
    *why = "the CUDA driver sees no GPU";
    return -1;
  }
  return n;
}

#define FLOWJIT_NEED_GPUS_AND_NCCL(gpus)                                                           \
  std::string why_;                                                                                \
  int gpus = real_gpus(&why_);                                                                     \
  if (gpus < 0) {                                                                                  \
    if (required("FLOWJIT_REQUIRE_GPU")) FAIL() << "FLOWJIT_REQUIRE_GPU is set: no GPU: " << why_; \
    GTEST_SKIP() << "no GPU: " << why_;                                                            \
  }                                                                                                \
  if (!rc::nccl_available(&why_)) {                                                                \
    if (required("FLOWJIT_REQUIRE_NCCL")) FAIL() << "FLOWJIT_REQUIRE_NCCL is set: " << why_;       \
    GTEST_SKIP() << "a GPU but no NCCL: " << why_;                                                 \
  }

// A hang on the GPU fails the test instead of stalling the GPU check.
rc::NcclOptions gpu_options() {
  rc::NcclOptions o;
  o.timeout_seconds = 60;
  return o;
}

TEST(NcclGpu, OneRankRoundTrip) {
  FLOWJIT_NEED_GPUS_AND_NCCL(gpus);
  auto comm = rc::make_nccl_communicator({0}, gpu_options());
  std::printf("[nccl] %s on %s\n", comm->describe().c_str(), comm->device(0).info().str().c_str());
  EXPECT_EQ(comm->describe(), "nccl " + rc::nccl_version_text(rc::nccl().version) + ": 1 GPU");
  check_everything(
      1, [&](int) -> runtime::Communicator& { return *comm; },
      [&](int q) -> rc::Device& { return comm->device(q); });
}

TEST(NcclGpu, StridedCopy) {
  FLOWJIT_NEED_GPUS_AND_NCCL(gpus);
  auto dev = rc::Device::open(0);
  rc::DeviceBuffer src(dev, 4 * 10), dst(dev, 4 * 16);
  std::vector<char> host(40);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<char>(i);
  upload(*dev, src.ptr(), host);
  upload(*dev, dst.ptr(), std::vector<char>(64, 0));
  {
    rc::Device::Scope s(*dev);
    rc::strided_copy(*dev, dst.ptr() + 2, 16, src.ptr(), 10, 6, 4);
  }
  auto got = download(*dev, dst.ptr(), 64);
  for (size_t r = 0; r < 4; ++r)
    for (size_t b = 0; b < 16; ++b)
      EXPECT_EQ(got[r * 16 + b], b >= 2 && b < 8 ? static_cast<char>(r * 10 + b - 2) : 0)
          << r << "," << b;
}

TEST(NcclGpu, TwoRanks) {
  FLOWJIT_NEED_GPUS_AND_NCCL(gpus);
  if (gpus < 2) GTEST_SKIP() << "one GPU here: the two-rank check needs two";
  auto comm = rc::make_nccl_communicator({0, 1}, gpu_options());
  std::printf("[nccl] %s\n", comm->describe().c_str());
  check_everything(
      2, [&](int) -> runtime::Communicator& { return *comm; },
      [&](int q) -> rc::Device& { return comm->device(q); });
}

}  // namespace
