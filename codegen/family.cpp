// The kernel family registry, built from codegen/families/families.def.
#include "codegen/family.h"

#include "ir/error.h"
#include "ir/op.h"

namespace flowjit::codegen {

#define FAMILY(Op, name) extern const KernelFamily name##_family;
#include "codegen/families/families.def"

const std::vector<const KernelFamily*>& kernel_families() {
  static const std::vector<const KernelFamily*> all = {
#define FAMILY(Op, name) &name##_family,
#include "codegen/families/families.def"
  };
  return all;
}

const KernelFamily* family_for_op(OpKind op) {
  for (const KernelFamily* f : kernel_families())
    if (f->op == op) return f;
  return nullptr;
}

const KernelFamily& family_of(const Kernel& k) {
  const auto& all = kernel_families();
  FJ_CHECK(
      k.kind == Kernel::Kind::Family && k.family >= 0 && k.family < static_cast<int>(all.size()),
      "kernel ", k.name, " is not of a registered family (", k.family, ")");
  return *all[k.family];
}

int64_t dims_product(const ir::Shape& s, size_t lo, size_t hi) {
  int64_t p = 1;
  for (size_t d = lo; d < hi; ++d) p *= s[d];
  return p;
}

int family_operands(const Kernel& k) {
  const int n = ir::op_arity(family_of(k).op);
  if (n >= 0) return n;
  FJ_CHECK(!k.params.empty() && k.params.back() >= 0 &&
               k.params.back() < static_cast<int64_t>(k.params.size()),
           "family kernel ", k.name, ": no operand count");
  return static_cast<int>(k.params.back());
}

namespace {
// The params after the record's: an arg per operand and the result's, then
// the operand count for a variadic op.
size_t arg_params(const Kernel& k) {
  return static_cast<size_t>(family_operands(k)) + 1 + (ir::op_arity(family_of(k).op) < 0 ? 1 : 0);
}
}  // namespace

int family_arg(const Kernel& k, int i) {
  const int n = family_operands(k);
  const size_t tail = arg_params(k);
  FJ_CHECK(i >= 0 && i <= n && k.params.size() >= tail, "family kernel ", k.name,
           ": no arg for operand ", i);
  const int64_t a = k.params[k.params.size() - tail + static_cast<size_t>(i)];
  FJ_CHECK(a >= 0 && a < static_cast<int64_t>(k.args.size()), "family kernel ", k.name,
           ": operand ", i, " has arg ", a, " of ", k.args.size());
  return static_cast<int>(a);
}

const int64_t* family_params(const Kernel& k, size_t n) {
  const size_t args = arg_params(k);
  FJ_CHECK(k.params.size() == n + args, family_of(k).name, " kernel ", k.name, " has ",
           k.params.size(), " params, expected ", n, " and ", args, " args");
  return k.params.data();
}

}  // namespace flowjit::codegen
