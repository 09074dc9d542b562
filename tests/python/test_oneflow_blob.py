"""OneFlow's blob-level API as OneFlow's own op tests use it: typing.Tuple
parameters, blob operators and layout attributes, flow.Size, logical-view
casts and the distribute ops, local blobs and watch handlers, layer names."""
import threading
from typing import Tuple

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


@pytest.fixture(autouse=True)
def _fresh_session():
    flow.clear_default_session()
    yield
    flow.config.cpu_device_num(1)
    flow.clear_default_session()


# ---------------------------------------------------------------- typing.Tuple parameters

def test_a_tuple_of_placeholders_is_one_parameter():
    @flow.global_function()
    def add3(xs: Tuple[(tp.Numpy.Placeholder((5, 2)),) * 3], y: tp.Numpy.Placeholder((5, 2))) -> tp.Numpy:
        assert isinstance(xs, tuple) and len(xs) == 3
        return flow.math.add_n(list(xs)) * y

    a = [np.random.rand(5, 2).astype(np.float32) for _ in range(4)]
    np.testing.assert_allclose(add3(tuple(a[:3]), a[3]), (a[0] + a[1] + a[2]) * a[3], rtol=1e-6)
    np.testing.assert_allclose(add3(xs=a[:3], y=a[3]), (a[0] + a[1] + a[2]) * a[3], rtol=1e-6)
    with pytest.raises(TypeError, match=r"^job 'add3': parameter 'xs' is annotated as a typing.Tuple of 3 "
                                        r"placeholders, so it takes a tuple of 3 arrays; got a list of 2$"):
        add3(a[:2], a[3])
    with pytest.raises(TypeError, match=r"^job 'add3' takes 2 arguments \(xs, y\) but 1 was given$"):
        add3(tuple(a[:3]))


def test_nested_tuples_and_list_placeholders_in_a_tuple():
    cfg = flow.FunctionConfig()
    cfg.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=cfg)
    def f(x: Tuple[tp.ListNumpy.Placeholder((4,)), Tuple[tp.ListNumpy.Placeholder((4,))]]
          ) -> Tuple[tp.ListNumpy, tp.ListNumpy]:
        a, (b,) = x
        return a + b, a - b

    u, v = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    s, d = f(([u], ([v],)))
    np.testing.assert_array_equal(s[0], u + v)
    np.testing.assert_array_equal(d[0], u - v)


def test_a_tuple_annotation_must_hold_placeholders():
    with pytest.raises(TypeError, match=r"parameter 'x_1' needs a placeholder annotation"):
        @flow.global_function()
        def bad(x: Tuple[tp.Numpy.Placeholder((2,)), int]) -> tp.Numpy:
            return x[0]


def test_placeholder_takes_a_name():
    ph = tp.Numpy.Placeholder((2, 3), dtype=flow.float, name="images")
    assert ph.name == "images" and ph.shape == (2, 3)
    with pytest.raises(TypeError, match=r"name must be a string"):
        tp.Numpy.Placeholder((2,), name=3)


# ---------------------------------------------------------------- operators and attributes

def test_mod_and_floordiv_follow_numpy():
    @flow.global_function()
    def f(a: tp.Numpy.Placeholder((64, 64)), b: tp.Numpy.Placeholder((64, 64))
          ) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        return a % b, a // b, 3.0 % b, (a * 10.0) % -0.7

    rng = np.random.default_rng(0)
    a = (rng.random((64, 64), np.float32) - 0.5) * 8
    b = rng.random((64, 64), np.float32) + 0.01
    m, q, r, n = f(a, b)
    np.testing.assert_array_equal(m, a % b)  # exact, as numpy's
    np.testing.assert_array_equal(q, a // b)
    np.testing.assert_allclose(r, np.float32(3.0) % b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(n, (a * np.float32(10)) % np.float32(-0.7), rtol=1e-5, atol=1e-5)

    @flow.global_function()
    def g(a: tp.Numpy.Placeholder((6,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy]:
        return a % 4, a // 4

    ai = np.array([-7, -4, -1, 0, 5, 9], np.int32)
    m, q = g(ai)
    np.testing.assert_array_equal(m, ai % 4)
    np.testing.assert_array_equal(q, ai // 4)


def test_blob_layout_attributes_say_what_was_declared():
    seen = {}

    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((4, 6))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(6, 6), distribute=flow.distribute.split(1))
        y = flow.matmul(x, w)
        seen.update(dynamic=y.is_dynamic, tensor_list=y.is_tensor_list, split=y.split_axis,
                    dist=y.distribute, wsplit=w.split_axis, lbn=y.logical_blob_name, op=y.op_name,
                    tag=y.parallel_conf.device_tag(), size=y.parallel_size, job=y.job_name)
        z = y.with_distribute(flow.distribute.split(-1))
        seen.update(zsplit=z.split_axis, zb=y.with_broadcast_distribute().distribute,
                    zs=y.with_split_distribute(0).split_axis, same=z.shape == y.shape)
        return z

    np.testing.assert_array_equal(f(np.zeros((4, 6), np.float32)), np.zeros((4, 6), np.float32))
    assert seen["dynamic"] is False and seen["tensor_list"] is False
    assert seen["split"] == flow.INVALID_SPLIT_AXIS and seen["dist"] == flow.distribute.auto()
    assert seen["wsplit"] == 1 and seen["zsplit"] == 1 and seen["zs"] == 0
    assert seen["zb"] == flow.distribute.broadcast() and seen["same"]
    assert seen["lbn"] == f"{seen['op']}/out" and seen["tag"] == "cpu" and seen["size"] == 1
    assert seen["job"] == "f"


def test_with_distribute_checks_its_argument():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x.with_distribute(flow.distribute.split(2))

    with pytest.raises(ValueError, match=r"with_distribute: blob 'x' has shape \(4,\), which has no axis 2"):
        f(np.zeros(4, np.float32))


def test_parallel_conf_follows_the_placement_and_device_count():
    seen = []
    flow.config.cpu_device_num(2)

    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((4,)), odd: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        y = flow.math.reduce_sum(x)
        seen.append((x.parallel_size, x.parallel_conf.device_name(), x.split_axis, odd.split_axis,
                     y.split_axis))
        return x + 1

    f(np.zeros(4, np.float32), np.zeros(3, np.float32))
    # A placeholder is split along axis 0 where its first extent divides (jit/distribute.h).
    assert seen == [(2, ["0:0-1"], 0, flow.INVALID_SPLIT_AXIS, flow.INVALID_SPLIT_AXIS)]


def test_size():
    s = flow.Size([2, 3, 2, 4])
    assert s == (2, 3, 2, 4) and isinstance(s, tuple) and s != [2, 3, 2, 4]
    assert s.numel() == 48 and flow.Size(()).numel() == 1
    assert s.index(2) == 0 and s.index(2, start=1) == 2 and s.count(2) == 2
    with pytest.raises(ValueError):
        s.index(4, start=0, end=3)
    assert repr(s) == "flow.Size([2, 3, 2, 4])"
    with pytest.raises(ValueError, match=r"non-negative int"):
        flow.Size((2, -1))
    with pytest.raises(TypeError, match=r"sequence of ints"):
        flow.Size(3)


# ---------------------------------------------------------------- views and layout casts

def test_view_casts_are_identities_and_dynamic_resize_is_refused():
    seen = []

    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((3, 4))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        seen.append(flow.cast_to_current_logical_view(x) is x)
        a = flow.cast_to_static_shape(x)
        b = flow.parallel_cast(x, distribute=flow.distribute.split(1),
                               gradient_distribute=flow.distribute.broadcast())
        c = flow.hierarchical_parallel_cast(x, parallel_distribution=["S(0)", "B"])
        seen.append((a.is_dynamic, b.split_axis))
        return a, b, c

    x = np.random.rand(3, 4).astype(np.float32)
    for out in f(x):
        np.testing.assert_array_equal(out, x)
    assert seen == [True, (False, 1)]

    @flow.global_function()
    def resize(x: tp.Numpy.Placeholder((3,)), n: tp.Numpy.Placeholder((1,), dtype=flow.int32)) -> tp.Numpy:
        return flow.sync_dynamic_resize(x, n)

    with pytest.raises(NotImplementedError, match=r"sync_dynamic_resize: flowjit has no dynamic shapes"):
        resize(np.zeros(3, np.float32), np.ones(1, np.int32))

    @flow.global_function()
    def bad(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.parallel_cast(x, distribute="S(0)")

    with pytest.raises(ValueError, match=r"parallel_cast: distribute must be flow.distribute.split"):
        bad(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match=r"not a valid distribute"):
        flow.distribute.assert_is_valid_distribute("split")
    flow.distribute.assert_is_valid_distribute(flow.distribute.split(0))


def test_distribute_ops_compute_their_values():
    flow.config.cpu_device_num(2)

    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((5, 3))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        parts = flow.advanced.distribute_split(x, axis=0)
        assert [p.shape for p in parts] == [(3, 3), (2, 3)]  # balanced: the first part one longer
        clones = flow.advanced.distribute_clone(x)
        mapped = flow.advanced.distribute_map(x, lambda p: p * 2.0)
        return (parts[1], flow.advanced.distribute_concat(list(parts), axis=0),
                flow.advanced.distribute_add(list(clones)), mapped, clones[0])

    x = np.random.rand(5, 3).astype(np.float32)
    p1, whole, total, mapped, clone = f(x)
    np.testing.assert_array_equal(p1, x[3:])
    np.testing.assert_array_equal(whole, x)
    np.testing.assert_allclose(total, 2 * x, rtol=1e-6)
    np.testing.assert_allclose(mapped, 2 * x, rtol=1e-6)
    np.testing.assert_array_equal(clone, x)

    @flow.global_function()
    def wrong(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return flow.advanced.distribute_add([x, x, x])

    with pytest.raises(ValueError, match=r"distribute_add: the current placement has 2 device\(s\) but 3 "
                                         r"blobs were given"):
        wrong(np.zeros(4, np.float32))


# ---------------------------------------------------------------- local blobs and watches

def test_local_blob_behaves_like_its_array():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((4, 3)), y: tp.Numpy.Placeholder((4,), dtype=flow.int32)):
        return x * 1.0, y + 0

    logits = np.array([[0, 2, 1], [5, 1, 0], [0, 0, 3], [1, 4, 2]], np.float32)
    labels = np.array([1, 0, 2, 0], np.int32)
    lx, ly = f(logits, labels).get()
    assert lx.size == 12 and lx.shape == (4, 3) and lx.dtype == np.float32 and len(lx) == 4
    assert ly.tolist() == [1, 0, 2, 0] and not lx.is_dynamic and lx.parallel_num() == 1
    np.testing.assert_array_equal(np.argmax(lx.ndarray(), 1) == ly, [True, True, True, False])
    np.testing.assert_array_equal(np.argmax(lx, 1) == labels, [True, True, True, False])
    np.testing.assert_array_equal(lx + 1, logits + 1)
    np.testing.assert_array_equal(2 * lx - lx, logits)
    np.testing.assert_array_equal(lx[1], logits[1])
    assert (lx == logits).all() and float(lx.sum()) == float(logits.sum())
    assert lx.numpy_list()[0] is lx.numpy()


def test_watch_handlers_get_the_form_their_annotation_asks_for_before_the_call_returns():
    got = {}

    def as_numpy(v: tp.Numpy):
        got["numpy"] = (type(v), v.shape)

    def as_list(v: tp.ListNumpy):
        got["list"] = (type(v), len(v), v[0].shape)

    def as_local(v):
        got["local"] = (v.numpy_list()[0].shape, v.numpy().shape, v.is_dynamic)
        got["thread"] = threading.get_ident()

    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.watch(x, as_numpy)
        flow.watch(x, as_list)
        flow.watch(x, as_local)
        return x

    f(np.ones(3, np.float32))
    # No sync: the handlers have run when the synchronous call returns.
    assert got["numpy"][1] == (3,) and issubclass(got["numpy"][0], np.ndarray)
    assert got["list"][0] is list and got["list"][1:] == (1, (3,))
    assert got["local"] == ((3,), (3,), False) and got["thread"] != threading.get_ident()

    def bad_annotation(v: int):
        pass

    @flow.global_function()
    def g(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.watch(x, bad_annotation)
        return x

    with pytest.raises(TypeError, match=r"flow.watch: the handler's parameter is annotated <class 'int'>"):
        g(np.ones(3, np.float32))

    @flow.global_function()
    def h(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.watch(x, lambda a, b: None)
        return x

    with pytest.raises(TypeError, match=r"flow.watch: the handler must take one argument"):
        h(np.ones(3, np.float32))


def test_an_unannotated_watch_of_a_per_device_value_is_their_concatenation():
    flow.config.cpu_device_num(2)
    cfg = flow.FunctionConfig()
    cfg.default_logical_view(flow.scope.mirrored_view())
    got = []

    @flow.global_function(function_config=cfg)
    def f(x: tp.ListNumpy.Placeholder((2,))) -> tp.ListNumpy:
        y = x * 2.0
        flow.watch(y, lambda v: got.append((np.array(v), [np.array(p) for p in v.numpy_list()])))
        return y

    f([np.array([1, 2], np.float32), np.array([3, 4], np.float32)])
    whole, parts = got[0]
    np.testing.assert_array_equal(whole, [2, 4, 6, 8])
    np.testing.assert_array_equal(parts[1], [6, 8])


# ---------------------------------------------------------------- names and trainability

def test_unnamed_layers_get_names_of_their_own():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        h = flow.layers.dense(x, 4)
        h = flow.layers.dense(h, 5)
        return flow.layers.prelu(flow.layers.dense(h, 2, name="head"))

    assert f(np.ones((2, 3), np.float32)).shape == (2, 2)
    assert sorted(flow.get_all_variables()) == ["Dense_0-bias", "Dense_0-weight", "Dense_1-bias",
                                                "Dense_1-weight", "PRelu_0-alpha", "head-bias",
                                                "head-weight"]


def test_trainable_is_the_requesting_jobs():
    """A variable an eval job created with trainable=False is trained by a
    train job asking for it with trainable=True (as in OneFlow)."""
    def var(trainable):
        return flow.get_variable("v", shape=(3,), initializer=flow.constant_initializer(1.0),
                                 trainable=trainable)

    @flow.global_function()
    def read() -> tp.Numpy:
        return var(False)

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        v = var(True)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(v * x)
        return v

    np.testing.assert_array_equal(read(), np.ones(3, np.float32))
    train(np.array([1, 2, 3], np.float32))
    # d(sum(v * x) / 3)/dv = x / 3 (OneFlow scales by the number of loss elements).
    np.testing.assert_allclose(read(), 1 - 0.1 * np.array([1, 2, 3]) / 3, rtol=1e-6)


# ---------------------------------------------------------------- tp.Numpy in the mirrored view

def test_a_numpy_argument_in_the_mirrored_view_is_cut_into_one_part_per_device():
    """OneFlow: a consistent input seen from the mirrored view over 2 devices
    is its rows cut in two; a tp.Numpy result joins the devices' rows."""
    flow.config.cpu_device_num(2)
    cfg = flow.FunctionConfig()
    cfg.default_logical_view(flow.scope.mirrored_view())
    shapes = []

    @flow.global_function(function_config=cfg)
    def f(x: tp.Numpy.Placeholder((4, 3))) -> Tuple[tp.Numpy, tp.ListNumpy]:
        y = flow.identity(x)
        shapes.append(y.shape)
        return y * 2.0, flow.math.reduce_sum(y, axis=[0], keepdims=True)

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    whole, per_device = f(x)
    assert shapes == [(2, 3)]
    np.testing.assert_array_equal(whole, x * 2)
    np.testing.assert_array_equal(per_device[0], x[:2].sum(0, keepdims=True))
    np.testing.assert_array_equal(per_device[1], x[2:].sum(0, keepdims=True))

    @flow.global_function(function_config=cfg)
    def odd(x: tp.Numpy.Placeholder((3,))) -> tp.ListNumpy:
        return x + 1

    with pytest.raises(ValueError, match=r"^job 'odd': parameter 'x' is a tp.Numpy placeholder in the mirrored "
                                         r"view over 2 devices, so its array is cut along axis 0 into 2 equal "
                                         r"parts, one per device; shape \(3,\) cannot be"):
        odd(np.zeros(3, np.float32))

    @flow.global_function(function_config=cfg)
    def total(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return flow.math.reduce_sum(x)

    # each device's full reduction has shape (1,) (OneFlow's shape rule), so they join into one per device
    v = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(total(v), [v[:2].sum(), v[2:].sum()])

    @flow.global_function(function_config=cfg)
    def scalar(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return flow.reshape(flow.math.reduce_sum(x), [])

    with pytest.raises(TypeError, match=r"a 0-d one cannot be joined into one array along axis 0; annotate "
                                        r"it tp.ListNumpy"):
        scalar(np.zeros(4, np.float32))
