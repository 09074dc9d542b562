// Element types, shapes and tensor types.
#include "ir/types.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

namespace {
// Rounds v to a binary format with `mant` fraction bits, smallest normal
// exponent `emin` and largest finite value `max` (IEEE round to nearest even).
double round_binary(double v, int mant, int emin, double max) {
  if (!std::isfinite(v) || v == 0) return v;
  int e = std::max(std::ilogb(v), emin);
  double ulp = std::ldexp(1.0, e - mant);
  double r = std::nearbyint(v / ulp) * ulp;
  if (std::fabs(r) > max) return std::copysign(INFINITY, v);
  return r;
}
}  // namespace

double round_to_float_dtype(double v, DType t) {
  switch (t) {
    case DType::Float32:
      return static_cast<double>(static_cast<float>(v));
    case DType::Float16:
      return round_binary(v, 10, -14, 65504.0);
    case DType::BFloat16:
      return round_binary(v, 7, -126, 3.3895313892515355e38);
    default:
      return v;
  }
}

float half_to_float(uint16_t bits, DType t) {
  uint32_t u;
  if (t == DType::BFloat16) {
    u = static_cast<uint32_t>(bits) << 16;
  } else {
    uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
    uint32_t exp = (bits >> 10) & 0x1f, frac = bits & 0x3ff;
    if (exp == 0x1f) {
      u = sign | 0x7f800000u | (frac << 13);  // inf or NaN
    } else if (exp != 0) {
      u = sign | ((exp + 112) << 23) | (frac << 13);
    } else {
      // zero or subnormal: frac * 2^-24, exact in float32
      float f = std::ldexp(static_cast<float>(frac), -24);
      return sign ? -f : f;
    }
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_half(float v, DType t) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (t == DType::BFloat16) {
    if (std::isnan(v)) return static_cast<uint16_t>((u >> 16) | 0x40);
    return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  return double_to_float16(v);
}

uint16_t double_to_float16(double v) {
  uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isnan(v)) return static_cast<uint16_t>(sign | 0x7e00);
  double r = std::fabs(round_to_float_dtype(v, DType::Float16));
  if (std::isinf(r)) return static_cast<uint16_t>(sign | 0x7c00);
  if (r < std::ldexp(1.0, -14))  // subnormal or zero: a multiple of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(r, 24)));
  int e = std::ilogb(r);
  auto frac = static_cast<uint16_t>(std::ldexp(r, 10 - e) - 1024);
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | frac);
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
