// pipeline: the pass pipeline, in one readable function, and its logging.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace flowjit::jit {

// Logging and dumping for one compilation. Level 1 prints stages and times,
// level 2 also the IR after every pass ("(unchanged)" when a pass changed
// nothing); with dump_dir set, every stage (IR after each pass, fusion,
// plan, LLVM IR, assembly) is written to a numbered file.
struct PassLog {
  std::string job;
  int debug = 0;
  std::string dump_dir;
  std::vector<std::pair<std::string, double>> times;  // pass, seconds

  void stage(const std::string& name, double seconds, const std::string& detail = "");
  void dump(const std::string& stage, const std::string& text);
  int dump_counter = 0;
  bool dump_failed = false;  // reported once per job
};

// What the passes may assume of the target.
struct OptimizeOptions {
  // The half types whose matmuls the target computes natively, which
  // widen_half keeps (the others run in float32): both on a GPU (tensor
  // cores), bfloat16 on a CPU with AVX512-BF16 (jit/backend.h, optimize_options).
  bool f16_matmuls = false;
  bool bf16_matmuls = false;
};

// Runs the passes in order, verifying the IR after each one:
//   simplify, fold, cse, transpose_fold, layout, decompose, widen_half,
//   reshape_sink, simplify, fold, dce
// CSE runs before decompose only, so the forward and backward expansions of a
// softmax keep their own reductions and each fuses into one kernel.
ir::Graph optimize(const ir::Graph& g, PassLog& log, const OptimizeOptions& options = {});

}  // namespace flowjit::jit
