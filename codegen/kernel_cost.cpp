// kernel_cost: what a kernel computes and touches, from its description.
#include "codegen/family.h"
#include "codegen/kernel.h"

namespace flowjit::codegen {

namespace {

// Nodes that move or name values rather than compute them.
bool arithmetic(const KNode& n) {
  switch (n.kind) {
    case KOp::Load:
    case KOp::Const:
    case KOp::Index:
    case KOp::Acc:
      return false;
    case KOp::Compute:
      return n.op != OpKind::Identity && n.op != OpKind::Cast;
    case KOp::Random:
    case KOp::Reduce:
      return true;
  }
  return true;
}

}  // namespace

std::optional<KernelCost> kernel_cost(const Kernel& k) {
  if (k.kind == Kernel::Kind::Collective) return std::nullopt;
  KernelCost c;
  int64_t points = 1;
  for (int64_t d : k.domain) points *= d;
  int64_t ops = 0;
  for (const KNode& n : k.nodes) ops += arithmetic(n) ? 1 : 0;
  c.flops = ops * points;
  if (k.kind == Kernel::Kind::MatMul) c.flops += 2 * k.mm.m * k.mm.n * k.mm.k * k.mm.batch;
  if (k.kind == Kernel::Kind::Family) c.flops = family_of(k).flops(k);
  for (const KernelArg& a : k.args) {
    const int64_t modes = static_cast<int64_t>(a.read) + static_cast<int64_t>(a.written);
    c.bytes += a.elements * ir::dtype_bytes(a.dtype) * (modes > 0 ? modes : 1);
  }
  return c;
}

}  // namespace flowjit::codegen
