// fusion: groups the nodes of an optimized graph into kernels, schedules
// them and plans their memory.
//
// Rules (all stated in terms of op traits, never op names):
//  * Elementwise chains, with broadcasting, become one loop kernel.
//  * A reduction absorbs the elementwise producers of its operand, the
//    elementwise consumers of its result, and reductions over the same domain
//    that feed it (softmax: max, then sum of exp, then the division, in one
//    kernel with phases).
//  * A matmul absorbs its elementwise epilogue (bias add, activation, the
//    ReLU mask of the backward pass, an optimizer update), evaluated on the
//    register tile.
//  * A node joins its consumer's kernel only when every consumer is in that
//    kernel; views (reshape that only adds or drops unit dims, transpose,
//    broadcast) and cheap sources (constants, iotas, scalars) are re-indexed
//    or recomputed in every kernel that uses them, and so is a value scaled
//    by scalars (0.5 * x) that nothing needs in memory: recomputing it reads
//    what loading it would.
//  * Assigns store into the variable from the kernel that computes the value
//    when that is safe in place (every read of the variable in that kernel is
//    at the written element), and otherwise through a temporary copied after
//    every read of the old value.
// Buffers of intermediates get arena offsets from their live ranges
// (jit/memory); inputs, outputs and variables are used in place.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel.h"
#include "ir/graph.h"
#include "runtime/executable.h"

namespace flowjit::jit {

struct FusedProgram {
  std::vector<codegen::Kernel> kernels;  // in launch order
  // The launch records (abi/launch.h): symbols, buffers, summaries and
  // collective steps; the backend's codegen writes their geometry.
  runtime::Plan plan;
  // One line per kernel: its name, the printed IR values it computes, and
  // the values it stores. Names refer to print_graph of `graph`.
  std::string description;
  ir::Graph graph;  // the graph fused (after fusion's own materializations)
  int64_t bytes_without_reuse = 0;
};

struct FusionOptions {
  // false: every compute node is its own kernel (views and constants are
  // still folded into their users). The unfused reference for tests;
  // FLOWJIT_DISABLE_FUSION=1 selects it.
  bool fuse = true;
  // [harden] function_config().check_numerics(True): every float value a
  // kernel stores is checked for NaN and infinity; the first kernel that
  // stores one fails the run, naming the kernel, the op and its source line.
  bool check_numerics = false;
  // [harden] The devices that run this program (a distributed job's
  // per-device graph, jit/distribute). Above 1 the devices agree on a
  // failed check: the status buffers are all-gathered before a variable is
  // written and at the end, and every device stops or skips alike.
  int devices = 1;
  // The job a failed check names ("": the job fused; a segment of a staged
  // job names its job).
  std::string checks_job;
};

FusedProgram fuse(const ir::Graph& g, const std::string& job_name, FusionOptions opts = {});

}  // namespace flowjit::jit
