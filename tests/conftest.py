"""Shared fixtures: the real embedded generator, loaded once per test session."""

import os

import pytest
import torch

from sbon.models import load_generator, load_reward

# Modules that start the app, a browser, Ray or a benchmark's command line: `python -m pytest -m "not slow"`
# leaves them out for a quick run between edits; `python -m pytest` runs everything.
SLOW_MODULES = {"test_app_e2e.py", "test_benchmarks_smoke.py", "test_reliability.py", "test_distributed.py",
                "test_gpu_ready.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def gen():
    # SBON_TEST_DEVICE=cuda runs the suite on a GPU; float32 everywhere, since the coupling tests
    # compare texts token for token and bfloat16's batch-dependent rounding can flip a rare token.
    return load_generator("smollm2-135m", device=os.environ.get("SBON_TEST_DEVICE", "cpu"), dtype=torch.float32)


@pytest.fixture(scope="session")
def likelihood(gen):
    return load_reward("likelihood", generator=gen)




COMPARISON_PROMPT = "Give three tips for staying healthy."


@pytest.fixture(scope="session")
def comparison_events(gen, likelihood):
    """Every event of one real small comparison (N=6, 24 tokens, two decision points), for the
    app's tests: the budget holds 6 candidates of prompt + 8 tokens and alpha=0.2 prunes one per round."""
    from sbon.analysis.comparison import comparison_events as events

    prompt_tokens = len(gen.encode_prompt(COMPARISON_PROMPT))
    return list(events(gen, likelihood, COMPARISON_PROMPT, 6, alpha=0.2, kv_budget=6 * (prompt_tokens + 8),
                       max_new_tokens=24, seed=1, taus=[4, 8, 16]))


@pytest.fixture(scope="session")
def comparison(comparison_events):
    return comparison_events[-1].comparison
