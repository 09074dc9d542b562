// Element types, shapes and tensor types of the flowjit graph IR.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flowjit::ir {

enum class DType : uint8_t {
#define DTYPE(E, name, sname, bytes, kind) E,
#include "ir/dtypes.def"
};

enum class DTypeKind : uint8_t { Bool, Int, Float };

constexpr int kNumDTypes = 0
#define DTYPE(E, name, sname, bytes, kind) +1
#include "ir/dtypes.def"
    ;

std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
int dtype_bytes(DType t);
DTypeKind dtype_kind(DType t);
inline bool is_float(DType t) { return dtype_kind(t) == DTypeKind::Float; }
inline bool is_int(DType t) { return dtype_kind(t) == DTypeKind::Int; }
inline bool is_bool(DType t) { return dtype_kind(t) == DTypeKind::Bool; }
inline bool is_signed_int(DType t) { return is_int(t) && t != DType::UInt8; }
// float16 and bfloat16: 2 bytes in memory, float32 in registers.
inline bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
// The bytes of the type a kernel computes an element in (float32 for the half types).
inline int reg_bytes(DType t) { return is_half(t) ? 4 : dtype_bytes(t); }

// A shape is a list of non-negative extents; rank 0 is a scalar.
using Shape = std::vector<int64_t>;

// The element count. Every shape a node has passed shape_size_problem(), so
// this cannot overflow there; for any other shape it saturates at INT64_MAX
// instead of overflowing.
int64_t num_elements(const Shape& s);
// Why a tensor of this dtype and shape cannot be indexed with int64 ("" when
// it can): the element count, the product of the non-zero extents (which the
// strides reach even when an extent is 0) or the byte size overflows.
std::string shape_size_problem(DType dtype, const Shape& s);
std::string shape_str(const Shape& s);  // "[100,784]"

// Row-major (C-order) strides in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);

// Broadcast two shapes numpy-style (right-aligned, 1 stretches). Returns
// nullopt when they are incompatible.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);

// True when `from` broadcasts to `to` (numpy rules, `to` unchanged).
bool broadcasts_to(const Shape& from, const Shape& to);

struct TensorType {
  DType dtype = DType::Float32;
  Shape shape;

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const { return num_elements(shape); }
  int64_t bytes() const { return numel() * dtype_bytes(dtype); }
  std::string str() const;  // "f32[100,784]"
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};

// The value v takes in a floating-point dtype (round to nearest even, with
// overflow to infinity); v itself for the other dtypes.
double round_to_float_dtype(double v, DType t);
// The bits of a float16 or bfloat16 element and their float32 value (the
// float32 is rounded to nearest even; a NaN stays a NaN).
float half_to_float(uint16_t bits, DType t);
uint16_t float_to_half(float v, DType t);
// The float16 nearest to a double (one rounding), as its bits.
uint16_t double_to_float16(double v);

// Short type names used by the printer: f32, f64, f16, bf16, i32, i64, i8, u8, bool.
std::string_view dtype_short_name(DType t);
std::optional<DType> dtype_from_short_name(std::string_view name);

}  // namespace flowjit::ir
