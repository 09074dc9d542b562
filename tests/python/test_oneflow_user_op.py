"""flow.user_op_builder: OneFlow op types mapped onto flowjit ops, against numpy."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


def _cfg():
    cfg = flow.function_config()
    cfg.default_data_type(flow.float32)
    return cfg


def _run(body, *arrays):
    """Traces `body(*blobs)` in a predict job over float32 placeholders."""
    flow.clear_default_session()
    shapes = [a.shape for a in arrays]
    if len(arrays) == 1:
        @flow.global_function(function_config=_cfg())
        def job(x: tp.Numpy.Placeholder(shapes[0], dtype=flow.float32)) -> tp.Numpy:
            return body(x)
    else:
        @flow.global_function(function_config=_cfg())
        def job(x: tp.Numpy.Placeholder(shapes[0], dtype=flow.float32),
                y: tp.Numpy.Placeholder(shapes[1], dtype=flow.float32)) -> tp.Numpy:
            return body(x, y)
    return job(*arrays)


X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
Y = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)


def _one(op, ins, out="out", attrs=()):
    b = flow.user_op_builder("u").Op(op)
    for k, v in ins:
        b = b.Input(k, v)
    for k, v in attrs:
        b = b.Attr(k, v)
    return b.Output(out).Build().InferAndTryRun().SoleOutputBlob()


def test_relu_sigmoid_and_unary_math():
    np.testing.assert_array_equal(_run(lambda x: _one("relu", [("in", [x])]), X), np.maximum(X, 0))
    np.testing.assert_allclose(_run(lambda x: _one("sigmoid_v2", [("x", [x])], "y"), X),
                               1 / (1 + np.exp(-X)), rtol=1e-6)
    np.testing.assert_allclose(_run(lambda x: _one("exp", [("x", [x])], "y"), X), np.exp(X), rtol=1e-6)


def test_matmul_with_attributes():
    got = _run(lambda a, b: _one("matmul", [("a", [a]), ("b", [b])],
                                 attrs=[("transpose_a", False), ("alpha", 2.0)]), X, Y)
    np.testing.assert_allclose(got, 2 * X @ Y, rtol=1e-5)


def test_reshape_transpose_cast_scalar_mul():
    np.testing.assert_array_equal(_run(lambda x: _one("reshape", [("in", [x])], attrs=[("shape", (4, 3))]), X),
                                  X.reshape(4, 3))
    got = _run(lambda x: _one("transpose", [("input", [x])], "output", [("perm", [1, 0])]), X)
    np.testing.assert_array_equal(got, X.T)
    got = _run(lambda x: _one("cast", [("in", [x])], attrs=[("dtype", flow.int32)]), X)
    np.testing.assert_array_equal(got, X.astype(np.int32))
    got = _run(lambda x: _one("scalar_mul", [("in", [x])], attrs=[("has_float_operand", True),
                                                                   ("float_operand", 3.0)]), X)
    np.testing.assert_allclose(got, 3 * X, rtol=1e-6)


def test_add_n_and_broadcast_add():
    got = _run(lambda x: _one("add_n", [("in", [x, x, x])]), X)
    np.testing.assert_allclose(got, 3 * X, rtol=1e-6)
    row = X[:1]
    got = _run(lambda x, r: _one("broadcast_add", [("x", [x]), ("y", [r])], "z"), X, row)
    np.testing.assert_allclose(got, X + row, rtol=1e-6)


def test_multi_output_order_follows_output_calls():
    def body(x):
        like = [flow.constant(0.0, shape=(1, 4)), flow.constant(0.0, shape=(2, 4))]
        a, b = (flow.user_op_builder("s").Op("split_like").Input("in", [x]).Input("like", like)
                .Output("out", 2).Attr("axis", 0).Build().InferAndTryRun().RemoteBlobList())
        return flow.concat([b, a], axis=0)
    np.testing.assert_array_equal(_run(body, X), np.concatenate([X[1:], X[:1]]))


def test_multi_square_sum_and_count_not_finite():
    got = _run(lambda x: _one("multi_square_sum", [("x", [x, x * 2])], "y"), X)
    np.testing.assert_allclose(got, [5 * np.sum(X * X)], rtol=1e-5)
    bad = X.copy()
    bad[0, 0], bad[1, 2] = np.inf, np.nan
    got = _run(lambda x: _one("count_not_finite", [("x", [x])], "y"), bad)
    np.testing.assert_array_equal(got, [2])


def test_dynamic_loss_scale_schedule_updates_variables():
    flow.clear_default_session()

    @flow.global_function(function_config=_cfg())
    def job(count: tp.Numpy.Placeholder((1,), dtype=flow.int64)) -> tp.Numpy:
        good = flow.get_variable("good", shape=(1,), dtype=flow.int64,
                                 initializer=flow.constant_initializer(1, dtype=flow.int64))
        scale = flow.get_variable("scale", shape=(1,), dtype=flow.float32,
                                  initializer=flow.constant_initializer(100.0))
        (flow.user_op_builder("sched").Op("dynamic_loss_scale_schedule").Input("count_not_finite", [count])
         .Input("loss_scale", [scale]).Input("good_step_counter", [good])
         .Attr("increment_period", 2).Attr("multiplier", 2.0).Build().InferAndTryRun())
        return count

    expect = [(0, 200.0), (1, 200.0), (0, 400.0), (0, 200.0), (0, 100.0)]  # (good, scale) after each
    for c, (g, s) in zip([0, 0, 0, 1, 1], expect):
        job(np.array([c], np.int64))
        v = flow.get_all_variables()
        assert (v["good"].numpy()[0], v["scale"].numpy()[0]) == (g, s)


def test_unknown_and_test_only_op_types():
    with pytest.raises(NotImplementedError, match="'ccrelu' is a test-only C\\+\\+ op of OneFlow"):
        flow.user_op_builder("x").Op("ccrelu")
    with pytest.raises(NotImplementedError, match="does not map the OneFlow op type 'no_such_op'"):
        flow.user_op_builder("x").Op("no_such_op")
    with pytest.raises(NotImplementedError, match="'ccrelu' is a test-only"):
        flow.user_op_module_builder("ccrelu")


def test_bad_builder_calls():
    b = flow.user_op_builder("x").Op("reshape")
    with pytest.raises(ValueError, match="op 'reshape' has inputs in"):
        b.Input("x", [])
    with pytest.raises(ValueError, match="op 'reshape' has attributes shape"):
        b.Attr("axis", 1)
    with pytest.raises(TypeError, match="expected a shape"):
        b.Attr("shape", 3.5)
    with pytest.raises(TypeError, match="the attribute is a shape"):
        b.Attr("shape", (1,), "AttrTypeInt64")
    with pytest.raises(ValueError, match="input 'in' is not given"):
        b.Build()
    with pytest.raises(ValueError, match="call .Op"):
        flow.user_op_builder("y").Input("in", [])


def test_required_attribute_missing():
    def body(x):
        return flow.user_op_builder("r").Op("reshape").Input("in", [x]).Output("out").Build()
    with pytest.raises(ValueError, match="attribute 'shape' .* is required"):
        _run(body, X)


def test_user_op_types_lists_the_mapping():
    names = flow.user_op_types()
    for t in ("relu", "matmul", "reshape", "transpose", "cast", "add_n", "scalar_mul", "broadcast_add",
              "identity", "split_like", "dynamic_loss_scale_schedule"):
        assert t in names


class _Adder(flow.deprecated.nn.Module):
    def __init__(self):
        flow.deprecated.nn.Module.__init__(self)
        self.builder = flow.user_op_module_builder("add_n")
        self.builder.InputSize("in", 2).Output("out")
        self.builder.user_op_module.InitOpKernel()

    def forward(self, x, y):
        return (self.builder.OpName(f"Add_{self.call_seq_no}").Input("in", [x, y]).Build()
                .InferAndTryRun().RemoteBlobList()[0])


def test_user_op_module_and_find_or_create_module():
    names = []

    def body(x, y):
        with flow.scope.namespace("ns"):
            adder = flow.find_or_create_module("adder", _Adder)
            z = adder(x, y)
            w = flow.find_or_create_module("adder", _Adder, reuse=True)(z, x)
            names.extend([z.op_name, w.op_name])
            with pytest.raises(ValueError, match="module 'ns-adder' already exists"):
                flow.find_or_create_module("adder", _Adder)
            with pytest.raises(ValueError, match="InputSize\\('in', 2\\) but Input\\('in'\\) got 3"):
                adder.builder.Input("in", [x, x, x]).Build()
            with pytest.raises(ValueError, match="cannot change its op type"):
                adder.builder.Op("relu")
        return w
    got = _run(body, X, X * 3)
    np.testing.assert_allclose(got, X + 3 * X + X, rtol=1e-6)
    assert names == ["ns-Add_0", "ns-Add_1"]
