// auto_mixed_precision: OneFlow's allow/infer/deny lists over the forward graph.
#include "jit/passes/auto_mixed_precision.h"

#include "ir/error.h"

namespace flowjit::jit {

using namespace ir;

namespace {

enum class List { Allow, Infer, Deny };

List list_of(OpKind op) {
  switch (op) {
    case OpKind::MatMul:
    case OpKind::Conv:
      return List::Allow;
    case OpKind::Identity:
    case OpKind::Neg:
    case OpKind::Abs:
    case OpKind::Relu:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Square:
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Where:
    case OpKind::Reshape:
    case OpKind::Transpose:
    case OpKind::Broadcast:
    case OpKind::Window:
    case OpKind::Pad:
    case OpKind::Slice:
    case OpKind::Gather:
    case OpKind::GatherNd:
      return List::Infer;
    default:
      return List::Deny;
  }
}

NodeRef cast_to(const NodeRef& x, DType t) {
  if (x->dtype() == t) return x;
  return make_node(OpKind::Cast, {x}, Attrs{{"dtype", t}}, x->loc());
}

}  // namespace

Graph auto_mixed_precision(const Graph& g, DType half, std::vector<NodeRef>& keep,
                           std::vector<NodeRef>& watched) {
  FJ_CHECK(is_half(half), "auto_mixed_precision: ", dtype_name(half), " is not a half type");
  // One graph over every root, so `keep` and `watched` are mapped with the outputs.
  Graph all = g;
  size_t n_out = g.outputs.size();
  for (auto& k : keep) all.outputs.push_back(k);
  for (auto& w : watched) all.outputs.push_back(w);
  Graph r = rewrite_graph(all, [&](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    const auto& orig = n->inputs();
    List list = list_of(n->op());
    bool to_half = list == List::Allow && n->dtype() == DType::Float32;
    if (list == List::Infer && n->dtype() == DType::Float32)
      for (size_t i = 0; i < in.size(); ++i)
        if (orig[i]->dtype() == DType::Float32 && in[i]->dtype() == half) to_half = true;
    bool changed = false;
    for (size_t i = 0; i < in.size(); ++i) {
      // Inputs that were float32: half in a half op, float32 (as before) in any other.
      DType want = to_half && orig[i]->dtype() == DType::Float32 ? half : orig[i]->dtype();
      NodeRef x = cast_to(in[i], want);
      changed = changed || x != in[i] || in[i] != orig[i];
      in[i] = x;
    }
    if (!changed) return n;
    return make_node(n->op(), std::move(in), n->attrs(), n->loc());
  });
  Graph out;
  out.name = g.name;
  out.params = r.params;
  out.effects = r.effects;
  for (size_t i = 0; i < n_out; ++i)
    out.outputs.push_back(cast_to(r.outputs[i], g.outputs[i]->dtype()));
  for (size_t i = 0; i < keep.size(); ++i)
    keep[i] = cast_to(r.outputs[n_out + i], keep[i]->dtype());
  for (size_t i = 0; i < watched.size(); ++i) watched[i] = r.outputs[n_out + keep.size() + i];
  return out;
}

}  // namespace flowjit::jit
