"""Very deep graphs (issue [fuzz]): a chain of 10,000 elementwise ops compiled
as one kernel overflowed the stack in the kernel emitter's recursion and, once
that recursed no more, took LLVM over 10 minutes as one function. The emitter
now evaluates operands bottom-up with its own stack, and fusion cuts a chain
into kernels of at most a few hundred ops."""
import numpy as np

import flowjit as flow
import flowjit.typing as tp


def _chain(n):
    @flow.global_function(type="predict")
    def deep_chain(x: tp.Numpy.Placeholder((8,))) -> tp.Numpy:
        for i in range(n):
            x = x * 1.0001 + 0.0001 if i % 2 else flow.math.tanh(x)
        return x
    return deep_chain


def _reference(x, n):
    x = x.astype(np.float64)
    for i in range(n):
        x = x * 1.0001 + 0.0001 if i % 2 else np.tanh(x)
    return x


def test_a_chain_of_10000_ops_compiles_in_bounded_kernels_and_matches_numpy():
    job = _chain(10000)
    x = np.linspace(-2, 2, 8).astype(np.float32)
    np.testing.assert_allclose(job(x), _reference(x, 10000), rtol=1e-4, atol=1e-5)
    compiled = job.compiled_jobs()[0]
    # 10,000 ops (5,000 tanh and 5,000 fused multiply-adds) in several kernels, none unbounded.
    assert 10 <= compiled._job.num_kernels <= 100, compiled._job.num_kernels


def test_a_short_chain_is_still_one_kernel():
    job = _chain(40)
    x = np.linspace(-2, 2, 8).astype(np.float32)
    np.testing.assert_allclose(job(x), _reference(x, 40), rtol=1e-5, atol=1e-6)
    assert job.compiled_jobs()[0]._job.num_kernels == 1
