"""Shared fixtures: the real embedded generator, loaded once per test session."""

import pytest
import torch

from sbon.models import load_generator, load_reward

torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture(scope="session")
def gen():
    return load_generator("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def likelihood(gen):
    return load_reward("likelihood", generator=gen)


