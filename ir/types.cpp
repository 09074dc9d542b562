// Element types, shapes and tensor types.
#include "ir/types.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

namespace flowjit::ir {

namespace {
struct DTypeInfo {
  std::string_view name;
  std::string_view short_name;
  int bytes;
  DTypeKind kind;
};
constexpr DTypeInfo kDTypes[] = {
#define DTYPE(E, name, sname, bytes, kind) {name, sname, bytes, DTypeKind::kind},
#include "ir/dtypes.def"
};
}  // namespace

std::string_view dtype_name(DType t) { return kDTypes[static_cast<int>(t)].name; }
std::string_view dtype_short_name(DType t) { return kDTypes[static_cast<int>(t)].short_name; }
int dtype_bytes(DType t) { return kDTypes[static_cast<int>(t)].bytes; }
DTypeKind dtype_kind(DType t) { return kDTypes[static_cast<int>(t)].kind; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kDTypes[i].name == name) return static_cast<DType>(i);
  return std::nullopt;
}

std::optional<DType> dtype_from_short_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kDTypes[i].short_name == name) return static_cast<DType>(i);
  return std::nullopt;
}

int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n)) return INT64_MAX;
  return n;
}

std::string shape_size_problem(DType dtype, const Shape& s) {
  int64_t n = 1, reach = 1, bytes = 0;
  for (int64_t d : s) {
    if (d < 0) return "extent " + std::to_string(d) + " is negative";
    if (__builtin_mul_overflow(n, d, &n) ||
        __builtin_mul_overflow(reach, std::max<int64_t>(d, 1), &reach))
      return "its element count overflows int64 (more than 9223372036854775807)";
  }
  if (__builtin_mul_overflow(n, static_cast<int64_t>(dtype_bytes(dtype)), &bytes))
    return std::to_string(n) + " elements of " + std::to_string(dtype_bytes(dtype)) +
           " bytes overflow int64 bytes";
  return "";
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    if (__builtin_mul_overflow(acc, s[i], &acc)) acc = INT64_MAX;  // (never for a node's shape)
  }
  return st;
}

std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da == db || db == 1) {
      out[i] = da;
    } else if (da == 1) {
      out[i] = db;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  size_t off = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != to[i + off] && from[i] != 1) return false;
  return true;
}

std::string TensorType::str() const {
  return std::string(dtype_short_name(dtype)) + shape_str(shape);
}

}  // namespace flowjit::ir
