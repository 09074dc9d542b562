// CudaExecutable: a compiled job's GPU kernels and the plan that launches
// them, the GPU counterpart of runtime::Executable.
//
// The plan is the same runtime::Plan (buffers and launch order), whose
// launch records carry their GPU grids (abi::GpuGrid), and the module
// image (PTX, and a cubin when ptxas made one for this device's SM). Every
// buffer lives on the device for the executable's life: the arena, one
// buffer per input and output, and the variables' device copies
// (DeviceVariables, shared by the executables of a session, kept coherent
// with the host through VariableStorage::device_copies). A run copies
// the inputs into pinned staging and then to the device, launches every
// kernel in order on the device's stream, copies the outputs back to
// staging and records an event; completion is observed with the event
// (done() polls, finish() waits), never by synchronizing the device.
//
// One device of a distributed job (runtime/distributed.h, set_device): the
// plan's collective launches have no kernel; they run through the job's
// NcclCommunicator, whose rank for this executable is on the same Device.
// Adjacent all_reduces go as one bucket (all_reduce_many, one NCCL group) as
// on the CPU. With overlap (the default; FLOWJIT_OVERLAP=0 turns it off),
// every NCCL collective runs on the device's communication stream: an event
// recorded on the compute stream after the launches before it (its
// producers) is what the communication stream waits for; the collective and
// then its completion event are enqueued there, and the compute stream waits
// for that event just before launch `complete_before` (the first that needs
// the result: abi/launch.h; at once for a collective without one). So a
// bucket's all_reduce runs while the rest of the backward pass runs, and
// each update waits only for its own bucket. The host never waits on a
// collective then; the run's end is polled through the communicator
// (wait_event), so a failing peer still stops it. Without overlap the
// collectives run in plan order on the compute stream and the communicator
// waits for each before returning. Either way the CUDA streams, not the host
// thread, order the work: the host enqueues a whole run without blocking.
//
// As a runtime::Program, start() enqueues a run (completing the previous
// one first: one set of staging buffers) and its PendingRun is completed by
// whoever needs it first, the caller delivering its results or the next
// start(), which then waits only for the GPU.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/collective.h"
#include "runtime/cuda/device.h"
#include "runtime/executable.h"
#include "runtime/program.h"
#include "runtime/variables.h"

namespace flowjit::runtime::cuda {

class NcclCommunicator;

struct GpuImage {
  std::string ptx;          // always usable: the driver compiles it for the device
  std::vector<char> cubin;  // preferred when cubin_sm is the device's SM
  int cubin_sm = 0;
};

// Device copies of a session's variables on one GPU, by name. A copy is
// created (and the newest value uploaded) the first time an executable binds
// the variable; the variable's VariableStorage::device_copies then tracks
// which of the host and its GPU copies hold the newest value:
//  * before a GPU run, prepare() uploads the copy when it is stale (after a
//    host write, or a run on another GPU, whose value comes via the host);
//  * after a run that may write variables, written() makes this copy the
//    newest: host reads (runtime::sync_host: checkpoints, reads from Python,
//    CPU jobs) download it first, lazily;
//  * host writes (runtime::mark_host_written: initializers, checkpoint loads,
//    set from Python) make every GPU copy stale.
// Copies live as long as this object (their memory goes back to the device
// with it). Callers serialize the uses of one variable, as they serialize
// runs (the session's run mutex); transfers are ordered on the device's
// stream after the kernels already queued there, and are synchronous.
class DeviceVariables : public DeviceState {
 public:
  explicit DeviceVariables(std::shared_ptr<Device> d) : d_(std::move(d)) {}
  ~DeviceVariables();
  DeviceVariables(const DeviceVariables&) = delete;
  DeviceVariables& operator=(const DeviceVariables&) = delete;

  // The device address of v's copy, creating it (with the newest value).
  CUdeviceptr get(VariableStorage& v);
  // Before a run: makes the copy current (uploads when stale); its address.
  CUdeviceptr prepare(VariableStorage& v);
  // After a run that may have written v on this device.
  void written(VariableStorage& v);
  // Pushes the host value to this device (the host value becomes the newest).
  void upload(VariableStorage& v);
  // Makes the host value current (downloads when a GPU holds a newer one).
  void download(VariableStorage& v);
  void download_all(VariableStore& store);
  bool has(const VariableStorage& v) const;
  // Whether this device holds a newer value of v than the host.
  bool holds_newest(const VariableStorage& v) const;
  const std::shared_ptr<Device>& device() const { return d_; }

  struct Slot;  // one variable's copy on this device (executable.cpp)

 private:
  std::shared_ptr<Slot> slot(VariableStorage& v, bool* created);  // requires mu_

  std::shared_ptr<Device> d_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Slot>> vars_;
};

class CudaExecutable : public Program {
 public:
  // Loads the module and resolves every kernel; allocates the device
  // buffers and the pinned staging. UserError(Runtime) when the driver
  // rejects the image (with the driver's JIT log) or lacks a kernel.
  // Every launch of `plan` carries its GPU grid (codegen/nvptx wrote it).
  CudaExecutable(std::shared_ptr<Device> d, Plan plan, const GpuImage& image);
  ~CudaExecutable();
  CudaExecutable(const CudaExecutable&) = delete;
  CudaExecutable& operator=(const CudaExecutable&) = delete;

  const Plan& plan() const override { return plan_; }
  // The same code and plan loaded on device `d`, bound to nothing (one per
  // GPU of a distributed job).
  std::shared_ptr<CudaExecutable> instance(std::shared_ptr<Device> d) const;
  // A device of a distributed job: `comm` must be an NcclCommunicator whose
  // rank `rank` is this executable's Device (UserError otherwise).
  void set_device(std::shared_ptr<Communicator> comm, int rank) override;
  void gather_variable_pieces(size_t index, void* dst, int64_t outer, int64_t piece_bytes) override;
  // "cubin sm_90" or "ptx (driver JIT for sm_90)".
  std::string loaded_from() const override { return loaded_from_; }
  std::string device() const override { return "gpu:" + std::to_string(d_->info().ordinal); }

  // As Executable::bind_variables (same checks and messages), then points
  // the kernels at the device copies in `dev`, which must outlive the runs.
  void bind_variables(VariableStore& host, DeviceVariables& dev);
  // Program's: `device` must be a GPU's DeviceVariables (the copies on the
  // device the instance is loaded on).
  void bind(VariableStore& store, const std::shared_ptr<DeviceState>& device) override;
  std::shared_ptr<Program> instance_for(VariableStore& store,
                                        const std::shared_ptr<DeviceState>& device) const override;
  // Whether a run may write variables (train steps, assigns): then each run
  // makes the device copies the newest values. Predict jobs leave the host
  // current, so reading their variables never downloads. Default: true.
  void set_writes_variables(bool w) override { writes_variables_ = w; }
  bool writes_variables() const { return writes_variables_; }
  const std::shared_ptr<Device>& gpu() const { return d_; }

  // Stages the inputs (host addresses, C-contiguous; the caller may reuse
  // them when submit returns), brings the variables' device copies up to
  // date and enqueues the whole run. One run may be in flight per executable.
  void submit(const void* const* inputs);
  bool done();                        // the run's event has completed
  void finish(void* const* outputs);  // waits for the event, copies the outputs out
  bool in_flight() const { return in_flight_; }

  // Program: start() = submit() after completing the previous run; its
  // PendingRun's complete() = finish() into the outputs given to start()
  // (nothing when a later start() did so already). The executable must
  // outlive its pending runs. run() = start() + complete().
  std::shared_ptr<PendingRun> start(const void* const* inputs, std::vector<void*> outputs) override;
  void run(const void* const* inputs, void* const* outputs) override;
  class Run;

  // The kernel parameters of launch `i` (device addresses), for tests.
  std::vector<CUdeviceptr> kernel_args(size_t i) const;

 private:
  void load_and_allocate(const GpuImage& image);
  void run_collective(size_t li);
  // Overlap: run_collective(li) on the communication stream, between the
  // events; returns the launch the compute stream must wait before (-1: at once).
  int64_t enqueue_collective(size_t li);
  void release_driver_objects();
  void resolve_args();

  std::shared_ptr<Device> d_;
  Plan plan_;
  GpuImage image_;  // for instance()
  std::string loaded_from_;
  std::shared_ptr<Communicator> comm_;
  NcclCommunicator* nccl_ = nullptr;  // comm_, once set_device checked it
  int rank_ = 0;
  std::vector<std::vector<size_t>> buckets_;  // all_reduce_buckets(plan_)
  std::vector<bool> bucketed_;                // a later member of a bucket
  CUmodule module_ = nullptr;
  std::vector<CUfunction> fns_;
  DeviceBuffer arena_;
  std::vector<DeviceBuffer> inputs_, outputs_;
  std::vector<CUdeviceptr> variables_;
  std::vector<VariableStorage*> host_variables_;  // bound, in plan order
  DeviceVariables* device_variables_ = nullptr;
  bool writes_variables_ = true;
  PinnedBuffer staging_;
  std::vector<size_t> stage_in_, stage_out_;  // offsets into staging_
  size_t stage_status_ = 0;  // [harden] the status buffer's copy (plan_.status_offset >= 0)
  // [harden] The status all_gathers of a distributed plan (is_status_gather)
  // and where each one's result (every rank's status) is copied, on the
  // stream of the all_gather, right after it: finish() raises from these.
  std::vector<std::pair<size_t, size_t>> status_gathers_;  // (launch, staging offset)
  void stage_gathered_status(size_t li, CUstream s);
  std::vector<CUdeviceptr> arg_values_;  // every launch's parameters, concatenated
  std::vector<void*> arg_ptrs_;          // &arg_values_[k], what cuLaunchKernel reads
  std::vector<size_t> arg_start_;
  CUevent done_ = nullptr;
  std::vector<CUevent> produced_, completed_;  // per collective launch (overlap)
  bool overlapped_ = false;                    // the run in flight uses the comm stream
  bool bound_ = false;
  bool in_flight_ = false;
  std::mutex runs_mu_;
  std::shared_ptr<Run> pending_;  // the started run not yet finished (guarded by runs_mu_)
  void finish_locked(Run& r);     // requires runs_mu_
};

}  // namespace flowjit::runtime::cuda
