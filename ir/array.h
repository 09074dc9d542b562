// Array views: pad, slice, gather and gather_nd (ops.def), shared by shape
// inference, autodiff, fusion and the layout pass.
//
// Per dim d of an operand with extent n:
//   pad    out = lo + hi + n + (n - 1) * interior  (n > 0; lo + hi when n == 0);
//          out[i] = x[(i - lo) / (interior + 1)] when that divides and is in
//          [0, n), else pad_value (XLA's pad: its adjoint is a strided slice).
//   slice  out[i] = x[begin + i * step], i < shape[d]; step != 0, every read
//          inside x (a negative step walks backwards).
//   gather(p, idx)     attrs axis, batch_dims:
//          out[pre..., j..., post...] = p[pre..., idx[pre[:batch_dims]..., j...], post...]
//          shape p[:axis] + idx[batch_dims:] + p[axis + 1:].
//   gather_nd(p, idx)  idx [..., K]: out[j..., rest...] = p[idx[j..., 0..K-1], rest...],
//          shape idx[:-1] + p[K:].
// Indices outside [0, extent) are clamped into it (0 or extent - 1): reads
// never leave the buffer, and gradients go to the element that was read.
#pragma once

#include "ir/node.h"

namespace flowjit::ir {

// Shape and dtype inference for the ops above and segment_sum (called by
// infer_type).
TensorType infer_array_view(OpKind op, const std::vector<NodeRef>& inputs, Attrs& attrs);

}  // namespace flowjit::ir
