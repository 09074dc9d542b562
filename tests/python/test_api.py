"""The job-function API: layers, variables, initializers, sessions, annotations,
placeholders and the forms of @global_function, against numpy references."""
import typing

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


def sgd(lr=0.1):
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0)


# ---------------------------------------------------------------- layers.dense

def test_dense_variables_default_zero_init_and_activation(rng):
    @flow.global_function(type="predict")
    def fc(x: tp.Numpy.Placeholder((7, 17), dtype=flow.float)) -> tp.Numpy:
        return flow.layers.dense(x, 5, activation=flow.nn.relu, name="fc")

    x = rng.standard_normal((7, 17)).astype(np.float32)
    out = fc(x)
    np.testing.assert_array_equal(out, np.zeros((7, 5), np.float32))  # zero init -> relu(0)
    vs = flow.get_all_variables()
    assert set(vs) == {"fc-weight", "fc-bias"}
    assert vs["fc-weight"].shape == (5, 17) and vs["fc-weight"].dtype == np.float32
    assert vs["fc-bias"].shape == (5,) and vs["fc-bias"].dtype == np.float32
    np.testing.assert_array_equal(vs["fc-weight"], 0)
    np.testing.assert_array_equal(vs["fc-bias"], 0)

    w = rng.standard_normal((5, 17)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    flow.load_variables({"fc-weight": w, "fc-bias": b})
    want = np.maximum(x.astype(np.float64) @ w.T + b, 0)
    np.testing.assert_allclose(fc(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(flow.get_all_variables()["fc-weight"], w)


def test_dense_options(rng):
    @flow.global_function(type="predict")
    def fc(x: tp.Numpy.Placeholder((2, 3, 17), dtype=flow.float)) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        a = flow.layers.dense(x, 4, use_bias=False, name="nobias",
                              kernel_initializer=flow.constant_initializer(0.5))
        b = flow.layers.dense(x, 6, activation=flow.math.tanh, name="tanh_fc",
                              bias_initializer=flow.ones_initializer())
        return a, b

    x = rng.standard_normal((2, 3, 17)).astype(np.float32)
    a, b = fc(x)
    vs = flow.get_all_variables()
    assert set(vs) == {"nobias-weight", "tanh_fc-weight", "tanh_fc-bias"}
    # rank-3 inputs are flattened to (-1, in) and reshaped back
    np.testing.assert_allclose(a, np.broadcast_to(0.5 * x.astype(np.float64).sum(-1, keepdims=True),
                                                  (2, 3, 4)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, np.full((2, 3, 6), np.tanh(1.0)), rtol=1e-5, atol=1e-6)


def test_dense_shares_weights_by_name(rng):
    @flow.global_function()
    def two(x: tp.Numpy.Placeholder((3, 4))) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        init = flow.random_normal_initializer(seed=3)
        return (flow.layers.dense(x, 2, name="same", kernel_initializer=init),
                flow.layers.dense(x, 2, name="same", kernel_initializer=init))

    x = rng.standard_normal((3, 4)).astype(np.float32)
    a, b = two(x)
    np.testing.assert_array_equal(a, b)
    w = flow.get_all_variables()["same-weight"]
    np.testing.assert_allclose(a, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-6)


BATCH = 100


def test_seed_mlp_forward_matches_numpy(rng):
    @flow.global_function(type="predict")
    def eval_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        reshape = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, name="hidden")
        return flow.layers.dense(hidden, 10, name="output")

    images = rng.random((BATCH, 1, 28, 28)).astype(np.float32)
    eval_job(images)  # creates the variables
    vs = flow.get_all_variables()
    assert {k: v.shape for k, v in vs.items()} == {
        "hidden-weight": (512, 784), "hidden-bias": (512,), "output-weight": (10, 512),
        "output-bias": (10,)}
    w1 = (rng.standard_normal((512, 784)) * 0.05).astype(np.float32)
    b1 = (rng.standard_normal(512) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((10, 512)) * 0.05).astype(np.float32)
    b2 = (rng.standard_normal(10) * 0.1).astype(np.float32)
    flow.load_variables({"hidden-weight": w1, "hidden-bias": b1, "output-weight": w2,
                         "output-bias": b2})
    got = eval_job(images)
    x = images.reshape(BATCH, -1).astype(np.float64)
    want = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    assert got.shape == (BATCH, 10) and got.dtype == np.float32
    # 1e-5 relative to the logits' magnitude
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# ---------------------------------------------------------------- variables

def test_variables_shared_between_train_and_predict_jobs():
    @flow.global_function(type="predict")
    def read() -> tp.Numpy:
        return flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(7.0))

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(w * x)
        sgd(0.1).minimize(loss)
        return loss

    x = np.array([1.0, 2.0, 3.0], np.float32)
    # the train job traces first: its initializer creates w
    loss = train(x)
    np.testing.assert_allclose(loss, 6.0, rtol=1e-6)
    w1 = np.ones(3, np.float32) - np.float32(0.1) * x
    np.testing.assert_allclose(read(), w1, rtol=1e-6)  # the predict job sees the update
    # and keeps seeing updates after it was compiled
    train(x)
    np.testing.assert_allclose(read(), w1 - np.float32(0.1) * x, rtol=1e-6)
    vs = flow.get_all_variables()
    assert "w" in vs
    np.testing.assert_allclose(vs["w"], w1 - np.float32(0.1) * x, rtol=1e-6)
    np.testing.assert_allclose(vs["w"].numpy(), vs["w"])  # OneFlow's .numpy() spelling
    # a job created later shares the variable too, and does not re-initialize it
    @flow.global_function(type="predict")
    def read2(y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.get_variable("w", shape=(3,), initializer=flow.ones_initializer()) * y

    np.testing.assert_allclose(read2(x), (w1 - np.float32(0.1) * x) * x, rtol=1e-6)


def test_get_all_variables_is_a_copy():
    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.get_variable("c", shape=(4,), initializer=flow.constant_initializer(2.0))

    job()
    v = flow.get_all_variables()["c"]
    v[:] = 100
    np.testing.assert_array_equal(flow.get_all_variables()["c"], np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(job(), np.full(4, 2.0, np.float32))


def test_load_variables_checks(rng):
    @flow.global_function()
    def job() -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return (flow.get_variable("a", shape=(2, 3)),
                flow.get_variable("n", shape=(4,), dtype=flow.int32))

    job()
    a = rng.standard_normal((2, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=r"variable 'a' has shape \(2, 3\) but the value has shape \(3, 2\)"):
        flow.load_variables({"a": a.T.copy()})
    with pytest.raises(TypeError, match=r"variable 'a' is float32 but the value is float64; convert it "
                                        r"with \.astype\(np\.float32\)"):
        flow.load_variables({"a": a.astype(np.float64)})
    with pytest.raises(TypeError, match="must be a numpy array"):
        flow.load_variables({"a": [[1, 2, 3], [4, 5, 6]]})
    with pytest.raises(TypeError, match="expected a dict"):
        flow.load_variables([("a", a)])
    # unknown names: skipped by default (OneFlow's ignore_mismatch=True), an error otherwise
    flow.load_variables({"nope": a, "n": np.arange(4, dtype=np.int32)})
    with pytest.raises(ValueError, match="the session has no variable named 'nope'"):
        flow.load_variables({"nope": a}, ignore_mismatch=False)
    got_a, got_n = job()
    np.testing.assert_array_equal(got_a, 0)
    np.testing.assert_array_equal(got_n, np.arange(4, dtype=np.int32))
    # all or nothing: a bad entry anywhere leaves every variable unchanged
    with pytest.raises(ValueError):
        flow.load_variables({"a": a, "n": np.arange(5, dtype=np.int32)})
    with pytest.raises(ValueError):
        flow.load_variables({"a": a, "nope": a}, ignore_mismatch=False)
    np.testing.assert_array_equal(job()[0], 0)
    # values from get_all_variables and non-contiguous arrays are accepted
    flow.load_variables({"a": np.asarray(rng.standard_normal((3, 2)), np.float32).T})
    vals = flow.get_all_variables()
    flow.load_variables({"a": a})
    np.testing.assert_array_equal(job()[0], a)
    flow.load_variables(vals)
    np.testing.assert_array_equal(job()[0], vals["a"])


def test_load_variables_non_contiguous(rng):
    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.get_variable("t", shape=(3, 5)) + 0.0

    job()
    base = rng.standard_normal((5, 3)).astype(np.float32)
    flow.load_variables({"t": base.T})
    np.testing.assert_array_equal(job(), base.T)
    big = rng.standard_normal((6, 10)).astype(np.float32)
    flow.load_variables({"t": big[::2, ::-2]})
    np.testing.assert_array_equal(job(), big[::2, ::-2])


def test_variable_mismatch_between_jobs_is_an_error():
    @flow.global_function()
    def first() -> tp.Numpy:
        return flow.get_variable("m", shape=(3,))

    @flow.global_function()
    def second() -> tp.Numpy:
        return flow.get_variable("m", shape=(4,))

    first()
    with pytest.raises(ValueError, match=r"variable 'm' exists in the session as flow.float32\(3,\) but "
                                         r"is requested as flow.float32\(4,\)"):
        second()
    np.testing.assert_array_equal(first(), np.zeros(3, np.float32))


def test_clear_default_session_resets_variables():
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(w * x)
        sgd(0.5).minimize(loss)
        return loss

    @flow.global_function()
    def read() -> tp.Numpy:
        return flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))

    x = np.ones(3, np.float32)
    train(x)
    np.testing.assert_allclose(read(), np.full(3, 0.5, np.float32))
    assert "w" in flow.get_all_variables()
    flow.clear_default_session()
    assert flow.get_all_variables() == {}
    # jobs compiled before the clear recompile and start from fresh variables
    np.testing.assert_allclose(read(), np.ones(3, np.float32))
    np.testing.assert_allclose(train(x), 3.0)
    np.testing.assert_allclose(read(), np.full(3, 0.5, np.float32))


# ---------------------------------------------------------------- initializers

N_ROWS, N_COLS = 250, 400  # 100k elements: sample statistics within ~1%
FAN_IN, FAN_OUT = N_COLS, N_ROWS  # OneFlow's convention for 2-D weights (out, in)


def _init_job(inits, shape=(N_ROWS, N_COLS), dtype=flow.float):
    @flow.global_function()
    def init_job() -> typing.Dict[str, tp.Numpy]:
        return {name: flow.get_variable(name, shape=shape, dtype=dtype, initializer=init)
                for name, init in inits.items()}

    return init_job()


def _frac_within(v, mean, k_sigma, sigma):
    return np.mean(np.abs(v - mean) <= k_sigma * sigma)


def test_constant_initializers():
    got = _init_job({"c": flow.constant_initializer(2.5), "z": flow.zeros_initializer(),
                     "o": flow.ones_initializer()}, shape=(17, 33))
    np.testing.assert_array_equal(got["c"], np.full((17, 33), 2.5, np.float32))
    np.testing.assert_array_equal(got["z"], np.zeros((17, 33), np.float32))
    np.testing.assert_array_equal(got["o"], np.ones((17, 33), np.float32))
    ints = _init_job({"ci": flow.constant_initializer(3)}, shape=(5,), dtype=flow.int64)
    np.testing.assert_array_equal(ints["ci"], np.full(5, 3, np.int64))


def test_random_uniform_initializer():
    v = _init_job({"u": flow.random_uniform_initializer(minval=-2.0, maxval=3.0)})["u"]
    assert v.shape == (N_ROWS, N_COLS) and v.dtype == np.float32
    assert v.min() >= -2.0 and v.max() <= 3.0
    assert abs(v.mean() - 0.5) < 0.03
    assert abs(v.std() - 5 / np.sqrt(12)) < 0.015 * 5 / np.sqrt(12)
    hist, _ = np.histogram(v, bins=10, range=(-2, 3))  # flat
    assert np.all(np.abs(hist / v.size - 0.1) < 0.006), hist
    assert len(np.unique(v)) > 0.9 * v.size


def test_random_uniform_initializer_double_precision():
    v = _init_job({"u64": flow.random_uniform_initializer(minval=0.0, maxval=1.0)}, dtype=flow.double)["u64"]
    assert v.dtype == np.float64 and v.min() >= 0 and v.max() < 1
    assert abs(v.mean() - 0.5) < 0.005
    # float64 values carry more than float32's 24 bits
    assert np.mean(v.astype(np.float32).astype(np.float64) == v) < 0.01


@pytest.mark.parametrize("dtype", [flow.int32, flow.int64, flow.int8])
def test_random_uniform_initializer_integers(dtype):
    # OneFlow: integers uniform in [minval, maxval)
    v = _init_job({"ui": flow.random_uniform_initializer(minval=-3, maxval=7)}, dtype=dtype)["ui"]
    assert v.dtype == dtype.np
    assert v.min() == -3 and v.max() == 6
    counts = np.bincount(v.ravel() + 3)
    assert len(counts) == 10 and np.all(np.abs(counts / v.size - 0.1) < 0.006), counts


@pytest.mark.parametrize("dtype", [flow.float, flow.double])
def test_random_normal_initializer(dtype):
    v = _init_job({"n": flow.random_normal_initializer(mean=1.0, stddev=2.0)}, dtype=dtype)["n"]
    assert v.dtype == dtype.np
    assert abs(v.mean() - 1.0) < 0.03
    assert abs(v.std() - 2.0) < 0.02
    assert abs(_frac_within(v, 1.0, 1, 2.0) - 0.6827) < 0.006
    assert abs(_frac_within(v, 1.0, 2, 2.0) - 0.9545) < 0.004
    assert np.abs(v - 1).max() > 3 * 2.0  # real tails


def test_truncated_normal_initializers():
    got = _init_job({"t": flow.truncated_normal_initializer(mean=0.5, stddev=0.3),
                     "t01": flow.truncated_normal(0.1)})
    t, t01 = got["t"], got["t01"]
    assert np.all(np.abs(t - 0.5) <= 2 * 0.3 + 1e-6)
    assert abs(t.mean() - 0.5) < 0.005
    assert abs(t.std() - 0.87962566 * 0.3) < 0.01 * 0.3  # std of a 2-sigma-truncated normal
    assert np.all(np.abs(t01) <= 0.2 + 1e-7)
    assert abs(t01.mean()) < 0.002
    assert abs(t01.std() - 0.087962566) < 0.001
    assert np.abs(t01).max() > 0.19  # reaches the truncation point


def _uniform_limit(fan):
    return np.sqrt(3.0 / fan)


@pytest.mark.parametrize("name", ["glorot_uniform", "xavier_uniform", "glorot_normal", "xavier_normal"])
def test_glorot_xavier(name):
    init = getattr(flow, f"{name}_initializer")()
    v = _init_job({"g": init})["g"]
    fan_avg = (FAN_IN + FAN_OUT) / 2.0
    std = np.sqrt(1.0 / fan_avg)
    assert abs(v.mean()) < 0.01 * std * 3
    assert abs(v.std() - std) < 0.015 * std
    if name.endswith("uniform"):
        limit = np.sqrt(6.0 / (FAN_IN + FAN_OUT))
        assert v.min() >= -limit and v.max() <= limit and v.max() > 0.99 * limit
    else:
        assert np.abs(v).max() > 3 * std


@pytest.mark.parametrize("scale,mode,distribution", [
    (2.0, "fan_in", "truncated_normal"), (1.0, "fan_out", "random_normal"),
    (3.0, "fan_avg", "random_uniform"), (1.0, "fan_in", "random_uniform")])
def test_variance_scaling(scale, mode, distribution):
    init = flow.variance_scaling_initializer(scale=scale, mode=mode, distribution=distribution)
    v = _init_job({"vs": init})["vs"]
    fan = {"fan_in": FAN_IN, "fan_out": FAN_OUT, "fan_avg": (FAN_IN + FAN_OUT) / 2}[mode]
    std = np.sqrt(scale / fan)  # the std of the result, for every distribution (OneFlow, TF)
    assert abs(v.mean()) < 0.03 * std
    assert abs(v.std() - std) < 0.015 * std
    if distribution == "truncated_normal":
        assert np.abs(v).max() <= 2 * std / 0.87962566 * (1 + 1e-6)
    if distribution == "random_uniform":
        assert np.abs(v).max() <= np.sqrt(3) * std * (1 + 1e-6)


@pytest.mark.parametrize("distribution", ["random_normal", "random_uniform"])
@pytest.mark.parametrize("nonlinearity,gain", [("relu", np.sqrt(2)), ("tanh", 5 / 3),
                                                ("leaky_relu", np.sqrt(2)), ("linear", 1.0)])
def test_kaiming(distribution, nonlinearity, gain):
    shape = (64, 32, 7, 7)  # a convolution weight, NCHW: fan_in = 32*7*7, fan_out = 64*7*7
    init = flow.kaiming_initializer(shape, distribution=distribution, mode="fan_in",
                                    nonlinearity=nonlinearity)
    fo = flow.kaiming_initializer(shape, distribution=distribution, mode="fan_out",
                                  nonlinearity=nonlinearity)
    got = _init_job({"k": init, "kfo": fo}, shape=shape)
    for key, fan in (("k", 32 * 49), ("kfo", 64 * 49)):
        v = got[key]
        std = gain / np.sqrt(fan)
        assert abs(v.mean()) < 0.03 * std, key
        assert abs(v.std() - std) < 0.015 * std, (key, v.std(), std)
        if distribution == "random_uniform":
            assert np.abs(v).max() <= np.sqrt(3) * std * (1 + 1e-6)


def test_initializers_are_reproducible():
    def values():
        flow.clear_default_session()
        return _init_job({"a": flow.random_normal_initializer(seed=7),
                          "b": flow.random_normal_initializer(seed=7),
                          "c": flow.random_normal_initializer(seed=8),
                          "d": flow.random_uniform_initializer(),
                          "e": flow.truncated_normal(0.1)}, shape=(1000,))

    first, second = values(), values()
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])  # same seed, same values, every session
    np.testing.assert_array_equal(first["a"], first["b"])  # the seed alone decides the values
    assert not np.array_equal(first["a"], first["c"])


def test_seed_zero_is_a_seed():
    got = _init_job({"s0a": flow.random_normal_initializer(seed=0),
                     "s0b": flow.random_normal_initializer(seed=0)}, shape=(100,))
    np.testing.assert_array_equal(got["s0a"], got["s0b"])


def test_unseeded_variables_differ_by_name():
    got = _init_job({"x1": flow.random_normal_initializer(), "x2": flow.random_normal_initializer()},
                    shape=(1000,))
    assert not np.array_equal(got["x1"], got["x2"])
    assert abs(np.corrcoef(got["x1"], got["x2"])[0, 1]) < 0.1


def test_random_values_differ_per_element():
    # a counter-based generator must not repeat with the 16-lane vector width
    v = _init_job({"r": flow.random_uniform_initializer()}, shape=(33, 17))["r"].ravel()
    assert len(np.unique(v)) == v.size
    assert abs(np.corrcoef(v[:-16], v[16:])[0, 1]) < 0.2


# ---------------------------------------------------------------- return annotations

def test_return_annotations(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)

    @flow.global_function()
    def numpy_job(a: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return a * 2

    @flow.global_function()
    def tuple_job(a: tp.Numpy.Placeholder((2, 3))) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return a + 1, flow.math.reduce_sum(a)

    @flow.global_function()
    def list_job(a: tp.Numpy.Placeholder((2, 3))) -> typing.List[tp.Numpy]:
        return [a, a * 3, -a]

    @flow.global_function()
    def dict_job(a: tp.Numpy.Placeholder((2, 3))) -> typing.Dict[str, tp.Numpy]:
        return {"neg": -a, "sq": a * a}

    @flow.global_function()
    def bundle_job(a: tp.Numpy.Placeholder((2, 3))) -> tp.Bundle[tp.Numpy]:
        return {"pair": (a, a + 1), "list": [a * 2, {"deep": a * 3}], "one": -a}

    @flow.global_function()
    def none_job(a: tp.Numpy.Placeholder((2, 3))) -> None:
        flow.math.exp(a)

    @flow.global_function()
    def listnumpy_job(a: tp.Numpy.Placeholder((2, 3))) -> tp.ListNumpy:
        return a - 1

    @flow.global_function()
    def mixed_job(a: tp.Numpy.Placeholder((2, 3))) -> typing.Tuple[tp.ListNumpy, tp.Numpy]:
        return a, a * 0

    r = numpy_job(x)
    assert isinstance(r, np.ndarray)
    np.testing.assert_array_equal(r, x * 2)
    r = tuple_job(x)
    assert isinstance(r, tuple) and len(r) == 2
    np.testing.assert_array_equal(r[0], x + 1)
    np.testing.assert_allclose(r[1], x.sum(), rtol=1e-6)
    r = list_job(x)
    assert isinstance(r, list) and len(r) == 3
    for g, w in zip(r, [x, x * 3, -x]):
        np.testing.assert_array_equal(g, w)
    r = dict_job(x)
    assert isinstance(r, dict) and set(r) == {"neg", "sq"}
    np.testing.assert_array_equal(r["neg"], -x)
    np.testing.assert_array_equal(r["sq"], x * x)
    r = bundle_job(x)
    assert set(r) == {"pair", "list", "one"}
    assert isinstance(r["pair"], tuple) and isinstance(r["list"], list)
    np.testing.assert_array_equal(r["pair"][0], x)
    np.testing.assert_array_equal(r["pair"][1], x + 1)
    np.testing.assert_array_equal(r["list"][0], x * 2)
    np.testing.assert_array_equal(r["list"][1]["deep"], x * 3)
    np.testing.assert_array_equal(r["one"], -x)
    assert none_job(x) is None
    r = listnumpy_job(x)
    assert isinstance(r, list) and len(r) == 1 and isinstance(r[0], np.ndarray)
    np.testing.assert_array_equal(r[0], x - 1)
    r = mixed_job(x)
    assert isinstance(r[0], list) and len(r[0]) == 1
    np.testing.assert_array_equal(r[0][0], x)
    np.testing.assert_array_equal(r[1], np.zeros_like(x))
    # the fast path (second call) builds the same structures
    assert isinstance(tuple_job(x), tuple) and isinstance(bundle_job(x)["pair"], tuple)
    assert none_job(x) is None and isinstance(listnumpy_job(x), list)


def test_results_never_alias_inputs_or_variables():
    @flow.global_function()
    def ident(x: tp.Numpy.Placeholder((1000,))) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return x, flow.get_variable("alias_v", shape=(3,), initializer=flow.ones_initializer())

    x = np.arange(1000, dtype=np.float32)
    for _ in range(2):
        r, v = ident(x)
        assert r is not x and not np.shares_memory(r, x)
        r[:] = 5
        v[:] = 9
        np.testing.assert_array_equal(x, np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(ident(x)[1], np.ones(3, np.float32))


def test_unaligned_and_read_only_inputs():
    @flow.global_function()
    def add1(x: tp.Numpy.Placeholder((1000,))) -> tp.Numpy:
        return x * 2 + 1

    raw2 = np.frombuffer(np.linspace(0, 1, 1000, dtype=np.float32).tobytes(), np.uint8)
    buf = np.zeros(raw2.size + 3, np.uint8)
    buf[3:] = raw2
    odd = np.frombuffer(buf.data, dtype=np.float32, count=1000, offset=3)
    assert not odd.flags.aligned
    ro = np.linspace(-1, 1, 1000, dtype=np.float32)
    ro.flags.writeable = False
    for _ in range(2):
        np.testing.assert_array_equal(add1(odd), odd * 2 + 1)
        np.testing.assert_array_equal(add1(ro), ro * 2 + 1)


def test_results_are_fresh_arrays(rng):
    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return a + 1

    x = rng.standard_normal(4).astype(np.float32)
    r1 = job(x)
    r1[:] = 0
    r2 = job(x)
    np.testing.assert_array_equal(r2, x + 1)
    x2 = x * 2
    r3 = job(x2)
    np.testing.assert_array_equal(r2, x + 1)  # earlier results are not overwritten
    np.testing.assert_array_equal(r3, x2 + 1)


# ---------------------------------------------------------------- placeholders

def test_list_numpy_placeholder_bounds_and_compiles_once_per_shape(rng):
    @flow.global_function()
    def job(x: tp.ListNumpy.Placeholder((4, 5)), y: tp.Numpy.Placeholder((1,))) -> tp.ListNumpy:
        return x * y + flow.math.reduce_sum(x, axis=0)

    y = rng.standard_normal(1).astype(np.float32)
    seen = set()
    for shape in [(3, 5), (3, 5), (2, 5), (4, 5), (3, 5), (1, 1), (4, 2), (0, 5), (2, 5)]:
        x = rng.standard_normal(shape).astype(np.float32)
        r = job([x], y)
        assert isinstance(r, list) and len(r) == 1 and r[0].shape == shape
        np.testing.assert_allclose(r[0], x * y + x.sum(0), rtol=1e-5, atol=1e-6)
        seen.add(shape)
        assert len(job.compiled_jobs()) == len(seen)  # each new concrete shape compiles once
    with pytest.raises(ValueError, match=r"x\[0\]' has shape \(5, 5\), which is not within the "
                                         r"declared bounds \(4, 5\)"):
        job([np.zeros((5, 5), np.float32)], y)
    with pytest.raises(ValueError, match="not within the declared bounds"):
        job([np.zeros((4,), np.float32)], y)
    with pytest.raises(TypeError, match="expects a list with one array per device"):
        job(np.zeros((4, 5), np.float32), y)
    with pytest.raises(ValueError, match=r"expects 1 element\(s\), one per device, but got 2"):
        job([np.zeros((4, 5), np.float32)] * 2, y)
    assert len(job.compiled_jobs()) == len(seen)


def test_recompile_limit_warns(rng):
    cfg = flow.function_config()
    cfg.recompile_limit(2)

    @flow.global_function(function_config=cfg)
    def job(x: tp.ListNumpy.Placeholder((8,))) -> tp.ListNumpy:
        return x + 1

    job([np.zeros(1, np.float32)])
    job([np.zeros(2, np.float32)])
    with pytest.warns(RuntimeWarning, match=r"job 'job' has been compiled 3 times \(limit 2\); the last "
                                             r"recompile was because x: "):
        job([np.zeros(3, np.float32)])
    np.testing.assert_array_equal(job([np.zeros(3, np.float32)])[0], np.ones(3, np.float32))


def test_list_numpy_broadcasting_shape_mismatch_is_an_error(rng):
    @flow.global_function()
    def job(x: tp.ListNumpy.Placeholder((4, 5)), y: tp.Numpy.Placeholder((5,))) -> tp.ListNumpy:
        return x * y

    y = np.ones(5, np.float32)
    with pytest.raises(ValueError, match="mul"):
        job([np.ones((4, 2), np.float32)], y)  # (4, 2) * (5,) cannot broadcast
    np.testing.assert_array_equal(job([np.ones((2, 5), np.float32)], y)[0], np.ones((2, 5)))


def test_non_contiguous_inputs(rng):
    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((3, 4)), b: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return a * b + flow.math.reduce_sum(a, axis=0)

    base = rng.standard_normal((4, 3)).astype(np.float32)
    big = rng.standard_normal((6, 8)).astype(np.float32)
    bvec = rng.standard_normal(8).astype(np.float32)
    cases = [(base.T, bvec[::2]), (big[::2, 1::2], bvec[::-2]), (np.asfortranarray(base.T), bvec[:4]),
             (big[1:4, 2:6], bvec[4:])]
    for _ in range(2):  # the first call compiles, the second takes the fast path
        for a, b in cases:
            assert not a.flags.c_contiguous
            np.testing.assert_allclose(job(a, b), a * b + a.sum(0), rtol=1e-6, atol=1e-6)


def test_non_contiguous_list_numpy_input(rng):
    @flow.global_function()
    def job(a: tp.ListNumpy.Placeholder((5, 5))) -> tp.ListNumpy:
        return a + 1

    base = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(job([base.T])[0], base.T + 1, rtol=1e-6)


def test_keyword_arguments(rng):
    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((3,)), b: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return a - b

    a, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(job(a, b=b), a - b)
    np.testing.assert_array_equal(job(b=b, a=a), a - b)


def test_zero_d_placeholder(rng):
    @flow.global_function()
    def job(s: tp.Numpy.Placeholder((), dtype=flow.double), v: tp.Numpy.Placeholder((7,))) -> tp.Numpy:
        return v * flow.cast(s, flow.float)

    v = rng.standard_normal(7).astype(np.float32)
    np.testing.assert_allclose(job(np.array(2.5), v), v * 2.5, rtol=1e-6)


# ---------------------------------------------------------------- defining and calling jobs

def test_defining_a_job_after_other_jobs_ran(rng):
    @flow.global_function()
    def first(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x + flow.get_variable("shared", shape=(4,), initializer=flow.constant_initializer(1.0))

    x = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(first(x), x + 1, rtol=1e-6)

    @flow.global_function(type="train")
    def second(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        v = flow.get_variable("shared", shape=(4,))
        w = flow.get_variable("own", shape=(4,), initializer=flow.constant_initializer(2.0))
        loss = flow.math.reduce_sum(v * w * x)
        sgd(0.25).minimize(loss)
        return loss

    np.testing.assert_allclose(second(x), 2 * x.sum(), rtol=1e-5)
    # shared was 1 and own 2: d/d shared = own * x, d/d own = shared * x
    np.testing.assert_allclose(first(x), x + 1 - 0.25 * 2 * x, rtol=1e-5, atol=1e-6)

    @flow.global_function()
    def third() -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return flow.get_variable("shared", shape=(4,)), flow.get_variable("own", shape=(4,))

    s, o = third()
    np.testing.assert_allclose(s, 1 - 0.5 * x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(o, 2 - 0.25 * x, rtol=1e-5, atol=1e-6)


def test_global_function_forms(rng):
    x = rng.standard_normal(3).astype(np.float32)

    @flow.global_function("predict")
    def a(v: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return v + 1

    @flow.global_function(flow.function_config())
    def b(v: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return v + 2

    @flow.global_function
    def c(v: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return v + 3

    @flow.global_function(type="predict", function_config=flow.function_config())
    def d(v: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return v + 4

    @flow.global_function()
    def e(v: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return v + 5

    for i, job in enumerate((a, b, c, d, e), 1):
        assert isinstance(job, flow.JobFunction)
        np.testing.assert_allclose(job(x), x + i, rtol=1e-6)
    assert a.__name__ == "a" and "a" in repr(a)


def test_train_job_positional_form(rng):
    @flow.global_function("train")
    def t(v: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("tw", shape=(3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(w * v)
        sgd(1.0).minimize(loss)
        return loss

    x = np.array([1.0, 2.0, 3.0], np.float32)
    t(x)
    np.testing.assert_allclose(flow.get_all_variables()["tw"], 1 - x)


def test_default_data_type_double(rng):
    cfg = flow.function_config()
    cfg.default_data_type(flow.double)

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.Numpy.Placeholder((2, 3), dtype=flow.double)) -> typing.Dict[str, tp.Numpy]:
        return {"var": flow.get_variable("dv", shape=(3,), initializer=flow.ones_initializer()),
                "const": flow.constant(1.5), "zeros": flow.zeros((2,)), "ones": flow.ones((2,)),
                "int_const": flow.constant(2), "explicit": flow.constant(1.0, dtype=flow.float),
                "dense": flow.layers.dense(x, 4, name="d64",
                                           kernel_initializer=flow.constant_initializer(0.25)),
                "mixed": x * 0.1}

    x = rng.standard_normal((2, 3))
    r = job(x)
    assert r["var"].dtype == np.float64
    assert r["const"].dtype == np.float64 and r["const"] == 1.5
    assert r["zeros"].dtype == np.float64 and r["ones"].dtype == np.float64
    assert r["int_const"].dtype == np.int32
    assert r["explicit"].dtype == np.float32
    assert r["dense"].dtype == np.float64
    np.testing.assert_allclose(r["dense"], np.repeat(0.25 * x.sum(1, keepdims=True), 4, axis=1),
                               rtol=1e-12)
    np.testing.assert_allclose(r["mixed"], x * 0.1, rtol=1e-15)
    vs = flow.get_all_variables()
    assert vs["dv"].dtype == np.float64 and vs["d64-weight"].dtype == np.float64

    # a job without the config still defaults to float32
    @flow.global_function()
    def plain() -> tp.Numpy:
        return flow.get_variable("fv", shape=(2,)) + flow.constant(1.0)

    assert plain().dtype == np.float32


def test_function_config_methods_chain():
    cfg = flow.function_config()
    assert cfg.default_data_type(flow.float) is cfg
    cfg.default_logical_view(flow.scope.consistent_view())

    @flow.global_function(function_config=cfg)
    def job() -> tp.Numpy:
        return flow.constant(1.0)

    assert job() == 1.0


def test_many_calls_and_interleaving(rng):
    @flow.global_function()
    def add(a: tp.Numpy.Placeholder((17,)), b: tp.Numpy.Placeholder((17,))) -> tp.Numpy:
        return a + b

    @flow.global_function()
    def mul(a: tp.Numpy.Placeholder((17,)), b: tp.Numpy.Placeholder((17,))) -> tp.Numpy:
        return a * b

    for i in range(50):
        a = rng.standard_normal(17).astype(np.float32)
        b = rng.standard_normal(17).astype(np.float32)
        np.testing.assert_array_equal(add(a, b), a + b)
        np.testing.assert_array_equal(mul(a, b), a * b)
    assert len(add.compiled_jobs()) == 1 and len(mul.compiled_jobs()) == 1


def test_async_callback(rng):
    got = []

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((5,))) -> tp.Callback[tp.Numpy]:
        return a * 3

    xs = [rng.standard_normal(5).astype(np.float32) for _ in range(4)]
    for x in xs:
        job(x)(got.append)
    flow.sync_default_session()
    assert len(got) == 4
    for g, x in zip(got, xs):
        np.testing.assert_allclose(g, x * 3, rtol=1e-6)


def test_list_numpy_takes_any_extents_up_to_the_declared_element_count():
    # OneFlow's rule for dynamic (ListNumpy) placeholders: the same rank and at
    # most as many elements as declared, whatever the extents (its slice tests
    # pass (2, 10) for a (3, 7) placeholder).
    @flow.global_function(type="predict")
    def dyn(x: tp.ListNumpy.Placeholder((3, 7))) -> tp.ListNumpy:
        return x * 2.0

    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    np.testing.assert_array_equal(dyn([x])[0], x * 2)
    with pytest.raises(ValueError, match=r"not within the declared bounds \(3, 7\) \(same rank and at most 21"):
        dyn([np.zeros((2, 11), np.float32)])
    with pytest.raises(ValueError, match="not within the declared bounds"):
        dyn([np.zeros((21,), np.float32)])
