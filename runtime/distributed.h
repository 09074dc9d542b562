// A job spread over several devices: one program per device of this
// process, all compiled from the same per-device graph (jit/distribute),
// run concurrently (device 0 on the caller's thread, the others on their
// own worker threads) and joined by a Communicator. A device is a CPU
// Executable (collectives through the thread or Gloo communicator) or a
// GPU's CudaExecutable (through an NcclCommunicator over the same Devices).
//
// Inputs and outputs are the job's logical values: a Whole slot is the same
// buffer on every device (results: device 0 writes it), a Rows slot is split
// along its first dimension (device of global rank g reads or writes rows
// [g*n/parts, (g+1)*n/parts) in place, no copies), and a PerDevice slot
// (mirrored view) has one buffer per device of this process.
//
// Variables: each device has its own copy or piece (VariableStorage::
// replicas). The session's value is scattered to the devices before a run
// when it is newer, and gathered back only when something on the host reads
// it (sync_host) — except split variables over several processes, whose
// pieces are gathered after every run that may change them (the pieces of
// other processes cannot be fetched later without all processes taking part).
// On GPUs a replica is itself a host storage with a GPU copy
// (VariableStorage::device_copies): scattering marks that copy stale (the
// GPU uploads it before its run), gathering downloads it first.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/collective.h"
#include "runtime/executable.h"
#include "runtime/program.h"

namespace flowjit::runtime {

struct DeviceSlot {
  enum Kind : uint8_t { Whole, Rows, PerDevice } kind = Whole;
  ir::TensorType type;  // logical (Whole, Rows) or per-device (PerDevice)
};

class DeviceWorkers;

class DistributedExecutable : public Program {
 public:
  // `devices[d]` runs as global rank first_rank + d; its variables are
  // bound to per-device storages that carry `replicas` of host storages in
  // `host_vars` (same order as the plan's variables).
  DistributedExecutable(std::vector<std::shared_ptr<Program>> devices,
                        std::shared_ptr<Communicator> comm, int first_rank,
                        std::vector<DeviceSlot> inputs, std::vector<DeviceSlot> outputs,
                        std::vector<VariableStorage*> host_vars, bool several_processes);
  ~DistributedExecutable();

  int num_devices() const { return static_cast<int>(devices_.size()); }
  const std::vector<DeviceSlot>& inputs() const { return inputs_; }
  const std::vector<DeviceSlot>& outputs() const { return outputs_; }
  // Pointers per slot: one for Whole and Rows, num_devices() for PerDevice.
  size_t num_input_pointers() const;
  size_t num_output_pointers() const;
  const Program& device(int d) const { return *devices_[d]; }
  const Communicator& communicator() const { return *comm_; }
  std::string job_name() const { return devices_[0]->plan().job_name; }

  // Program: device 0's plan; slots of `arrays` num_devices() for PerDevice.
  const Plan& plan() const override { return devices_[0]->plan(); }
  std::vector<ProgramSlot> input_slots() const override { return slots(inputs_); }
  std::vector<ProgramSlot> output_slots() const override { return slots(outputs_); }
  // "cpu", or the GPUs of this process: "gpu:0,1".
  std::string device() const override;
  std::string loaded_from() const override { return devices_[0]->loaded_from(); }
  std::vector<const Executable*> host_devices() const override;

  // As Executable::set_writes_variables: a writing run makes the variables'
  // GPU copies stale.
  void set_writes_variables(bool w) override { writes_variables_ = w; }

  // Not reentrant (callers serialize runs, like Executable::run).
  void run(const void* const* inputs, void* const* outputs) override;

  // Keeps `o` alive as long as the devices (a GPU's variable copies).
  void keep_alive(std::shared_ptr<void> o) { owned_.push_back(std::move(o)); }

 private:
  std::vector<ProgramSlot> slots(const std::vector<DeviceSlot>& s) const;

  std::vector<std::shared_ptr<void>> owned_;  // destroyed after devices_
  std::vector<std::shared_ptr<Program>> devices_;
  std::shared_ptr<Communicator> comm_;
  int first_rank_;
  std::vector<DeviceSlot> inputs_, outputs_;
  std::vector<VariableStorage*> host_vars_;
  bool several_processes_;
  bool writes_variables_ = true;
  std::vector<std::vector<AlignedBuffer>> discard_;  // per device: outputs nobody reads
  std::unique_ptr<DeviceWorkers> workers_;
  // Several processes: before the first run every device all_gathers a
  // fixed-size fingerprint of what the program exchanges (each collective's
  // kind and sizes, the split variables), so processes that traced different
  // programs (a variable of another shape) get a clear error on every rank
  // instead of collectives of different sizes, which Gloo's own thread
  // answers with std::terminate.
  bool fingerprint_checked_ = false;
  void check_same_program(int device);
};

// Creates (or checks) the device copies of `host` for a distributed job.
// Throws UserError when the variable is already distributed differently.
void attach_replicas(VariableStorage& host, int split_axis, int parts, int first_rank,
                     std::vector<VariableStorage*> local);
// Makes host.data current: gathers from this process's devices when they
// hold newer values.
void sync_host(VariableStorage& host);
// The host value was written (load_variables, a single-device job): the
// devices get it before their next run.
void mark_host_written(VariableStorage& host);

}  // namespace flowjit::runtime
