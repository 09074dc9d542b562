// OpKind and op properties, generated from ir/ops.def.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace flowjit::ir {

enum class OpKind : uint16_t {
#define OP(E, name, arity, traits, grad) E,
#include "ir/ops.def"
};

constexpr int kNumOps = 0
#define OP(E, name, arity, traits, grad) +1
#include "ir/ops.def"
    ;

// Trait bits: properties of an op that passes query instead of listing names.
enum OpTrait : uint32_t {
  kSource = 1u << 0,          // no operands; produces a value from attributes
  kElementwise = 1u << 1,     // result[i] depends on operand[i] (broadcast)
  kReduce = 1u << 2,          // reduces attribute `axes`
  kView = 1u << 3,            // re-indexes its operand, no arithmetic
  kContraction = 1u << 4,     // matmul
  kComposite = 1u << 5,       // expanded by the decompose pass
  kEffect = 1u << 6,          // writes state; kept alive by dce
  kCommutative = 1u << 7,     // binary op with f(a, b) == f(b, a)
  kCompare = 1u << 8,         // elementwise comparison producing bool
  kTranscendental = 1u << 9,  // costs a polynomial evaluation per element
  kCheap = 1u << 10,          // recomputed in every consumer instead of stored
  kCollective = 1u << 11,     // communicates between the devices of a distributed job
  kAddressed = 1u << 12,      // view read through computed addresses (offsets, guarded or
                              // indirect coordinates): its operands must be in memory
  kFamily = 1u << 13,         // computed by a kernel family of its own (codegen/family.h):
                              // one kernel over contiguous operands, never fused
};

enum class GradKind : uint8_t { Rule, Zero, None };

// Attribute schemas (the ATTR lines of ops.def).
enum class AttrKind : uint8_t { Bool, Int, Float, Number, Str, Ints, DType };
struct AttrSpec {
  OpKind op;
  std::string_view key;
  AttrKind kind;
  bool required;
  std::string_view dflt;  // what the op's rule uses when an optional one is absent
};
std::string_view attr_kind_name(AttrKind k);  // "an int", "a list of ints", ...
// The attributes `op` takes, in the order ops.def lists them.
const std::vector<const AttrSpec*>& op_attrs(OpKind op);

std::string_view op_name(OpKind k);
std::optional<OpKind> op_from_name(std::string_view name);
int op_arity(OpKind k);  // -1 for variadic
uint32_t op_traits(OpKind k);
GradKind op_grad_kind(OpKind k);

inline bool has_trait(OpKind k, OpTrait t) { return (op_traits(k) & t) != 0; }
inline bool is_elementwise(OpKind k) { return has_trait(k, kElementwise); }
inline bool is_reduce(OpKind k) { return has_trait(k, kReduce); }
inline bool is_view(OpKind k) { return has_trait(k, kView); }
inline bool is_source(OpKind k) { return has_trait(k, kSource); }
inline bool is_composite(OpKind k) { return has_trait(k, kComposite); }
inline bool is_effect(OpKind k) { return has_trait(k, kEffect); }
inline bool is_collective(OpKind k) { return has_trait(k, kCollective); }
inline bool is_contraction(OpKind k) { return has_trait(k, kContraction); }
inline bool is_cheap(OpKind k) { return has_trait(k, kCheap); }
inline bool is_addressed(OpKind k) { return has_trait(k, kAddressed); }
inline bool is_family(OpKind k) { return has_trait(k, kFamily); }

}  // namespace flowjit::ir
