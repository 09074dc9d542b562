// Shape and dtype inference for every op, with the user-facing error messages.
#include <algorithm>
#include <cmath>

#include "ir/array.h"
#include "ir/conv.h"
#include "ir/error.h"
#include "ir/node.h"

namespace flowjit::ir {

namespace {

constexpr ErrorKind kType = ErrorKind::Type;
constexpr ErrorKind kValue = ErrorKind::Value;

const TensorType& in(const std::vector<NodeRef>& v, size_t i) { return v[i]->type(); }

// Normalizes one axis against a rank, allowing negative axes.
int64_t norm_axis(std::string_view op, int64_t axis, int rank) {
  FJ_USER_CHECK(axis >= -rank && axis < std::max(rank, 1), kValue, op, ": axis ", axis,
                " is out of range for a rank-", rank, " input (expected -", rank, " <= axis < ",
                std::max(rank, 1), ")");
  return axis < 0 ? axis + rank : axis;
}

Shape attr_shape(std::string_view op, const Attrs& a) {
  Shape s = a.get_ints("shape");
  for (int64_t d : s)
    FJ_USER_CHECK(d >= 0, kValue, op, ": shape ", shape_str(s), " has a negative extent");
  return s;
}

void check_float(std::string_view op, const TensorType& t, const char* what = "input") {
  FJ_USER_CHECK(is_float(t.dtype), kType, op, ": ", what, " must be a floating-point tensor, got ",
                t.str(), " (use flow.cast to convert)");
}

void check_not_bool(std::string_view op, const TensorType& t) {
  FJ_USER_CHECK(!is_bool(t.dtype), kType, op, ": arithmetic on a bool tensor (", t.str(),
                ") is not defined; cast it first with flow.cast(x, flow.float)");
}

Shape broadcast_or_throw(std::string_view op, const TensorType& a, const TensorType& b) {
  auto s = broadcast_shapes(a.shape, b.shape);
  FJ_USER_CHECK(s.has_value(), kValue, op, ": shapes ", shape_str(a.shape), " and ",
                shape_str(b.shape),
                " cannot be broadcast together (numpy rules: trailing "
                "dimensions must be equal or 1)");
  return *s;
}

void check_same_dtype(std::string_view op, const TensorType& a, const TensorType& b) {
  FJ_USER_CHECK(a.dtype == b.dtype, kType, op, ": operand dtypes differ: ", a.str(), " and ",
                b.str(), "; convert one with flow.cast(x, flow.", dtype_name(a.dtype), ")");
}

TensorType infer_unary(OpKind op, const TensorType& x) {
  std::string_view name = op_name(op);
  switch (op) {
    case OpKind::Identity:
      return x;
    case OpKind::LogicalNot:
      FJ_USER_CHECK(is_bool(x.dtype), kType, name, ": expected a bool tensor, got ", x.str());
      return x;
    case OpKind::Neg:
    case OpKind::Abs:
    case OpKind::Sign:
    case OpKind::Square:
    case OpKind::Relu:
      check_not_bool(name, x);
      return x;
    default:
      check_float(name, x);
      return x;
  }
}

TensorType infer_binary(OpKind op, const TensorType& a, const TensorType& b) {
  std::string_view name = op_name(op);
  check_same_dtype(name, a, b);
  Shape s = broadcast_or_throw(name, a, b);
  if (has_trait(op, kCompare)) return {DType::Bool, s};
  if (op == OpKind::LogicalAnd || op == OpKind::LogicalOr) {
    FJ_USER_CHECK(is_bool(a.dtype), kType, name, ": expected bool tensors, got ", a.str());
    return {DType::Bool, s};
  }
  check_not_bool(name, a);
  if (op == OpKind::Pow) check_float(name, a);
  return {a.dtype, s};
}

TensorType infer_reduce(OpKind op, const TensorType& x, Attrs& attrs) {
  std::string_view name = op_name(op);
  IntList axes = attrs.get_ints("axes");
  for (auto& ax : axes) ax = norm_axis(name, ax, x.rank());
  std::sort(axes.begin(), axes.end());
  FJ_USER_CHECK(std::adjacent_find(axes.begin(), axes.end()) == axes.end(), kValue, name,
                ": axis listed twice");
  bool keep = attrs.get_bool("keepdims", false);
  attrs.set("axes", axes);
  attrs.set("keepdims", keep);
  Shape out;
  for (int d = 0; d < x.rank(); ++d) {
    bool reduced = std::binary_search(axes.begin(), axes.end(), d);
    if (!reduced) {
      out.push_back(x.shape[d]);
    } else {
      if (op == OpKind::ReduceMax || op == OpKind::ReduceMin || op == OpKind::ArgMax ||
          op == OpKind::ArgMin)
        FJ_USER_CHECK(x.shape[d] > 0, kValue, name, ": cannot reduce the empty axis ", d, " of ",
                      x.str(), " (the result has no identity)");
      if (keep) out.push_back(1);
    }
  }
  if (op == OpKind::ArgMax || op == OpKind::ArgMin) {
    FJ_USER_CHECK(axes.size() == 1, kValue, name, ": expected exactly one axis, got ", axes.size());
    DType dt = attrs.has("dtype") ? attrs.get_dtype("dtype") : DType::Int32;
    FJ_USER_CHECK(is_int(dt), kType, name, ": index dtype must be an integer type, got ",
                  dtype_name(dt));
    attrs.set("dtype", dt);
    check_not_bool(name, x);
    return {dt, out};
  }
  check_not_bool(name, x);
  return {x.dtype, out};
}

TensorType infer_reshape(const TensorType& x, Attrs& attrs) {
  Shape s = attrs.get_ints("shape");
  int infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      FJ_USER_CHECK(infer_at < 0, kValue, "reshape: only one dimension can be -1, got ",
                    shape_str(s));
      infer_at = static_cast<int>(i);
    } else {
      FJ_USER_CHECK(s[i] >= 0, kValue, "reshape: invalid extent ", s[i], " in ", shape_str(s));
      if (__builtin_mul_overflow(known, s[i], &known)) known = INT64_MAX;  // cannot match
    }
  }
  int64_t n = x.numel();
  if (infer_at >= 0) {
    FJ_USER_CHECK(known > 0 && n % known == 0, kValue, "reshape: cannot reshape ", x.str(), " (", n,
                  " elements) to ", shape_str(s));
    s[infer_at] = n / known;
  }
  FJ_USER_CHECK(num_elements(s) == n, kValue, "reshape: cannot reshape ", x.str(), " (", n,
                " elements) to ", shape_str(s), " (", num_elements(s), " elements)");
  attrs.set("shape", s);
  return {x.dtype, s};
}

TensorType infer_transpose(const TensorType& x, Attrs& attrs) {
  IntList perm = attrs.get_ints("perm");
  FJ_USER_CHECK(static_cast<int>(perm.size()) == x.rank(), kValue, "transpose: perm has ",
                perm.size(), " entries but the input ", x.str(), " has rank ", x.rank());
  std::vector<bool> seen(x.rank(), false);
  Shape out;
  for (auto& p : perm) {
    p = norm_axis("transpose", p, x.rank());
    FJ_USER_CHECK(!seen[p], kValue, "transpose: perm lists axis ", p, " twice");
    seen[p] = true;
    out.push_back(x.shape[p]);
  }
  attrs.set("perm", perm);
  return {x.dtype, out};
}

TensorType infer_matmul(const TensorType& a, const TensorType& b, Attrs& attrs) {
  bool ta = attrs.get_bool("transpose_a", false), tb = attrs.get_bool("transpose_b", false);
  attrs.set("transpose_a", ta);
  attrs.set("transpose_b", tb);
  FJ_USER_CHECK(a.rank() >= 2 && b.rank() >= 2, kValue,
                "matmul: operands must have rank 2 or more, got ", a.str(), " and ", b.str());
  check_same_dtype("matmul", a, b);
  check_not_bool("matmul", a);
  int ra = a.rank(), rb = b.rank();
  FJ_USER_CHECK(rb == 2 || rb == ra, kValue, "matmul: b must have rank 2 or the rank of a (", ra,
                "), got ", b.str());
  Shape batch(a.shape.begin(), a.shape.end() - 2);
  if (rb == ra) {
    Shape bb(b.shape.begin(), b.shape.end() - 2);
    FJ_USER_CHECK(batch == bb, kValue, "matmul: batch dimensions differ: a is ", a.str(), ", b is ",
                  b.str());
  }
  int64_t m = ta ? a.shape[ra - 1] : a.shape[ra - 2];
  int64_t ka = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  int64_t kb = tb ? b.shape[rb - 1] : b.shape[rb - 2];
  int64_t n = tb ? b.shape[rb - 2] : b.shape[rb - 1];
  FJ_USER_CHECK(ka == kb, kValue, "matmul: inner dimensions differ: a is ", a.str(),
                ta ? " (transposed)" : "", " with k=", ka, " but b is ", b.str(),
                tb ? " (transposed)" : "", " with k=", kb);
  Shape out = batch;
  out.push_back(m);
  out.push_back(n);
  return {a.dtype, out};
}

TensorType infer_source(OpKind op, Attrs& attrs) {
  std::string_view name = op_name(op);
  Shape s = attr_shape(name, attrs);
  DType dt = attrs.get_dtype("dtype");
  switch (op) {
    case OpKind::Parameter:
    case OpKind::Variable:
      FJ_USER_CHECK(!attrs.get_str("name").empty(), kValue, name, ": a name is required");
      break;
    case OpKind::Fill:
      (void)attrs.get_float("value");
      break;
    case OpKind::Iota:
      FJ_USER_CHECK(!is_bool(dt), kType, "iota: dtype must be numeric");
      attrs.set("axis", norm_axis("iota", attrs.get_int("axis"), static_cast<int>(s.size())));
      break;
    default:  // random sources
      FJ_USER_CHECK(is_float(dt), kType, name, ": dtype must be floating point, got ",
                    dtype_name(dt));
      attrs.set("seed", attrs.get_int("seed", 0));
      break;
  }
  return {dt, s};
}

// attention, attention_grad (ops.def): q [..., Lq, D], k
// [..., Lk, D] (kt: [..., D, Lk]), v [..., Lk, Dv] with the same batch dims;
// bias of q's rank whose batch dims are 1 except for one run equal to q's,
// then Lq or 1, Lk or 1 (the kernels index it with strides,
// codegen/families/attention).
Shape swap_last(Shape s) {
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}

TensorType infer_attention(OpKind op, const std::vector<NodeRef>& inputs, Attrs& a) {
  const std::string_view name = op_name(op);
  const bool grad = op == OpKind::AttentionGrad;
  if (!a.has("dropout")) a.set("dropout", 0.0);
  if (!a.has("seed")) a.set("seed", int64_t{0});
  const double dropout = a.get_float("dropout");
  FJ_USER_CHECK(dropout >= 0.0 && dropout < 1.0, kValue, name, ": dropout must be in [0, 1), got ",
                dropout);
  // The operands, then the dropout's counter offset when it drops out.
  const size_t operands = (grad ? 11 : 4) + (dropout > 0.0 ? 1 : 0);
  FJ_USER_CHECK(inputs.size() == operands, kType, name, ": expected ", operands,
                " operands with dropout ", dropout, ", got ", inputs.size());
  if (dropout > 0.0) {
    const TensorType& off = in(inputs, operands - 1);
    FJ_USER_CHECK(off.dtype == DType::Int64 && off.rank() == 0, kType, name,
                  ": the dropout's counter offset must be an int64 scalar, got ", off.str());
  }
  const TensorType& q = in(inputs, 0);
  const TensorType k = grad ? in(inputs, 1) : TensorType{in(inputs, 1).dtype, {}};
  check_float(name, q, "q");
  const int r = q.rank();
  const TensorType& kt_in = grad ? in(inputs, 8) : in(inputs, 1);
  FJ_USER_CHECK(r >= 2 && kt_in.rank() == r, kValue, name, ": q ", q.str(), " and kt ", kt_in.str(),
                " must have one rank of at least 2");
  const Shape kshape = swap_last(kt_in.shape);
  const TensorType& v = in(inputs, 2);
  const TensorType& bias = in(inputs, 3);
  for (const TensorType* t : {&kt_in, &v, &bias}) check_same_dtype(name, q, *t);
  const Shape batch(q.shape.begin(), q.shape.end() - 2);
  const int64_t lq = q.shape[r - 2], d = q.shape[r - 1], lk = kshape[r - 2];
  FJ_USER_CHECK(v.rank() == r && bias.rank() == r &&
                    Shape(kshape.begin(), kshape.end() - 2) == batch &&
                    Shape(v.shape.begin(), v.shape.end() - 2) == batch && kshape[r - 1] == d &&
                    v.shape[r - 2] == lk,
                kValue, name, ": expected kt [..., ", d, ", Lk], v [..., Lk, Dv] and bias of rank ",
                r, " with q's batch dims ", shape_str(batch), ", got q ", q.str(), ", kt ",
                kt_in.str(), ", v ", v.str(), ", bias ", bias.str());
  int runs = 0;
  for (int i = 0; i + 2 < r; ++i) {
    const bool full = bias.shape[i] == batch[i] && batch[i] != 1;
    FJ_USER_CHECK(full || bias.shape[i] == 1, kValue, name, ": bias ", bias.str(),
                  " does not broadcast to q's batch dims ", shape_str(batch));
    if (full && (i == 0 || !(bias.shape[i - 1] == batch[i - 1] && batch[i - 1] != 1))) ++runs;
  }
  FJ_USER_CHECK(runs <= 1 && (bias.shape[r - 2] == lq || bias.shape[r - 2] == 1) &&
                    (bias.shape[r - 1] == lk || bias.shape[r - 1] == 1),
                kValue, name, ": bias ", bias.str(), " must be [..., ", lq, " or 1, ", lk,
                " or 1] whose batch dims are 1 but for one run equal to q's ", shape_str(batch));
  const double scale = a.get_float("scale");
  FJ_USER_CHECK(scale == scale, kValue, name, ": scale is NaN");
  Shape out = batch;
  out.push_back(lq);
  if (!grad) {  // the output rows, then each query's log-sum-exp
    out.push_back(v.shape[r - 1] + 1);
    return {q.dtype, out};
  }
  // attention_grad: dout, lse, delta, then the transposed operands.
  Shape dout = batch;
  dout.push_back(lq);
  dout.push_back(v.shape[r - 1]);
  const Shape want[] = {
      dout, out, out, swap_last(q.shape), swap_last(k.shape), swap_last(v.shape), swap_last(dout)};
  for (size_t i = 0; i < 7; ++i) {
    const TensorType& t = in(inputs, 4 + i);
    check_same_dtype(name, q, t);
    FJ_USER_CHECK(t.shape == want[i], kValue, name, ": operand ", 4 + i, " must be ",
                  shape_str(want[i]), ", got ", t.str());
  }
  FJ_USER_CHECK(k.shape == kshape, kValue, name, ": k ", k.str(), " is not kt ", kt_in.str(),
                " transposed");
  const int64_t wrt = a.get_int("wrt");
  FJ_USER_CHECK(wrt >= 0 && wrt <= 4, kValue, name,
                ": wrt must be 0 (q), 1 (k), 2 (v), 3 (the scores) or 4 (k and v), got ", wrt);
  if (wrt == 3) {  // [..., Lq, Lk]
    out.push_back(lk);
    return {q.dtype, out};
  }
  if (wrt == 4) {  // [..., Lk, D + Dv]
    out.back() = lk;
    out.push_back(d + v.shape[r - 1]);
    return {q.dtype, out};
  }
  return in(inputs, static_cast<size_t>(wrt));
}

}  // namespace

TensorType infer_type(OpKind op, const std::vector<NodeRef>& inputs, Attrs& attrs) {
  std::string_view name = op_name(op);
  if (is_source(op)) return infer_source(op, attrs);
  if (op == OpKind::Cast) {
    DType dt = attrs.get_dtype("dtype");
    return {dt, in(inputs, 0).shape};
  }
  if (op == OpKind::CheckFinite) {
    check_float(name, in(inputs, 0));
    return in(inputs, 0);
  }
  if (op == OpKind::CheckIndex) {
    const TensorType& x = in(inputs, 0);
    FJ_USER_CHECK(is_int(x.dtype), kType, attrs.get_str("what"),
                  " must be an integer tensor (int32 or int64), got ", x.str());
    FJ_USER_CHECK(attrs.get_int("limit") >= 0, kValue, name, ": limit must be >= 0, got ",
                  attrs.get_int("limit"));
    return x;
  }
  if (is_elementwise(op)) {
    switch (inputs.size()) {
      case 1:
        return infer_unary(op, in(inputs, 0));
      case 2:
        return infer_binary(op, in(inputs, 0), in(inputs, 1));
      default: {  // where(cond, x, y)
        const TensorType &c = in(inputs, 0), &x = in(inputs, 1), &y = in(inputs, 2);
        FJ_USER_CHECK(is_bool(c.dtype), kType, "where: condition must be a bool tensor, got ",
                      c.str(), " (compare it, e.g. x > 0, or flow.cast it to flow.bool)");
        check_same_dtype(name, x, y);
        Shape s = broadcast_or_throw(name, x, y);
        s = broadcast_or_throw(name, c, TensorType{x.dtype, s});
        return {x.dtype, s};
      }
    }
  }
  if (is_reduce(op)) return infer_reduce(op, in(inputs, 0), attrs);
  switch (op) {
    case OpKind::Reshape:
      return infer_reshape(in(inputs, 0), attrs);
    case OpKind::Transpose:
      return infer_transpose(in(inputs, 0), attrs);
    case OpKind::Broadcast: {
      Shape s = attr_shape(name, attrs);
      FJ_USER_CHECK(broadcasts_to(in(inputs, 0).shape, s), kValue,
                    "broadcast: ", in(inputs, 0).str(), " cannot be broadcast to ", shape_str(s));
      return {in(inputs, 0).dtype, s};
    }
    case OpKind::MatMul:
      return infer_matmul(in(inputs, 0), in(inputs, 1), attrs);
    case OpKind::Conv:
    case OpKind::ConvDataGrad:
    case OpKind::ConvFilterGrad:
    case OpKind::Window:
    case OpKind::Unwindow:
      return infer_conv_family(op, inputs, attrs);
    case OpKind::Pad:
    case OpKind::Slice:
    case OpKind::Gather:
    case OpKind::GatherNd:
    case OpKind::SegmentSum:
      return infer_array_view(op, inputs, attrs);
    case OpKind::Attention:
    case OpKind::AttentionGrad:
      return infer_attention(op, inputs, attrs);
    case OpKind::RandomUniformAt: {
      const TensorType& off = in(inputs, 0);
      FJ_USER_CHECK(off.dtype == DType::Int64 && off.rank() == 0, kType,
                    "random_uniform_at: the counter offset must be an int64 scalar, got ",
                    off.str());
      DType dt = attrs.get_dtype("dtype");
      FJ_USER_CHECK(is_float(dt), kType, name, ": dtype must be floating point, got ",
                    dtype_name(dt));
      attrs.set("seed", attrs.get_int("seed", 0));
      return {dt, attr_shape(name, attrs)};
    }
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      const TensorType& x = in(inputs, 0);
      check_float(name, x);
      FJ_USER_CHECK(x.rank() >= 1, kValue, name, ": input must have rank >= 1, got ", x.str());
      attrs.set("axis", norm_axis(name, attrs.get_int("axis", -1), x.rank()));
      return x;
    }
    case OpKind::SparseCrossEntropy: {
      const TensorType &labels = in(inputs, 0), &logits = in(inputs, 1);
      check_float(name, logits, "logits");
      FJ_USER_CHECK(is_int(labels.dtype), kType, name,
                    ": labels must be an integer tensor (int32 or int64), got ", labels.str());
      FJ_USER_CHECK(logits.rank() >= 1, kValue, name, ": logits must have rank >= 1, got ",
                    logits.str());
      Shape expect(logits.shape.begin(), logits.shape.end() - 1);
      FJ_USER_CHECK(labels.shape == expect, kValue, name, ": labels have shape ",
                    shape_str(labels.shape), " but logits ", logits.str(), " need labels of shape ",
                    shape_str(expect), " (one class index per row of logits)");
      return {logits.dtype, expect};
    }
    case OpKind::OneHot: {
      const TensorType& x = in(inputs, 0);
      FJ_USER_CHECK(is_int(x.dtype), kType, "one_hot: indices must be an integer tensor, got ",
                    x.str());
      int64_t depth = attrs.get_int("depth");
      FJ_USER_CHECK(depth > 0, kValue, "one_hot: depth must be positive, got ", depth);
      Shape s = x.shape;
      s.push_back(depth);
      DType dt = attrs.get_dtype("dtype");
      (void)attrs.get_float("on_value");
      (void)attrs.get_float("off_value");
      return {dt, s};
    }
    case OpKind::AllReduce:
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::LocalSlice: {
      const TensorType& x = in(inputs, 0);
      int64_t parts = attrs.get_int("parts");
      FJ_USER_CHECK(parts >= 1, kValue, name, ": parts must be >= 1, got ", parts);
      if (op == OpKind::AllReduce) return x;
      FJ_USER_CHECK(x.rank() >= 1, kValue, name, ": needs rank >= 1, got ", x.str());
      int axis = norm_axis(name, attrs.get_int("axis"), x.rank());
      attrs.set("axis", static_cast<int64_t>(axis));
      Shape s = x.shape;
      if (op == OpKind::AllGather) {
        s[axis] *= parts;
      } else {
        FJ_USER_CHECK(s[axis] % parts == 0, kValue, name, ": dimension ", axis, " of ", x.str(),
                      " does not split into ", parts, " equal parts");
        s[axis] /= parts;
      }
      return {x.dtype, s};
    }
    case OpKind::Assign: {
      const NodeRef& var = inputs[0];
      FJ_CHECK(var->op() == OpKind::Variable, "assign: first operand must be a variable");
      FJ_USER_CHECK(var->type() == in(inputs, 1), kType, "assign: variable '",
                    var->attrs().get_str("name"), "' is ", var->type().str(),
                    " but the new value is ", in(inputs, 1).str());
      return var->type();
    }
    default:
      break;
  }
  FJ_CHECK(false, "no type rule for op ", name);
}

}  // namespace flowjit::ir
