// Op names, arities and traits, generated from ir/ops.def.
#include "ir/op.h"

namespace flowjit::ir {

namespace {
struct OpInfo {
  std::string_view name;
  int arity;
  uint32_t traits;
  GradKind grad;
};
constexpr OpInfo kOps[] = {
#define OP(E, name, arity, traits, grad) {name, arity, static_cast<uint32_t>(traits), GradKind::grad},
#include "ir/ops.def"
};
}  // namespace

std::string_view op_name(OpKind k) { return kOps[static_cast<int>(k)].name; }
int op_arity(OpKind k) { return kOps[static_cast<int>(k)].arity; }
uint32_t op_traits(OpKind k) { return kOps[static_cast<int>(k)].traits; }
GradKind op_grad_kind(OpKind k) { return kOps[static_cast<int>(k)].grad; }

std::optional<OpKind> op_from_name(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (kOps[i].name == name) return static_cast<OpKind>(i);
  return std::nullopt;
}

}  // namespace flowjit::ir
