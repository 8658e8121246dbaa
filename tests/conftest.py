"""Shared fixtures: the real embedded generator, loaded once per test session."""

import os

import pytest

from sbon.models import load_generator, load_reward


@pytest.fixture(scope="session")
def gen():
    # SBON_TEST_DEVICE=cuda runs the suite on a GPU (in bfloat16); CI and the default are the CPU.
    return load_generator("smollm2-135m", device=os.environ.get("SBON_TEST_DEVICE", "cpu"))


@pytest.fixture(scope="session")
def likelihood(gen):
    return load_reward("likelihood", generator=gen)


