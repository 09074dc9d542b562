// CudaExecutable: a compiled job's GPU kernels and the plan that launches
// them, the GPU counterpart of runtime::Executable.
//
// The plan is the same runtime::Plan (buffers and launch order); the GPU
// adds per launch its grid, block and dynamic shared memory, and the module
// image (PTX, and a cubin when ptxas made one for this device's SM). Every
// buffer lives on the device for the executable's life: the arena, one
// buffer per input and output, and the variables' device copies
// (DeviceVariables, shared by the executables of a session). A run copies
// the inputs into pinned staging and then to the device, launches every
// kernel in order on the device's stream, copies the outputs back to
// staging and records an event; completion is observed with the event
// (done() polls, finish() waits), never by synchronizing the device.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/cuda/device.h"
#include "runtime/executable.h"
#include "runtime/variables.h"

namespace flowjit::runtime::cuda {

struct GpuLaunch {
  std::string symbol;
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_bytes = 0;  // dynamic shared memory
};

// Text form for the disk cache: one "gpulaunch sym gx gy gz bx by bz shared"
// line per launch. deserialize throws UserError(Value) on damaged text.
std::string serialize_launches(const std::vector<GpuLaunch>& launches);
std::vector<GpuLaunch> deserialize_launches(const std::string& text);

struct GpuImage {
  std::string ptx;          // always usable: the driver compiles it for the device
  std::vector<char> cubin;  // preferred when cubin_sm is the device's SM
  int cubin_sm = 0;
};

// Device copies of a session's variables, by name. A copy is created (and
// uploaded from the host storage) the first time an executable binds the
// variable; train jobs then update it in place on the device. download()
// brings values back for the host (checkpoints, reads from Python), upload()
// pushes host changes (initializers, checkpoint loads). Both are synchronous.
class DeviceVariables {
 public:
  explicit DeviceVariables(std::shared_ptr<Device> d) : d_(std::move(d)) {}
  CUdeviceptr get(const VariableStorage& v);
  void upload(const VariableStorage& v);
  void download(VariableStorage& v);
  void download_all(VariableStore& store);
  bool has(const std::string& name) const;
  const std::shared_ptr<Device>& device() const { return d_; }

 private:
  struct Entry {
    ir::TensorType type;
    DeviceBuffer buf;
  };
  Entry& entry(const VariableStorage& v);  // requires mu_

  std::shared_ptr<Device> d_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> vars_;
};

class CudaExecutable {
 public:
  // Loads the module and resolves every kernel; allocates the device
  // buffers and the pinned staging. UserError(Runtime) when the driver
  // rejects the image (with the driver's JIT log) or lacks a kernel.
  CudaExecutable(std::shared_ptr<Device> d, Plan plan, std::vector<GpuLaunch> launches,
                 const GpuImage& image);
  ~CudaExecutable();
  CudaExecutable(const CudaExecutable&) = delete;
  CudaExecutable& operator=(const CudaExecutable&) = delete;

  const Plan& plan() const { return plan_; }
  const std::vector<GpuLaunch>& launches() const { return launches_; }
  // "cubin sm_90" or "ptx (driver JIT for sm_90)".
  const std::string& loaded_from() const { return loaded_from_; }

  // As Executable::bind_variables (same checks and messages), then points
  // the kernels at the device copies in `dev`.
  void bind_variables(VariableStore& host, DeviceVariables& dev);

  // Stages the inputs (host addresses, C-contiguous; the caller may reuse
  // them when submit returns) and enqueues the whole run. One run may be in
  // flight per executable.
  void submit(const void* const* inputs);
  bool done();                        // the run's event has completed
  void finish(void* const* outputs);  // waits for the event, copies the outputs out
  void run(const void* const* inputs, void* const* outputs) {
    submit(inputs);
    finish(outputs);
  }
  bool in_flight() const { return in_flight_; }

  // The kernel parameters of launch `i` (device addresses), for tests.
  std::vector<CUdeviceptr> kernel_args(size_t i) const;

 private:
  void load_and_allocate(const GpuImage& image);
  void release_driver_objects();
  void resolve_args();

  std::shared_ptr<Device> d_;
  Plan plan_;
  std::vector<GpuLaunch> launches_;
  std::string loaded_from_;
  CUmodule module_ = nullptr;
  std::vector<CUfunction> fns_;
  DeviceBuffer arena_;
  std::vector<DeviceBuffer> inputs_, outputs_;
  std::vector<CUdeviceptr> variables_;
  PinnedBuffer staging_;
  std::vector<size_t> stage_in_, stage_out_;  // offsets into staging_
  std::vector<CUdeviceptr> arg_values_;       // every launch's parameters, concatenated
  std::vector<void*> arg_ptrs_;               // &arg_values_[k], what cuLaunchKernel reads
  std::vector<size_t> arg_start_;
  CUevent done_ = nullptr;
  bool bound_ = false;
  bool in_flight_ = false;
};

}  // namespace flowjit::runtime::cuda
