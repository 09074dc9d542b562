// Kernel families: the registry of kernels that fusion does not build from
// loops or a matmul (codegen/families/families.def lists them). Each family
// computes one kFamily IR op as one kernel whose arguments are the op's
// operands, contiguous, then its result; its parameters are a few integers
// (Kernel::params) that the family derives from the node and its emitters
// read. The structural key, dumps and costs of a family kernel go through
// its record, so a new family touches its folder, families.def, the IR op
// and what the op means above the IR (autodiff, distribution, Python).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/kernel.h"

namespace flowjit::codegen {

struct KernelFamily {
  std::string_view name;  // the folder's name, e.g. "segment_sum"
  OpKind op;              // the IR op it computes
  // The kernel's parameters for node `n` of `op` (its operands' and
  // result's types are in the node).
  std::vector<int64_t> (*params)(const ir::Node& n);
  // What the kernel computes, for plans and dumps.
  std::string (*summary)(const Kernel& k);
  // Element operations (flops) of one run; bytes come from the args.
  int64_t (*flops)(const Kernel& k);
};

// Kernel::params of a family kernel are the record's params, then the arg
// of each of the op's operands and of its result (fusion appends them: one
// buffer read twice, attention(q, q, q, b), is one arg), then, for an op of
// any number of operands (arity -1), that number. The number of operands of
// family kernel `k`:
int family_operands(const Kernel& k);
// The arg of operand `i` of family kernel `k` (i == family_operands(k): its
// result):
int family_arg(const Kernel& k, int i);
// The record's params of family kernel `k` (without the args), checked to
// be `n`.
const int64_t* family_params(const Kernel& k, size_t n);

// The product of dims [lo, hi) of `s`: how the families' params flatten
// their operands' shapes.
int64_t dims_product(const ir::Shape& s, size_t lo, size_t hi);

// The family computing `op`, or null.
const KernelFamily* family_for_op(OpKind op);
// Kernel::family's record (checked).
const KernelFamily& family_of(const Kernel& k);
// Every family, in families.def's order (Kernel::family indexes it).
const std::vector<const KernelFamily*>& kernel_families();

}  // namespace flowjit::codegen
