// fold: constant folding.
//
// Elementwise ops, casts, views and reductions whose operands are all Fill
// constants become one Fill. Values are computed in double precision and then
// rounded to the result dtype with the same rules as the generated code
// (integer division truncates and gives 0 for a zero divisor; float to
// integer conversion saturates). This runs at compile time only.
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph fold(const ir::Graph& g);

}  // namespace flowjit::jit
