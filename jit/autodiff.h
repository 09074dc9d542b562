// autodiff: reverse-mode differentiation on the IR.
//
// gradients() walks the graph from `y` back to the nodes in `wrt`, calling
// one VJP rule per op (the rule table is generated from ir/ops.def: an op
// marked Rule must have a vjp_<Op> function, one marked Zero passes no
// gradient, one marked None is an error when a gradient must flow through
// it). Contributions to a node are summed. Gradients of broadcasting ops are
// summed back to the operand's shape. The result is ordinary IR: the
// backward graph goes through the same passes, fusion and codegen as the
// forward one.
#pragma once

#include <vector>

#include "ir/node.h"

namespace flowjit::jit {

// d(sum(seed * y)) / d(wrt[i]) for each i; a node y does not depend on gets
// a zero Fill. `seed` has y's type. Throws UserError naming the op (and its
// source line) when a gradient must pass through a non-differentiable op.
std::vector<ir::NodeRef> gradients(const ir::NodeRef& y, const ir::NodeRef& seed,
                                   const std::vector<ir::NodeRef>& wrt);

// Whether a gradient flows from op `op` into an operand of dtype `operand`.
// Floats always; bools never; integers, as in OneFlow (whose kernels carry
// integer gradients through casts), through the ops that only add, multiply,
// select or move values: identity, cast, neg, add, sub, mul, maximum,
// minimum, where, reshape, transpose, broadcast, slice, pad, reduce_sum.
bool gradient_flows_into(ir::OpKind op, ir::DType operand);

}  // namespace flowjit::jit
