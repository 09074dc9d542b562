// simplify: algebraic simplification.
//
// Rewrites that are exact in IEEE arithmetic: x + (-0.0), x - 0.0 (and
// integer zeros), x * 1, x / 1,
// neg(neg(x)), identity and same-type casts, where(c, x, x), reshape and
// broadcast to the operand's own shape, a slice reading back exactly what
// a pad padded, and chains of reshapes or of transposes collapse into one.
// x * 0 is left alone (NaN and inf * 0).
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph simplify(const ir::Graph& g);

}  // namespace flowjit::jit
