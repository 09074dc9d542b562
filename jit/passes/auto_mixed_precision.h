// auto_mixed_precision: OneFlow's automatic mixed precision
// (function_config().enable_auto_mixed_precision(True)) as a rewrite of the
// traced forward graph, before autodiff.
//
// Ops fall in three lists, as in OneFlow's pass:
//   allow   matmul, convolution: run in the half type;
//   infer   elementwise arithmetic and activations, and the ops that only
//           move data (reshape, transpose, broadcast, slice, pad, gather):
//           run in the half type when one of their float32 operands already
//           is (the rest are converted), in float32 otherwise;
//   deny    everything else (reductions, so softmax, the losses and the
//           normalizations' statistics; exp and log; assigns): float32.
// Casts are inserted only at the boundaries between the lists; they are
// elementwise, so fusion folds them into their neighbours. Variables stay
// float32 (master weights): a matmul reads its weight through a cast, whose
// gradient is the cast back, so gradients and optimizer state are float32.
// Only float32 values change; float64 and integer ones are left alone.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace flowjit::jit {

// Rewrites `g` with `half` (Float16 or BFloat16) as the low precision. The
// job's outputs keep their dtypes (cast back where they changed); `keep` are
// other nodes the caller holds (losses, cast back to float32) and `watched`
// nodes whose gradients are requested (replaced by their rewritten node, in
// whatever precision it runs); both are updated in place.
ir::Graph auto_mixed_precision(const ir::Graph& g, ir::DType half, std::vector<ir::NodeRef>& keep,
                               std::vector<ir::NodeRef>& watched);

}  // namespace flowjit::jit
