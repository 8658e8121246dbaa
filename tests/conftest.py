"""Shared fixtures: the real embedded generator, loaded once per test session."""

import os

import pytest
import torch

from sbon.models import load_generator, load_reward

# Modules that start the app, a browser, Ray or a benchmark's command line: `python -m pytest -m "not slow"`
# leaves them out for a quick run between edits; `python -m pytest` runs everything.
SLOW_MODULES = {"test_app_e2e.py", "test_benchmarks_smoke.py", "test_reliability.py", "test_distributed.py",
                "test_gpu_ready.py"}


def pytest_configure(config):
    # pytest-xdist's processes (pyproject's addopts) share the cores: torch's threads of one process wait on each
    # other at every operation when another process holds a core, so each takes its share of the cores, and so do
    # the app servers and command lines the tests start (torch reads OMP_NUM_THREADS).
    # The app decodes eagerly in the tests (and in the servers they start): its default, the compiled step once
    # built, would start a minute-long build in a child process beside them (tests/test_app_decode.py checks it).
    os.environ.setdefault("SBON_DECODE", "eager")
    # The test processes, the app servers and a browser share the cores: an OpenMP thread that spins while it waits
    # for a core another process holds makes each parallel region many times slower; passive waiting yields the core.
    # OpenMP reads this once, when a process loads it: set here, before pytest-xdist starts its processes and the
    # tests start theirs (this process's own torch is loaded already, and computes nothing).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        # pytest-xdist (`--dist loadgroup` in pyproject): a file's tests run in one process, so its module fixtures
        # are made once, and every test that drives the app server or the browser runs in the same one, so one
        # server and one browser start (Playwright's sync API allows one browser driver per process).
        shared = {"server", "browser"} & set(item.fixturenames)
        item.add_marker(pytest.mark.xdist_group("app-server" if shared else item.path.name))


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """`python app.py` on a free port, shared by every browser and API test (its log and pid on the URL)."""
    from benchmarks.browser import serve_app
    from sbon.errors import SBoNError

    try:  # a fresh machine's first start converts the packaged generator once: minutes on two cores
        with serve_app(tmp_path_factory.mktemp("app") / "app.log", start_timeout_s=600) as url:
            yield url
    except SBoNError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def browser():
    """Headless chromium through Playwright; the browser tests skip only when one of them is missing."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -r requirements-dev.txt)")
    from benchmarks.browser import CHROMIUM, chromium

    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed (apt-get update && apt-get install -y chromium)")
    with chromium() as b:
        yield b


@pytest.fixture
def unmeasured_machine(monkeypatch, tmp_path, gen):
    """A machine on which nothing is measured and no compiled step was ever saved: its own $SBON_CACHE holding the
    models' copies (links to this machine's), without a saved choice or inductor's caches; no forced path. What a
    machine converts and builds once whatever it measures (the generator's float32 copy, made by ``gen``; int4
    blocks; C++ kernels) is this machine's, linked even before it exists: a fresh machine pays for it once, not in
    every test (both are written whole, then renamed)."""
    from sbon.cache import cache_dir
    for shared in ("int4-blocks", "kernels"):
        (cache_dir() / shared).mkdir(parents=True, exist_ok=True)
    for entry in cache_dir().iterdir():
        if entry.name not in ("machine", "inductor"):
            (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.setenv("SBON_CACHE", str(tmp_path))
    for name in ("SBON_WEIGHTS", "SBON_DECODE", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


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
