// reshape_sink: moves a reshape below the elementwise ops that use it.
//
// elementwise(reshape(a), b...) becomes reshape(elementwise(a, b'...)) when
// every other operand b can be written in a's shape: per group of dims the
// reshape splits or merges, b is either whole or broadcast (extent 1). A
// non-unit reshape is a fusion boundary (its operand must be in memory), so
// this lets the ops join the kernel computing `a`: a convolution, whose
// result is flat over the spatial dims, then takes the bias, batch-norm
// scale and shift and residual add of the user's NCHW code as its epilogue.
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph reshape_sink(const ir::Graph& g);

}  // namespace flowjit::jit
