// fusion's first stages, each a function from one record to the next:
//
//   prepare:  Graph -> Graph      every value a kernel must read from memory
//                                 (matmul and family operands, an assign's
//                                 value, an output) is computed into a buffer
//   analyze:  Graph -> Uses       who reads, assigns and returns each value
//   group:    Uses -> Grouping    which nodes form each kernel, and how each
//                                 member's dims map onto the kernel's domain
//
// Kernel formation (internal.h: Fuser) reads the Grouping; the launch order
// is its own stage (order.h); memory planning is jit/memory.h.
// print_grouping writes a Grouping as text, for tests and dumps.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "jit/fusion/views.h"

namespace flowjit::jit::fusion_detail {

// Makes every output, assign value, collective operand, matmul and family
// operand a buffer computed by a kernel (an identity where it was a view, a
// duplicable value or a collective's own buffer).
Graph prepare(const Graph& g);

// Collectives and family kernels write only their own buffer: a result or
// an assigned value is copied out of it by a kernel.
bool needs_identity_for_store(const NodeRef& n);

// How the values of a prepared graph are used.
struct Uses {
  std::vector<NodeRef> topo;                                      // topological order
  std::unordered_map<const Node*, int> pos;                       // position in topo
  std::unordered_map<const Node*, std::vector<NodeRef>> users;    // readers (not assigns)
  std::unordered_map<const Node*, std::vector<NodeRef>> assigns;  // assigns of a value
  std::unordered_map<const Node*, int> output_of;                 // returned as output i
  std::unordered_map<const Node*, int> param_index;               // input index of a param
  std::unordered_set<const Node*> must_store;  // read from memory by a matmul, view, family...
  // Elementwise chains right after a single-use matmul: kept for that
  // matmul's epilogue (a reduction kernel does not take them).
  std::unordered_set<const Node*> epilogue;
  // Scaled values (is_scaled_value) that nothing needs in memory: every
  // kernel that reads one recomputes it from its operand, as it does
  // duplicable views and constants.
  std::unordered_set<const Node*> recomputed;

  // Recomputed in every kernel that uses it (is_duplicable, or recomputed).
  bool duplicated(const NodeRef& n) const { return is_duplicable(n) || recomputed.count(n.get()); }
  NodeRef node_ref(const Node* n) const;
  // Compute nodes that consume `n`, looking through duplicable users.
  void effective_users(const NodeRef& n, std::vector<const Node*>& out) const;
};

Uses analyze(const Graph& prepared);

// One kernel's nodes: a loop over `domain` (with reduced dims) or a
// contraction `mm` with its epilogue, or a collective or family root alone.
struct Group {
  int id = 0;
  bool matmul = false;
  NodeRef root;
  NodeRef mm;  // the MatMul node of a matmul group
  Shape domain;
  std::vector<bool> reduced;
  bool has_reduce = false;
  std::vector<int> remap;  // set when absorbing a reduction renumbered the domain
  std::unordered_map<const Node*, std::vector<DimMap>> maps;  // members and their maps
  std::vector<NodeRef> members;                               // in absorption order
  int computes = 0;  // members that are computed here (not duplicated views or constants)
  bool member(const NodeRef& n) const { return maps.count(n.get()) > 0; }
};

// The most computed ops one kernel takes: a longer chain is cut into several
// kernels. LLVM's time on one function grows faster than its size (a chain of
// 10,000 fused ops compiled for over 10 minutes as one kernel); past a few
// hundred ops per element, a stored intermediate costs little.
constexpr int kMaxKernelComputes = 512;

struct GroupingOptions {
  bool fuse = true;  // false: every compute node is a kernel of its own
  // Positions (in Uses::topo) of matmuls that take no epilogue (fuse()
  // retries with a matmul here when its epilogue's layout cannot be built;
  // group() adds those whose epilogue would be a heavy one).
  std::set<int> unfused_matmuls;
};

// Groups in creation order: roots from the last node back, each grown by
// absorbing its producers (jit/fusion.h states the rules).
struct Grouping {
  std::vector<std::unique_ptr<Group>> groups;
  std::unordered_map<const Node*, int> group_of;  // computed members -> group id
};

Grouping group(const Uses& uses, const GroupingOptions& opts);

// One line per group, in creation order, with values named as print_graph
// names them in `g`:
//   g0 loop [8,7] reduce{1}: %3{0,-1} %4{0,1} ...  (a member and its dim maps)
std::string print_grouping(const Graph& g, const Uses& uses, const Grouping& grouping);

}  // namespace flowjit::jit::fusion_detail
