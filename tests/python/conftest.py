"""Shared fixtures: every test starts with an empty session."""
import numpy as np
import pytest

import flowjit as flow


@pytest.fixture(autouse=True)
def fresh_session():
    flow.clear_default_session()
    yield
    flow.sync_default_session()
    flow.clear_default_session()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
