"""Normalizations of flow.nn and flow.layers beyond the batch and layer norm
layers of _conv: OneFlow's functional batch_normalization and layer_norm (the
statistics and parameters passed in), GroupNorm, InstanceNorm, the fused
batch-norm-add-relu layers and the explicit layer-norm gradients. All are
written with ordinary ops, so their gradients come from autodiff."""
import numbers
from typing import Any, Optional, Tuple

from . import builders as _ops
from .._core import trace as _trace
from .._core.blob import Blob
from .composite import floating


def _param(p, x, axis, api, what):
    """A 1-D parameter along `axis` of x, or one of x's rank, reshaped to broadcast."""
    if p is None:
        return None
    floating(p, api, what)
    r = len(x.shape)
    if len(p.shape) == 1:
        if p.shape[0] != x.shape[axis]:
            _trace.fail(ValueError, f"{api}: {what} has {p.shape[0]} values but x has {x.shape[axis]} along "
                        f"axis {axis}")
        shape = [1] * r
        shape[axis] = p.shape[0]
        return _ops.reshape(p, shape)
    if len(p.shape) == r:
        return p
    _trace.fail(ValueError, f"{api}: {what} must be 1-D (one value per channel) or have x's rank {r}, got "
                f"shape {tuple(p.shape)}")


def _axis(x, axis, api, what="axis"):
    r = len(x.shape)
    if not isinstance(axis, numbers.Integral) or isinstance(axis, bool) or not -r <= axis < r:
        _trace.fail(ValueError, f"{api}: {what} must be an int in [{-r}, {r}) for a rank-{r} input, got "
                    f"{axis!r}")
    return int(axis) % r


def batch_normalization(x: Blob, mean: Blob, variance: Blob, offset: Optional[Blob] = None,
                        scale: Optional[Blob] = None, variance_epsilon: Optional[float] = 1e-5, axis: int = 1,
                        name: Optional[str] = None) -> Blob:
    """(x - mean) / sqrt(variance + variance_epsilon) * scale + offset, with the
    statistics given: mean, variance, offset and scale are 1-D along `axis`
    (1 for NCHW) or have x's rank.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2)), mean: tp.Numpy.Placeholder((2,)),
        ...         var: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.nn.batch_normalization(x, mean, var, variance_epsilon=0.0, axis=1)
        >>> job(np.float32([[1, 2], [3, 6]]), np.float32([2, 4]), np.float32([1, 4])).tolist()
        [[-1.0, -1.0], [1.0, 1.0]]
    """
    api = "nn.batch_normalization"
    floating(x, api, "x")
    ax = _axis(x, axis, api)
    m = _param(mean, x, ax, api, "mean")
    v = _param(variance, x, ax, api, "variance")
    if m is None or v is None:
        _trace.fail(TypeError, f"{api}: mean and variance must be Blobs")
    eps = 0.0 if variance_epsilon is None else float(variance_epsilon)
    y = _ops.multiply(_ops.subtract(x, m), _ops.rsqrt(_ops.add(v, eps)))
    s = _param(scale, x, ax, api, "scale")
    if s is not None:
        y = _ops.multiply(y, s)
    o = _param(offset, x, ax, api, "offset")
    if o is not None:
        y = _ops.add(y, o)
    return y if name is None else _ops.identity(y, name=name)


def _normalize(x, axes, eps):
    mean = _ops.reduce_mean(x, axes, keepdims=True)
    centered = _ops.subtract(x, mean)
    variance = _ops.reduce_mean(_ops.square(centered), axes, keepdims=True)
    return _ops.multiply(centered, _ops.rsqrt(_ops.add(variance, float(eps))))


def layer_norm(inputs: Blob, gamma: Optional[Blob] = None, beta: Optional[Blob] = None, begin_norm_axis: int = 1,
               begin_params_axis: int = -1, epsilon: float = 1e-5, name: Optional[str] = None) -> Blob:
    """x normalized over the axes from `begin_norm_axis` on (biased variance),
    times gamma plus beta; gamma and beta hold x's shape from
    `begin_params_axis` on.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.nn.layer_norm(x, epsilon=0.0)
        >>> job(np.float32([[1, 3], [5, 5.5]])).tolist()
        [[-1.0, 1.0], [-1.0, 1.0]]
    """
    api = "nn.layer_norm"
    floating(inputs, api, "inputs")
    x = inputs
    r = len(x.shape)
    na = _axis(x, begin_norm_axis, api, "begin_norm_axis")
    pa = _axis(x, begin_params_axis, api, "begin_params_axis")
    if not isinstance(epsilon, numbers.Real) or float(epsilon) < 0:
        _trace.fail(ValueError, f"{api}: epsilon must be a number >= 0, got {epsilon!r}")
    y = _normalize(x, list(range(na, r)), epsilon)
    pshape = list(x.shape[pa:])
    for p, what in ((gamma, "gamma"), (beta, "beta")):
        if p is None:
            continue
        floating(p, api, what)
        n = 1
        for d in p.shape:
            n *= d
        want = 1
        for d in pshape:
            want *= d
        if n != want:
            _trace.fail(ValueError, f"{api}: {what} of shape {tuple(p.shape)} must hold x's shape from axis "
                        f"{pa} on, {tuple(pshape)}")
        p = _ops.reshape(p, [1] * pa + pshape)
        y = _ops.multiply(y, p) if what == "gamma" else _ops.add(y, p)
    return y if name is None else _ops.identity(y, name=name)


def _affine(x, affine, name, api):
    """x * gamma + beta with variables `<name>_gamma` (ones) and `<name>_beta`
    (zeros) of shape (1, C, 1), OneFlow's GroupNorm and InstanceNorm parameters."""
    if not affine:
        return x
    from .._core.variables import ConstantInitializer, get_variable
    c = x.shape[1]
    gamma = get_variable(f"{name}_gamma", shape=(1, c, 1), dtype=x.dtype, initializer=ConstantInitializer(1.0))
    beta = get_variable(f"{name}_beta", shape=(1, c, 1), dtype=x.dtype, initializer=ConstantInitializer(0.0))
    return _ops.add(_ops.multiply(x, gamma), beta)


def _unique(name, prefix):
    return _trace.unique_name(name, prefix, "nn", f"nn:{prefix}", prefix)


def group_normalization(x: Blob, num_groups: int = 32, eps: float = 1e-05, affine: bool = True,
                        name: Optional[str] = None) -> Blob:
    """Normalizes each of `num_groups` groups of channels of x (N, C, ...) per
    sample over its channels and spatial positions; with `affine`, scales and
    shifts each channel by the variables `<name>_gamma` and `<name>_beta`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 4, 1))) -> tp.Numpy:
        ...     return flow.nn.group_normalization(x, num_groups=2, eps=0.0)
        >>> job(np.float32([[[1], [3], [0], [10]]]))[0, :, 0].tolist()
        [-1.0, 1.0, -1.0, 1.0]
    """
    api = "GroupNorm"
    floating(x, api, "x")
    if len(x.shape) < 3:
        _trace.fail(ValueError, f"{api}: x must have rank >= 3 (N, C, spatial...), got shape {tuple(x.shape)}")
    if not isinstance(num_groups, numbers.Integral) or isinstance(num_groups, bool) or num_groups < 1 \
            or x.shape[1] % num_groups:
        _trace.fail(ValueError, f"{api}: num_groups must be a positive divisor of the {x.shape[1]} channels, "
                    f"got {num_groups!r}")
    name = _unique(name, api)
    n, c = x.shape[0], x.shape[1]
    y = _normalize(_ops.reshape(x, [n, int(num_groups), -1]), [2], eps)
    y = _affine(_ops.reshape(y, [n, c, -1]), affine, name, api)
    return _ops.reshape(y, list(x.shape))


def _instance_norm(x, rank, eps, affine, name, api):
    floating(x, api, "x")
    if len(x.shape) != rank:
        _trace.fail(ValueError, f"{api}: x must have rank {rank} (N, C and {rank - 2} spatial dims), got shape "
                    f"{tuple(x.shape)}")
    name = _unique(name, api)
    n, c = x.shape[0], x.shape[1]
    y = _normalize(_ops.reshape(x, [n, c, -1]), [2], eps)
    return _ops.reshape(_affine(y, affine, name, api), list(x.shape))


def instance_normalization1d(x: Blob, eps: float = 1e-05, affine: bool = True, name: Optional[str] = None) -> Blob:
    """Normalizes each channel of each sample of x (N, C, L) over L; with
    `affine`, the variables `<name>_gamma` and `<name>_beta` (1, C, 1) apply.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.instance_normalization1d(x, eps=0.0)
        >>> job(np.float32([[[1, 3], [10, 0]]])).tolist()
        [[[-1.0, 1.0], [1.0, -1.0]]]
    """
    return _instance_norm(x, 3, eps, affine, name, "InstanceNorm1d")


def instance_normalization2d(x: Blob, eps: float = 1e-05, affine: bool = True, name: Optional[str] = None) -> Blob:
    """:func:`instance_normalization1d` for x (N, C, H, W), over H and W.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.instance_normalization2d(x, eps=0.0)
        >>> job(np.float32([[[[1, 3], [3, 1]]]])).tolist()
        [[[[-1.0, 1.0], [1.0, -1.0]]]]
    """
    return _instance_norm(x, 4, eps, affine, name, "InstanceNorm2d")


def instance_normalization3d(x: Blob, eps: float = 1e-05, affine: bool = True, name: Optional[str] = None) -> Blob:
    """:func:`instance_normalization1d` for x (N, C, D, H, W), over D, H and W.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 2, 1, 1))) -> tp.Numpy:
        ...     return flow.nn.instance_normalization3d(x, eps=0.0)
        >>> job(np.float32([1, 3]).reshape(1, 1, 2, 1, 1)).ravel().tolist()
        [-1.0, 1.0]
    """
    return _instance_norm(x, 5, eps, affine, name, "InstanceNorm3d")


def batch_normalization_add_relu(inputs: Blob, addend: Optional[Blob] = None, axis: int = -1,
                                 momentum: float = 0.99, epsilon: float = 0.001, center: bool = True,
                                 scale: bool = True, beta_initializer: Optional[Any] = None,
                                 gamma_initializer: Optional[Any] = None, beta_regularizer: Optional[Any] = None,
                                 gamma_regularizer: Optional[Any] = None,
                                 moving_mean_initializer: Optional[Any] = None,
                                 moving_variance_initializer: Optional[Any] = None, trainable: bool = True,
                                 training: bool = True, name: str = "BatchNorm") -> Blob:
    """relu(batch_normalization(inputs) + addend) (addend optional), with the
    variables and moving statistics of :func:`flowjit.layers.batch_normalization`.

    Example:
        >>> @flow.global_function()   # predict: the moving statistics (0 and 1) normalize
        ... def job(x: tp.Numpy.Placeholder((1, 3)), a: tp.Numpy.Placeholder((1, 3))) -> tp.Numpy:
        ...     return flow.layers.batch_normalization_add_relu(x, a, axis=1, epsilon=0.0)
        >>> job(np.float32([[1, -2, 3]]), np.float32([[1, 1, -4]])).tolist()
        [[2.0, 0.0, 0.0]]
    """
    from .conv import batch_normalization as bn
    y = bn(inputs, axis, momentum, epsilon, center, scale, beta_initializer, gamma_initializer,
           beta_regularizer, gamma_regularizer, moving_mean_initializer, moving_variance_initializer,
           trainable, training, name)
    if addend is not None:
        floating(addend, "batch_normalization_add_relu", "addend")
        if tuple(addend.shape) != tuple(inputs.shape):
            _trace.fail(ValueError, f"batch_normalization_add_relu: addend has shape {tuple(addend.shape)} but "
                        f"inputs have {tuple(inputs.shape)}")
        y = _ops.add(y, addend)
    return _ops.relu(y)


def batch_normalization_relu(inputs: Blob, axis: int = -1, momentum: float = 0.99, epsilon: float = 0.001,
                             center: bool = True, scale: bool = True, beta_initializer: Optional[Any] = None,
                             gamma_initializer: Optional[Any] = None, beta_regularizer: Optional[Any] = None,
                             gamma_regularizer: Optional[Any] = None,
                             moving_mean_initializer: Optional[Any] = None,
                             moving_variance_initializer: Optional[Any] = None, trainable: bool = True,
                             training: bool = True, name: str = "BatchNorm") -> Blob:
    """relu(batch_normalization(inputs)), with the variables of
    :func:`flowjit.layers.batch_normalization`.

    Example:
        >>> @flow.global_function()   # predict: the moving statistics (0 and 1) normalize
        ... def job(x: tp.Numpy.Placeholder((1, 3))) -> tp.Numpy:
        ...     return flow.layers.batch_normalization_relu(x, axis=1, epsilon=0.0)
        >>> job(np.float32([[1, -2, 3]])).tolist()
        [[1.0, 0.0, 3.0]]
    """
    return batch_normalization_add_relu(inputs, None, axis, momentum, epsilon, center, scale, beta_initializer,
                                        gamma_initializer, beta_regularizer, gamma_regularizer,
                                        moving_mean_initializer, moving_variance_initializer, trainable,
                                        training, name)


def _norm_axes(x, begin, api, what):
    floating(x, api, "x")
    a = _axis(x, begin, api, what)
    return list(range(a, len(x.shape)))


def layer_norm_grad(dy: Blob, x: Blob, mean: Blob, inv_variance: Blob, begin_norm_axis: int = 1,
                    name: str = "LayerNormGrad") -> Blob:
    """The gradient of layer normalization (without gamma and beta) with
    respect to x: with xhat = (x - mean) * inv_variance over the axes from
    begin_norm_axis on (mean and inv_variance shaped to broadcast, or holding
    one value per normalized row), dx = inv_variance * (dy - mean(dy) -
    xhat * mean(dy * xhat)).

    Example:
        >>> @flow.global_function()
        ... def job(dy: tp.Numpy.Placeholder((1, 2)), x: tp.Numpy.Placeholder((1, 2)),
        ...         mean: tp.Numpy.Placeholder((1, 1)), inv_var: tp.Numpy.Placeholder((1, 1))) -> tp.Numpy:
        ...     return flow.layers.layer_norm_grad(dy, x, mean, inv_var)
        >>> job(np.float32([[1, 1]]), np.float32([[1, 3]]), np.float32([[2]]), np.float32([[1]])).tolist()
        [[0.0, 0.0]]
    """
    api = "layers.layer_norm_grad"
    axes = _norm_axes(x, begin_norm_axis, api, "begin_norm_axis")
    for b, what in ((dy, "dy"), (mean, "mean"), (inv_variance, "inv_variance")):
        floating(b, api, what)
    if tuple(dy.shape) != tuple(x.shape):
        _trace.fail(ValueError, f"{api}: dy has shape {tuple(dy.shape)} but x has {tuple(x.shape)}")
    kept = list(x.shape[:axes[0]]) + [1] * len(axes)
    m = _ops.reshape(mean, kept)
    iv = _ops.reshape(inv_variance, kept)
    xhat = _ops.multiply(_ops.subtract(x, m), iv)
    g = _ops.subtract(_ops.subtract(dy, _ops.reduce_mean(dy, axes, keepdims=True)),
                      _ops.multiply(xhat, _ops.reduce_mean(_ops.multiply(dy, xhat), axes, keepdims=True)))
    return _ops.multiply(iv, g, name=name)


def layer_norm_param_grad(dy: Blob, norm: Blob, gamma: Blob, begin_params_axis: int = -1,
                          name: str = "LayerNormParamGrad") -> Tuple[Blob, Blob, Blob]:
    """The gradients of y = norm * gamma + beta, in OneFlow's order:
    (normalized_diff = dy * gamma, beta_diff = the sum of dy over the leading
    axes, gamma_diff = the sum of dy * norm over them); gamma holds norm's
    shape from begin_params_axis on.

    Example:
        >>> @flow.global_function()
        ... def job(dy: tp.Numpy.Placeholder((2, 2)), norm: tp.Numpy.Placeholder((2, 2)),
        ...         gamma: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     dx, beta_diff, gamma_diff = flow.layers.layer_norm_param_grad(dy, norm, gamma)
        ...     return flow.concat([beta_diff, gamma_diff], axis=0)
        >>> job(np.float32([[1, 2], [3, 4]]), np.float32([[1, -1], [1, 1]]), np.float32([2, 2])).tolist()
        [4.0, 6.0, 4.0, 2.0]
    """
    api = "layers.layer_norm_param_grad"
    axes = _norm_axes(norm, begin_params_axis, api, "begin_params_axis")
    floating(dy, api, "dy")
    floating(gamma, api, "gamma")
    if tuple(dy.shape) != tuple(norm.shape):
        _trace.fail(ValueError, f"{api}: dy has shape {tuple(dy.shape)} but norm has {tuple(norm.shape)}")
    pshape = list(norm.shape[axes[0]:])
    lead = list(range(axes[0]))

    def lead_sum(v):
        return _ops.reshape(_ops.reduce_sum(v, lead) if lead else v, list(gamma.shape))
    d_norm = _ops.multiply(dy, _ops.reshape(gamma, [1] * axes[0] + pshape), name=f"{name}_normalized_diff")
    return d_norm, lead_sum(dy), lead_sum(_ops.multiply(dy, norm))
