"""flow.layers: layers built from variables and ops.

The docstrings' examples assume ``import numpy as np``, ``import flowjit as flow``
and ``import flowjit.typing as tp``; each starts from a fresh session.
"""
import numbers
from typing import Callable, Optional, Sequence

from . import _C, nn
from ._ops import builders as _ops
from ._core import trace as _trace
from ._core.blob import Blob
from ._ops.encode import categorical_ordinal_encoder  # noqa: F401
from ._core.variables import Initializer, get_variable
from .distribute import Distribute
from .regularizers import Regularizer


def _layer_name(api, title, name):
    """`name`, or for an unnamed layer `<title>_<n>` (as the convolution layers)."""
    return _trace.unique_name(name, api, "layers", f"layer:{api}", title)


def dense(inputs: Blob, units: int, activation: Optional[Callable[[Blob], Blob]] = None, use_bias: bool = True,
          kernel_initializer: Optional[Initializer] = None, bias_initializer: Optional[Initializer] = None,
          kernel_regularizer: Optional[Regularizer] = None, bias_regularizer: Optional[Regularizer] = None,
          trainable: bool = True, name: Optional[str] = None, model_distribute: Optional[Distribute] = None) -> Blob:
    """A fully connected layer: activation(inputs @ weight^T + bias).

    OneFlow's conventions: the weight is a variable `<name>-weight` of shape
    (units, in_features), the bias `<name>-bias` of shape (units,); inputs of
    rank > 2 are flattened to (-1, in_features) and reshaped back. Without a
    name the layers of a job are Dense_0, Dense_1, ... in trace order (so a
    train and an eval job building the same layers share their variables).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.layers.dense(x, units=2, activation=flow.math.relu,
        ...                              kernel_initializer=flow.constant_initializer(0.5),
        ...                              bias_initializer=flow.constant_initializer(-2.0))
        >>> job(np.float32([[1, 2, 3], [1, 1, 1]])).tolist()   # relu(0.5 * sum(x) - 2), twice
        [[1.0, 1.0], [0.0, 0.0]]
    """
    name = _layer_name("dense", "Dense", name)
    loc = _trace.user_location()
    if not isinstance(inputs, Blob):
        _trace.fail(TypeError, f"dense '{name}': inputs must be a Blob, got {type(inputs).__name__}", loc)
    if not isinstance(units, numbers.Integral) or isinstance(units, bool) or units <= 0:
        _trace.fail(ValueError, f"dense '{name}': units must be a positive int, got {units!r}", loc)
    shape = inputs.shape
    if len(shape) < 2:
        _trace.fail(ValueError, f"dense '{name}': inputs must have rank >= 2 (batch, features), got "
                    f"shape {shape}", loc)
    in_features = shape[-1]
    wname = f"{name}-weight"
    info = _C.variable_info(wname)
    if info is not None and len(info[0]) == 2 and tuple(info[0]) != (units, in_features):
        have_units, have_in = info[0]
        if have_in != in_features:
            _trace.fail(ValueError, f"dense '{name}': input has {in_features} features but weight "
                        f"'{wname}' expects {have_in}", loc)
        _trace.fail(ValueError, f"dense '{name}': {units} units requested but weight '{wname}' has "
                    f"{have_units}", loc)
    x = inputs if len(shape) == 2 else _ops.reshape(inputs, [-1, in_features])
    weight = get_variable(wname, shape=(units, in_features), dtype=inputs.dtype,
                          initializer=kernel_initializer, regularizer=kernel_regularizer,
                          trainable=trainable, distribute=model_distribute)
    out = _ops.matmul(x, weight, transpose_b=True, name=f"{name}_matmul")
    if use_bias:
        bias = get_variable(f"{name}-bias", shape=(units,), dtype=inputs.dtype,
                            initializer=bias_initializer, regularizer=bias_regularizer,
                            trainable=trainable)
        out = nn.bias_add(out, bias, name=f"{name}_bias_add")
    if activation is not None:
        out = activation(out)
    if len(shape) > 2:
        out = _ops.reshape(out, list(shape[:-1]) + [units])
    return out


def prelu(inputs: Blob, alpha_initializer: Optional[Initializer] = None,
          alpha_regularizer: Optional[Regularizer] = None, shared_axes: Optional[Sequence[int]] = None,
          trainable: bool = True, name: Optional[str] = None, model_distribute: Optional[Distribute] = None) -> Blob:
    """max(x, 0) + alpha * min(x, 0) with a learned alpha: the variable
    `<name>-alpha` of shape inputs.shape[1:], extent 1 along `shared_axes`
    (axes of inputs, >= 1); zeros unless alpha_initializer says otherwise.
    Without a name the layers of a job are PRelu_0, PRelu_1, ...

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 3))) -> tp.Numpy:
        ...     return flow.layers.prelu(x, alpha_initializer=flow.constant_initializer(0.25))
        >>> job(np.float32([[-4, 0, 2]])).tolist()
        [[-1.0, 0.0, 2.0]]
    """
    name = _layer_name("prelu", "PRelu", name)
    loc = _trace.user_location()
    if not isinstance(inputs, Blob):
        _trace.fail(TypeError, f"prelu '{name}': inputs must be a Blob, got {type(inputs).__name__}", loc)
    shape = list(inputs.shape)
    if len(shape) < 2:
        _trace.fail(ValueError, f"prelu '{name}': inputs must have rank >= 2 (batch first), got shape "
                    f"{tuple(shape)}", loc)
    alpha_shape = shape[1:]
    for a in shared_axes or ():
        if not isinstance(a, numbers.Integral) or isinstance(a, bool) or not 1 <= a < len(shape):
            _trace.fail(ValueError, f"prelu '{name}': shared_axes must hold axes 1..{len(shape) - 1} of "
                        f"the rank-{len(shape)} inputs, got {list(shared_axes)!r}", loc)
        alpha_shape[a - 1] = 1
    alpha = get_variable(f"{name}-alpha", shape=tuple(alpha_shape), dtype=inputs.dtype,
                         initializer=alpha_initializer or _variables.constant_initializer(0.0),
                         regularizer=alpha_regularizer, trainable=trainable,
                         distribute=model_distribute)
    return _activations.prelu(inputs, alpha, name=name)


from ._ops import activations as _activations  # noqa: E402
from ._core import variables as _variables  # noqa: E402

# Convolution, pooling and normalization layers (issue #11).
from ._ops.conv import (average_pooling1d, average_pooling2d, average_pooling3d,  # noqa: E402,F401
                        batch_normalization, layer_norm, max_pooling1d, max_pooling2d, max_pooling3d)
from ._ops.conv import (layer_conv1d as conv1d, layer_conv2d as conv2d,  # noqa: E402,F401
                        layer_conv3d as conv3d)

# Fused batch-norm layers, the explicit layer-norm gradients and upsampling.
from ._ops.norm import (batch_normalization_add_relu, batch_normalization_relu,  # noqa: E402,F401
                        layer_norm_grad, layer_norm_param_grad)
from ._ops.resample import upsample_2d  # noqa: E402,F401
