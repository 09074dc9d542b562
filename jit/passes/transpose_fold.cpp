// transpose_fold: transposes into matmul flags.
#include "jit/passes/transpose_fold.h"

namespace flowjit::jit {

using namespace ir;

bool swaps_last_two(const IntList& perm) {
  size_t r = perm.size();
  if (r < 2) return false;
  for (size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}

Graph transpose_fold(const Graph& g) {
  return rewrite_graph(g, [](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    if (n->op() != OpKind::MatMul) return Node::with_inputs(n, std::move(in));
    bool ta = n->attrs().get_bool("transpose_a"), tb = n->attrs().get_bool("transpose_b");
    NodeRef a = in[0], b = in[1];
    if (a->op() == OpKind::Transpose && swaps_last_two(a->attrs().get_ints("perm"))) {
      a = a->input(0);
      ta = !ta;
    }
    if (b->op() == OpKind::Transpose && swaps_last_two(b->attrs().get_ints("perm")) &&
        (b->input(0)->rank() == 2 || b->input(0)->rank() == a->rank())) {
      b = b->input(0);
      tb = !tb;
    }
    if (a == in[0] && b == in[1]) return Node::with_inputs(n, std::move(in));
    return make_node(OpKind::MatMul, {a, b}, Attrs{{"transpose_a", ta}, {"transpose_b", tb}},
                     n->loc());
  });
}

}  // namespace flowjit::jit
