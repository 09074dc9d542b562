// Program: a loaded job the caller runs, whatever it runs on: the CPU
// (runtime::Executable), a GPU (runtime::cuda::CudaExecutable) or several
// devices (runtime::DistributedExecutable). The compile driver returns one,
// the session queues its runs and the bindings call it; none of them asks
// which kind it is.
//
// Arguments and results are the job's logical values, each passed as
// `arrays` C-contiguous host buffers of `type` (one, or one per device for a
// value of the mirrored view), in slot order.
//
// Runs: run() is synchronous. start() begins a run and returns at once with
// a PendingRun whose complete() waits for it and writes its results. A CPU
// program computes inside start() (the caller's thread does the work); a
// GPU program only stages the inputs and enqueues, so a worker can go on
// while the device computes, and the callback thread completes the run. At
// most one run of a program is in flight: start() completes the previous
// one first. Callers serialize start() and run() of one program (the
// session's run lock); complete() needs no lock.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/types.h"

namespace flowjit::runtime {

struct Plan;
class Executable;
class Communicator;
class VariableStore;

// What a device holds for its programs beside the session's variables: a
// GPU's copies of them (runtime::cuda::DeviceVariables). The CPU has none
// (null). Programs take it as this base, so nothing above the runtime asks
// which kind of program or device it has.
class DeviceState {
 public:
  virtual ~DeviceState() = default;
};

struct ProgramSlot {
  ir::TensorType type;
  int arrays = 1;           // buffers passed for this slot
  bool per_device = false;  // one buffer per device (mirrored view): a list in Python
};

class PendingRun {
 public:
  virtual ~PendingRun() = default;
  // Waits for the run and writes its results to the outputs given to
  // start(); rethrows the run's error. Idempotent.
  virtual void complete() = 0;
};

class Program {
 public:
  virtual ~Program() = default;

  // One device's launch plan (every device of a distributed job has the same).
  virtual const Plan& plan() const = 0;
  virtual std::vector<ProgramSlot> input_slots() const;
  virtual std::vector<ProgramSlot> output_slots() const;
  // "cpu" (also for several CPU devices) or "gpu:0".
  virtual std::string device() const = 0;
  // Where the code came from, for reports ("cubin sm_90"); "" on the CPU.
  virtual std::string loaded_from() const { return ""; }
  // Whether runs may write variables (the job has assigns): a writing run
  // makes every other copy of its variables (device replicas, GPU copies)
  // stale; one that does not leaves them current. Default: true.
  virtual void set_writes_variables(bool w) = 0;

  // `inputs`/`outputs`: one pointer per array, slots in order.
  virtual void run(const void* const* inputs, void* const* outputs) = 0;
  // The outputs must stay valid until complete() returns; the inputs only
  // until start() returns.
  virtual std::shared_ptr<PendingRun> start(const void* const* inputs, std::vector<void*> outputs);

  // The CPU executables whose launches FLOWJIT_PROFILE=1 timed, per device
  // (none for a GPU program: the device times its launches).
  virtual std::vector<const Executable*> host_devices() const { return {}; }
  // Whether run() computes on the calling thread launch by launch (one CPU
  // device), so an interrupt can stop it between two launches.
  virtual bool runs_on_caller() const { return false; }

  // Points the program at the session's variables (`device`: the device's
  // copies of them, null on the CPU). Programs made of others (several
  // devices, stages) bind their parts when they are made and refuse this.
  virtual void bind(VariableStore& store, const std::shared_ptr<DeviceState>& device);
  // Another program of the same code for one device of a distributed job,
  // bound to that device's variables (`device` as for bind). A program that
  // cannot be one throws UserError(NotImplemented).
  virtual std::shared_ptr<Program> instance_for(VariableStore& store,
                                                const std::shared_ptr<DeviceState>& device) const;

  // One device of a distributed job (runtime/distributed.h): its
  // collectives go through `comm` as global rank `rank`. A program that
  // cannot be one throws UserError(NotImplemented).
  virtual void set_device(std::shared_ptr<Communicator> comm, int rank);
  // Collective, after a run: every rank's piece of the split variable bound
  // as plan variable `index` (`outer` blocks of `piece_bytes`) gathered
  // into host memory `dst`, [outer][ranks][piece]. What a distributed job
  // over several processes does to keep split variables whole on every host.
  virtual void gather_variable_pieces(size_t index, void* dst, int64_t outer, int64_t piece_bytes);

  // Total pointers passed for the slots.
  static size_t count_arrays(const std::vector<ProgramSlot>& slots);
};

}  // namespace flowjit::runtime
