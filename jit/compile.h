// compile: the driver from a traced job to a runnable Executable.
//
//   trace -> (train: autodiff + optimizer) -> passes -> fusion + memory
//         -> disk cache lookup -> codegen (LLVM, ORC) -> Executable
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "jit/distribute.h"
#include "jit/optimizer.h"
#include "runtime/distributed.h"
#include "runtime/executable.h"
#include "runtime/variables.h"

namespace flowjit::jit {

// What the tracer hands to the compiler.
struct JobDescription {
  std::string name;
  bool train = false;
  ir::Graph graph;  // params, returned values, explicit effects
  std::optional<OptimizerConfig> optimizer;
  std::vector<ir::NodeRef> losses;
  ir::NodeRef lr;    // rank-0 float learning rate (train jobs)
  ir::NodeRef step;  // the job's int64 train-step variable (train jobs)
  std::vector<ir::NodeRef> trainable;  // trainable variables the job reads
  std::string source;                  // "file.py:12" of the job function
  std::string signature;               // the placeholder signature, for the cache
  // parts > 1: compile the per-device graph of a job spread over devices.
  DistributeOptions distribution;
};

struct CompileSettings {
  int debug = 0;             // FLOWJIT_DEBUG
  std::string dump_dir;      // FLOWJIT_DUMP_DIR
  // FLOWJIT_CACHE_DIR, default ~/.cache/flowjit; "" (FLOWJIT_DISABLE_CACHE=1)
  // disables the disk cache.
  std::string cache_dir;
  int64_t cache_max_bytes = 0;  // FLOWJIT_CACHE_MAX_BYTES (0: default bound, -1: unparsable)
  bool keep_text = false;    // keep IR/LLVM text on the result even without debug
  bool fuse = true;          // FLOWJIT_DISABLE_FUSION=1 turns fusion off (tests)
  static CompileSettings from_environment();
};

struct CompiledJob {
  // Single-device jobs: bound to the session store. Distributed jobs: the
  // per-device program, unbound; make_distributed instantiates the devices.
  std::shared_ptr<runtime::Executable> executable;
  std::vector<runtime::KernelFn> fns;
  std::shared_ptr<void> code;
  std::optional<DistributedGraph> distributed;  // layouts, for distributed jobs
  std::vector<ir::TensorType> logical_inputs, logical_outputs;
  std::string ir_traced;      // before optimization
  std::string ir_optimized;   // after the pipeline
  std::string fusion_plan;    // kernels and what they compute
  std::string kernels;        // loop-level kernel descriptions
  std::string llvm_ir;        // optimized LLVM IR (kept with debug >= 3 or keep_text)
  std::string assembly;       // with debug >= 4
  std::vector<std::pair<std::string, ir::TensorType>> new_variables;
  double seconds_passes = 0, seconds_codegen = 0, seconds_total = 0;
  bool from_disk_cache = false;
  std::string cache_key;
  std::vector<std::string> warnings;  // e.g. a cache that could not be written
};

// Compiles `job`, creating the optimizer-state variables it introduces in
// `store` (zero-filled) and binding the executable to the store.
CompiledJob compile_job(const JobDescription& job, const CompileSettings& settings,
                        runtime::VariableStore& store);

// The devices of this process for a distributed job: device d runs as
// global rank first_rank + d with its variables in device_stores[d], copies
// or pieces of the session's (`host`).
std::shared_ptr<runtime::DistributedExecutable> make_distributed(
    const CompiledJob& job, runtime::VariableStore& host,
    const std::vector<runtime::VariableStore*>& device_stores,
    std::shared_ptr<runtime::Communicator> comm, int first_rank, bool several_processes);

}  // namespace flowjit::jit
