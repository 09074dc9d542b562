// widen_half: half-precision matmuls, convolutions, collectives and family
// kernels in float32.
#include "jit/passes/widen_half.h"

namespace flowjit::jit {

using namespace ir;

namespace {

bool needs_widening(const NodeRef& n, bool f16_matmuls, bool bf16_matmuls) {
  if (!is_half(n->dtype())) return false;
  switch (n->op()) {
    case OpKind::MatMul:
      return !(n->dtype() == DType::Float16 ? f16_matmuls : bf16_matmuls);
    case OpKind::Conv:
    case OpKind::ConvDataGrad:
    case OpKind::ConvFilterGrad:
      return true;
    default:
      return is_collective(n->op()) || is_family(n->op());
  }
}

NodeRef cast_to(const NodeRef& x, DType t) {
  if (x->dtype() == t) return x;
  return make_node(OpKind::Cast, {x}, Attrs{{"dtype", t}}, x->loc());
}

}  // namespace

Graph widen_half(const Graph& g, bool f16_matmuls, bool bf16_matmuls) {
  return rewrite_graph(g, [&](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    if (!needs_widening(n, f16_matmuls, bf16_matmuls)) return Node::with_inputs(n, std::move(in));
    for (NodeRef& x : in)
      if (is_half(x->dtype())) x = cast_to(x, DType::Float32);
    NodeRef wide = make_node(n->op(), std::move(in), n->attrs(), n->loc());
    return cast_to(wide, n->dtype());
  });
}

}  // namespace flowjit::jit
