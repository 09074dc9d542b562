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
#define OP(E, name, arity, traits, grad) \
  {name, arity, static_cast<uint32_t>(traits), GradKind::grad},
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

namespace {
constexpr bool Req = true, Opt = false;
constexpr AttrSpec kAttrs[] = {
#define OP(E, name, arity, traits, grad)
#define ATTR(E, key, kind, presence, dflt) {OpKind::E, key, AttrKind::kind, presence, dflt},
#include "ir/ops.def"
};
}  // namespace

std::string_view attr_kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::Bool:
      return "a bool";
    case AttrKind::Int:
      return "an int";
    case AttrKind::Float:
      return "a float";
    case AttrKind::Number:
      return "a number";
    case AttrKind::Str:
      return "a string";
    case AttrKind::Ints:
      return "a list of ints";
    case AttrKind::DType:
      return "a dtype";
  }
  return "?";
}

const std::vector<const AttrSpec*>& op_attrs(OpKind op) {
  static const std::vector<std::vector<const AttrSpec*>> by_op = [] {
    std::vector<std::vector<const AttrSpec*>> v(kNumOps);
    for (const AttrSpec& a : kAttrs) v[static_cast<int>(a.op)].push_back(&a);
    return v;
  }();
  return by_op[static_cast<int>(op)];
}

}  // namespace flowjit::ir
