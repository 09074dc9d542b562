// Geometry of convolutions and sliding windows, shared by shape inference,
// autodiff, fusion and the layout pass.
//
// Every op here works on channels-first operands, the S spatial dims last:
//   x [N, C, in_1..in_S], w [Co, C/groups, k_1..k_S].
// Along spatial dim i, output position o and kernel tap t read input
//   position  o * strides[i] + t * dilations[i] - pads_lo[i]
// (outside [0, in_i) the input counts as the op's padding value), and
//   out_i = (in_i + pads_lo[i] + pads_hi[i] - dilations[i] * (k_i - 1) - 1) / strides[i] + 1.
//
// The ops and their attributes (ops.def):
//   conv(x, w)             -> [N, groups, Co/groups, prod(out)]     (implicit GEMM)
//   conv_data_grad(dy, w)  -> [N, groups, C/groups, prod(in)]       attr in_spatial
//   conv_filter_grad(x, dy)-> [groups, Co/groups, C/groups * prod(k)] attr kernel
//   window(x)              -> [lead..., out_1..out_S, k_1..k_S]      attrs window, pad_value
//   unwindow(d)            -> [lead..., in_1..in_S, k_1..k_S]        attrs window, in_spatial
// Results of the conv ops are flat over the spatial dims so that a conv is a
// batched matmul [batch, M, N] to fusion and the backends; Python reshapes
// them. window is the view a pooling reduces over; unwindow is its adjoint's
// view (element (i, t) is d at o = (i + pad - t * dilation) / stride when
// that divides and is in range, else 0), summed over t by window's gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/node.h"

namespace flowjit::ir {

struct ConvGeometry {
  int spatial = 0;  // S
  std::vector<int64_t> in, kernel, out, strides, dilations, pads_lo, pads_hi;
  int64_t groups = 1;

  int64_t in_size() const;      // prod(in)
  int64_t kernel_size() const;  // prod(kernel)
  int64_t out_size() const;     // prod(out)
};

// Reads and checks the common attributes (strides, dilations, pads_lo,
// pads_hi, groups) for `spatial` dims with the given input and kernel
// extents, and computes the output extents. Throws a user error naming `op`.
ConvGeometry conv_geometry(std::string_view op, const Attrs& a, const std::vector<int64_t>& in,
                           const std::vector<int64_t>& kernel);

// The geometry of a conv, conv_data_grad, conv_filter_grad, window or
// unwindow node (after its type was inferred).
ConvGeometry geometry_of(const Node& n);

}  // namespace flowjit::ir

namespace flowjit::ir {
// Shape and dtype inference for the ops above (called by infer_type).
TensorType infer_conv_family(OpKind op, const std::vector<NodeRef>& inputs, Attrs& attrs);
}  // namespace flowjit::ir
