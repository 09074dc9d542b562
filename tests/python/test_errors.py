"""User errors: each raises a Python exception whose message names the job, the
parameter or op, what was expected and what was given (and the user's source
line for errors found while tracing). After each, the process keeps working,
nothing ran and no variable changed."""
import os
import typing

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

THIS_FILE = os.path.basename(__file__)


def line_of(marker):
    """The line number in this file of the (unique) line containing `marker`."""
    lines = [i for i, text in enumerate(open(__file__).read().splitlines(), 1)
             if marker in text and "line_of(" not in text]
    assert len(lines) == 1, (marker, lines)
    return lines[0]


def sgd(lr=0.1):
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0)


def still_works():
    """A fresh job compiles and runs correctly."""
    @flow.global_function()
    def healthy(x: tp.Numpy.Placeholder((17,))) -> tp.Numpy:
        return flow.math.exp(x) + 1

    x = np.linspace(-2, 2, 17).astype(np.float32)
    np.testing.assert_allclose(healthy(x), np.exp(x) + 1, rtol=1e-5)


@pytest.fixture
def counted_train_job():
    """A train job whose every run changes variable 'w' (w -= 0.5 * x) and the train step."""
    @flow.global_function(type="train")
    def step(x: tp.Numpy.Placeholder((3,)), n: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(w * x) + flow.math.reduce_sum(flow.cast(n, flow.float))
        sgd(0.5).minimize(loss)
        return loss

    x = np.ones(3, np.float32)
    n = np.zeros(2, np.int32)
    step(x, n)
    return step, x, n


def snapshot():
    return {k: np.array(v) for k, v in flow.get_all_variables().items()}


def assert_unchanged(before):
    after = snapshot()
    assert set(after) == set(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


# ---------------------------------------------------------------- calling a job with bad arguments

def test_wrong_number_of_arguments(counted_train_job):
    step, x, n = counted_train_job
    before = snapshot()
    with pytest.raises(TypeError, match=r"^job 'step' takes 2 arguments \(x, n\) but 1 was given$"):
        step(x)
    with pytest.raises(TypeError, match=r"^job 'step' takes 2 arguments \(x, n\) but 3 were given$"):
        step(x, n, n)
    with pytest.raises(TypeError, match=r"job 'step' takes 2 arguments \(x, n\) but 0 were given"):
        step()
    with pytest.raises(TypeError, match=r"job 'step' is missing argument 'n'"):
        step(x=x)
    with pytest.raises(TypeError, match=r"job 'step' got unexpected argument\(s\) \['m'\]; its "
                                        r"parameters are \['x', 'n'\]"):
        step(x, n=n, m=n)
    with pytest.raises(TypeError, match=r"job 'step' got multiple values for argument 'x'"):
        step(x, n, x=x)
    assert_unchanged(before)
    step(x, n)  # still callable, and it runs
    np.testing.assert_allclose(flow.get_all_variables()["w"], np.zeros(3, np.float32))


@pytest.mark.parametrize("bad,what", [([1.0, 2.0, 3.0], "list"), (None, "NoneType"), (3.0, "float"),
                                      ("abc", "str"), (np.float32(1.0), "float32")])
def test_non_array_argument(counted_train_job, bad, what):
    step, x, n = counted_train_job
    before = snapshot()
    with pytest.raises(TypeError, match=rf"^job 'step': parameter 'x' expects a numpy array "
                                        rf"\(tp\.Numpy\.Placeholder\(\(3,\), dtype=flow\.float32\)\) "
                                        rf"but got {what}"):
        step(bad, n)
    assert_unchanged(before)
    still_works()


def test_scalar_argument_hint():
    @flow.global_function()
    def scale(s: tp.Numpy.Placeholder((), dtype=flow.float)) -> tp.Numpy:
        return s * 2

    with pytest.raises(TypeError, match=r"a scalar must be passed as a 0-d array, e\.g\. "
                                        r"np\.array\(1\.5, dtype=np\.float32\)"):
        scale(1.5)
    np.testing.assert_allclose(scale(np.array(1.5, np.float32)), 3.0)


def test_wrong_shape(counted_train_job):
    step, x, n = counted_train_job
    before = snapshot()
    msg = (r"^job 'step': parameter 'x' is declared with shape \(3,\) but the array has shape \(4,\); "
           r"a tp\.Numpy placeholder needs exactly its declared shape \(use tp\.ListNumpy\.Placeholder "
           r"for varying sizes\)$")
    with pytest.raises(ValueError, match=msg):
        step(np.ones(4, np.float32), n)
    with pytest.raises(ValueError, match=r"parameter 'n' is declared with shape \(2,\) but the array has "
                                         r"shape \(1, 2\)"):
        step(x, np.zeros((1, 2), np.int32))
    with pytest.raises(ValueError, match=r"parameter 'x' is declared with shape \(3,\) but the array has "
                                         r"shape \(\)"):
        step(np.array(1.0, np.float32), n)
    assert_unchanged(before)
    assert len(step.compiled_jobs()) == 1
    still_works()


def test_wrong_dtype(counted_train_job):
    step, x, n = counted_train_job
    before = snapshot()
    with pytest.raises(TypeError, match=r"^job 'step': parameter 'n' is declared int32 but the array is "
                                        r"int64; convert it with n\.astype\(np\.int32\)$"):
        step(x, n.astype(np.int64))
    with pytest.raises(TypeError, match=r"parameter 'x' is declared float32 but the array is float64; "
                                        r"convert it with x\.astype\(np\.float32\)"):
        step(x.astype(np.float64), n)
    with pytest.raises(TypeError, match=r"parameter 'n' is declared int32 but the array is float32; "
                                        r"convert it with n\.astype\(np\.int32\)"):
        step(x, n.astype(np.float32))
    with pytest.raises(TypeError, match=r"parameter 'x' is declared float32 but the array is >f4; "
                                        r"convert it with x\.astype\(np\.float32\)"):
        step(x.astype(">f4"), n)
    assert_unchanged(before)
    still_works()


def test_list_numpy_argument_errors():
    @flow.global_function()
    def job(x: tp.ListNumpy.Placeholder((4, 5), dtype=flow.int32)) -> tp.ListNumpy:
        return x + 1

    with pytest.raises(TypeError, match=r"parameter 'x\[0\]' is declared int32 but the array is int64; "
                                        r"convert it with x\.astype\(np\.int32\)"):
        job([np.zeros((2, 5), np.int64)])
    with pytest.raises(TypeError, match=r"parameter 'x' \(tp\.ListNumpy\.Placeholder\(\(4, 5\), "
                                        r"dtype=flow\.int32\)\) expects a list with one array per device"):
        job(np.zeros((2, 5), np.int32))
    with pytest.raises(TypeError, match=r"parameter 'x\[0\]' expects a numpy array"):
        job([[1, 2]])
    with pytest.raises(ValueError, match=r"job 'job': parameter 'x\[0\]' has shape \(4, 6\), which is not "
                                         r"within the declared bounds \(4, 5\)"):
        job([np.zeros((4, 6), np.int32)])
    assert job.compiled_jobs() == []
    np.testing.assert_array_equal(job([np.zeros((1, 5), np.int32)])[0], np.ones((1, 5), np.int32))


# ---------------------------------------------------------------- errors while tracing

def test_shape_error_while_tracing_names_op_and_user_line():
    @flow.global_function()
    def mm(a: tp.Numpy.Placeholder((3, 4)), b: tp.Numpy.Placeholder((5, 6))) -> tp.Numpy:
        v = flow.get_variable("created_by_mm", shape=(2,))
        return flow.matmul(a, b) + flow.math.reduce_sum(v)  # MATMUL-LINE

    a, b = np.ones((3, 4), np.float32), np.ones((5, 6), np.float32)
    where = f"{THIS_FILE}:{line_of('# MATMUL-LINE')}"
    for _ in range(2):  # a failed trace is not cached: the second call fails the same way
        with pytest.raises(ValueError) as info:
            mm(a, b)
        msg = str(info.value)
        assert msg.startswith(f"job 'mm', {where}: matmul: "), msg
        assert "inner dimensions" in msg and "4" in msg and "5" in msg, msg
    # the failed trace created no variable and compiled nothing
    assert flow.get_all_variables() == {}
    assert mm.compiled_jobs() == []
    still_works()


def test_trace_errors_in_layers_and_ops_name_the_user_line():
    @flow.global_function()
    def bad_dense(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        flow.layers.dense(x, 2, name="fc")
        return flow.layers.dense(flow.reshape(x, [4, 3]), 2, name="fc")  # DENSE-LINE

    with pytest.raises(ValueError, match=rf"^job 'bad_dense', {THIS_FILE}:{line_of('# DENSE-LINE')}: "
                                         r"get_variable: variable 'fc-weight' was already requested in "
                                         r"this job as flow\.float32\(2, 4\), now as flow\.float32\(2, 3\)"):
        bad_dense(np.ones((3, 4), np.float32))

    @flow.global_function()
    def dense_of_array(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        return flow.layers.dense(np.ones((3, 4)), 2)  # DENSE-ARRAY-LINE

    # an unnamed dense layer is named Dense_0, Dense_1, ... per job, as in OneFlow
    with pytest.raises(TypeError, match=rf"^job 'dense_of_array', {THIS_FILE}:"
                                        rf"{line_of('# DENSE-ARRAY-LINE')}: dense 'Dense_0': inputs must "
                                        r"be a Blob, got ndarray"):
        dense_of_array(np.ones((3, 4), np.float32))

    @flow.global_function()
    def bad_reshape(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        return flow.reshape(x, [5, -1])  # RESHAPE-LINE

    with pytest.raises(ValueError, match=rf"^job 'bad_reshape', {THIS_FILE}:{line_of('# RESHAPE-LINE')}: "
                                         r"reshape"):
        bad_reshape(np.ones((3, 4), np.float32))

    @flow.global_function()
    def bad_add(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x + y  # ADD-LINE

    with pytest.raises(ValueError, match=rf"^job 'bad_add', {THIS_FILE}:{line_of('# ADD-LINE')}: add"):
        bad_add(np.ones(3, np.float32), np.ones(4, np.float32))

    @flow.global_function()
    def bad_dtype(x: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> tp.Numpy:
        return flow.math.exp(x)  # EXP-LINE

    with pytest.raises(TypeError, match=rf"^job 'bad_dtype', {THIS_FILE}:{line_of('# EXP-LINE')}: exp: "
                                        r"input must be a floating-point tensor"):
        bad_dtype(np.ones(3, np.int32))
    assert flow.get_all_variables() == {}
    still_works()


def test_python_exception_in_job_body_leaves_no_trace():
    @flow.global_function()
    def boom(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.get_variable("boom_var", shape=(3,))
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug"):
        boom(np.ones(3, np.float32))
    assert flow.get_all_variables() == {}
    with pytest.raises(RuntimeError, match="can only be used inside a function decorated with "
                                           "@flow.global_function"):
        flow.constant(1.0)  # the tracing context was left
    still_works()


def test_blob_used_as_bool_or_array():
    @flow.global_function()
    def branchy(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        if x > 0:
            return x
        return -x

    with pytest.raises(TypeError, match=r"blob '.*' has no value while the job is being traced, so it "
                                        r"cannot be used as a Python bool \(use flow\.where"):
        branchy(np.ones(3, np.float32))

    @flow.global_function()
    def numpyish(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.constant(float(np.sum(np.asarray(x))))

    with pytest.raises(TypeError, match="has no data while the job is being traced"):
        numpyish(np.ones(3, np.float32))

    @flow.global_function()
    def with_array(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return x + np.ones(3, np.float32)

    with pytest.raises(TypeError, match=r"add: expected a Blob or a Python number, got ndarray \(numpy "
                                        r"arrays must be passed to the job as placeholders\)"):
        with_array(np.ones(3, np.float32))
    still_works()


def test_bad_return_values():
    @flow.global_function()
    def returns_array(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return np.ones(3)

    with pytest.raises(TypeError, match=r"job 'returns_array': expected a Blob for the Numpy result, got "
                                        r"ndarray"):
        returns_array(np.ones(3, np.float32))

    @flow.global_function()
    def wrong_arity(x: tp.Numpy.Placeholder((3,))) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return x, x, x

    with pytest.raises(TypeError, match=r"job 'wrong_arity': annotated to return a tuple of 2 but "
                                        r"returned a tuple of 3"):
        wrong_arity(np.ones(3, np.float32))

    @flow.global_function()
    def returns_none_declared(x: tp.Numpy.Placeholder((3,))) -> None:
        return x

    with pytest.raises(TypeError, match=r"job 'returns_none_declared' is annotated to return None but "
                                        r"returned Blob"):
        returns_none_declared(np.ones(3, np.float32))
    still_works()


# ---------------------------------------------------------------- blobs outside their job

def test_blob_outside_a_job_function():
    saved = []

    @flow.global_function()
    def keep(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        saved.append(x)
        return x * 2

    x = np.arange(3, dtype=np.float32)
    keep(x)
    blob = saved[0]
    assert blob.shape == (3,) and blob.dtype is flow.float32
    with pytest.raises(RuntimeError, match=r"^flow\.add can only be used inside a function decorated "
                                           r"with @flow\.global_function, while it is being traced \(flowjit has no eager mode\)$"):
        blob + 1
    with pytest.raises(RuntimeError, match=r"^flow\.exp can only be used inside a function decorated"):
        flow.math.exp(blob)
    with pytest.raises(RuntimeError, match=r"^flow\.get_variable can only be used inside"):
        flow.get_variable("outside", shape=(3,))
    with pytest.raises(RuntimeError, match=r"^flow\.constant can only be used inside"):
        flow.constant(1.0)

    @flow.global_function()
    def other(y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return y + blob  # OTHER-LINE

    with pytest.raises(RuntimeError, match=rf"^job 'other', {THIS_FILE}:{line_of('# OTHER-LINE')}: add: "
                                           r"blob 'x' belongs to job 'keep', whose tracing has finished; "
                                           r"a blob can only be used inside the job function that "
                                           r"created it$"):
        other(x)

    @flow.global_function()
    def returns_foreign(y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return blob

    with pytest.raises(RuntimeError, match="blob 'x' belongs to job 'keep'"):
        returns_foreign(x)
    np.testing.assert_array_equal(keep(x), x * 2)
    assert flow.get_all_variables() == {}


# ---------------------------------------------------------------- annotations and decoration

@pytest.mark.parametrize("shape,exc,msg", [
    ((0, 3), ValueError, r"tp\.Numpy\.Placeholder: shape must be a tuple of positive ints, got \(0, 3\) "
                         r"\(extent 0 is not a positive int\)"),
    ((-1,), ValueError, r"got \(-1,\) \(extent -1 is not a positive int\)"),
    ("abc", TypeError, r"tp\.Numpy\.Placeholder: shape must be a tuple of positive ints, got 'abc'"),
    ((2.5, 3), ValueError, r"extent 2\.5 is not a positive int"),
    ((True, 3), ValueError, r"extent True is not a positive int"),
    (None, TypeError, r"got None"),
    (5, TypeError, r"got 5"),
])
def test_placeholder_bad_shape(shape, exc, msg):
    with pytest.raises(exc, match=msg):
        tp.Numpy.Placeholder(shape, dtype=flow.float)
    with pytest.raises(exc, match=msg.replace(r"tp\.Numpy", r"tp\.ListNumpy")):
        tp.ListNumpy.Placeholder(shape)


def test_placeholder_bad_dtype():
    with pytest.raises(TypeError, match=r"tp\.Numpy\.Placeholder dtype: expected a flowjit dtype such as "
                                        r"flow\.float32, got 'nope'"):
        tp.Numpy.Placeholder((3,), dtype="nope")
    assert tp.Numpy.Placeholder((3,), dtype=np.float16).dtype is flow.float16
    assert tp.Numpy.Placeholder([2, 3], dtype=np.int64).dtype is flow.int64


def test_unknown_function_config_setting():
    cfg = flow.function_config()
    with pytest.raises(AttributeError, match=r"function_config has no setting 'no_such_setting'; "
                                             r"flowjit's settings are: default_data_type"):
        cfg.no_such_setting(True)
    with pytest.raises(NotImplementedError, match=r"function_config\.enable_tensorrt is a OneFlow setting "
                                                  r"that flowjit does not implement"):
        cfg.enable_tensorrt(True)
    with pytest.raises(AttributeError, match=r"function_config settings are methods: call "
                                             r"config\.default_data_type\(value\)"):
        cfg.default_data_type = flow.double
    with pytest.raises(TypeError, match="function_config.default_data_type"):
        cfg.default_data_type("complex")
    with pytest.raises(ValueError, match=r"recompile_limit: expected a positive int, got 0"):
        cfg.recompile_limit(0)
    # the config is still usable, with its default
    @flow.global_function(function_config=cfg)
    def job() -> tp.Numpy:
        return flow.constant(1.5)

    assert job().dtype == np.float32


def test_train_job_without_minimize():
    @flow.global_function(type="train")
    def no_minimize(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.get_variable("nm", shape=(3,)) * x

    for _ in range(2):
        with pytest.raises(TypeError, match=r"^job 'no_minimize' is declared type=\"train\" but never calls "
                                            r"an optimizer's minimize\(loss\)"):
            no_minimize(np.ones(3, np.float32))
    assert flow.get_all_variables() == {}
    still_works()


def test_minimize_twice_and_outside():
    @flow.global_function(type="train")
    def twice(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        loss = flow.math.reduce_sum(flow.get_variable("tw2", shape=(3,)) * x)
        sgd().minimize(loss)
        sgd().minimize(loss)
        return loss

    with pytest.raises(ValueError, match="already called minimize; pass a list of losses"):
        twice(np.ones(3, np.float32))
    with pytest.raises(RuntimeError, match=r"SGD\.minimize can only be used inside"):
        sgd().minimize(None)
    assert flow.get_all_variables() == {}


def test_callback_without_type_argument():
    with pytest.raises(TypeError, match=r"^job 'cb': tp\.Callback needs the result type, e\.g\. "
                                        r"tp\.Callback\[tp\.Numpy\]$"):
        @flow.global_function()
        def cb(x: tp.Numpy.Placeholder((3,))) -> tp.Callback:
            return x


def test_parameter_without_placeholder_annotation():
    with pytest.raises(TypeError, match=r"^job 'plain': parameter 'x' needs a placeholder annotation such "
                                        r"as tp\.Numpy\.Placeholder\(\(100, 784\), dtype=flow\.float\) or a "
                                        r"typing\.Tuple of them, got no annotation$"):
        @flow.global_function()
        def plain(x) -> tp.Numpy:
            return x

    with pytest.raises(TypeError, match=r"job 'kind_only': parameter 'x' needs a placeholder annotation .*, "
                                        r"got <class 'flowjit\.typing\.Numpy'>$"):
        @flow.global_function()
        def kind_only(x: tp.Numpy) -> tp.Numpy:
            return x

    with pytest.raises(TypeError, match=r"job 'star': parameter 'args' must be a plain positional "
                                        r"parameter"):
        @flow.global_function()
        def star(*args: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
            return args[0]


def test_bad_return_annotation_and_decorator_arguments():
    with pytest.raises(TypeError, match=r"job 'ret_int': unsupported return annotation <class 'int'>"):
        @flow.global_function()
        def ret_int(x: tp.Numpy.Placeholder((3,))) -> int:
            return x

    with pytest.raises(ValueError, match=r"global_function: type must be \"train\" or \"predict\", got "
                                         r"'inference'"):
        flow.global_function(type="inference")
    with pytest.raises(TypeError, match=r"global_function: function_config must come from "
                                        r"flow\.function_config\(\)"):
        flow.global_function(type="predict", function_config={"default_data_type": flow.float})


def test_get_variable_errors():
    @flow.global_function()
    def no_shape() -> tp.Numpy:
        return flow.get_variable("ns")  # NOSHAPE-LINE

    with pytest.raises(ValueError, match=rf"^job 'no_shape', {THIS_FILE}:{line_of('# NOSHAPE-LINE')}: "
                                         r"get_variable: variable 'ns' needs a shape$"):
        no_shape()

    @flow.global_function()
    def bad_shape() -> tp.Numpy:
        return flow.get_variable("bs", shape=(3, -2))

    with pytest.raises(ValueError, match=r"get_variable: shape of 'bs' must be a tuple of non-negative ints"):
        bad_shape()

    @flow.global_function()
    def bad_init() -> tp.Numpy:
        return flow.get_variable("bi", shape=(3,), initializer=np.ones(3))

    with pytest.raises(TypeError, match=r"get_variable: initializer must be a flow initializer"):
        bad_init()
    assert flow.get_all_variables() == {}


def test_bad_initializer_arguments():
    with pytest.raises(ValueError, match=r"random_uniform_initializer: maxval \(0\.0\) must be >= minval"):
        flow.random_uniform_initializer(1.0, 0.0)
    with pytest.raises(ValueError, match=r"variance_scaling_initializer: mode must be one of"):
        flow.variance_scaling_initializer(mode="fan_sideways")
    with pytest.raises(ValueError, match=r"kaiming_initializer: nonlinearity must be one of"):
        flow.kaiming_initializer((3, 3), nonlinearity="swish")


def test_rejected_train_call_changes_nothing(counted_train_job):
    step, x, n = counted_train_job
    before = snapshot()
    assert any(k.startswith("System-Train-TrainStep") for k in before)
    bad_calls = [lambda: step(x), lambda: step(x, n.astype(np.int64)), lambda: step(x[:2], n),
                 lambda: step(list(x), n), lambda: step(x, None), lambda: step(x, n, n)]
    for call in bad_calls:
        with pytest.raises((TypeError, ValueError)):
            call()
    assert_unchanged(before)
    # and one good call changes w by exactly one step
    step(x, n)
    np.testing.assert_allclose(flow.get_all_variables()["w"], before["w"] - 0.5 * x)


def test_process_survives_many_errors():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((5,))) -> tp.Numpy:
        return x * 2

    good = np.arange(5, dtype=np.float32)
    bads = [np.arange(6, dtype=np.float32), good.astype(np.int8), "x", None, [good], good.reshape(5, 1),
            np.array([object()] * 5), np.zeros((0,), np.float32)]
    for _ in range(3):
        for b in bads:
            with pytest.raises((TypeError, ValueError)):
                job(b)
            np.testing.assert_array_equal(job(good), good * 2)


def test_an_arena_too_large_to_allocate_is_a_memory_error_naming_the_job_and_size():
    # Before: "MemoryError: std::bad_alloc", naming no job, buffer or size.
    @flow.global_function(type="predict")
    def needs_two_tib(x: tp.Numpy.Placeholder((1, 4)), w: tp.Numpy.Placeholder((4, 4))) -> tp.Numpy:
        big = flow.broadcast_to(x, (1 << 36, 4)) + 1.0  # 1 TiB, stored for the matmul
        return flow.math.reduce_sum(flow.matmul(big, w), axis=0)

    with pytest.raises(MemoryError, match=r"job 'needs_two_tib': cannot allocate its arena .* of \d+ bytes"):
        needs_two_tib(np.ones((1, 4), np.float32), np.ones((4, 4), np.float32))
