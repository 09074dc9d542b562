// layout: produce values in the layout their consumers read.
#include "jit/passes/layout.h"

#include <unordered_map>

#include "jit/passes/transpose_fold.h"

namespace flowjit::jit {

using namespace ir;

Graph layout(const Graph& g) {
  std::unordered_map<const Node*, int> uses;
  for (const NodeRef& n : g.topo_order())
    for (const NodeRef& i : n->inputs()) ++uses[i.get()];
  for (const NodeRef& o : g.outputs) ++uses[o.get()];
  return rewrite_graph(g, [&](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    bool single_use = n->op() == OpKind::Transpose && uses[n->input(0).get()] == 1;
    NodeRef cand = Node::with_inputs(n, std::move(in));
    if (cand->op() != OpKind::Transpose) return cand;
    const IntList& perm = cand->attrs().get_ints("perm");
    const NodeRef& x = cand->input(0);
    if (x->op() == OpKind::MatMul && swaps_last_two(perm) &&
        (x->input(0)->rank() == x->input(1)->rank())) {
      bool ta = x->attrs().get_bool("transpose_a"), tb = x->attrs().get_bool("transpose_b");
      return make_node(OpKind::MatMul, {x->input(1), x->input(0)},
                       Attrs{{"transpose_a", !tb}, {"transpose_b", !ta}}, x->loc());
    }
    if (single_use && is_elementwise(x->op())) {
      // Only when every operand has the full shape (no broadcasting).
      for (auto& o : x->inputs())
        if (o->shape() != x->shape()) return cand;
      std::vector<NodeRef> ops;
      for (auto& o : x->inputs()) ops.push_back(transpose(o, perm));
      return make_node(x->op(), ops, x->attrs(), x->loc());
    }
    return cand;
  });
}

}  // namespace flowjit::jit
