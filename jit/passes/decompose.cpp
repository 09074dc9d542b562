// decompose: composite ops to primitives.
#include "jit/passes/decompose.h"

#include "ir/error.h"

namespace flowjit::jit {

using namespace ir;

namespace {

NodeRef keep_reduce(OpKind op, const NodeRef& x, int64_t axis) {
  return reduce(op, x, {axis}, /*keepdims=*/true);
}

// where(x's class index == label, a, b) pieces: a bool mask of x's shape that
// is true at [..., labels[...]].
NodeRef label_mask(const NodeRef& labels, const Shape& full) {
  Shape col = labels->shape();
  col.push_back(1);
  NodeRef lab = reshape(labels, col);
  int64_t axis = static_cast<int64_t>(full.size()) - 1;
  NodeRef iota =
      make_node(OpKind::Iota, {},
                Attrs{{"shape", full}, {"dtype", labels->dtype()}, {"axis", axis}}, labels->loc());
  return binary(OpKind::Equal, iota, lab);
}

NodeRef expand(const NodeRef& n, const std::vector<NodeRef>& in) {
  const Attrs& a = n->attrs();
  switch (n->op()) {
    case OpKind::Softmax: {
      int64_t axis = a.get_int("axis");
      NodeRef x = in[0];
      NodeRef z = binary(OpKind::Sub, x, keep_reduce(OpKind::ReduceMax, x, axis));
      NodeRef e = unary(OpKind::Exp, z);
      return binary(OpKind::Div, e, keep_reduce(OpKind::ReduceSum, e, axis));
    }
    case OpKind::LogSoftmax: {
      int64_t axis = a.get_int("axis");
      NodeRef x = in[0];
      NodeRef z = binary(OpKind::Sub, x, keep_reduce(OpKind::ReduceMax, x, axis));
      NodeRef lse = unary(OpKind::Log, keep_reduce(OpKind::ReduceSum, unary(OpKind::Exp, z), axis));
      return binary(OpKind::Sub, z, lse);
    }
    case OpKind::SparseCrossEntropy: {
      // loss = log(sum(exp(z))) - z[label], z = logits - max(logits).
      NodeRef labels = in[0], logits = in[1];
      int64_t axis = logits->rank() - 1;
      NodeRef z = binary(OpKind::Sub, logits, keep_reduce(OpKind::ReduceMax, logits, axis));
      NodeRef lse = unary(OpKind::Log, keep_reduce(OpKind::ReduceSum, unary(OpKind::Exp, z), axis));
      NodeRef picked =
          keep_reduce(OpKind::ReduceSum,
                      where(label_mask(labels, logits->shape()), z, scalar_like(0.0, z)), axis);
      return reshape(binary(OpKind::Sub, lse, picked), n->shape());
    }
    case OpKind::OneHot: {
      NodeRef mask = label_mask(in[0], n->shape());
      DType dt = n->dtype();
      return where(mask, fill(a.get_float("on_value"), {}, dt, n->loc()),
                   fill(a.get_float("off_value"), {}, dt, n->loc()));
    }
    default:
      FJ_CHECK(false, "decompose: no expansion for ", op_name(n->op()));
  }
}

}  // namespace

Graph decompose(const Graph& g) {
  return rewrite_graph(g, [](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    if (!is_composite(n->op())) return Node::with_inputs(n, std::move(in));
    NodeRef r = expand(n, in);
    FJ_CHECK(r->type() == n->type(), "decompose changed the type of ", op_name(n->op()));
    return r;
  });
}

}  // namespace flowjit::jit
