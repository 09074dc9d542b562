// Type rules of the array views (ir/array.h).
#include "ir/array.h"

#include <algorithm>
#include <cmath>

#include "ir/error.h"

namespace flowjit::ir {

namespace {

constexpr ErrorKind kType = ErrorKind::Type;
constexpr ErrorKind kValue = ErrorKind::Value;

IntList ints_or(const Attrs& a, const std::string& key, size_t n, int64_t dflt) {
  if (!a.has(key)) return IntList(n, dflt);
  return a.get_ints(key);
}

void check_len(std::string_view op, const char* what, const IntList& v, const TensorType& x) {
  FJ_USER_CHECK(v.size() == static_cast<size_t>(x.rank()), kValue, op, ": ", what, " has ",
                v.size(), " entries but the input ", x.str(), " has rank ", x.rank(),
                " (one per dim expected)");
}

void check_index(std::string_view op, const TensorType& idx) {
  FJ_USER_CHECK(is_int(idx.dtype), kType, op,
                ": indices must be an integer tensor (int32 or int64), got ", idx.str());
}

// The pad value as x's dtype holds it: an exact int for an integer x (a
// double would round int64 beyond 2^53), a float otherwise.
AttrValue pad_value(DType t, const Attrs& a) {
  if (!is_int(t)) return a.has("pad_value") ? a.get_float("pad_value") : 0.0;
  if (!a.has("pad_value")) return int64_t{0};
  int64_t v = 0;
  if (const auto* i = std::get_if<int64_t>(a.find("pad_value"))) {
    v = *i;
  } else {
    double d = a.get_float("pad_value");
    FJ_USER_CHECK(std::isfinite(d) && d >= -0x1p63 && d < 0x1p63, kValue, "pad: pad_value ", d,
                  " is not a value of ", dtype_name(t));
    v = static_cast<int64_t>(d);  // toward zero, as int() in Python
  }
  int bits = dtype_bytes(t) * 8;
  if (bits < 64) {
    int64_t lo = is_signed_int(t) ? -(int64_t{1} << (bits - 1)) : 0;
    int64_t hi = is_signed_int(t) ? (int64_t{1} << (bits - 1)) - 1 : (int64_t{1} << bits) - 1;
    FJ_USER_CHECK(v >= lo && v <= hi, kValue, "pad: pad_value ", v, " is out of range for ",
                  dtype_name(t), " (", lo, "..", hi, ")");
  }
  return v;
}

TensorType infer_pad(const TensorType& x, Attrs& a) {
  IntList lo = ints_or(a, "pads_lo", x.rank(), 0), hi = ints_or(a, "pads_hi", x.rank(), 0);
  IntList interior = ints_or(a, "interior", x.rank(), 0);
  check_len("pad", "pads_lo", lo, x);
  check_len("pad", "pads_hi", hi, x);
  check_len("pad", "interior", interior, x);
  Shape out;
  for (int d = 0; d < x.rank(); ++d) {
    FJ_USER_CHECK(lo[d] >= 0 && hi[d] >= 0 && interior[d] >= 0, kValue, "pad: padding of dim ", d,
                  " must be >= 0, got ", lo[d], ", ", hi[d], " (interior ", interior[d], ")");
    int64_t n = x.shape[d], ext = 0;
    FJ_USER_CHECK(!__builtin_mul_overflow(n > 0 ? n - 1 : 0, interior[d], &ext) &&
                      !__builtin_add_overflow(ext, n, &ext) &&
                      !__builtin_add_overflow(ext, lo[d], &ext) &&
                      !__builtin_add_overflow(ext, hi[d], &ext),
                  kValue, "pad: the padded extent of dim ", d, " (", n, " + ", lo[d], " + ", hi[d],
                  ", interior ", interior[d], ") overflows int64");
    out.push_back(ext);
  }
  a.set("pads_lo", lo);
  a.set("pads_hi", hi);
  a.set("interior", interior);
  a.set("pad_value", pad_value(x.dtype, a));
  return {x.dtype, out};
}

TensorType infer_slice(const TensorType& x, Attrs& a) {
  IntList begin = a.get_ints("begin"), step = ints_or(a, "step", x.rank(), 1);
  Shape shape = a.get_ints("shape");
  check_len("slice", "begin", begin, x);
  check_len("slice", "step", step, x);
  check_len("slice", "shape", shape, x);
  for (int d = 0; d < x.rank(); ++d) {
    FJ_USER_CHECK(step[d] != 0, kValue, "slice: step of dim ", d, " must not be 0");
    FJ_USER_CHECK(shape[d] >= 0, kValue, "slice: extent ", shape[d], " of dim ", d, " is negative");
    if (shape[d] == 0) {
      begin[d] = 0;
      continue;
    }
    int64_t last = begin[d] + (shape[d] - 1) * step[d];
    FJ_USER_CHECK(begin[d] >= 0 && begin[d] < x.shape[d] && last >= 0 && last < x.shape[d], kValue,
                  "slice: dim ", d, " reads ", shape[d], " elements from ", begin[d],
                  " in steps of ", step[d], " (up to ", last, "), outside the input extent ",
                  x.shape[d], " of ", x.str());
  }
  a.set("begin", begin);
  a.set("step", step);
  return {x.dtype, shape};
}

TensorType infer_gather(const TensorType& p, const TensorType& idx, Attrs& a) {
  check_index("gather", idx);
  FJ_USER_CHECK(p.rank() >= 1, kValue, "gather: params must have rank >= 1, got ", p.str());
  int64_t axis = a.get_int("axis", 0);
  FJ_USER_CHECK(axis >= -p.rank() && axis < p.rank(), kValue, "gather: axis ", axis,
                " is out of range for params ", p.str(), " (expected -", p.rank(), " <= axis < ",
                p.rank(), ")");
  if (axis < 0) axis += p.rank();
  int64_t bd = a.get_int("batch_dims", 0);
  if (bd < 0) bd += idx.rank();
  FJ_USER_CHECK(bd >= 0 && bd <= idx.rank() && bd <= axis, kValue, "gather: batch_dims ",
                a.get_int("batch_dims", 0), " must be in [0, ", std::min<int64_t>(axis, idx.rank()),
                "] for params ", p.str(), ", indices ", idx.str(), " and axis ", axis);
  for (int64_t d = 0; d < bd; ++d)
    FJ_USER_CHECK(idx.shape[d] == p.shape[d], kValue, "gather: batch dim ", d, " of indices ",
                  idx.str(), " is ", idx.shape[d], " but params ", p.str(), " have ", p.shape[d]);
  Shape out(p.shape.begin(), p.shape.begin() + axis);
  out.insert(out.end(), idx.shape.begin() + bd, idx.shape.end());
  out.insert(out.end(), p.shape.begin() + axis + 1, p.shape.end());
  FJ_USER_CHECK(p.shape[axis] > 0 || num_elements(out) == 0, kValue, "gather: axis ", axis,
                " of params ", p.str(), " is empty, so there is nothing to gather");
  a.set("axis", axis);
  a.set("batch_dims", bd);
  return {p.dtype, out};
}

TensorType infer_gather_nd(const TensorType& p, const TensorType& idx) {
  check_index("gather_nd", idx);
  FJ_USER_CHECK(idx.rank() >= 1, kValue, "gather_nd: indices must have rank >= 1, got ", idx.str());
  int64_t k = idx.shape.back();
  FJ_USER_CHECK(k >= 1 && k <= p.rank(), kValue, "gather_nd: the last dim of indices ", idx.str(),
                " indexes ", k, " dims, but params ", p.str(), " have ", p.rank(),
                " (expected 1 to ", p.rank(), ")");
  Shape out(idx.shape.begin(), idx.shape.end() - 1);
  out.insert(out.end(), p.shape.begin() + k, p.shape.end());
  for (int64_t d = 0; d < k; ++d)
    FJ_USER_CHECK(p.shape[d] > 0 || num_elements(out) == 0, kValue, "gather_nd: dim ", d,
                  " of params ", p.str(), " is empty, so there is nothing to gather");
  return {p.dtype, out};
}

// segment_sum(data, ids): out = data.shape[:axis] + [num_segments] +
// data.shape[axis + m:], where ids = data.shape[:bd] + data.shape[axis:axis + m].
TensorType infer_segment_sum(const TensorType& d, const TensorType& ids, Attrs& a) {
  check_index("segment_sum", ids);
  FJ_USER_CHECK(!is_bool(d.dtype), kType, "segment_sum: data must be numbers, got ", d.str());
  int64_t axis = a.get_int("axis"), bd = a.get_int("batch_dims", 0), s = a.get_int("num_segments");
  int64_t m = ids.rank() - bd;
  FJ_USER_CHECK(bd >= 0 && bd <= axis && m >= 0 && axis + m <= d.rank(), kValue,
                "segment_sum: segment ids ", ids.str(), " with ", bd,
                " batch dims cannot index data ", d.str(), " from axis ", axis);
  for (int64_t j = 0; j < ids.rank(); ++j) {
    int64_t dd = j < bd ? j : axis + j - bd;
    FJ_USER_CHECK(ids.shape[j] == d.shape[dd], kValue, "segment_sum: dim ", j, " of segment ids ",
                  ids.str(), " is ", ids.shape[j], " but dim ", dd, " of data ", d.str(), " is ",
                  d.shape[dd]);
  }
  FJ_USER_CHECK(s >= 0, kValue, "segment_sum: num_segments must be >= 0, got ", s);
  Shape out(d.shape.begin(), d.shape.begin() + axis);
  out.push_back(s);
  out.insert(out.end(), d.shape.begin() + axis + m, d.shape.end());
  a.set("batch_dims", bd);
  return {d.dtype, out};
}

}  // namespace

TensorType infer_array_view(OpKind op, const std::vector<NodeRef>& inputs, Attrs& attrs) {
  switch (op) {
    case OpKind::Pad:
      return infer_pad(inputs[0]->type(), attrs);
    case OpKind::Slice:
      return infer_slice(inputs[0]->type(), attrs);
    case OpKind::Gather:
      return infer_gather(inputs[0]->type(), inputs[1]->type(), attrs);
    case OpKind::GatherNd:
      return infer_gather_nd(inputs[0]->type(), inputs[1]->type());
    case OpKind::SegmentSum:
      return infer_segment_sum(inputs[0]->type(), inputs[1]->type(), attrs);
    default:
      FJ_CHECK(false, "infer_array_view: ", op_name(op));
  }
  return {};
}

}  // namespace flowjit::ir
