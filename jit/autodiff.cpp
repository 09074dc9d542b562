// autodiff: reverse-mode differentiation on the IR, one VJP rule per op.
#include "jit/autodiff.h"

#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "ir/graph.h"

namespace flowjit::jit {

using namespace ir;

namespace {

using Grads = std::vector<NodeRef>;  // one per operand; nullptr: no gradient

NodeRef c(double v, const NodeRef& like) { return scalar_like(v, like); }
NodeRef add(const NodeRef& a, const NodeRef& b) { return binary(OpKind::Add, a, b); }
NodeRef sub(const NodeRef& a, const NodeRef& b) { return binary(OpKind::Sub, a, b); }
NodeRef mul(const NodeRef& a, const NodeRef& b) { return binary(OpKind::Mul, a, b); }
NodeRef div(const NodeRef& a, const NodeRef& b) { return binary(OpKind::Div, a, b); }
NodeRef neg(const NodeRef& a) { return unary(OpKind::Neg, a); }

// The gradient of a reduction output, reshaped to keepdims form and
// broadcast back to the operand's shape.
NodeRef unreduce(const NodeRef& dy, const NodeRef& n) {
  const NodeRef& x = n->input(0);
  Shape keep = x->shape();
  for (int64_t a : n->attrs().get_ints("axes")) keep[a] = 1;
  return broadcast(reshape(dy, keep), x->shape());
}

NodeRef unreduce_value(const NodeRef& n) { return unreduce(n, n); }

// ---- one rule per differentiable op (ops.def: grad = Rule)

Grads vjp_Identity(const NodeRef&, const NodeRef& dy) { return {dy}; }
Grads vjp_Cast(const NodeRef& n, const NodeRef& dy) {
  const NodeRef& x = n->input(0);
  if (!gradient_flows_into(OpKind::Cast, x->dtype())) return {nullptr};
  return {cast(dy, x->dtype())};
}
Grads vjp_Neg(const NodeRef&, const NodeRef& dy) { return {neg(dy)}; }
Grads vjp_Abs(const NodeRef& n, const NodeRef& dy) {
  return {mul(dy, unary(OpKind::Sign, n->input(0)))};
}
Grads vjp_Exp(const NodeRef& n, const NodeRef& dy) { return {mul(dy, n)}; }
Grads vjp_Log(const NodeRef& n, const NodeRef& dy) { return {div(dy, n->input(0))}; }
Grads vjp_Sqrt(const NodeRef& n, const NodeRef& dy) { return {div(dy, mul(c(2, n), n))}; }
Grads vjp_Rsqrt(const NodeRef& n, const NodeRef& dy) {
  // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
  return {mul(dy, mul(c(-0.5, n), mul(n, mul(n, n))))};
}
Grads vjp_Square(const NodeRef& n, const NodeRef& dy) {
  return {mul(dy, mul(c(2, n), n->input(0)))};
}
Grads vjp_Reciprocal(const NodeRef& n, const NodeRef& dy) { return {neg(mul(dy, mul(n, n)))}; }
Grads vjp_Tanh(const NodeRef& n, const NodeRef& dy) { return {mul(dy, sub(c(1, n), mul(n, n)))}; }
Grads vjp_Sigmoid(const NodeRef& n, const NodeRef& dy) {
  return {mul(dy, mul(n, sub(c(1, n), n)))};
}
Grads vjp_Relu(const NodeRef& n, const NodeRef& dy) {
  // Masked by the output (y > 0 iff x > 0), which is already materialized.
  return {where(binary(OpKind::Greater, n, c(0, n)), dy, c(0, dy))};
}
Grads vjp_Sin(const NodeRef& n, const NodeRef& dy) {
  return {mul(dy, unary(OpKind::Cos, n->input(0)))};
}
Grads vjp_Cos(const NodeRef& n, const NodeRef& dy) {
  return {neg(mul(dy, unary(OpKind::Sin, n->input(0))))};
}
// d/dx erf(x) = 2/sqrt(pi) e^(-x^2); erfc = 1 - erf has the opposite sign.
NodeRef erf_slope(const NodeRef& x, double scale) {
  return mul(c(scale, x), unary(OpKind::Exp, neg(mul(x, x))));
}
Grads vjp_Erf(const NodeRef& n, const NodeRef& dy) {
  return {mul(dy, erf_slope(n->input(0), 1.1283791670955126))};
}
Grads vjp_Erfc(const NodeRef& n, const NodeRef& dy) {
  return {mul(dy, erf_slope(n->input(0), -1.1283791670955126))};
}

Grads vjp_Add(const NodeRef& n, const NodeRef& dy) {
  return {sum_to_shape(dy, n->input(0)->shape()), sum_to_shape(dy, n->input(1)->shape())};
}
Grads vjp_Sub(const NodeRef& n, const NodeRef& dy) {
  return {sum_to_shape(dy, n->input(0)->shape()), sum_to_shape(neg(dy), n->input(1)->shape())};
}
Grads vjp_Mul(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &a = n->input(0), &b = n->input(1);
  return {sum_to_shape(mul(dy, b), a->shape()), sum_to_shape(mul(dy, a), b->shape())};
}
Grads vjp_Div(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &a = n->input(0), &b = n->input(1);
  return {sum_to_shape(div(dy, b), a->shape()), sum_to_shape(neg(div(mul(dy, n), b)), b->shape())};
}
Grads vjp_Pow(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &a = n->input(0), &b = n->input(1);
  NodeRef da = mul(dy, mul(b, binary(OpKind::Pow, a, sub(b, c(1, b)))));
  NodeRef db = mul(dy, mul(n, unary(OpKind::Log, a)));
  return {sum_to_shape(da, a->shape()), sum_to_shape(db, b->shape())};
}
Grads vjp_Maximum(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &a = n->input(0), &b = n->input(1);
  NodeRef pick_a = binary(OpKind::GreaterEqual, a, b);
  return {sum_to_shape(where(pick_a, dy, c(0, dy)), a->shape()),
          sum_to_shape(where(pick_a, c(0, dy), dy), b->shape())};
}
Grads vjp_Minimum(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &a = n->input(0), &b = n->input(1);
  NodeRef pick_a = binary(OpKind::LessEqual, a, b);
  return {sum_to_shape(where(pick_a, dy, c(0, dy)), a->shape()),
          sum_to_shape(where(pick_a, c(0, dy), dy), b->shape())};
}
Grads vjp_Where(const NodeRef& n, const NodeRef& dy) {
  const NodeRef& cond = n->input(0);
  return {nullptr, sum_to_shape(where(cond, dy, c(0, dy)), n->input(1)->shape()),
          sum_to_shape(where(cond, c(0, dy), dy), n->input(2)->shape())};
}

Grads vjp_ReduceSum(const NodeRef& n, const NodeRef& dy) { return {unreduce(dy, n)}; }
// Max and min: the gradient is shared equally by the elements that attain
// the extreme value (as TensorFlow and OneFlow do).
Grads vjp_extreme(const NodeRef& n, const NodeRef& dy) {
  const NodeRef& x = n->input(0);
  NodeRef hit = cast(binary(OpKind::Equal, x, unreduce_value(n)), x->dtype());
  NodeRef count = reduce(OpKind::ReduceSum, hit, n->attrs().get_ints("axes"), true);
  return {mul(unreduce(dy, n), div(hit, broadcast(count, x->shape())))};
}
Grads vjp_ReduceMax(const NodeRef& n, const NodeRef& dy) { return vjp_extreme(n, dy); }
Grads vjp_ReduceMin(const NodeRef& n, const NodeRef& dy) { return vjp_extreme(n, dy); }
Grads vjp_ReduceProd(const NodeRef& n, const NodeRef& dy) {
  return {div(mul(unreduce(dy, n), unreduce_value(n)), n->input(0))};
}

Grads vjp_Reshape(const NodeRef& n, const NodeRef& dy) {
  return {reshape(dy, n->input(0)->shape())};
}
Grads vjp_Transpose(const NodeRef& n, const NodeRef& dy) {
  const IntList& perm = n->attrs().get_ints("perm");
  IntList inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return {transpose(dy, inv)};
}
Grads vjp_Broadcast(const NodeRef& n, const NodeRef& dy) {
  return {sum_to_shape(dy, n->input(0)->shape())};
}

IntList swap_last_two(int rank) {
  IntList p(rank);
  for (int i = 0; i < rank; ++i) p[i] = i;
  std::swap(p[rank - 1], p[rank - 2]);
  return p;
}

// Convolutions (ir/conv.h): the data gradient and the filter gradient are
// implicit GEMMs of their own, with the forward op's geometry.
Attrs conv_attrs(const NodeRef& n) {
  Attrs a;
  for (const char* key : {"strides", "dilations", "pads_lo", "pads_hi", "groups"})
    if (const AttrValue* v = n->attrs().find(key)) a.set(key, *v);
  return a;
}
Grads vjp_Conv(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &x = n->input(0), &w = n->input(1);
  Attrs da = conv_attrs(n);
  da.set("in_spatial", IntList(x->shape().begin() + 2, x->shape().end()));
  Attrs fa = conv_attrs(n);
  fa.set("kernel", IntList(w->shape().begin() + 2, w->shape().end()));
  NodeRef dx = make_node(OpKind::ConvDataGrad, {dy, w}, da, n->loc());
  NodeRef dw = make_node(OpKind::ConvFilterGrad, {x, dy}, fa, n->loc());
  return {reshape(dx, x->shape()), reshape(dw, w->shape())};
}
// A window's gradient: every window element's gradient summed back at the
// input position it was read from (unwindow, then a sum over the taps).
Grads vjp_Window(const NodeRef& n, const NodeRef& dy) {
  const NodeRef& x = n->input(0);
  const IntList& k = n->attrs().get_ints("window");
  int S = static_cast<int>(k.size());
  Attrs a = conv_attrs(n);
  a.set("window", k);
  a.set("pad_value", 0.0);
  a.set("in_spatial", IntList(x->shape().end() - S, x->shape().end()));
  NodeRef u = make_node(OpKind::Unwindow, {dy}, a, n->loc());
  IntList taps;
  for (int i = 0; i < S; ++i) taps.push_back(u->rank() - S + i);
  return {reduce(OpKind::ReduceSum, u, taps, false)};
}

// Array views (ir/array.h). A pad's gradient is the strided slice it
// placed its operand at; a slice's is the pad that puts it back.
Grads vjp_Pad(const NodeRef& n, const NodeRef& dy) {
  const Attrs& a = n->attrs();
  IntList step = a.get_ints("interior");
  for (auto& s : step) s += 1;
  Attrs sa{{"begin", a.get_ints("pads_lo")}, {"step", step}, {"shape", n->input(0)->shape()}};
  return {make_node(OpKind::Slice, {dy}, sa, n->loc())};
}
Grads vjp_Slice(const NodeRef& n, const NodeRef& dy) {
  const Shape& x = n->input(0)->shape();
  const IntList &begin = n->attrs().get_ints("begin"), &step = n->attrs().get_ints("step");
  const Shape& out = n->shape();
  int r = n->rank();
  IntList lo(r), hi(r), interior(r), rbegin(r), rstep(r, 1);
  bool reverse = false;
  for (int d = 0; d < r; ++d) {
    if (out[d] == 0) {  // nothing was read: the gradient is all padding
      lo[d] = x[d];
      hi[d] = interior[d] = 0;
      continue;
    }
    int64_t last = begin[d] + (out[d] - 1) * step[d];
    int64_t first = std::min(begin[d], last);
    lo[d] = first;
    hi[d] = x[d] - 1 - std::max(begin[d], last);
    interior[d] = std::abs(step[d]) - 1;
    if (step[d] < 0) {
      reverse = true;
      rbegin[d] = out[d] - 1;
      rstep[d] = -1;
    }
  }
  NodeRef g = dy;
  if (reverse)
    g = make_node(OpKind::Slice, {dy}, Attrs{{"begin", rbegin}, {"step", rstep}, {"shape", out}},
                  n->loc());
  Attrs pa{{"pads_lo", lo}, {"pads_hi", hi}, {"interior", interior}, {"pad_value", 0.0}};
  return {make_node(OpKind::Pad, {g}, pa, n->loc())};
}

// Gathers: the gradient of params is a segment sum of dy whose segment ids
// are the (clamped) indices: one segment_sum kernel (codegen/families), whose
// cost is that of reading dy once, not of comparing every index with every
// params row.
NodeRef clamp_index(const NodeRef& idx, int64_t extent) {
  NodeRef hi =
      fill(static_cast<double>(std::max<int64_t>(extent - 1, 0)), {}, idx->dtype(), idx->loc());
  return binary(OpKind::Maximum, binary(OpKind::Minimum, idx, hi),
                fill(0, {}, idx->dtype(), idx->loc()));
}
// The segment ids of a gather's gradient. A gather whose indices are
// checked (check_index) fails its run on an index out of range, and a failed
// run writes no variable, so the unchecked indices serve; an unchecked
// gather clamps, and so do its segment ids (the gradient goes to the element
// that was read).
NodeRef gather_segment_ids(const NodeRef& n, int64_t extent) {
  const NodeRef& x = n->input(1);
  return x->op() == OpKind::CheckIndex ? x->input(0) : clamp_index(x, extent);
}
NodeRef segment_sum(const NodeRef& data, const NodeRef& ids, int64_t axis, int64_t batch_dims,
                    int64_t segments, const SourceLoc& loc) {
  return make_node(OpKind::SegmentSum, {data, ids},
                   Attrs{{"axis", axis}, {"batch_dims", batch_dims}, {"num_segments", segments}},
                   loc);
}
Grads vjp_Gather(const NodeRef& n, const NodeRef& dy) {
  const NodeRef& p = n->input(0);
  if (!is_float(p->dtype())) return {nullptr, nullptr};
  int64_t axis = n->attrs().get_int("axis"), bd = n->attrs().get_int("batch_dims");
  int64_t extent = p->shape()[axis];
  return {segment_sum(dy, gather_segment_ids(n, extent), axis, bd, extent, n->loc()), nullptr};
}
// gather_nd: the K index components flattened into one id over params'
// first K dims (in int64), then a segment sum over the index dims.
Grads vjp_GatherNd(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &p = n->input(0), &x = n->input(1);
  const NodeRef& idx = x->op() == OpKind::CheckIndex ? x->input(0) : x;
  if (!is_float(p->dtype())) return {nullptr, nullptr};
  const Shape &ps = p->shape(), &is = idx->shape();
  int k = static_cast<int>(is.back());
  Shape lead(is.begin(), is.end() - 1);
  NodeRef flat;
  int64_t segments = 1;
  for (int c0 = k - 1; c0 >= 0; --c0) {
    IntList begin(is.size(), 0), step(is.size(), 1);
    Shape one = is;
    begin.back() = c0;
    one.back() = 1;
    NodeRef comp = make_node(OpKind::Slice, {idx},
                             Attrs{{"begin", begin}, {"step", step}, {"shape", one}}, n->loc());
    comp = make_node(OpKind::Cast, {reshape(clamp_index(comp, ps[c0]), lead)},
                     Attrs{{"dtype", DType::Int64}}, n->loc());
    if (segments != 1) comp = mul(comp, fill(static_cast<double>(segments), {}, DType::Int64));
    flat = flat ? add(flat, comp) : comp;
    segments *= ps[c0];
  }
  Shape rows{segments};
  rows.insert(rows.end(), ps.begin() + k, ps.end());
  return {reshape(segment_sum(dy, flat, 0, 0, segments, n->loc()), ps), nullptr};
}
// segment_sum: each data row receives its segment's gradient, a gather of dy
// by the ids; rows whose id is out of range (dropped) receive zero.
Grads vjp_SegmentSum(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &data = n->input(0), &ids = n->input(1);
  if (!is_float(data->dtype())) return {nullptr, nullptr};
  int64_t axis = n->attrs().get_int("axis"), bd = n->attrs().get_int("batch_dims"),
          segments = n->attrs().get_int("num_segments");
  if (segments == 0) return {fill(0, data->shape(), data->dtype(), n->loc()), nullptr};
  NodeRef g = make_node(OpKind::Gather, {dy, clamp_index(ids, segments)},
                        Attrs{{"axis", axis}, {"batch_dims", bd}}, n->loc());
  // in range: ids as [batch dims, 1 per other outer dim, ids' dims, 1 per inner dim]
  const Shape& ds = data->shape();
  Shape mask_shape(ids->shape().begin(), ids->shape().begin() + bd);
  mask_shape.resize(axis, 1);
  mask_shape.insert(mask_shape.end(), ids->shape().begin() + bd, ids->shape().end());
  mask_shape.resize(ds.size(), 1);
  NodeRef in_range = binary(
      OpKind::LogicalAnd, binary(OpKind::GreaterEqual, ids, fill(0, {}, ids->dtype(), ids->loc())),
      binary(OpKind::Less, ids, fill(static_cast<double>(segments), {}, ids->dtype(), ids->loc())));
  return {where(broadcast(reshape(in_range, mask_shape), ds), g, c(0, g)), nullptr};
}

// attention(q, kt, v, bias): the flash-attention backward. It reads each
// query's log-sum-exp from the forward's result and delta = sum(dy * out);
// the gradients recompute the probabilities block by block (ops.def).
Grads vjp_Attention(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &q = n->input(0), &kt = n->input(1), &v = n->input(2), &bias = n->input(3);
  const Attrs& a = n->attrs();
  const bool causal = a.get_bool("causal");
  const double scale = a.get_float("scale");
  const IntList swap = swap_last_two(n->rank());
  // n is [..., Lq, Dv + 1]: the output rows, then each query's log-sum-exp,
  // whose gradient is not asked for (only this rule reads it).
  const int r = n->rank();
  auto last = [&](const NodeRef& x, int64_t from, int64_t width) {
    IntList begin(r, 0), step(r, 1);
    Shape shape = x->shape();
    begin[r - 1] = from;
    shape[r - 1] = width;
    return make_node(OpKind::Slice, {x}, Attrs{{"begin", begin}, {"step", step}, {"shape", shape}},
                     n->loc());
  };
  const int64_t d = q->shape()[r - 1], dv = v->shape()[r - 1];
  const NodeRef dout = last(dy, 0, dv);
  Shape rows = n->shape();
  rows.pop_back();
  NodeRef lse = reshape(last(n, dv, 1), rows);
  NodeRef delta = reduce(OpKind::ReduceSum, mul(dout, last(n, 0, dv)), {r - 1}, /*keepdims=*/false);
  std::vector<NodeRef> operands = {q,
                                   transpose(kt, swap),
                                   v,
                                   bias,
                                   dout,
                                   lse,
                                   delta,
                                   transpose(q, swap),
                                   kt,
                                   transpose(v, swap),
                                   transpose(dout, swap)};
  // With dropout, the gradients draw the forward's mask again (its counter
  // offset is the forward's last operand).
  const double dropout = a.get_float("dropout");
  if (dropout > 0) operands.push_back(n->input(4));
  auto grad = [&](int64_t wrt) {
    return make_node(OpKind::AttentionGrad, operands,
                     Attrs{{"causal", causal},
                           {"dropout", dropout},
                           {"scale", scale},
                           {"seed", a.get_int("seed")},
                           {"wrt", wrt}},
                     n->loc());
  };
  // dk and dv from one kernel, side by side: [..., Lk, D + Dv]
  NodeRef dkv = grad(4);
  Grads g = {grad(0), transpose(last(dkv, 0, d), swap), last(dkv, d, dv),
             sum_to_shape(grad(3), bias->shape())};
  if (dropout > 0) g.push_back(nullptr);  // the counter offset
  return g;
}

Grads vjp_MatMul(const NodeRef& n, const NodeRef& dy) {
  const NodeRef &a = n->input(0), &b = n->input(1);
  bool ta = n->attrs().get_bool("transpose_a"), tb = n->attrs().get_bool("transpose_b");
  int r = a->rank();
  // C = op(A) op(B). The classic identities:
  //   dop(A) = dC op(B)^T,  dop(B) = op(A)^T dC
  // written with flags so that no explicit transpose is materialized.
  NodeRef da, db;
  bool b_shared = b->rank() == 2 && r > 2;  // b broadcast over a's batch
  if (!ta) {
    da = matmul(dy, b, false, !tb);
  } else {
    // dA = op(B) dC^T, produced as (dC op(B)^T)^T when b is shared.
    da =
        b_shared ? transpose(matmul(dy, b, false, !tb), swap_last_two(r)) : matmul(b, dy, tb, true);
  }
  if (!b_shared) {
    db = !tb ? matmul(a, dy, !ta, false) : matmul(dy, a, true, ta);
  } else if (!ta) {
    // Fold a's batch into rows: dB = A2^T dC2 (or its transpose).
    int64_t k = a->shape()[r - 1], nn = dy->shape()[r - 1];
    NodeRef a2 = reshape(a, {k ? a->type().numel() / k : 0, k});
    NodeRef dy2 = reshape(dy, {nn ? dy->type().numel() / nn : 0, nn});
    db = !tb ? matmul(a2, dy2, true, false) : matmul(dy2, a2, true, false);
  } else {
    // Batched products, then summed over the batch axes.
    IntList batch;
    for (int i = 0; i < r - 2; ++i) batch.push_back(i);
    NodeRef per = !tb ? matmul(a, dy, false, false) : matmul(dy, a, true, true);
    db = reduce(OpKind::ReduceSum, per, batch, false);
  }
  return {da, db};
}

Grads vjp_Softmax(const NodeRef& n, const NodeRef& dy) {
  int64_t axis = n->attrs().get_int("axis");
  NodeRef s = reduce(OpKind::ReduceSum, mul(dy, n), {axis}, true);
  return {mul(n, sub(dy, s))};
}
Grads vjp_LogSoftmax(const NodeRef& n, const NodeRef& dy) {
  int64_t axis = n->attrs().get_int("axis");
  NodeRef s = reduce(OpKind::ReduceSum, dy, {axis}, true);
  return {sub(dy, mul(unary(OpKind::Exp, n), s))};
}
Grads vjp_SparseCrossEntropy(const NodeRef& n, const NodeRef& dy) {
  // dlogits = (softmax(logits) - one_hot(labels)) * dy[..., None]
  const NodeRef &labels = n->input(0), &logits = n->input(1);
  int64_t axis = logits->rank() - 1;
  NodeRef p = make_node(OpKind::Softmax, {logits}, Attrs{{"axis", axis}}, n->loc());
  NodeRef oh = make_node(OpKind::OneHot, {labels},
                         Attrs{{"depth", logits->shape()[axis]},
                               {"dtype", logits->dtype()},
                               {"on_value", 1.0},
                               {"off_value", 0.0}},
                         n->loc());
  Shape col = labels->shape();
  col.push_back(1);
  return {nullptr, mul(sub(p, oh), reshape(dy, col))};
}

Grads vjp(const NodeRef& n, const NodeRef& dy) {
  switch (n->op()) {
#define RULE_Rule(E) \
  case OpKind::E:    \
    return vjp_##E(n, dy);
#define RULE_Zero(E)
#define RULE_None(E)
#define OP(E, name, arity, traits, grad) RULE_##grad(E)
#include "ir/ops.def"
#undef RULE_Rule
#undef RULE_Zero
#undef RULE_None
    default:
      break;
  }
  FJ_CHECK(false, "no VJP rule dispatched for ", op_name(n->op()));
}

}  // namespace

bool gradient_flows_into(OpKind op, DType operand) {
  if (is_float(operand)) return true;
  if (!is_int(operand)) return false;
  switch (op) {
    case OpKind::Identity:
    case OpKind::Cast:
    case OpKind::Neg:
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Where:
    case OpKind::Reshape:
    case OpKind::Transpose:
    case OpKind::Broadcast:
    case OpKind::Slice:
    case OpKind::Pad:
    case OpKind::ReduceSum:
      return true;
    default:
      return false;
  }
}

std::vector<NodeRef> gradients(const NodeRef& y, const NodeRef& seed,
                               const std::vector<NodeRef>& wrt) {
  FJ_CHECK(seed->type() == y->type(), "gradient seed type ", seed->type().str(), " vs ",
           y->type().str());
  Graph g;
  g.outputs = {y};
  std::vector<NodeRef> order = g.topo_order();
  // Nodes on a path from some wrt node to y: only they need gradients.
  std::unordered_set<const Node*> needs;
  for (auto& w : wrt) needs.insert(w.get());
  for (const NodeRef& n : order)
    for (auto& i : n->inputs())
      if (needs.count(i.get())) {
        needs.insert(n.get());
        break;
      }
  std::unordered_map<const Node*, NodeRef> adj;
  adj[y.get()] = seed;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeRef& n = *it;
    auto a = adj.find(n.get());
    if (a == adj.end() || !needs.count(n.get()) || n->inputs().empty()) continue;
    bool any_input_needs = false;
    for (auto& i : n->inputs()) any_input_needs |= needs.count(i.get()) > 0;
    if (!any_input_needs) continue;
    switch (op_grad_kind(n->op())) {
      case GradKind::Zero:
        continue;
      case GradKind::None:
        throw_user(ErrorKind::Value, "autodiff: op '", op_name(n->op()), "'",
                   n->loc().known() ? " at " + n->loc().str() : std::string(),
                   " is not differentiable, but the loss depends on a trainable variable "
                   "through it");
      case GradKind::Rule:
        break;
    }
    // The gradient ops of a placed op run where it runs.
    PlacementScope placed(n->loc().placement);
    Grads gs = vjp(n, a->second);
    FJ_CHECK(gs.size() == n->inputs().size(), "VJP of ", op_name(n->op()), " returned ", gs.size(),
             " gradients");
    for (size_t i = 0; i < gs.size(); ++i) {
      const NodeRef& in = n->input(i);
      if (!gs[i] || !needs.count(in.get()) || !gradient_flows_into(n->op(), in->dtype())) continue;
      FJ_CHECK(gs[i]->type() == in->type(), "VJP of ", op_name(n->op()), " operand ", i,
               " has type ", gs[i]->type().str(), " but the operand is ", in->type().str());
      auto& slot = adj[in.get()];
      slot = slot ? add(slot, gs[i]) : gs[i];
    }
  }
  std::vector<NodeRef> out;
  for (auto& w : wrt) {
    auto a = adj.find(w.get());
    out.push_back(a != adj.end() ? a->second : fill(0.0, w->shape(), w->dtype(), w->loc()));
  }
  return out;
}

}  // namespace flowjit::jit
