// layout: chooses the layout in which a value is produced, so consumers read
// it without a transpose.
//
// transpose(matmul(a, b)) (swapping the last two axes) becomes
// matmul(b, a) with swapped and negated flags: (AB)^T = B^T A^T, produced
// directly in the transposed layout. A transpose of an elementwise op used
// only by that transpose moves onto the op's operands, so the elementwise op
// runs (and fuses) in its consumer's layout.
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph layout(const ir::Graph& g);

}  // namespace flowjit::jit
