// Executable: a compiled job's kernels and the plan that launches them.
//
// The plan is data (serializable into the disk cache): the job's signature,
// the arena size, and an ordered list of launch records (abi/launch.h), each
// naming a kernel symbol, the buffers it takes and its geometry (a CPU range
// or a GPU grid). The runtime resolves buffers per call and runs launches in
// order; a CPU launch whose range exceeds its grain is split over the TBB
// thread pool.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "abi/launch.h"
#include "ir/error.h"
#include "ir/types.h"
#include "runtime/comm/collective.h"
#include "runtime/memory.h"
#include "runtime/program.h"
#include "runtime/variables.h"

namespace flowjit::runtime {

// Kernel ABI shared with codegen: args[i] is the base address of argument i.
using KernelFn = void (*)(char* const* args, int64_t begin, int64_t end, char* scratch);

// The launch record (abi/launch.h): fusion makes it, codegen writes its
// geometry, the runtime runs it.
using abi::BufferKind;
using abi::BufferRef;
using abi::CollectiveStep;
using abi::CpuRange;
using abi::Geometry;
using abi::GpuGrid;
using abi::Launch;
const char* collective_op_name(CollectiveStep::Op op);

// [harden] A check of the run (index ranges, numerics): kernels report the
// first one that fails to the run's status buffer, int64 {check + 1, value,
// flat position, 0} at arena offset Plan::status_offset; the runtime raises
// it after the launch as a UserError naming the job, `what`, the value and
// its position in `shape`.
struct RunCheck {
  std::string what;             // "one_hot: indices"
  std::string where;            // the user's "file.py:12", or ""
  int64_t limit = 0;            // values must be in [0, limit); -1: one per last-dim index
  std::vector<int64_t> limits;  // limit -1: the limit of each last-dim index
  std::vector<int64_t> shape;   // of the checked tensor
  bool numerics = false;        // a NaN/infinity check: the value is a double's bits
  // Several devices: the axis along which each device holds its piece of
  // the checked tensor (`shape` is the piece's), -1 all of it, -2 its own
  // (the mirrored view). ir/ops.def, check_index's device_split.
  int device_split = -1;
  // The job the error names, when not the plan's (the segments of a staged
  // job are programs of their own; their checks name the user's job).
  std::string job;
};

// The error a failed check reports (status words 1 and 2: value, position).
// On device `rank` of `parts`: the position in the logical tensor (a split
// piece's position plus the rank's offset), or "on device" where there is no
// logical whole.
std::string describe_failed_check(const std::string& job, const RunCheck& c, int64_t value,
                                  int64_t position, int rank = 0, int parts = 1);

// [harden] A failed check of a distributed job that every device raises at
// the same launch, after the status all_gather (jit/fusion/schedule.cpp):
// the devices stopped together, so their communicator stays usable
// (runtime/distributed.cpp does not abort it).
class FailedCheckOnEveryDevice : public UserError {
 public:
  using UserError::UserError;
};

struct Plan {
  std::string job_name;
  std::vector<ir::TensorType> inputs;
  std::vector<ir::TensorType> outputs;
  std::vector<std::pair<std::string, ir::TensorType>> variables;
  std::vector<Launch> launches;
  int64_t arena_bytes = 0;
  // [harden] Fusion makes them for every compile, also on a disk-cache hit
  // (whose launches must equal fusion's); plan.txt keeps them too ("status",
  // "check" lines) for what runs a cached plan without fusion (exports).
  int64_t status_offset = -1;  // arena offset of the status buffer, -1: no checks
  std::vector<RunCheck> checks;
  // [harden] Ctrl-C: launches from this one on may write variables (fusion
  // orders variable writers after every check); a run interrupted before it
  // stops and leaves every variable as it was. 0 (unknown: a plan read back
  // without fusion) never stops.
  int64_t first_variable_write = 0;

  // Whether `o` launches the same kernels on the same buffers: equal but
  // for what codegen decides per launch (the geometry). The disk cache's
  // hit path checks a stored plan against fusion's with this.
  bool same_program(const Plan& o) const;

  // The one text form of a plan and its launches (plan.txt), CPU and GPU.
  std::string serialize() const;
  // Throws UserError(Value) on malformed text.
  static Plan deserialize(const std::string& text);
  std::string describe() const;  // launches, one per line
};

// [harden] Raises FailedCheckOnEveryDevice for the first device whose word
// in a status all_gather's result (`words`: `step.parts` blocks of
// `step.inner` int64s) holds a failed check; returns when none does. Both
// executables (CPU and GPU) call it, so every device raises the same error.
void raise_first_gathered_check(const Plan& plan, const CollectiveStep& step, const int64_t* words);

// A launch that all-gathers the run's status buffer (operand: the status
// buffer, result: one status per rank).
bool is_status_gather(const Plan& plan, const Launch& l);

// Adjacent all_reduces of one dtype whose buffers do not overlap run as one
// bucket (Communicator::all_reduce_many): per launch, the launches of the
// bucket that starts there (empty for non-all_reduces and later members).
std::vector<std::vector<size_t>> all_reduce_buckets(const Plan& plan);

// Whether collectives with a completion point run beside the kernels (a
// communication thread on CPU devices, a communication stream on GPUs):
// false when FLOWJIT_OVERLAP=0, which runs every collective synchronously.
bool overlap_enabled();

class Executable : public Program {
 public:
  // `fns[i]` is the code of plan.launches[i] (null for collectives);
  // `code_owner` keeps it alive.
  Executable(Plan plan, std::vector<KernelFn> fns, std::shared_ptr<void> code_owner);

  const Plan& plan() const override { return plan_; }
  std::string device() const override { return "cpu"; }
  std::vector<const Executable*> host_devices() const override { return {this}; }
  bool runs_on_caller() const override { return true; }
  // Another executable of the same code and plan, bound to nothing (one per
  // device of a distributed job).
  std::shared_ptr<Executable> instance() const;
  // Program's: bind_variables (a CPU program has no device state), and an
  // instance bound to `store`.
  void bind(VariableStore& store, const std::shared_ptr<DeviceState>& device) override;
  std::shared_ptr<Program> instance_for(VariableStore& store,
                                        const std::shared_ptr<DeviceState>& device) const override;

  // Points the variable slots at the store's storage, creating none: every
  // variable must exist with the planned type (UserError otherwise).
  void bind_variables(VariableStore& store);

  // Runs every launch in order. inputs/outputs hold one base address per
  // plan input/output; all must be 64-byte aligned and C-contiguous.
  // Not reentrant: callers serialize runs of one executable.
  void run(const void* const* inputs, void* const* outputs) override;

  std::string debug_name() const { return plan_.job_name; }

  // The device this executable is in a distributed job: collectives go
  // through `comm` as `rank`. Required when the plan has collectives.
  void set_device(std::shared_ptr<Communicator> comm, int rank) override;
  void gather_variable_pieces(size_t index, void* dst, int64_t outer, int64_t piece_bytes) override;
  bool has_collectives() const { return !collective_index_.empty(); }
  // Whether runs may write variables (the job has assigns): a run that
  // writes makes every other copy of its variables (device replicas, GPU
  // copies) stale; one that does not leaves them current.
  void set_writes_variables(bool w) override { writes_variables_ = w; }
  // The storages bound by bind_variables, in plan order.
  const std::vector<VariableStorage*>& bound_variables() const { return variable_storages_; }

  // Per-launch wall time, collected when FLOWJIT_PROFILE=1 is set.
  struct LaunchProfile {
    std::string symbol;
    int64_t calls = 0;
    double seconds = 0;
  };
  std::vector<LaunchProfile> profile() const;
  // One record per launch run while profiling (the newest kMaxEvents):
  // start on the steady clock (CLOCK_MONOTONIC, Python's time.monotonic_ns),
  // duration, and the OS thread id of the thread that ran it.
  struct LaunchEvent {
    int32_t launch = 0;
    int64_t start_ns = 0, dur_ns = 0;
    int64_t thread = 0;
  };
  static constexpr size_t kMaxEvents = 1 << 20;
  std::vector<LaunchEvent> events() const;

 private:
  char* scratch_for(int thread, int64_t bytes);
  [[noreturn]] void raise_failed_check() const;
  // After a status all_gather (launch li): raises the failed check of the
  // first rank that has one, on every device alike.
  void raise_gathered_check(size_t li, char* const* args) const;
  std::vector<bool> checks_;          // per launch: its kernel reports to the status buffer
  std::vector<bool> status_gathers_;  // per launch: is_status_gather

  Plan plan_;
  std::vector<KernelFn> fns_;
  std::shared_ptr<void> code_owner_;
  void run_collective(size_t li, char* const* args);

  std::vector<char*> variable_ptrs_;
  std::vector<VariableStorage*> variable_storages_;
  std::vector<CollectiveStep> collectives_;
  std::vector<int> collective_index_;  // per launch: index into collectives_, or -1
  // Adjacent all_reduces of one dtype run as one bucket: bucket_[li] lists
  // the launches of the bucket that starts at li; later members are empty
  // and marked in bucketed_.
  std::vector<std::vector<size_t>> bucket_;
  std::vector<bool> bucketed_;
  std::shared_ptr<Communicator> comm_;
  int rank_ = 0;
  std::unique_ptr<CollectiveQueue> comm_thread_;  // asynchronous all_reduces (overlap)
  std::mutex record_mu_;                          // record() from both threads
  AlignedBuffer arena_;
  std::vector<char*> argbuf_;      // per-launch resolved argument arrays, concatenated
  std::vector<size_t> arg_start_;  // start of launch i in argbuf_
  std::vector<AlignedBuffer> scratch_;
  std::vector<int64_t> scratch_size_;
  std::vector<LaunchProfile> profile_;
  std::vector<LaunchEvent> events_;  // a ring of kMaxEvents once full
  size_t events_next_ = 0;
  void record(size_t li, std::chrono::steady_clock::time_point t0);
  void record_bucket(size_t li, std::chrono::steady_clock::time_point t0);
  bool bound_ = false;
  bool writes_variables_ = true;
};

// [harden] Ctrl-C during a run: set (from a signal handler) while a run that
// Python's main thread called is in progress. A CPU executable without
// collectives checks it between launches: before its first variable write
// it stops there with ir::Interrupted; after, it completes. Cleared by the
// caller before the run.
std::atomic<bool>& interrupt_requested();

// Threads used for parallel launches (the TBB pool size).
int num_threads();
void set_num_threads(int n);  // 0 restores the default (all cores)

}  // namespace flowjit::runtime
