"""The differential program fuzzer (tests/fuzz/programs.py): a short
deterministic slice, its machinery (mismatch, crash and hang are reported),
and one regression test per finding of issue [fuzz].

The long run is by hand: ``tools/dev.sh fuzz programs`` (FLOWJIT_FUZZ_SECONDS)
or ``python tests/fuzz/programs.py --seconds N --seed S``.
Tests marked xfail(strict=True) are open findings whose fix lies in a module
being reworked; each XPASSes (and fails the run) once its fix lands: then
drop the marker and the finding's key in programs.KNOWN.
"""
import os
import sys
from typing import Tuple

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fuzz"))
try:
    import programs  # noqa: E402 - needs hypothesis (tools/dev.sh installs it)
except ImportError:
    programs = None
needs_hypothesis = pytest.mark.skipif(programs is None, reason="hypothesis is not installed "
                                      "(pip install hypothesis; tools/dev.sh setup does)")

SLICE_EXAMPLES = 700   # about 30 s on two shared cores


@pytest.fixture
def fuzzer():
    if programs is None:
        pytest.skip("hypothesis is not installed")
    fz = programs.Fuzzer(timeout=60)
    yield fz
    fz.close()


def test_deterministic_slice(fuzzer, monkeypatch):
    """A fixed, derandomized slice of the fuzzer, open known findings left out;
    it draws train jobs with several kinds of optimizer and jobs on 2 devices."""
    kinds = set()
    check = programs.check_program

    def counting(p, worker):
        kinds.add(p.opt.kind if p.opt else "SGD(lr=1)" if p.train else "predict")
        if p.devices > 1:
            kinds.add("mirrored" if p.mirrored() else "consistent")
        return check(p, worker)
    monkeypatch.setattr(programs, "check_program", counting)
    fuzzer.run(seed=0, max_examples=SLICE_EXAMPLES, derandomize=True, stop_on_first=True)
    assert fuzzer.cases >= SLICE_EXAMPLES // 2, fuzzer.cases
    assert not fuzzer.findings, "\n\n".join(f"{m}\n{r}" for m, r in fuzzer.findings)
    assert {"consistent", "mirrored", "predict", "SGD(lr=1)"} <= kinds, kinds
    assert len(kinds & set(programs.OPTIMIZERS)) >= 4, kinds   # (each one: the test below)


def _program(source_lines, x, want, exact=True):
    p = programs.Program()
    p.inputs = [("x0", x)]
    p.lines = list(source_lines)
    p.outputs = [programs.Val("v0", want.dtype.name, want, exact, 1.0)]
    return p


def test_fuzzer_reports_a_mismatch_with_a_reproducer(fuzzer):
    x = np.array([1.0, -0.0, 2.0], np.float32)
    p = _program(["v0 = flow.math.add(x0, 1.0)"], x, np.array([2.0, 1.0, 3.5], np.float32), exact=False)
    msg = programs.check_program(p, fuzzer.worker)
    assert msg is not None and "v0: at (2,)" in msg, msg
    repro = p.reproducer(msg)
    assert "def test_fuzz_finding" in repro and "flow.math.add(x0, 1.0)" in repro
    compile(repro, "<reproducer>", "exec")
    # and the sign of zero counts in an exact comparison
    p = _program(["v0 = flow.identity(x0)"], x, np.array([1.0, 0.0, 2.0], np.float32))
    assert "expected 0.0 " in programs.check_program(p, fuzzer.worker)


@needs_hypothesis
def test_fuzzer_survives_a_crash_and_a_hang():
    fz = programs.Fuzzer(timeout=5)
    try:
        x = np.zeros(2, np.float32)
        crash = _program(["import os", "os.abort()", "v0 = x0"], x, x)
        assert programs.check_program(crash, fz.worker).startswith("crash: exit status")
        hang = _program(["import time", "time.sleep(30)", "v0 = x0"], x, x)
        assert programs.check_program(hang, fz.worker).startswith("hang:")
        ok = _program(["v0 = flow.identity(x0)"], x, x)
        assert programs.check_program(ok, fz.worker) is None   # a fresh worker
    finally:
        fz.close()


def _train_program(opt, devices=1, view="consistent"):
    """w -> tanh(x0 * w), loss sum(out * lw): one update of `opt` on 1 or 2 devices."""
    p = programs.Program(train=True, opt=opt, devices=devices, view=view)
    p.var_init = np.array([0.5, -1.25, 2.0])
    x = np.array([[1.0, 2.0, -3.0], [0.5, -0.25, 4.0]])
    p.weights = np.array([[0.5, -1.0, 0.25], [1.0, 0.75, -0.5]])
    p.inputs = [("x0", x), ("lw", p.weights)]
    p.lines = ["v0 = flow.math.tanh(flow.math.multiply(x0, w))"]
    p.outputs = [programs.Val("v0", "float64", np.tanh(x * p.var_init), False, 4.0)]
    p.grad = programs._fd_grad(p)
    return p


def _optimizers():
    if programs is None:
        return [None]
    O = programs.Opt
    return [None,
            O("SGD", 0.5, {"momentum": 0.9}, clip=1.0),
            O("SGDW", 0.1, {"momentum": 0.5, "weight_decay": 0.5}, sched=False),
            O("Adam", 0.1, {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "do_bias_correction": True}),
            O("AdamW", 0.1, {"beta1": 0.5, "beta2": 0.9, "epsilon": 1e-3, "do_bias_correction": False,
                             "weight_decay": 0.5}),
            O("LazyAdam", 0.5, {"beta1": 0.9, "beta2": 0.9, "epsilon": 1e-6}),
            O("RMSProp", 0.1, {"decay_rate": 0.9, "epsilon": 1e-3, "centered": True}),
            O("LAMB", 0.1, {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6, "weight_decay": 0.5}),
            O("LARS", 0.5, {"momentum_beta": 0.9, "epsilon": 1e-9, "lars_coefficient": 0.1,
                            "weight_decay": 0.5})]


@pytest.mark.parametrize("opt", _optimizers(), ids=lambda o: o.kind if o else "SGD-lr1")
def test_fuzzer_optimizer_reference_agrees_on_1_and_2_devices(fuzzer, opt):
    """The reference of one update (programs._ref_update) agrees with flowjit
    for each optimizer, on one device and on two (consistent, mirrored)."""
    for devices, view in ((1, "consistent"), (2, "consistent"), (2, "mirrored")):
        p = _train_program(opt, devices, view)
        assert programs.check_program(p, fuzzer.worker) is None, (devices, view)


def test_fuzzer_reports_a_wrong_update_with_a_reproducer(fuzzer, monkeypatch):
    # LAMB's trust ratio taken over d + weight_decay * w (the paper's rule,
    # not OneFlow's): the fuzzer tells the updates apart
    opt = _optimizers()[7]
    right = programs._ref_update

    def paper_lamb(o, w, g):
        k = o.kw
        d = (1 - k["beta1"]) * g / (1 - k["beta1"])
        d = d / (np.sqrt((1 - k["beta2"]) * g * g / (1 - k["beta2"])) + k["epsilon"]) + k["weight_decay"] * w
        return w - float(np.float32(o.lr)) * programs._norm(w) / programs._norm(d) * d
    p = _train_program(opt, 2, "mirrored")
    monkeypatch.setattr(programs, "_ref_update", paper_lamb)
    msg = programs.check_program(p, fuzzer.worker)
    assert msg is not None and msg.startswith("after one update of flow.optimizer.LAMB(") \
        and msg.endswith("(2 devices, mirrored view)"), msg
    repro = p.reproducer(msg)
    assert "flow.config.cpu_device_num(2)" in repro and "w_want = " in repro
    compile(repro, "<reproducer>", "exec")
    monkeypatch.setattr(programs, "_ref_update", right)
    assert programs.check_program(p, fuzzer.worker) is None


@needs_hypothesis
def test_fuzzer_reference_gradient_leaves_out_a_kink_within_a_step_of_a_small_slope():
    # maximum(w, 0) * 1e-5 at w = 1.19e-7, within the central difference's step
    # (1e-6) of the kink: the difference straddles it (5.6e-6, where the
    # gradient is 1e-5 or 0); the two steps' differences disagree by 4e-6, which
    # the check's atol (1e-6) does not cover, so the element is not checked.
    def grad(w):
        p = programs.Program(train=True)
        p.var_init, p.weights = np.array([w]), np.array([1e-5])
        p.inputs = [("x0", np.array([0.0])), ("lw", p.weights)]
        p.lines = ["v0 = flow.math.maximum(w, x0)"]
        p.outputs = [programs.Val("v0", "float64", np.maximum(p.var_init, 0.0), True, 1.0)]
        return programs._fd_grad(p)
    assert np.isnan(grad(1.192092896e-07)[0])
    np.testing.assert_allclose(grad(0.5), [1e-5], rtol=1e-6)   # away from the kink: checked
    np.testing.assert_allclose(grad(-0.5), [0.0], atol=1e-12)


def test_fuzzer_finds_an_open_finding_when_asked(fuzzer):
    """With the known findings drawn too, the fuzzer finds one (this fails
    once all of programs.KNOWN are fixed and removed: then delete it)."""
    if not programs.KNOWN:
        pytest.skip("no open known findings")
    fz = programs.Fuzzer(timeout=60, skip_known=False)
    try:
        fz.run(seed=1, max_examples=600, derandomize=True, stop_on_first=True)
    finally:
        fz.close()
    assert fz.findings and "def test_fuzz_finding" in fz.findings[0][1]


# ---------------------------------------------------------------- regression tests of the findings

def _job(body, *arrays, type="predict"):
    import inspect
    names = [f"x{i}" for i in range(len(arrays))]

    def fn(*blobs):
        return body(*blobs)
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    fn.__annotations__ = {n: tp.Numpy.Placeholder(a.shape, dtype=programs_dtype(a)) for n, a in zip(names, arrays)}
    fn.__annotations__["return"] = tp.Numpy
    fn.__name__ = fn.__qualname__ = "fuzz_regression"
    return flow.global_function(type=type)(fn)(*arrays)


def programs_dtype(a):
    return getattr(flow, {"float32": "float32", "float64": "float64", "int8": "int8", "uint8": "uint8",
                          "int32": "int32", "int64": "int64", "bool": "bool_"}[a.dtype.name])


def test_sort_puts_nan_last_and_keeps_infinities():
    x = np.array([3, np.nan, 1, -np.inf, 2], np.float32)
    np.testing.assert_array_equal(_job(lambda a: flow.sort(a), x), np.sort(x))
    np.testing.assert_array_equal(_job(lambda a: flow.argsort(a), x), np.argsort(x, kind="stable"))
    # top_k: NaN is the largest (PyTorch), then 3, 2
    np.testing.assert_array_equal(_job(lambda a: flow.math.top_k(a, k=3), x), [1, 0, 4])


def test_sort_keeps_negative_zero():
    x = np.array([-0.0], np.float32)
    assert np.signbit(_job(lambda a: flow.sort(a), x)).all()


def test_concat_keeps_negative_zero():
    x = np.array([-0.0, 1.0], np.float32)
    got = _job(lambda a: flow.concat([a, a], axis=0), x)
    assert np.signbit(got).tolist() == [True, False, True, False]


def test_pad_int64_constant_beyond_2_53_is_exact():
    x = np.array([1, 2], np.int64)
    got = _job(lambda a: flow.pad(a, [(1, 0)], constant_value=2 ** 53 + 1), x)
    np.testing.assert_array_equal(got, [2 ** 53 + 1, 1, 2])
    big = np.iinfo(np.int64).max   # through a double it is 2^63, which wraps to INT64_MIN
    np.testing.assert_array_equal(_job(lambda a: flow.pad(a, [(0, 1)], constant_value=big), x), [1, 2, big])
    # a pad of a constant (fold compares the values, in a double)
    c = 2 ** 53
    got = _job(lambda a: flow.pad(flow.constant(c, flow.int64, [2]), [(1, 0)], constant_value=c + 1) + a * 0,
               np.zeros(3, np.int64))
    np.testing.assert_array_equal(got, [2 ** 53 + 1, 2 ** 53, 2 ** 53])


def test_pad_int_constant_out_of_range_or_not_finite_is_refused():
    x = np.array([1, 2], np.int8)
    with pytest.raises(OverflowError, match=r"pad: the pad value 300 is out of bounds for flow.int8 "
                                            r"\(range -128..127\)"):
        _job(lambda a: flow.pad(a, [(1, 0)], constant_value=300), x)
    with pytest.raises(ValueError, match=r"pad: the pad value nan is not finite, so flow.int8 has "
                                         r"no such value"):
        _job(lambda a: flow.pad(a, [(1, 0)], constant_value=float("nan")), x)
    # a float constant is truncated, as int() does
    np.testing.assert_array_equal(_job(lambda a: flow.pad(a, [(1, 0)], constant_value=-2.7), x), [-2, 1, 2])


@pytest.mark.parametrize("dtype,value", [(np.int8, 300), (np.uint8, -1), (np.int32, 2 ** 31), (np.int8, 128)])
def test_out_of_range_int_scalar_is_refused(dtype, value):
    # numpy 2 raises OverflowError for `int8_array + 300`; wrapping it silently is wrong.
    with pytest.raises((OverflowError, ValueError), match=str(value)):
        _job(lambda a: a + value, np.array([1, 2], dtype))


def test_range_of_nan_is_a_user_error():
    with pytest.raises(ValueError, match=r"range: .*(nan|finite)"):
        _job(lambda a: flow.range(0, float("nan")), np.zeros(1, np.float32))


def test_batch_norm_train_on_an_empty_batch_keeps_moving_statistics():
    @flow.global_function(type="train")
    def step(x: tp.ListNumpy.Placeholder((4, 3), dtype=flow.float32)) -> tp.ListNumpy:
        y = flow.layers.batch_normalization(x, axis=1, training=True, name="bn")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(y)
        return y

    out = step([np.zeros((0, 3), np.float32)])
    assert out[0].shape == (0, 3)
    v = flow.get_all_variables()
    np.testing.assert_array_equal(v["bn-moving_mean"], np.zeros(3, np.float32))
    np.testing.assert_array_equal(v["bn-moving_variance"], np.ones(3, np.float32))
    # a real batch still updates them (momentum 0.99)
    x = np.array([[1, 2, 3], [3, 6, 9]], np.float32)
    step([x])
    v = flow.get_all_variables()
    np.testing.assert_allclose(v["bn-moving_mean"], 0.01 * x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(v["bn-moving_variance"], 0.99 + 0.01 * x.var(0, ddof=1), rtol=1e-5)


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize("padding", [[[0, 0], [0, 0], [2, 2], [0, 0]], [[0, 0], [0, 0], [0, 0], [0, 3]]])
def test_pool_padding_with_a_window_of_only_padding_is_refused(pool, padding):
    x = np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(ValueError, match=rf"{pool}: padding \(\d, \d\) along spatial dim \d leaves a window "
                                         r"of ksize 2 \(stride 1\) with no input element"):
        _job(lambda a: getattr(flow.nn, pool)(a, 2, 1, padding, data_format="NCHW"), x)


def test_pool_padding_below_the_window_still_works():
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    got = _job(lambda a: flow.nn.max_pool2d(a, 2, 1, [[0, 0], [0, 0], [1, 1], [1, 1]], data_format="NCHW"), x)
    assert got.shape == (1, 1, 4, 4) and np.isfinite(got).all()


def test_conv_padding_that_overflows_is_a_user_error():
    x = np.ones((1, 1, 3, 3), np.float32)
    w = np.ones((1, 1, 2, 2), np.float32)
    with pytest.raises(ValueError, match=r"conv: the padded input along spatial dim 0 \(3 \+ padding "
                                         r"4611686018427387904 \+ 4611686018427387904\) overflows int64"):
        _job(lambda a, b: flow.nn.conv2d(a, b, 1, 2 ** 62, data_format="NCHW"), x, w)


def test_fused_softmax_of_a_broadcast_view():
    # The store of a value computed once per kept point (it reads the input
    # through stride 0 along the reduced axis) went to the first reduced point
    # only; the rest of the row was never written.
    x = np.zeros((4, 1), np.float32)
    got = _job(lambda a: flow.nn.softmax(flow.broadcast_to(a, [4, 2])), x)
    np.testing.assert_allclose(got, np.full((4, 2), 0.5, np.float32), rtol=1e-6)


def test_fused_softmax_of_a_broadcast_view_unfused_is_right(monkeypatch):
    monkeypatch.setenv("FLOWJIT_DISABLE_FUSION", "1")
    x = np.zeros((4, 1), np.float32)
    got = _job(lambda a: flow.nn.softmax(flow.broadcast_to(a, [4, 2])), x)
    np.testing.assert_allclose(got, np.full((4, 2), 0.5, np.float32), rtol=1e-6)


_ = Tuple  # (the reproducers the fuzzer prints import it)
