"""flow.checkpoint and flow.train.CheckPoint: OneFlow's on-disk layout, exact
round trips of training state, validation errors, atomic saves.

Note: the job functions are made afresh for each test, because a job function
that ran before flow.clear_default_session() (which conftest calls around
every test) raises "compiled before flow.clear_default_session()" on every
later call instead of recompiling (JobFunction.__call__'s fast path).
"""
import os

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from flowjit import checkpoint

STEP = "System-Train-TrainStep-sgd_job"
SGD_VARS = {"hidden-weight", "hidden-bias", "hidden-weight-momentum", "hidden-bias-momentum", STEP}


def make_sgd_job():
    """A fresh job function (see the module's note)."""
    @flow.global_function(type="train")
    def sgd_job(x: tp.Numpy.Placeholder((8, 4), dtype=flow.float),
                y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        logits = flow.layers.dense(x, 3, kernel_initializer=flow.random_normal_initializer(stddev=0.5),
                                   name="hidden")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]),
                           momentum=0.9).minimize(loss)
        return loss
    return sgd_job


def make_adam_job():
    @flow.global_function(type="train")
    def adam_job(x: tp.Numpy.Placeholder((8, 4), dtype=flow.float),
                 y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        logits = flow.layers.dense(x, 3, kernel_initializer=flow.random_normal_initializer(stddev=0.5),
                                   name="adam_layer")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.05])).minimize(loss)
        return loss
    return adam_job


def make_typed_job():
    @flow.global_function(type="predict")
    def typed_job(x: tp.Numpy.Placeholder((2,), dtype=flow.float)) -> tp.Numpy:
        """Variables of every dtype, a scalar, and names unsafe as directory names."""
        flow.get_variable("i8", shape=(2, 2), dtype=flow.int8, initializer=flow.constant_initializer(-3))
        flow.get_variable("u8", shape=(3,), dtype=flow.uint8, initializer=flow.constant_initializer(200))
        flow.get_variable("i32", shape=(2,), dtype=flow.int32, initializer=flow.constant_initializer(-7))
        flow.get_variable("i64", shape=(), dtype=flow.int64, initializer=flow.constant_initializer(5))
        flow.get_variable("f64", shape=(1, 2), dtype=flow.double,
                          initializer=flow.random_normal_initializer())
        flow.get_variable("flag", shape=(2,), dtype=flow.bool, initializer=flow.ones_initializer())
        flow.get_variable("scope/inner/w", shape=(2,), initializer=flow.constant_initializer(1.5))
        flow.get_variable("50%off", shape=(1,), initializer=flow.constant_initializer(2.5))
        flow.get_variable("snapshot_done", shape=(1,), initializer=flow.constant_initializer(3.5))
        flow.get_variable("empty", shape=(0, 3), initializer=flow.zeros_initializer())
        return x + flow.get_variable("bias2", shape=(2,), initializer=flow.ones_initializer())
    return typed_job


@pytest.fixture
def sgd_job():
    return make_sgd_job()


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((8, 4)).astype(np.float32), (np.arange(8) % 3).astype(np.int32)


def train(job, steps, seed=0):
    x, y = batch(seed)
    return [float(job(x, y).mean()) for _ in range(steps)]


def snapshot():
    return {k: np.array(v) for k, v in flow.get_all_variables().items()}


def assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def tree(path):
    """{relative file path: bytes} of a directory."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = fh.read()
    return out


@pytest.fixture
def trained(tmp_path, sgd_job):
    train(sgd_job, 3)
    path = tmp_path / "ck"
    flow.checkpoint.save(str(path))
    return path


# ---------------------------------------------------------------- layout

def test_save_writes_oneflow_layout(trained, tmp_path):
    values = snapshot()
    assert set(values) == SGD_VARS
    assert sorted(os.listdir(trained)) == sorted(SGD_VARS | {"snapshot_done"})
    assert os.path.getsize(trained / "snapshot_done") == 0
    expected_meta = {
        "hidden-weight": "shape {\n  dim: 3\n  dim: 4\n}\ndata_type: kFloat\n",
        "hidden-weight-momentum": "shape {\n  dim: 3\n  dim: 4\n}\ndata_type: kFloat\n",
        "hidden-bias": "shape {\n  dim: 3\n}\ndata_type: kFloat\n",
        "hidden-bias-momentum": "shape {\n  dim: 3\n}\ndata_type: kFloat\n",
        STEP: "shape {\n}\ndata_type: kInt64\n",
    }
    for name, meta in expected_meta.items():
        assert sorted(os.listdir(trained / name)) == ["meta", "out"]
        assert (trained / name / "meta").read_text() == meta
        data = (trained / name / "out").read_bytes()
        assert len(data) == values[name].nbytes
        assert data == values[name].astype(values[name].dtype.newbyteorder("<")).tobytes()
    assert (trained / STEP / "out").read_bytes() == (3).to_bytes(8, "little")
    # Nothing but the checkpoint is left next to it (the temporary directory was renamed).
    assert os.listdir(tmp_path) == ["ck"]


def test_meta_matches_protobuf_text_format():
    # text_format.MessageToString(VariableMetaInfo) output, checked against protobuf itself.
    assert checkpoint.format_meta((512, 784), np.float32) == \
        "shape {\n  dim: 512\n  dim: 784\n}\ndata_type: kFloat\n"
    assert checkpoint.format_meta((), np.int64) == "shape {\n}\ndata_type: kInt64\n"
    names = {np.float32: "kFloat", np.float64: "kDouble", np.int8: "kInt8", np.int32: "kInt32",
             np.int64: "kInt64", np.uint8: "kUInt8", np.bool_: "kBool"}
    for dt, name in names.items():
        assert checkpoint.format_meta((2,), dt).endswith(f"data_type: {name}\n")
        assert checkpoint.parse_meta(checkpoint.format_meta((2, 0, 5), dt)) == ((2, 0, 5), name)
    # Other spellings protobuf's text parser accepts.
    assert checkpoint.parse_meta("shape { dim: 2 dim: 3 } data_type: kFloat") == ((2, 3), "kFloat")
    assert checkpoint.parse_meta("shape: < dim: 7; >\n# c\ndata_type: 1") == ((7,), "kChar")
    assert checkpoint.parse_meta("data_type: kDouble\n") == ((), "kDouble")
    for bad, why in [("shape { dim: 2 }", "data_type"), ("data_type: kFloat data_type: kFloat", "more than one"),
                     ("shape { dim: -1 } data_type: kFloat", "non-negative"),
                     ("shape { size: 1 } data_type: kFloat", "size"), ("stride {} data_type: kFloat", "stride"),
                     ("shape { dim: 2 data_type: kFloat", "unknown field 'data_type' in 'shape'"),
                     ("shape { dim: 2", "expected '}', got 'end of text'"), ("shape { dim: x } data_type: kFloat", "integer")]:
        with pytest.raises(ValueError, match=why):
            checkpoint.parse_meta(bad)


def test_names_are_escaped_reversibly():
    cases = {"hidden-weight": "hidden-weight", "a/b": "a%2Fb", "50%": "50%25", ".": "%2E",
             "..": "%2E%2E", "snapshot_done": "snapshot%5Fdone", "x\ny": "x%0Ay", "ü-w": "ü-w"}
    for name, d in cases.items():
        assert checkpoint.escape_name(name) == d
        assert checkpoint.unescape_name(d) == name


def test_all_dtypes_and_odd_names_round_trip(tmp_path):
    make_typed_job()(np.zeros(2, np.float32))
    values = snapshot()
    path = tmp_path / "typed"
    flow.checkpoint.save(path)
    dirs = set(os.listdir(path))
    assert {"scope%2Finner%2Fw", "50%25off", "snapshot%5Fdone", "snapshot_done"} <= dirs
    assert os.path.isfile(path / "snapshot_done") and os.path.isdir(path / "snapshot%5Fdone")
    assert (path / "flag" / "meta").read_text() == "shape {\n  dim: 2\n}\ndata_type: kBool\n"
    assert (path / "u8" / "meta").read_text().endswith("data_type: kUInt8\n")
    assert (path / "i8" / "meta").read_text().endswith("data_type: kInt8\n")
    assert (path / "f64" / "meta").read_text().endswith("data_type: kDouble\n")
    assert os.path.getsize(path / "empty" / "out") == 0
    got = flow.checkpoint.get(path)
    assert_same(got, values)
    assert got["i64"].shape == () and int(got["i64"]) == 5
    assert got["scope/inner/w"].numpy().tolist() == [1.5, 1.5]  # .numpy() as in OneFlow


# ---------------------------------------------------------------- round trips

def test_restores_parameters_optimizer_state_and_step(trained, sgd_job):
    saved = snapshot()
    reference = train(sgd_job, 2)          # steps 4 and 5 from the saved state
    after_reference = snapshot()
    assert int(after_reference[STEP]) == 5
    for name in SGD_VARS:
        assert not np.array_equal(after_reference[name], saved[name]), name
    flow.load_variables(flow.checkpoint.get(trained))
    assert_same(snapshot(), saved)
    # With momentum and step restored, training continues exactly as before.
    assert train(sgd_job, 2) == reference
    assert_same(snapshot(), after_reference)


def test_adam_state_round_trips(tmp_path):
    adam_job = make_adam_job()
    train(adam_job, 3)
    names = set(flow.get_all_variables())
    assert {"adam_layer-weight-m", "adam_layer-weight-v", "System-Train-TrainStep-adam_job"} <= names
    saved = snapshot()
    flow.checkpoint.save(tmp_path / "adam")
    reference = train(adam_job, 2)
    flow.train.CheckPoint().load(tmp_path / "adam")
    assert_same(snapshot(), saved)
    assert train(adam_job, 2) == reference


def test_get_does_not_modify_the_session(trained, sgd_job):
    train(sgd_job, 1)
    before = snapshot()
    got = flow.checkpoint.get(trained)
    assert set(got) == SGD_VARS and int(got[STEP]) == 3
    assert_same(snapshot(), before)
    got["hidden-weight"][...] = 0  # the arrays are the caller's own copies
    assert_same(snapshot(), before)


def test_get_of_one_variable_directory(trained):
    w = flow.checkpoint.get(trained / "hidden-weight")
    np.testing.assert_array_equal(w, flow.get_all_variables()["hidden-weight"])


def test_reads_a_checkpoint_written_by_oneflow(tmp_path):
    # Laid out by hand the way OneFlow writes one, with its other legal spellings.
    path = tmp_path / "of"
    os.makedirs(path / "w")
    os.makedirs(path / "c")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    (path / "w" / "out").write_bytes(a.tobytes())
    (path / "w" / "meta").write_text("shape { dim: 2 dim: 3 } data_type: kFloat")
    (path / "c" / "out").write_bytes(np.array([-1, 2], np.int8).tobytes())
    (path / "c" / "meta").write_text("shape {\n  dim: 2\n}\ndata_type: kChar\n")
    (path / "snapshot_done").write_bytes(b"")
    got = flow.checkpoint.get(path)
    np.testing.assert_array_equal(got["w"], a)
    assert got["c"].dtype == np.int8 and got["c"].tolist() == [-1, 2]


def test_save_of_a_var_dict(tmp_path):
    d = {"a": np.arange(4, dtype=np.int32).reshape(2, 2), "b": np.float64(2.5),
         "h": np.ones(3, np.float16)}
    flow.checkpoint.save(tmp_path / "d", d)
    got = flow.checkpoint.get(tmp_path / "d")
    assert got["a"].tolist() == [[0, 1], [2, 3]] and got["b"].shape == () and float(got["b"]) == 2.5
    assert got["h"].dtype == np.float16
    assert (tmp_path / "d" / "h" / "meta").read_text().endswith("data_type: kFloat16\n")
    with pytest.raises(TypeError, match="'s'.*dtype <U1"):
        flow.checkpoint.save(tmp_path / "e", {"s": np.array(["x"])})
    with pytest.raises(TypeError, match="'n'.*numpy array"):
        flow.checkpoint.save(tmp_path / "e", {"n": [1.0]})
    with pytest.raises(TypeError, match="path"):
        flow.checkpoint.save(123)
    assert not os.path.exists(tmp_path / "e")


# ---------------------------------------------------------------- errors

def _truncate(p):
    data = (p / "hidden-weight-momentum" / "out").read_bytes()
    (p / "hidden-weight-momentum" / "out").write_bytes(data[:-4])


def _extend(p):
    with open(p / "hidden-weight-momentum" / "out", "ab") as f:
        f.write(b"\0")


CORRUPTIONS = {
    "no out": (lambda p: os.remove(p / "hidden-weight-momentum" / "out"), "no data file"),
    "truncated out": (_truncate, "holds 44 bytes but .* need 48"),
    "long out": (_extend, "holds 49 bytes"),
    "bad meta": (lambda p: (p / "hidden-weight-momentum" / "meta").write_text("shape { dim: 3 dim 4 }"),
                 "cannot parse"),
    "unknown dtype": (lambda p: (p / "hidden-weight-momentum" / "meta").write_text(
        "shape { dim: 3 dim: 4 } data_type: kFloat8"), "unknown dtype 'kFloat8'"),
    "unsupported dtype": (lambda p: (p / "hidden-weight-momentum" / "meta").write_text(
        "shape { dim: 3 dim: 4 } data_type: kTensorBuffer"), "kTensorBuffer, which flowjit cannot represent"),
    "no meta": (lambda p: os.remove(p / "hidden-weight-momentum" / "meta"), "no meta file"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_variable_is_named(trained, kind, sgd_job):
    corrupt, why = CORRUPTIONS[kind]
    corrupt(trained)
    with pytest.raises(checkpoint.CheckpointError, match=why) as e:
        flow.checkpoint.get(trained)
    assert "'hidden-weight-momentum'" in str(e.value)
    if kind == "no meta":
        return  # CheckPoint.load takes the shape and dtype from the session, as OneFlow does
    # Nothing is half-loaded: the variables sorted before the corrupt one stay as they are.
    train(sgd_job, 1)
    before = snapshot()
    with pytest.raises(checkpoint.CheckpointError, match="'hidden-weight-momentum'"):
        flow.train.CheckPoint().load(trained)
    assert_same(snapshot(), before)


def test_missing_and_incomplete_checkpoints(trained, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        flow.checkpoint.get(tmp_path / "nowhere")
    with pytest.raises(NotADirectoryError, match="snapshot_done"):
        flow.checkpoint.get(trained / "snapshot_done")
    os.remove(trained / "snapshot_done")
    with pytest.raises(checkpoint.CheckpointError, match="incomplete.*snapshot_done"):
        flow.checkpoint.get(trained)
    with pytest.raises(checkpoint.CheckpointError, match="incomplete"):
        flow.train.CheckPoint().load(trained)


def test_load_checks_shape_and_dtype_before_setting_anything(tmp_path, sgd_job):
    train(sgd_job, 2)
    before = snapshot()
    good = {k: v + 1 for k, v in before.items()}
    flow.checkpoint.save(tmp_path / "shape", {**good, "hidden-weight-momentum": np.zeros((4, 3), np.float32)})
    flow.checkpoint.save(tmp_path / "dtype", {**good, "hidden-weight-momentum": np.zeros((3, 4), np.float64)})
    ck = flow.train.CheckPoint()
    with pytest.raises(ValueError, match=r"'hidden-weight-momentum' has shape \(3, 4\) in the session but "
                                         r"\(4, 3\)"):
        ck.load(tmp_path / "shape")
    with pytest.raises(TypeError, match="'hidden-weight-momentum' is float32 in the session but float64"):
        ck.load(tmp_path / "dtype")
    assert_same(snapshot(), before)
    with pytest.raises(ValueError, match="hidden-weight-momentum.*shape"):
        flow.load_variables(flow.checkpoint.get(tmp_path / "shape"))
    assert_same(snapshot(), before)


# ---------------------------------------------------------------- atomicity

def test_failed_save_leaves_nothing(trained, tmp_path, monkeypatch):
    calls = []
    real = checkpoint._write_file

    def failing(path, data):
        calls.append(path)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(checkpoint, "_write_file", failing)
    with pytest.raises(OSError, match="No space"):
        flow.checkpoint.save(tmp_path / "new")
    assert len(calls) == 4
    assert sorted(os.listdir(tmp_path)) == ["ck"]  # no target, no temporary directory
    # An empty directory at the target stays an empty directory, never an incomplete checkpoint.
    os.mkdir(tmp_path / "empty")
    calls.clear()
    with pytest.raises(OSError):
        flow.checkpoint.save(tmp_path / "empty")
    assert os.listdir(tmp_path / "empty") == []
    monkeypatch.setattr(checkpoint, "_write_file", real)
    flow.checkpoint.save(tmp_path / "empty")  # an empty directory is replaced
    assert_same(flow.checkpoint.get(tmp_path / "empty"), snapshot())


def test_failure_at_publish_leaves_nothing(tmp_path, monkeypatch, sgd_job):
    train(sgd_job, 1)

    def no_rename(src, dst):
        assert os.path.isfile(os.path.join(src, "snapshot_done"))  # complete, but not yet published
        raise OSError(5, "I/O error")

    monkeypatch.setattr(checkpoint.os, "rename", no_rename)
    with pytest.raises(OSError, match="I/O error"):
        flow.checkpoint.save(tmp_path / "ck")
    assert os.listdir(tmp_path) == []


def test_existing_checkpoint_is_never_overwritten(trained, tmp_path, monkeypatch, sgd_job):
    old = tree(trained)
    train(sgd_job, 2)
    for save in (flow.checkpoint.save, flow.train.CheckPoint().save):
        with pytest.raises(FileExistsError, match="non-empty directory .*ck.* already exists"):
            save(str(trained))
        assert tree(trained) == old
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="a file"):
        flow.checkpoint.save(tmp_path / "file")
    # Even if the target appears after the check, the final rename refuses to replace it.
    monkeypatch.setattr(checkpoint, "_check_target", lambda path, api: None)
    with pytest.raises(FileExistsError, match="created by someone else"):
        flow.checkpoint.save(trained)
    assert tree(trained) == old
    assert sorted(os.listdir(tmp_path)) == ["ck", "file"]
    assert int(flow.checkpoint.get(trained)[STEP]) == 3


# ---------------------------------------------------------------- CheckPoint

def test_checkpoint_init_save_load(tmp_path):
    ck = flow.train.CheckPoint()
    ck.init()  # before any job: valid, nothing to initialize yet
    assert flow.get_all_variables() == {}
    sgd_job = make_sgd_job()
    first = train(sgd_job, 3)
    # Variables traced after init() got their initializers: the same run as without init().
    flow.clear_default_session()
    sgd_job = make_sgd_job()
    assert train(sgd_job, 3) == first
    trained = snapshot()
    ck.init()  # after training: keeps the trained values (OneFlow >= 0.3 semantics)
    assert_same(snapshot(), trained)
    ck.save(tmp_path / "ck")
    reference = train(sgd_job, 2)
    ck.load(tmp_path / "ck")
    assert_same(snapshot(), trained)
    assert train(sgd_job, 2) == reference


def test_checkpoint_load_skips_names_the_session_lacks(tmp_path, sgd_job):
    train(sgd_job, 2)
    saved = snapshot()
    flow.checkpoint.save(tmp_path / "ck", {**saved, "other-weight": np.ones(2, np.float32)})
    train(sgd_job, 1)
    flow.train.CheckPoint().load(tmp_path / "ck")
    assert_same(snapshot(), saved)
    with pytest.raises(ValueError, match="other-weight"):
        flow.load_variables(flow.checkpoint.get(tmp_path / "ck"), ignore_mismatch=False)


def test_checkpoint_load_into_a_session_without_the_variables(trained):
    flow.clear_default_session()
    with pytest.raises(ValueError, match="none of the 5 variables .* call the jobs once"):
        flow.train.CheckPoint().load(trained)
    assert flow.get_all_variables() == {}


def test_checkpoint_load_without_meta_uses_the_session_types(trained, sgd_job):
    saved = snapshot()
    os.remove(trained / "hidden-bias" / "meta")
    train(sgd_job, 1)
    flow.train.CheckPoint().load(trained)
    assert_same(snapshot(), saved)
    _truncate_bias = (trained / "hidden-bias" / "out").read_bytes()[:-1]
    (trained / "hidden-bias" / "out").write_bytes(_truncate_bias)
    with pytest.raises(checkpoint.CheckpointError, match="'hidden-bias'.*11 bytes"):
        flow.train.CheckPoint().load(trained)
