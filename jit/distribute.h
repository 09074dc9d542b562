// distribute: turns a job's logical graph into the graph every device of a
// distributed job runs, with the collectives that keep it equal to the
// logical one.
//
// Every value gets a layout over the `parts` devices (OneFlow calls these
// SBP signatures):
//   B         broadcast: every device holds the whole value
//   S(axis)   split: device d holds the d-th of `parts` equal pieces
//   P         partial: the value is the sum over devices of what they hold
//   L         local (mirrored view): every device holds its own value; there
//             is no logical whole
// Placeholders are S(0) (B when their first dimension does not divide),
// variables are B or the S(axis) they were declared with. Each op takes the
// layout its rule derives from its operands' (a matmul of S(0) rows by a B
// weight is S(0); of two operands split along k it is P; a sum over the split
// axis is P), choosing among candidate signatures by the bytes that boxing
// the operands would move. Boxing inserts the collective ops: S->B
// all_gather, P->B all_reduce, P->S reduce_scatter, B->S local_slice. An
// assign boxes its value to its variable's layout, which is where gradients
// (P) are reduced. Results keep S(0) (each device writes its rows of the
// logical result) unless `whole_outputs`; P results are reduced.
//
// The output graph has local shapes and is the same on every device: the
// device index appears only inside the collectives, which the runtime runs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace flowjit::jit {

struct Sbp {
  enum Kind : uint8_t { Broadcast, Split, Partial, Local } kind = Broadcast;
  int axis = -1;  // Split only
  static Sbp B() { return {Broadcast, -1}; }
  static Sbp S(int a) { return {Split, a}; }
  static Sbp P() { return {Partial, -1}; }
  static Sbp L() { return {Local, -1}; }
  bool operator==(const Sbp& o) const { return kind == o.kind && axis == o.axis; }
  bool operator!=(const Sbp& o) const { return !(*this == o); }
  bool operator<(const Sbp& o) const { return kind != o.kind ? kind < o.kind : axis < o.axis; }
  std::string str() const;  // "B", "S(0)", "P", "L"
};

struct DistributeOptions {
  int parts = 1;
  bool mirrored = false;                  // the mirrored view: placeholders are L
  std::map<std::string, int> split_vars;  // variable -> declared split axis
  bool whole_outputs = false;             // every result B (several processes)
  // Placement per op (jit/stages.h): the device ids of each of the job's
  // placements, when its ops are placed on more than one device set; ops
  // traced outside every placement scope go to `default_stage` (-1: where
  // their operands or users are). Empty: the job runs on `parts` devices.
  std::vector<std::vector<int>> stages;
  int default_stage = -1;
};

struct DistributedGraph {
  ir::Graph local;
  std::vector<Sbp> params;   // per parameter (by index)
  std::vector<Sbp> outputs;  // per result
  // Every variable the graph uses with its layout and logical type.
  std::vector<std::tuple<std::string, Sbp, ir::TensorType>> variables;
  int collectives = 0;
  std::vector<std::string> warnings;  // declared layouts that could not be kept
  std::string description;            // one line per boxing, for FLOWJIT_DEBUG
};

// Throws UserError on layouts that cannot work (a declared split that does
// not divide, a mirrored value written into a variable).
DistributedGraph distribute(const ir::Graph& g, const DistributeOptions& opts);

}  // namespace flowjit::jit
