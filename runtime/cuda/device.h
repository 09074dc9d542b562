// A CUDA device as the runtime uses it: its primary context, a compute
// stream and a communication stream, an arena of device memory and pinned
// host staging. Every entry point makes
// the context current for its duration, so any thread may call it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/cuda/driver_api.h"
#include "runtime/cuda/range_allocator.h"

namespace flowjit::runtime::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm = 0;  // compute capability x 10
  int multiprocessors = 0;
  int64_t total_bytes = 0;
  int max_threads_per_block = 0;
  int max_shared_optin = 0;  // bytes of shared memory a block may opt in to
  std::string str() const;   // "NVIDIA H100 (sm_90, 132 SMs, 80 GiB)"
};

// Number of devices; throws UserError(Runtime) with kNoDriverMessage when
// there is no driver. `api` null: the process-wide driver().
int device_count(const DriverApi* api = nullptr);
std::vector<DeviceInfo> list_devices(const DriverApi* api = nullptr);

class Device {
 public:
  // Retains device `ordinal`'s primary context and creates two non-blocking
  // streams. UserError(Value) for an ordinal that does not exist.
  static std::shared_ptr<Device> open(int ordinal = 0, const DriverApi* api = nullptr);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  const DriverApi& api() const { return *api_; }
  // Kernels, copies, and the collectives of a job run without overlap.
  CUstream stream() const { return stream_; }
  // The collectives of a job run with overlap (runtime/cuda/executable.h):
  // ordered against the compute stream by events only.
  CUstream comm_stream() const { return comm_stream_; }
  void synchronize();  // waits for both streams

  // Makes the device's context current on this thread while alive.
  class Scope {
   public:
    explicit Scope(const Device& d);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const Device& d_;
  };

  // Device memory (256-byte aligned) from the arena: chunks of at least
  // chunk_bytes() taken from cuMemAlloc and split by a RangeAllocator.
  CUdeviceptr allocate(uint64_t bytes);
  void release(CUdeviceptr p);
  void trim();  // returns empty chunks to the driver
  uint64_t bytes_reserved() const;
  uint64_t bytes_in_use() const;
  void set_chunk_bytes(uint64_t b) { chunk_bytes_ = b; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }

  // Pinned (page-locked) host memory for staging copies.
  void* allocate_host(size_t bytes);
  void release_host(void* p);

 private:
  Device() = default;
  uint64_t bytes_reserved_locked() const;
  struct Chunk {
    CUdeviceptr base = 0;
    uint64_t size = 0;
    std::unique_ptr<RangeAllocator> ranges;
  };

  const DriverApi* api_ = nullptr;
  DeviceInfo info_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  CUstream comm_stream_ = nullptr;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
  uint64_t chunk_bytes_ = 64ull << 20;
};

// Device memory owned by one object.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::shared_ptr<Device> d, uint64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  CUdeviceptr ptr() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<Device> d_;
  CUdeviceptr ptr_ = 0;
  uint64_t bytes_ = 0;
};

// Pinned host memory owned by one object.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(std::shared_ptr<Device> d, size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  char* data() const { return static_cast<char*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<Device> d_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace flowjit::runtime::cuda
