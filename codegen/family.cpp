// The kernel family registry, built from codegen/families/families.def.
#include "codegen/family.h"

#include "ir/error.h"

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

}  // namespace flowjit::codegen
