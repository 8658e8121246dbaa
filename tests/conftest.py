"""Shared fixtures: the real embedded generator, loaded once per test session."""

import functools
import os

import pytest
import torch

from sbon.models import load_generator, load_reward

GENERATOR = "smollm2-135m"  # the embedded generator every fixture loads

# Modules that start the app, a browser, Ray or a benchmark's command line: `python -m pytest -m "not slow"`
# leaves them out for a quick run between edits; `python -m pytest` runs everything.
SLOW_MODULES = {"test_app_e2e.py", "test_benchmarks_smoke.py", "test_reliability.py", "test_distributed.py",
                "test_gpu_ready.py"}
# The groups of tests that take longest, longest first (`--durations=0` shows them): pytest-xdist hands out the
# groups in the order of the collection (pyproject's --no-loadscope-reorder), so these start first and the many
# short files fill in around them. Otherwise a long group handed out last runs on alone at the end, on one thread,
# with the other core idle meanwhile. Groups not named here follow in the collection's order.
APP_SERVER = "app-server"  # the group of the tests that drive the app server or the browser
LONGEST_FIRST = (APP_SERVER, "test_step_formats.py", "test_algorithms.py", "test_machine.py",
                 "test_benchmarks_smoke.py", "test_gpu_check.py", "test_headline.py", "test_app_decode.py",
                 "test_signals.py", "test_cuda_graphs.py", "test_gpu_ready.py", "test_app_handlers.py",
                 "test_inputs.py", "test_components.py")


def group_rank(group: str) -> int:
    """Where a group's tests go in the suite's order: LONGEST_FIRST's, then every other group."""
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


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
        item.add_marker(pytest.mark.xdist_group(APP_SERVER if shared else item.path.name))
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:  # one process runs them in the order written
        items.sort(key=lambda item: group_rank(item.get_closest_marker("xdist_group").args[0]))


@pytest.fixture(autouse=True)
def keeps_the_thread_count():
    """Give torch's thread count back after each test: the command line run in this process (tests/test_inputs.py)
    sets its own. Otherwise every later test of the process would compute on that count (each process with a thread
    per core, beside the other), and a session fixture made then would differ from the same run made on the
    process's own count (the generator's likelihood in bfloat16 gives other bits on another count)."""
    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def server(tmp_path_factory, request):
    """`python app.py` on a free port, shared by every browser and API test (its log and pid on the URL). Its runs
    decode in the app's measured choice of weight format; where nothing is measured yet, in the suite generator's
    (``gen``, loaded only then), not in float32, the app's safe path there, which reads more bytes per step."""
    from benchmarks.browser import serve_app
    from sbon.errors import SBoNError
    from sbon.machine import auto_path

    env = {}
    if not auto_path(GENERATOR).measured and (weights := request.getfixturevalue("gen").weights) != "fp32":
        env["SBON_WEIGHTS"] = weights
    try:  # a fresh machine's first start converts the packaged generator once: minutes on two cores
        with serve_app(tmp_path_factory.mktemp("app") / "app.log", start_timeout_s=600, env=env) as url:
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


@pytest.fixture(scope="session")
def windows(browser):
    """The browser tests' windows, kept between tests: a test opens the app's page in one by navigating it
    (benchmarks.browser.Windows), seconds cheaper than a new browser context."""
    from benchmarks.browser import Windows

    return Windows(browser)


@pytest.fixture
def unmeasured_machine(gen_fp32, machine_without_choice):
    """A machine on which nothing is measured and no compiled step was ever saved (``machine_without_choice``), whose
    cache holds the generator's float32 copy (made by ``gen_fp32`` before the cache's entries are linked)."""
    return machine_without_choice


@pytest.fixture
def machine_without_choice(monkeypatch, tmp_path):
    """Its own $SBON_CACHE holding the models' copies (links to this machine's), without a saved choice or inductor's
    caches, and no forced path: what this machine measured (a provisional choice it measures again, a compiled step)
    leaves the test alone. What a machine converts and builds once whatever it measures (int4 blocks, C++ kernels) is
    this machine's, linked even before it exists: a fresh machine pays for it once, not in every test (both are
    written whole, then renamed)."""
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


@functools.cache
def _generator(weights: str):
    return load_generator(GENERATOR, device=os.environ.get("SBON_TEST_DEVICE", "cpu"), weights=weights)


@pytest.fixture(scope="session")
def gen():
    """The embedded generator in a fast format exact here: bfloat16 where this CPU computes it natively and its step
    gives a row the same bits alone and in a batch on one thread (measured here: what the coupling tests compare
    token for token); on a CPU without bfloat16, int4-fma where its kernel runs and that holds; else float32,
    exact on one thread on any CPU without measuring. The suite's processes spend most of their time in the model's
    matrix products: bfloat16 reads half float32's bytes, int4-fma an eighth, in float32 arithmetic.
    SBON_TEST_WEIGHTS names a format instead; SBON_TEST_DEVICE=cuda runs the suite on a GPU, in float32 (a GPU's
    bfloat16 rounds a row differently within a batch)."""
    from sbon.int4 import KERNELS
    from sbon.machine import cpu_isa
    from sbon.probe import exact_on

    if os.environ.get("SBON_TEST_WEIGHTS"):
        return _generator(os.environ["SBON_TEST_WEIGHTS"])
    if os.environ.get("SBON_TEST_DEVICE", "cpu") == "cpu":
        if cpu_isa().endswith("with BF16") and exact_on(_generator("bf16"), 1):
            return _generator("bf16")
        if not KERNELS["fma"].problem() and exact_on(_generator("int4-fma"), 1):
            return _generator("int4-fma")
    return _generator("fp32")


@pytest.fixture(scope="session")
def gen_fp32():
    """The embedded generator in float32: for tests that hold a run to 1e-4 of a full recomputation or of a batch of
    other rows (prefill and reward scoring; bfloat16's rounding there depends on the batch), or compare the formats
    with the float32 copy. A module asks for it by overriding ``gen`` (and ``likelihood``) with it."""
    return _generator("fp32")


@pytest.fixture(scope="session")
def likelihood(gen):
    return load_reward("likelihood", generator=gen)


@pytest.fixture(scope="session")
def likelihood_fp32(gen_fp32):
    return load_reward("likelihood", generator=gen_fp32)


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
