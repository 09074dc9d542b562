"""flow.nn: activations, softmax and losses.

The docstrings' examples assume ``import numpy as np``, ``import flowjit as flow``
and ``import flowjit.typing as tp``; each starts from a fresh session.
"""
from typing import Optional

from ._core import dtypes as _dtypes, trace as _trace
from ._ops import builders as _ops
from ._core.blob import Blob
from ._ops.builders import (log_softmax, relu, sigmoid, softmax,  # noqa: F401
                            sparse_softmax_cross_entropy_with_logits, tanh)


def bias_add(value: Blob, bias: Blob, data_format: Optional[str] = None, name: Optional[str] = None) -> Blob:
    """value + bias along the channel axis (axis 1 for NCHW, else the last).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3)), b: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.bias_add(x, b)
        >>> job(np.zeros((2, 3), np.float32), np.float32([1, 2, 3])).tolist()
        [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    """
    if len(bias.shape) != 1:
        _trace.fail(ValueError, f"bias_add: bias must be 1-D, got shape {bias.shape}")
    if data_format is not None and data_format.startswith("NC") and len(value.shape) > 2:
        c = value.shape[1]
        if bias.shape[0] != c:
            _trace.fail(ValueError, f"bias_add: value has {c} channels but bias has {bias.shape[0]}")
        shape = [1] * len(value.shape)
        shape[1] = c
        return _ops.add(value, _ops.reshape(bias, shape), name=name)
    if value.shape[-1] != bias.shape[0]:
        _trace.fail(ValueError, f"bias_add: value has {value.shape[-1]} channels (last axis) but bias "
                    f"has {bias.shape[0]}")
    return _ops.add(value, bias, name=name)


def sigmoid_cross_entropy_with_logits(labels: Blob, logits: Blob, name: Optional[str] = None) -> Blob:
    """Elementwise logistic loss: max(x, 0) - x * z + log(1 + exp(-|x|)).
    Integer or bool labels are taken as their values in the logits' dtype,
    as OneFlow's kernel (templated on the label type) reads them.

    Example:
        >>> @flow.global_function()
        ... def job(labels: tp.Numpy.Placeholder((3,)), logits: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.sigmoid_cross_entropy_with_logits(labels, logits)
        >>> job(np.float32([1, 0, 1]), np.float32([0, 0, 100])).astype(float).round(3).tolist()
        [0.693, 0.693, 0.0]
    """
    for what, v in (("labels", labels), ("logits", logits)):
        if not isinstance(v, Blob):
            _trace.fail(TypeError, f"sigmoid_cross_entropy_with_logits: {what} must be a Blob, "
                        f"got {type(v).__name__}")
    if logits.dtype not in _dtypes.FLOATS:
        _trace.fail(TypeError, "sigmoid_cross_entropy_with_logits: logits must be floating point, got "
                    f"{logits.dtype!r}")
    x, z = logits, labels
    if z.dtype is not x.dtype:
        z = _ops.cast(z, x.dtype)
    return _ops.add(_ops.subtract(_ops.maximum(x, 0.0), _ops.multiply(x, z)),
                    _ops.log(_ops.add(_ops.exp(_ops.negative(_ops.abs(x))), 1.0)), name=name)


logsoftmax = log_softmax  # the name the OneFlow docs use

# Activations and losses composed of primitive ops (issue #12); the capitalized
# names are the ones OneFlow's lazy API exports the losses under.
from ._ops.activations import (elu, gelu, hardsigmoid, hardswish, hardtanh, leaky_relu,  # noqa: E402,F401
                               mish, relu6, silu, softsign, swish)
from ._ops.composite import moments, tril  # noqa: E402,F401
from ._ops.losses import (bce_loss, bce_with_logits_loss,  # noqa: E402,F401
                          distributed_sparse_softmax_cross_entropy_with_logits, kldiv_loss, l1_loss,
                          margin_ranking_loss, mse_loss, smooth_l1_loss, softmax_cross_entropy_with_logits,
                          sparse_cross_entropy, triplet_margin_loss)
BCELoss, BCEWithLogitsLoss, KLDivLoss, L1Loss, MSELoss = (
    bce_loss, bce_with_logits_loss, kldiv_loss, l1_loss, mse_loss)
MarginRankingLoss, TripletMarginLoss = margin_ranking_loss, triplet_margin_loss

# Convolutions, pooling and dropout (issue #11).
from ._ops.conv import (avg_pool1d, avg_pool2d, avg_pool3d, compat_conv2d, conv1d, conv2d,  # noqa: E402,F401
                        conv2d_transpose, conv3d, dropout, max_pool1d, max_pool2d, max_pool3d,
                        torch_conv2d_transpose)

# OneFlow's remaining lazy nn names: functional normalizations, resampling,
# the fused ops and softmax_grad.
from ._ops.fused import (fused_bias_add_dropout, fused_bias_add_gelu, fused_scale_tril,  # noqa: E402,F401
                         fused_scale_tril_softmax_dropout, fused_self_attention_query_mul_key_and_value,
                         random_mask_like, scaled_dot_product_attention, softmax_grad)
from ._ops.norm import (batch_normalization, group_normalization, instance_normalization1d,  # noqa: E402,F401
                        instance_normalization2d, instance_normalization3d, layer_norm)
from ._ops.resample import pixel_shuffle, pixel_shufflev2  # noqa: E402,F401
GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d = (
    group_normalization, instance_normalization1d, instance_normalization2d, instance_normalization3d)
PixelShuffle, PixelShufflev2 = pixel_shuffle, pixel_shufflev2
from ._ops.ctc import ctc_greedy_decoder  # noqa: E402,F401
