// simplify: algebraic simplification.
#include "jit/passes/simplify.h"

#include <cmath>

namespace flowjit::jit {

using namespace ir;

namespace {

// A zero constant that leaves every value unchanged when added (the IEEE
// additive identity is -0.0) or, with `subtracted`, when subtracted (+0.0).
// Integer zeros are identities either way.
bool is_additive_identity(const NodeRef& z, bool subtracted) {
  if (!is_fill(z, 0.0)) return false;
  if (!is_float(z->dtype())) return true;
  bool negative = std::signbit(z->attrs().get_float("value"));
  return subtracted ? !negative : negative;
}

// `x` stands in for `n` only if it has exactly n's type.
bool same_type(const NodeRef& x, const NodeRef& n) { return x->type() == n->type(); }

// Whether `slice` reads back exactly what `pad` padded: no interior
// padding, unit steps, and the window at the low pads with the operand's
// shape (the gradient of a slice, sliced again: attention's rows).
bool unpads(const NodeRef& slice, const NodeRef& pad) {
  const NodeRef& x = pad->input(0);
  if (!same_type(x, slice)) return false;
  const int r = slice->rank();
  auto ints = [r](const NodeRef& n, const char* key, int64_t dflt) {
    return n->attrs().has(key) ? n->attrs().get_ints(key) : IntList(r, dflt);
  };
  const IntList lo = ints(pad, "pads_lo", 0), interior = ints(pad, "interior", 0);
  const IntList step = ints(slice, "step", 1), begin = ints(slice, "begin", 0);
  for (int d = 0; d < r; ++d)
    if (interior[d] != 0 || step[d] != 1 || begin[d] != lo[d]) return false;
  return true;
}

NodeRef simplify_node(const NodeRef& n) {
  const auto& in = n->inputs();
  switch (n->op()) {
    case OpKind::Identity:
      return in[0];
    case OpKind::Cast:
      return in[0]->dtype() == n->dtype() ? in[0] : n;
    case OpKind::Add:
      // x + (-0.0) is x for every float x; x + 0.0 is not (-0.0 + 0.0 = 0.0).
      if (is_additive_identity(in[1], false) && same_type(in[0], n)) return in[0];
      if (is_additive_identity(in[0], false) && same_type(in[1], n)) return in[1];
      return n;
    case OpKind::Sub:
      // x - 0.0 is x for every float x; x - (-0.0) is not.
      if (is_additive_identity(in[1], true) && same_type(in[0], n)) return in[0];
      return n;
    case OpKind::Mul:
      if (is_fill(in[1], 1.0) && same_type(in[0], n)) return in[0];
      if (is_fill(in[0], 1.0) && same_type(in[1], n)) return in[1];
      return n;
    case OpKind::Div:
      if (is_fill(in[1], 1.0) && same_type(in[0], n)) return in[0];
      return n;
    case OpKind::Neg:
      if (in[0]->op() == OpKind::Neg) return in[0]->input(0);
      return n;
    case OpKind::Where:
      if (in[1] == in[2] && same_type(in[1], n)) return in[1];
      return n;
    case OpKind::Reshape:
      if (in[0]->shape() == n->shape()) return in[0];
      if (in[0]->op() == OpKind::Reshape) return reshape(in[0]->input(0), n->shape());
      return n;
    case OpKind::Broadcast:
      if (in[0]->shape() == n->shape()) return in[0];
      return n;
    case OpKind::Transpose:
      if (in[0]->op() == OpKind::Transpose) {
        const IntList& inner = in[0]->attrs().get_ints("perm");
        const IntList& outer = n->attrs().get_ints("perm");
        IntList perm(outer.size());
        for (size_t i = 0; i < outer.size(); ++i) perm[i] = inner[outer[i]];
        return transpose(in[0]->input(0), perm);
      }
      return n;
    case OpKind::Slice:
      if (in[0]->op() == OpKind::Pad && unpads(n, in[0])) return in[0]->input(0);
      return n;
    default:
      return n;
  }
}

}  // namespace

Graph simplify(const Graph& g) {
  return rewrite_graph(g, [](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    NodeRef cand = Node::with_inputs(n, std::move(in));
    // Repeat until this node is stable (each rule shrinks the expression).
    for (int i = 0; i < 8; ++i) {
      NodeRef next = simplify_node(cand);
      if (next == cand) break;
      cand = next;
    }
    return cand;
  });
}

}  // namespace flowjit::jit
