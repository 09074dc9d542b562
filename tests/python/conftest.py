"""Shared fixtures: every test starts with an empty session."""
import os
import shutil
import tempfile

import numpy as np
import pytest

import flowjit as flow

# The disk kernel cache of the whole test run lives in a temporary directory,
# never in the user's ~/.cache (compile_job reads FLOWJIT_CACHE_DIR on every
# compile; subprocesses inherit it). Tests of the cache itself use their own.
_CACHE_DIR = tempfile.mkdtemp(prefix="flowjit-test-cache-")
os.environ["FLOWJIT_CACHE_DIR"] = _CACHE_DIR


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_session():
    flow.clear_default_session()
    yield
    flow.sync_default_session()
    flow.clear_default_session()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
