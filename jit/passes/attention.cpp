// attention: matmul-softmax-matmul to one attention op (attention.h).
#include "jit/passes/attention.h"

#include <cstdlib>
#include <cstring>
#include <optional>
#include <unordered_map>

namespace flowjit::jit {

using namespace ir;

namespace {

struct Match {
  NodeRef q, k, v, bias;  // bias may be null
  double scale = 1;
  bool causal = false;
  // dropout between the softmax and the second matmul: its rate, seed and
  // counter offset (offset null: none)
  double dropout = 0;
  int64_t seed = 0;
  NodeRef offset;
};

// The dim, counted from the last (0), whose index a node's values are:
// iota, and reshapes and casts of a node with one dim of extent above 1.
std::optional<int> index_dim(const NodeRef& n) {
  auto only_dim = [](const Shape& s) -> std::optional<int> {
    std::optional<int> d;
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] != 1) {
        if (d) return std::nullopt;
        d = static_cast<int>(s.size() - 1 - i);
      }
    return d;
  };
  switch (n->op()) {
    case OpKind::Iota:
      return n->rank() - 1 - static_cast<int>(n->attrs().get_int("axis"));
    case OpKind::Cast:
      return index_dim(n->input(0));
    case OpKind::Reshape: {
      const NodeRef& x = n->input(0);
      std::optional<int> in = index_dim(x), from = only_dim(x->shape()), to = only_dim(n->shape());
      if (!in || !from || !to || *in != *from) return std::nullopt;
      return to;
    }
    default:
      return std::nullopt;
  }
}

// Whether `bias` is c where key j > query i and 0 elsewhere, c a constant at
// or below -1e4 (-1e9 and -10000 are what programs write): exp underflows to
// 0 for every masked score whose row's scores spread less than -c - 104, so
// skipping the masked keys (causal) is the same softmax.
bool causal_mask(const NodeRef& bias) {
  auto mask = [](const NodeRef& m) {
    NodeRef c = m->op() == OpKind::Cast ? m->input(0) : m;
    if (c->op() != OpKind::Greater && c->op() != OpKind::Less) return false;
    std::optional<int> a = index_dim(c->input(0)), b = index_dim(c->input(1));
    if (c->op() == OpKind::Less) std::swap(a, b);
    return a == 0 && b == 1;  // key index > query index
  };
  auto big = [](const NodeRef& c) {
    return c->op() == OpKind::Fill && c->rank() == 0 && c->attrs().get_float("value") <= -1e4;
  };
  const Shape& s = bias->shape();
  if (s.size() < 2 || s[s.size() - 1] != s[s.size() - 2]) return false;
  if (bias->op() == OpKind::Reshape) {  // leading 1s added or dropped
    const Shape& x = bias->input(0)->shape();
    for (const Shape* t : {&s, &x})
      for (size_t i = 0; i + 2 < t->size(); ++i)
        if ((*t)[i] != 1) return false;
    return x.size() >= 2 && x.back() == s.back() && x[x.size() - 2] == s[s.size() - 2] &&
           causal_mask(bias->input(0));
  }
  if (bias->op() == OpKind::Mul)
    return (mask(bias->input(0)) && big(bias->input(1))) ||
           (mask(bias->input(1)) && big(bias->input(0)));
  return false;
}

// Whether `keep` is true on and below the diagonal (key j <= query i):
// less_equal(j - i, 0) of iotas, as fused_scale_tril writes it.
bool tril(const NodeRef& keep) {
  if (keep->op() != OpKind::LessEqual) return false;
  const NodeRef &d = keep->input(0), &zero = keep->input(1);
  if (d->op() != OpKind::Sub || zero->op() != OpKind::Fill || zero->rank() != 0 ||
      zero->attrs().get_float("value") != 0.0)
    return false;
  return index_dim(d->input(0)) == 0 && index_dim(d->input(1)) == 1;
}

class Matcher {
 public:
  // Uses per node of the original graph; `old_of` maps a rewritten node to
  // the node it replaced.
  std::unordered_map<const Node*, int> uses;
  std::unordered_map<const Node*, const Node*> old_of;

  bool single(const NodeRef& n) const {
    auto o = old_of.find(n.get());
    auto u = uses.find(o == old_of.end() ? n.get() : o->second);
    return u != uses.end() && u->second == 1;
  }

  static bool scalar_fill(const NodeRef& n) {
    return n->op() == OpKind::Fill && n->rank() == 0 && is_float(n->dtype());
  }

  // matmul(q, k, transpose_b), optionally times or over scalar constants
  // (matmul's alpha, then fused_scale_tril's scale, as OneFlow's GPT writes).
  bool scaled_scores(const NodeRef& y, Match& m) const {
    NodeRef s = y;
    m.scale = 1;
    while ((s->op() == OpKind::Mul || s->op() == OpKind::Div) && single(s)) {
      const NodeRef &a = s->input(0), &b = s->input(1);
      NodeRef next;
      if (scalar_fill(b)) {
        next = a;
        const double c = b->attrs().get_float("value");
        m.scale *= s->op() == OpKind::Mul ? c : 1.0 / c;
      } else if (s->op() == OpKind::Mul && scalar_fill(a)) {
        next = b;
        m.scale *= a->attrs().get_float("value");
      } else {
        return false;
      }
      if (next->shape() != y->shape()) return false;
      s = next;
    }
    if (s->op() != OpKind::MatMul || !single(s) || s->attrs().get_bool("transpose_a") ||
        !s->attrs().get_bool("transpose_b"))
      return false;
    m.q = s->input(0);
    m.k = s->input(1);
    return true;
  }

  // flow.nn.dropout(p) as python/flowjit/_conv.py writes it: where(
  // greater_equal(random_uniform_at(offset), rate), p * c, 0) with c = 1 /
  // (1 - rate) and the uniforms of p's shape and dtype; returns p.
  NodeRef dropout_of(const NodeRef& y, Match& m) const {
    if (y->op() != OpKind::Where || !single(y)) return nullptr;
    const NodeRef &cond = y->input(0), &kept = y->input(1), &zero = y->input(2);
    if (cond->op() != OpKind::GreaterEqual || kept->op() != OpKind::Mul || !single(kept) ||
        zero->op() != OpKind::Fill || !is_float(zero->dtype()) ||
        zero->attrs().get_float("value") != 0.0 || kept->shape() != y->shape())
      return nullptr;
    const NodeRef &u = cond->input(0), &rate = cond->input(1);
    if (u->op() != OpKind::RandomUniformAt || u->shape() != y->shape() ||
        u->dtype() != y->dtype() || !scalar_fill(rate))
      return nullptr;
    const double p = rate->attrs().get_float("value");
    const int side = scalar_fill(kept->input(1)) ? 1 : scalar_fill(kept->input(0)) ? 0 : -1;
    if (!(p > 0 && p < 1) || side < 0 ||
        kept->input(side)->attrs().get_float("value") != 1.0 / (1.0 - p))
      return nullptr;
    m.dropout = p;
    m.seed = u->attrs().get_int("seed");
    m.offset = u->input(0);
    return kept->input(1 - side);
  }

  std::optional<Match> match(const NodeRef& n, const std::vector<NodeRef>& in) const {
    if (n->op() != OpKind::MatMul || n->attrs().get_bool("transpose_a") ||
        n->attrs().get_bool("transpose_b"))
      return std::nullopt;
    Match m;
    NodeRef p = in[0];
    const NodeRef& v = in[1];
    if (NodeRef kept = dropout_of(p, m)) p = kept;
    const int r = p->rank();
    if (p->op() != OpKind::Softmax || !single(p) || r < 2 || p->attrs().get_int("axis") != r - 1 ||
        p->shape() != in[0]->shape())
      return std::nullopt;
    NodeRef x = p->input(0);
    // fused_scale_tril's causal mask: where(j - i <= 0, scores, c), c <= -1e4
    if (x->op() == OpKind::Where && single(x) && tril(x->input(0)) && scalar_fill(x->input(2)) &&
        x->input(2)->attrs().get_float("value") <= -1e4 && x->input(1)->shape() == x->shape() &&
        x->shape()[r - 1] == x->shape()[r - 2]) {
      m.causal = true;
      x = x->input(1);
    }
    bool ok = scaled_scores(x, m);
    if (!ok && x->op() == OpKind::Add && single(x)) {
      for (int side = 0; side < 2 && !ok; ++side) {
        ok = scaled_scores(x->input(side), m) && x->input(side)->shape() == x->shape();
        if (ok) m.bias = x->input(1 - side);
      }
    }
    if (!ok) return std::nullopt;
    if (m.bias && causal_mask(m.bias) && m.bias->shape()[m.bias->rank() - 1] == x->shape()[r - 1] &&
        x->shape()[r - 1] == x->shape()[r - 2]) {
      m.causal = true;
      m.bias = nullptr;
    }
    m.v = v;
    const Shape& qs = m.q->shape();
    // float32 and float64 (half attention would round the log-sum-exp column)
    const DType dt = m.q->dtype();
    if ((dt != DType::Float32 && dt != DType::Float64) || m.k->rank() != r || v->rank() != r ||
        m.q->rank() != r || !std::equal(qs.begin(), qs.end() - 2, m.k->shape().begin()) ||
        !std::equal(qs.begin(), qs.end() - 2, v->shape().begin()))
      return std::nullopt;
    return m;
  }
};

// The bias as the attention op takes it: q's rank, batch dims 1 but for one
// run equal to q's (ir/infer.cpp), else broadcast over the batch dims.
NodeRef attention_bias(const NodeRef& bias, const NodeRef& q, const Shape& scores) {
  const int r = q->rank();
  if (!bias) return fill(0, Shape(r, 1), q->dtype(), q->loc());
  Shape s(r - bias->rank(), 1);
  s.insert(s.end(), bias->shape().begin(), bias->shape().end());
  NodeRef b = s == bias->shape() ? bias : reshape(bias, s);
  int runs = 0;
  for (int i = 0; i + 2 < r; ++i) {
    const bool full = s[i] != 1;
    if (full && (i == 0 || s[i - 1] == 1)) ++runs;
  }
  if (runs > 1) {
    Shape wide(scores.begin(), scores.end() - 2);
    wide.push_back(s[r - 2]);
    wide.push_back(s[r - 1]);
    b = broadcast(b, wide);
  }
  return b;
}

}  // namespace

int64_t attention_min_score_bytes() {
  const char* e = std::getenv("FLOWJIT_FUSE_ATTENTION");
  if (e != nullptr && std::strcmp(e, "0") == 0) return -1;
  if (e != nullptr && std::strcmp(e, "1") == 0) return 0;
  return int64_t{256} << 20;
}

Graph fuse_attention(const Graph& g, std::vector<NodeRef>& keep, std::vector<NodeRef>& watched,
                     int64_t min_score_bytes) {
  Graph all = g;
  const size_t n_out = g.outputs.size();
  for (auto& k : keep) all.outputs.push_back(k);
  for (auto& w : watched) all.outputs.push_back(w);
  Matcher mt;
  for (const NodeRef& n : all.topo_order())
    for (const NodeRef& i : n->inputs()) ++mt.uses[i.get()];
  for (const auto* roots : {&all.outputs, &all.effects})
    for (const NodeRef& n : *roots) ++mt.uses[n.get()];
  Graph r = rewrite_graph(all, [&](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    NodeRef out;
    std::optional<Match> m = mt.match(n, in);
    if (m && min_score_bytes > 0) {  // the rule of attention.h
      const Shape& s = in[0]->shape();
      const int64_t per_group = s[s.size() - 1] * s[s.size() - 2];
      if (per_group < (m->offset ? kLongDroppedScores : kLongScores) &&
          in[0]->type().numel() * dtype_bytes(in[0]->dtype()) < min_score_bytes)
        m = std::nullopt;
    }
    if (m) {
      NodeRef bias = attention_bias(m->bias, m->q, in[0]->shape());
      IntList swap;
      for (int i = 0; i < m->k->rank(); ++i) swap.push_back(i);
      std::swap(swap[swap.size() - 1], swap[swap.size() - 2]);
      std::vector<NodeRef> operands = {m->q, transpose(m->k, swap), m->v, bias};
      if (m->offset) operands.push_back(m->offset);
      NodeRef both = make_node(OpKind::Attention, operands,
                               Attrs{{"causal", m->causal},
                                     {"dropout", m->dropout},
                                     {"scale", m->scale},
                                     {"seed", m->seed}},
                               n->loc());
      // its rows end with each query's log-sum-exp (ops.def): the output is the rest
      const int r = both->rank();
      out =
          make_node(OpKind::Slice, {both},
                    Attrs{{"begin", IntList(r, 0)}, {"step", IntList(r, 1)}, {"shape", n->shape()}},
                    n->loc());
    } else {
      out = Node::with_inputs(n, std::move(in));
    }
    mt.old_of[out.get()] = n.get();
    return out;
  });
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = r.outputs[n_out + i];
  for (size_t i = 0; i < watched.size(); ++i) watched[i] = r.outputs[n_out + keep.size() + i];
  r.outputs.resize(n_out);
  return r;
}

}  // namespace flowjit::jit
