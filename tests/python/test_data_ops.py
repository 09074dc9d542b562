"""flow.data ops inside a job ([zoo]): decode_random, the synthetic data of
OneFlow's model programs, and the op semantics those programs rely on."""
from typing import Tuple

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


def test_decode_random_shapes_dtypes_and_a_new_batch_per_call():
    flow.clear_default_session()

    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        u = flow.data.decode_random(shape=(3, 4), dtype=flow.float, batch_size=2000)
        zeros = flow.data.decode_random((), flow.int32, batch_size=8, initializer=flow.zeros_initializer(flow.int32))
        ints = flow.data.decode_random([5], flow.int32, 1000,
                                       initializer=flow.random_uniform_initializer(0, 10, dtype=flow.int32))
        return u, zeros, ints

    u, zeros, ints = job()
    assert u.shape == (2000, 3, 4) and u.dtype == np.float32
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01  # OneFlow's default: U[0, 1)
    assert zeros.shape == (8,) and zeros.dtype == np.int32 and not zeros.any()
    assert ints.dtype == np.int32 and ints.min() == 0 and ints.max() == 9
    u2, _, ints2 = job()
    assert (u2 != u).mean() > 0.99 and (ints2 != ints).any()  # every call draws again


def test_decode_random_normal_initializers():
    flow.clear_default_session()

    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy]:
        n = flow.data.decode_random((4,), flow.float, 20000,
                                    initializer=flow.random_normal_initializer(mean=1.0, stddev=2.0))
        t = flow.data.decode_random((4,), flow.float64, 20000,
                                    initializer=flow.truncated_normal_initializer(stddev=1.0))
        return n, t

    n, t = job()
    assert abs(n.mean() - 1.0) < 0.05 and abs(n.std() - 2.0) < 0.05
    assert t.dtype == np.float64 and np.abs(t).max() <= 2.0
    assert abs(t.std() - 0.8796) < 0.02  # the standard normal truncated at +-2


def test_decode_random_rejects_bad_arguments():
    flow.clear_default_session()
    with pytest.raises(ValueError, match=r"data\.decode_random: batch_size must be an int >= 1, got 0"):
        @flow.global_function()
        def bad() -> tp.Numpy:
            return flow.data.decode_random((2,), flow.float, batch_size=0)
        bad()
    flow.clear_default_session()
    with pytest.raises(TypeError, match=r"data\.decode_random: shape must be a list or tuple of ints"):
        @flow.global_function()
        def bad2() -> tp.Numpy:
            return flow.data.decode_random(3, flow.float, batch_size=2)
        bad2()


def test_sigmoid_cross_entropy_takes_integer_labels():
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 1)), y: tp.Numpy.Placeholder((4, 1), dtype=flow.int32)) -> tp.Numpy:
        return flow.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=x)

    x = np.array([[-2.0], [0.5], [3.0], [0.0]], np.float32)
    y = np.array([[0], [1], [1], [0]], np.int32)
    want = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
    np.testing.assert_allclose(job(x, y), want, rtol=1e-6)


def test_a_synthetic_resnet_block_trains_on_decode_random():
    """What OneFlow's CNN programs do with --use synthetic data: images and
    labels from decode_random inside the train job, a residual block with
    batch normalization, SGD with momentum."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def train() -> tp.Numpy:
        labels = flow.data.decode_random((), flow.int32, 8, initializer=flow.zeros_initializer(flow.int32))
        images = flow.data.decode_random((3, 8, 8), flow.float, 8)
        h = flow.layers.conv2d(images, 4, 3, padding="SAME", name="c1")
        h = flow.layers.batch_normalization(h, axis=1, training=True, name="bn1")
        h = flow.nn.relu(h + flow.layers.conv2d(images, 4, 1, name="proj"))
        logits = flow.layers.dense(flow.reshape(h, [8, -1]), 5, name="fc")
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.05]), momentum=0.9).minimize(loss)
        return loss

    losses = [float(train().item()) for _ in range(30)]
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0]


def test_gather_with_axis_equal_to_batch_dims_is_oneflows_batch_gather():
    """BERT's _GatherIndexes: gather(seq (B, S, H), positions (B, P), axis=2,
    batch_dims=2) is OneFlow's batch_gather: out[b, p] = seq[b, positions[b, p]]."""
    flow.clear_default_session()

    @flow.global_function()
    def job(seq: tp.Numpy.Placeholder((2, 5, 3)), pos: tp.Numpy.Placeholder((2, 4), dtype=flow.int32)) -> tp.Numpy:
        return flow.gather(params=seq, indices=pos, axis=2, batch_dims=2)

    seq = np.arange(30, dtype=np.float32).reshape(2, 5, 3)
    pos = np.array([[0, 4, 1, 1], [3, 2, 0, 4]], np.int32)
    got = job(seq, pos)
    assert got.shape == (2, 4, 3)
    np.testing.assert_array_equal(got, np.stack([seq[b, pos[b]] for b in range(2)]))


def test_sparse_cross_entropy_takes_n_by_1_labels():
    flow.clear_default_session()

    @flow.global_function()
    def job(y: tp.Numpy.Placeholder((3, 1), dtype=flow.int32), x: tp.Numpy.Placeholder((3, 2))) -> tp.Numpy:
        return flow.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)

    x = np.array([[0, 1], [2, 0], [0, 0]], np.float32)
    y = np.array([[1], [0], [1]], np.int32)
    want = -np.log(np.exp(x[np.arange(3), y[:, 0]]) / np.exp(x).sum(1))
    got = job(y, x)
    assert got.shape == (3,)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_attention_scores_with_a_broadcast_mask_compile_and_match_numpy():
    """A (B, H, S, S) batched matmul whose epilogue adds a (B, 1, 1, S) mask:
    the mask's batch strides (S, 0) do not collapse into one batch dim, so
    fusion keeps the matmul out of the epilogue's kernel instead of refusing
    the job (BERT's attention)."""
    flow.clear_default_session()
    B, H, S, D = 2, 3, 5, 4

    @flow.global_function()
    def job(q: tp.Numpy.Placeholder((B, H, S, D)), k: tp.Numpy.Placeholder((B, H, S, D)),
            mask: tp.Numpy.Placeholder((B, 1, 1, S))) -> tp.Numpy:
        scores = flow.matmul(q, k, transpose_b=True) * 0.5 + mask
        return flow.nn.softmax(scores)

    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(2, B, H, S, D)).astype(np.float32)
    mask = np.where(rng.random((B, 1, 1, S)) < 0.3, -1e4, 0).astype(np.float32)
    s = q @ k.transpose(0, 1, 3, 2) * 0.5 + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(job(q, k, mask), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_oneflow_op_conf_enums_import_from_their_oneflow_path():
    import flowjit.core.operator.op_conf_pb2 as op_conf_util
    assert (op_conf_util.kNone, op_conf_util.kTanH, op_conf_util.kSigmoid, op_conf_util.kRelu) == (0, 1, 2, 3)
