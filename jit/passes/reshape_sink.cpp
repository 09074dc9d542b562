// reshape_sink: reshapes below elementwise ops (see the header).
#include "jit/passes/reshape_sink.h"

#include <optional>
#include <unordered_set>

namespace flowjit::jit {

using namespace ir;

namespace {

// The groups of a reshape from `from` to `to`: pairs of half-open dim
// ranges with equal products, as fine as possible (extent-1 dims join the
// group before them, or the first).
struct Group {
  size_t f0, f1, t0, t1;
};

std::optional<std::vector<Group>> reshape_groups(const Shape& from, const Shape& to) {
  std::vector<Group> out;
  size_t i = 0, j = 0;
  while (i < from.size() || j < to.size()) {
    Group g{i, i, j, j};
    int64_t pf = 1, pt = 1;
    // Take at least one dim from each side, then grow the smaller product.
    if (i < from.size()) pf *= from[i++];
    if (j < to.size()) pt *= to[j++];
    while (pf != pt) {
      if (pf < pt && i < from.size()) {
        pf *= from[i++];
      } else if (pt < pf && j < to.size()) {
        pt *= to[j++];
      } else {
        return std::nullopt;
      }
    }
    // Trailing extent-1 dims belong to this group.
    while (i < from.size() && from[i] == 1 && (j >= to.size() || to[j] != 1)) ++i;
    while (j < to.size() && to[j] == 1 && (i >= from.size() || from[i] != 1)) ++j;
    g.f1 = i;
    g.t1 = j;
    out.push_back(g);
  }
  return out;
}

// `b` (broadcasting to `to`) written in the shape `from`, or null when some
// group of b is neither whole nor broadcast.
NodeRef in_shape(const NodeRef& b0, const Shape& from, const Shape& to,
                 const std::vector<Group>& groups) {
  NodeRef b =
      b0->op() == OpKind::Broadcast ? b0->input(0) : b0;  // numpy broadcasting does the same
  if (b->rank() > static_cast<int>(to.size())) return nullptr;
  Shape bs(to.size() - b->rank(), 1);
  bs.insert(bs.end(), b->shape().begin(), b->shape().end());
  Shape want;
  for (const Group& g : groups) {
    bool whole = true, unit = true;
    for (size_t d = g.t0; d < g.t1; ++d) {
      whole &= bs[d] == to[d];
      unit &= bs[d] == 1;
    }
    if (!whole && !unit) return nullptr;
    for (size_t d = g.f0; d < g.f1; ++d) want.push_back(unit ? 1 : from[d]);
  }
  if (num_elements(want) != b->type().numel()) return nullptr;
  return reshape(b, want);
}

}  // namespace

Graph reshape_sink(const Graph& g) {
  // Reshapes of contractions sink, and keep sinking below the ops they
  // passed (other reshapes stay: below an assign's value they would cost a copy).
  std::unordered_set<const Node*> sunk;
  return rewrite_graph(g, [&](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    if (!is_elementwise(n->op())) return Node::with_inputs(n, std::move(in));
    int pick = -1;
    for (size_t i = 0; i < in.size(); ++i) {
      const NodeRef& r = in[i];
      if (r->op() != OpKind::Reshape || r->shape() != n->shape() || r->input(0)->rank() == 0)
        continue;
      if (is_contraction(r->input(0)->op()) || sunk.count(r->input(0).get())) {
        pick = static_cast<int>(i);
        break;
      }
    }
    if (pick < 0) return Node::with_inputs(n, std::move(in));
    const NodeRef& a = in[pick]->input(0);
    auto groups = reshape_groups(a->shape(), n->shape());
    if (!groups) return Node::with_inputs(n, std::move(in));
    std::vector<NodeRef> ops(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      ops[i] = static_cast<int>(i) == pick ? a : in_shape(in[i], a->shape(), n->shape(), *groups);
      if (!ops[i]) return Node::with_inputs(n, std::move(in));
    }
    NodeRef m = make_node(n->op(), ops, n->attrs(), n->loc());
    if (m->shape() != a->shape()) return Node::with_inputs(n, std::move(in));
    sunk.insert(m.get());
    return reshape(m, n->shape());
  });
}

}  // namespace flowjit::jit
