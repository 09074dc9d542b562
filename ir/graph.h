// A job's graph: its parameters, returned values and effects (assigns).
#pragma once

#include <string>
#include <vector>

#include "ir/node.h"

namespace flowjit::ir {

struct Graph {
  std::string name;
  std::vector<NodeRef> params;   // Parameter nodes, by their `index` attribute
  std::vector<NodeRef> outputs;  // returned values, in order
  std::vector<NodeRef> effects;  // Assign nodes, in program order

  // Every node reachable from params, outputs and effects, operands before
  // users. Deterministic: depth-first in operand order from the roots.
  std::vector<NodeRef> topo_order() const;

  // Same params/outputs/effects as pointers: cheap "did a pass change it".
  bool same_as(const Graph& o) const {
    return params == o.params && outputs == o.outputs && effects == o.effects;
  }
};

// Rewrites a graph bottom-up. `fn(node, new_inputs)` returns the node's
// replacement given its already-rewritten operands (Node::with_inputs when
// it has nothing to change). Unchanged subgraphs keep their NodeRefs.
template <class Fn>
Graph rewrite_graph(const Graph& g, Fn&& fn);

}  // namespace flowjit::ir

#include "ir/graph_inl.h"
