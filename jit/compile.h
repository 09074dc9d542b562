// compile: the driver from a traced job to a runnable runtime::Program.
//
//   trace -> (train: autodiff + optimizer) -> passes -> (distribute) -> fusion
//         + memory -> backend (jit/backend.h): disk cache lookup, or
//         compile -> code object -> disk cache store; then load -> Program
//
// Every target goes the same way; the backend for CompileSettings::target
// (CPU: LLVM -> ORC; GPU: LLVM NVPTX -> PTX, ptxas -> cubin, CUDA driver)
// is the only difference.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/target.h"
#include "ir/graph.h"
#include "jit/cache.h"
#include "jit/distribute.h"
#include "jit/optimizer.h"
#include "jit/stages.h"
#include "runtime/distributed.h"
#include "runtime/executable.h"
#include "runtime/program.h"
#include "runtime/variables.h"

namespace flowjit::jit {

struct FusedProgram;
struct PassLog;
struct StagedJob;

// What a job's kernels are generated for: plain data (the backend derives
// the rest, and the disk key, from it and from the device it runs on).
struct Target {
  enum class Kind : uint8_t { Cpu, Gpu };
  Kind kind = Kind::Cpu;
  int sm = 0;  // 0: the newest SM flowjit supports that the device runs (nvptx::codegen_sm)
  bool allow_tf32 = false;  // tensor cores for float32 matmuls (Python: FLOWJIT_ALLOW_TF32=1)
  codegen::MathLibrary math = codegen::MathLibrary::Auto;
  bool run_ptxas = true;  // a cubin when ptxas is found, else the driver compiles the PTX
  // Cpu: the x86-64 CPU the kernels are generated for, as LLVM names it
  // ("x86-64-v3"); empty: the host (codegen/cpu/backend.h, CompileOptions::cpu).
  std::string cpu;
  bool is_gpu() const { return kind == Kind::Gpu; }
};

// Where a job is loaded and run, as the runtime holds it: a handle, not
// code-generation data. A GPU job needs its GPU's copies of the session's
// variables (runtime::cuda::DeviceVariables, which hold the device), which
// its program binds; a CPU job none (null). Only the backend of the target
// knows the state's type.
struct RunDevice {
  std::shared_ptr<runtime::DeviceState> state;
};

struct JobDescription {
  std::string name;
  bool train = false;
  ir::Graph graph;  // params, returned values, explicit effects
  std::optional<OptimizerConfig> optimizer;
  std::vector<ir::NodeRef> losses;
  ir::NodeRef lr;                      // rank-0 float learning rate (train jobs)
  ir::NodeRef step;                    // the job's int64 train-step variable (train jobs)
  std::vector<ir::NodeRef> trainable;  // trainable variables the job reads
  // Values whose gradients become extra outputs after graph.outputs (train
  // jobs; flow.watch_diff).
  std::vector<ir::NodeRef> watched_grads;
  std::string source;     // "file.py:12" of the job function
  std::string signature;  // the placeholder signature, for the cache
  // A job run once (the variables' initializer): compiled for a short
  // compile (O0) rather than for speed.
  bool run_once = false;
  // parts > 1: compile the per-device graph of a job spread over devices.
  DistributeOptions distribution;
  // The job a failed check names, when not `name` (a segment of a staged job).
  std::string checks_job;
  // function_config().enable_auto_mixed_precision(True): the half type the
  // forward graph is rewritten to (passes/auto_mixed_precision.h).
  std::optional<ir::DType> mixed_precision;
};

struct CompileSettings {
  int debug = 0;         // FLOWJIT_DEBUG
  std::string dump_dir;  // FLOWJIT_DUMP_DIR
  // FLOWJIT_CACHE_DIR, default ~/.cache/flowjit; "" (FLOWJIT_DISABLE_CACHE=1)
  // disables the disk cache.
  std::string cache_dir;
  int64_t cache_max_bytes = 0;  // FLOWJIT_CACHE_MAX_BYTES (0: default bound, -1: unparsable)
  bool keep_text = false;       // keep IR/LLVM text on the result even without debug
  bool fuse = true;             // FLOWJIT_DISABLE_FUSION=1 turns fusion off (tests)
  bool check_numerics = false;  // [harden] function_config().check_numerics(True)
  // Keep the code object on the result (CompiledJob::code_object): exports.
  bool keep_object = false;
  // [harden] Polled between stages, kernels and LLVM passes (CPU codegen);
  // true stops the compile with ir::Interrupted (Ctrl-C from Python).
  std::function<bool()> interrupted;
  Target target;     // the CPU unless the job is placed on a GPU
  RunDevice device;  // the GPU's variable copies for a GPU target
  static CompileSettings from_environment();
};

// What one launch of kernel `symbol` computes and touches
// (codegen::kernel_cost), for the profiler's GFLOP/s and GB/s.
struct LaunchCost {
  std::string symbol;
  int64_t flops = 0;
  int64_t bytes = 0;
};

struct CompiledJob {
  // Single-device jobs: bound to the session store (GPU jobs: and to the
  // target's variable copies). Distributed jobs: the per-device program,
  // unbound; make_distributed instantiates the devices.
  std::shared_ptr<runtime::Program> program;
  std::optional<DistributedGraph> distributed;  // layouts, for distributed jobs
  // Jobs placed on several device sets (DistributeOptions::stages): the
  // compiled segments; make_staged instantiates them. `program` is null.
  std::shared_ptr<const StagedJob> staged;
  std::vector<ir::TensorType> logical_inputs, logical_outputs;
  bool writes_variables = true;  // the job has assigns (train steps, initializers)
  std::string ir_traced;         // before optimization
  std::string ir_optimized;      // after the pipeline
  std::string fusion_plan;       // kernels and what they compute
  std::string kernels;           // loop-level kernel descriptions
  std::string llvm_ir;           // optimized LLVM IR (kept with debug >= 3 or keep_text)
  std::string assembly;          // with debug >= 4 (GPU jobs: the PTX, also with keep_text)
  // Per kernel but collectives (which have none), on both the compile and
  // the disk-cache path.
  std::vector<LaunchCost> kernel_costs;
  std::vector<std::pair<std::string, ir::TensorType>> new_variables;
  double seconds_passes = 0, seconds_codegen = 0, seconds_total = 0;
  bool from_disk_cache = false;
  std::string cache_key;
  std::vector<std::string> warnings;  // e.g. a cache that could not be written
  std::string gpu_loaded_from;        // GPU jobs: "cubin sm_90" or "ptx (driver JIT ...)"
  // With CompileSettings::keep_object: the code the program runs (CPU: the
  // object container of codegen/cpu/kernel_units.h).
  std::vector<char> code_object;
  const runtime::Plan& plan() const { return program->plan(); }
};

// A job placed on several device sets, cut by jit/stages.h: one compiled job
// per segment (a distributed one when its placement spans several devices).
struct StagedJob {
  struct Segment {
    int stage = 0;
    int level = 0;
    CompiledJob job;
    std::vector<StageWire> inputs;
    std::vector<int> after;
  };
  std::vector<std::vector<int>> stages;  // device ids per placement
  std::vector<Segment> segments;
  std::vector<StageWire> outputs;
  std::string job_name;
};

// Compiles `job`, creating the optimizer-state variables it introduces in
// `store` (zero-filled) and binding the executable to the store.
CompiledJob compile_job(const JobDescription& job, const CompileSettings& settings,
                        runtime::VariableStore& store);

// The devices of this process for a distributed job: device d runs as
// global rank first_rank + d with its variables in device_stores[d], copies
// or pieces of the session's (`host`). device_states[d] is device d's state
// for its program (RunDevice::state; none on the CPU): a job compiled for a
// GPU target runs one CudaExecutable per GPU, on the GPU of that GPU's
// variable copies, and `comm` must then be an NcclCommunicator over those
// GPUs (ranks first_rank ..). The executable keeps the states.
std::shared_ptr<runtime::DistributedExecutable> make_distributed(
    const CompiledJob& job, runtime::VariableStore& host,
    const std::vector<runtime::VariableStore*>& device_stores,
    std::shared_ptr<runtime::Communicator> comm, int first_rank, bool several_processes,
    const std::vector<std::shared_ptr<runtime::DeviceState>>& device_states = {});

// The cache tool's check of the entry `key` in the cache at `dir`:
// DiskCache::inspect (nothing removed, touched or made), then, for an entry
// lookup() would read, what the hit path checks before loading it: its plan
// deserializes and holds meta.json's kernel count, and the backend that
// writes entries of its target accepts the code (cached_code_checks).
EntryReport inspect_cache_entry(const std::string& dir, const std::string& key);

// The segments of a staged job as one program: a placement on one device
// runs bound to the session's variables (`host`), one on several devices
// gets those devices' stores (device_stores[id]) and its own communicator.
std::shared_ptr<runtime::Program> make_staged(
    const CompiledJob& job, runtime::VariableStore& host,
    const std::vector<runtime::VariableStore*>& device_stores);

}  // namespace flowjit::jit
