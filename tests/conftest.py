"""Shared fixtures: the real embedded generator, loaded once per test session."""

import os

import pytest
import torch

from sbon.models import load_generator, load_reward


@pytest.fixture(scope="session")
def gen():
    # SBON_TEST_DEVICE=cuda runs the suite on a GPU; float32 everywhere, since the coupling tests
    # compare texts token for token and bfloat16's batch-dependent rounding can flip a rare token.
    return load_generator("smollm2-135m", device=os.environ.get("SBON_TEST_DEVICE", "cpu"), dtype=torch.float32)


@pytest.fixture(scope="session")
def likelihood(gen):
    return load_reward("likelihood", generator=gen)


