// transpose_fold: folds transposes of matmul operands into the matmul's
// transpose_a / transpose_b flags.
//
// matmul(transpose(a), b) where the transpose swaps the last two axes and
// keeps the batch axes becomes matmul(a, b, transpose_a = !transpose_a);
// the same for b. The matmul kernel reads its operands with any strides, so
// the flag costs nothing while the transpose would cost a copy.
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph transpose_fold(const ir::Graph& g);

// True when `perm` swaps the last two axes and keeps the others in place.
bool swaps_last_two(const ir::IntList& perm);

}  // namespace flowjit::jit
