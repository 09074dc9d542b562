// CUDA devices: discovery, primary context, stream, device arena, pinned memory.
#include "runtime/cuda/device.h"

#include <algorithm>
#include <sstream>

#include "ir/error.h"

namespace flowjit::runtime::cuda {

namespace {
const DriverApi& api_or_default(const DriverApi* api) { return api ? *api : driver(); }

DeviceInfo query(const DriverApi& api, int ordinal, CUdevice* out_dev) {
  CUdevice dev = 0;
  FLOWJIT_CU(api, cuDeviceGet, &dev, ordinal);
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {0};
  FLOWJIT_CU(api, cuDeviceGetName, name, static_cast<int>(sizeof(name) - 1), dev);
  info.name = name;
  int major = 0, minor = 0;
  FLOWJIT_CU(api, cuDeviceGetAttribute, &major, kAttrComputeCapabilityMajor, dev);
  FLOWJIT_CU(api, cuDeviceGetAttribute, &minor, kAttrComputeCapabilityMinor, dev);
  info.sm = major * 10 + minor;
  FLOWJIT_CU(api, cuDeviceGetAttribute, &info.multiprocessors, kAttrMultiprocessorCount, dev);
  FLOWJIT_CU(api, cuDeviceGetAttribute, &info.max_threads_per_block, kAttrMaxThreadsPerBlock, dev);
  FLOWJIT_CU(api, cuDeviceGetAttribute, &info.max_shared_optin, kAttrMaxSharedMemoryPerBlockOptin,
             dev);
  size_t total = 0;
  FLOWJIT_CU(api, cuDeviceTotalMem, &total, dev);
  info.total_bytes = static_cast<int64_t>(total);
  if (out_dev) *out_dev = dev;
  return info;
}
}  // namespace

std::string DeviceInfo::str() const {
  std::ostringstream os;
  os << name << " (sm_" << sm << ", " << multiprocessors << " SMs, "
     << (total_bytes + (1ll << 29)) / (1ll << 30) << " GiB)";
  return os.str();
}

int device_count(const DriverApi* api) {
  const DriverApi& a = api_or_default(api);
  int n = 0;
  FLOWJIT_CU(a, cuDeviceGetCount, &n);
  return n;
}

std::vector<DeviceInfo> list_devices(const DriverApi* api) {
  const DriverApi& a = api_or_default(api);
  std::vector<DeviceInfo> out;
  for (int i = 0, n = device_count(&a); i < n; ++i) out.push_back(query(a, i, nullptr));
  return out;
}

std::shared_ptr<Device> Device::open(int ordinal, const DriverApi* api) {
  const DriverApi& a = api_or_default(api);
  int n = device_count(&a);
  FJ_USER_CHECK(ordinal >= 0 && ordinal < n, ErrorKind::Value, "GPU ", ordinal,
                " does not exist: the CUDA driver sees ", n, n == 1 ? " device" : " devices");
  std::shared_ptr<Device> d(new Device());
  d->api_ = &a;
  d->info_ = query(a, ordinal, &d->dev_);
  FLOWJIT_CU(a, cuDevicePrimaryCtxRetain, &d->ctx_, d->dev_);
  try {
    Scope s(*d);
    FLOWJIT_CU(a, cuStreamCreate, &d->stream_, kStreamNonBlocking);
    FLOWJIT_CU(a, cuStreamCreate, &d->comm_stream_, kStreamNonBlocking);
  } catch (...) {
    if (d->stream_) a.cuStreamDestroy(d->stream_);
    d->stream_ = nullptr;
    a.cuDevicePrimaryCtxRelease(d->dev_);
    d->ctx_ = nullptr;
    throw;
  }
  return d;
}

Device::~Device() {
  if (!ctx_) return;
  // Errors are ignored here: a destructor cannot report them, and the
  // process may be exiting with the driver already torn down.
  if (api_->cuCtxPushCurrent(ctx_) == kCudaSuccess) {
    if (stream_) {
      api_->cuStreamSynchronize(stream_);
      api_->cuStreamDestroy(stream_);
    }
    if (comm_stream_) {
      api_->cuStreamSynchronize(comm_stream_);
      api_->cuStreamDestroy(comm_stream_);
    }
    for (Chunk& c : chunks_) api_->cuMemFree(c.base);
    CUcontext popped = nullptr;
    api_->cuCtxPopCurrent(&popped);
  }
  api_->cuDevicePrimaryCtxRelease(dev_);
}

Device::Scope::Scope(const Device& d) : d_(d) { FLOWJIT_CU(*d.api_, cuCtxPushCurrent, d.ctx_); }
Device::Scope::~Scope() {
  CUcontext popped = nullptr;
  d_.api_->cuCtxPopCurrent(&popped);
}

void Device::synchronize() {
  Scope s(*this);
  FLOWJIT_CU(*api_, cuStreamSynchronize, stream_);
  FLOWJIT_CU(*api_, cuStreamSynchronize, comm_stream_);
}

CUdeviceptr Device::allocate(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Chunk& c : chunks_)
    if (auto off = c.ranges->allocate(bytes)) return c.base + *off;
  uint64_t size =
      std::max<uint64_t>(chunk_bytes_, (bytes + (2ull << 20) - 1) / (2ull << 20) * (2ull << 20));
  Chunk c;
  {
    Scope s(*this);
    check(*api_, api_->cuMemAlloc(&c.base, size), "cuMemAlloc",
          "allocating " + std::to_string(size) + " bytes on " + info_.str() + ", " +
              std::to_string(bytes_reserved_locked()) + " bytes already reserved");
  }
  c.size = size;
  c.ranges = std::make_unique<RangeAllocator>(size, 256);
  auto off = c.ranges->allocate(bytes);
  FJ_CHECK(off.has_value(), "a fresh chunk cannot hold its allocation");
  CUdeviceptr p = c.base + *off;
  chunks_.push_back(std::move(c));
  return p;
}

void Device::release(CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Chunk& c : chunks_)
    if (p >= c.base && p < c.base + c.size) {
      c.ranges->release(p - c.base);
      return;
    }
  FJ_CHECK(false, "release of device address ", p, " which the arena did not allocate");
}

void Device::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  Scope s(*this);
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    if (it->ranges->empty()) {
      FLOWJIT_CU(*api_, cuMemFree, it->base);
      it = chunks_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t Device::bytes_reserved_locked() const {
  uint64_t n = 0;
  for (const Chunk& c : chunks_) n += c.size;
  return n;
}

uint64_t Device::bytes_reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_reserved_locked();
}

uint64_t Device::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const Chunk& c : chunks_) n += c.ranges->used();
  return n;
}

void* Device::allocate_host(size_t bytes) {
  Scope s(*this);
  void* p = nullptr;
  check(*api_, api_->cuMemAllocHost(&p, std::max<size_t>(bytes, 1)), "cuMemAllocHost",
        "pinning " + std::to_string(bytes) + " bytes of host staging memory");
  return p;
}

void Device::release_host(void* p) {
  if (!p) return;
  Scope s(*this);
  FLOWJIT_CU(*api_, cuMemFreeHost, p);
}

// ---------------------------------------------------------------- owners

DeviceBuffer::DeviceBuffer(std::shared_ptr<Device> d, uint64_t bytes)
    : d_(std::move(d)), ptr_(d_->allocate(bytes)), bytes_(bytes) {}
DeviceBuffer::~DeviceBuffer() {
  if (d_ && ptr_) d_->release(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : d_(std::move(o.d_)), ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (d_ && ptr_) d_->release(ptr_);
    d_ = std::move(o.d_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
  }
  return *this;
}

PinnedBuffer::PinnedBuffer(std::shared_ptr<Device> d, size_t bytes)
    : d_(std::move(d)), p_(d_->allocate_host(bytes)), bytes_(bytes) {}
PinnedBuffer::~PinnedBuffer() {
  if (d_ && p_) {
    try {
      d_->release_host(p_);
    } catch (...) {  // nothing to report from a destructor
    }
  }
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : d_(std::move(o.d_)), p_(o.p_), bytes_(o.bytes_) {
  o.p_ = nullptr;
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    this->~PinnedBuffer();
    new (this) PinnedBuffer(std::move(o));
  }
  return *this;
}

}  // namespace flowjit::runtime::cuda
