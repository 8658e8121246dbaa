"""How the app's runs decode (SBON_DECODE, components.model_cache.CompiledSteps): by default with the compiled step
once a child process has built it on this machine, eagerly until then; a run records the path it took.

The test suite itself runs the app eagerly (tests/conftest.py sets SBON_DECODE): the default would start a
minute-long build beside the tests. The last test here builds the step for real and is in `-m compile`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.model_cache import CompiledSteps, app_decode
from sbon.decoders import compiled_state
from sbon.errors import SBoNError
from sbon.models import cache_dir, load_generator

ROOT = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def gen_int4():
    return load_generator(NAME, device="cpu", weights="int4")


@pytest.fixture
def empty_step_cache(monkeypatch, tmp_path):
    """A machine with the models' cache but no compiled step ever saved: $SBON_CACHE a new folder holding the
    models' copies (links to this machine's), without inductor's caches, which go to their default place in it."""
    for entry in cache_dir().iterdir():
        if entry.name != "inductor":
            (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.setenv("SBON_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("SBON_DECODE", "auto")
    return tmp_path


def test_sbon_decode_forces_a_path_and_a_mistyped_one_stops_the_app_in_one_line(monkeypatch, gen_int4):
    steps = CompiledSteps()
    monkeypatch.setenv("SBON_DECODE", "eager")
    assert steps.decode(NAME, gen_int4) == "eager" and not steps._children
    monkeypatch.setenv("SBON_DECODE", "fast")
    with pytest.raises(SBoNError, match="unknown decode 'fast'"):
        app_decode()
    done = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env={**os.environ, "SBON_DECODE": "fast"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "SBON_DECODE: unknown decode 'fast': use one of auto, eager, compiled"]


def test_auto_decodes_eagerly_where_compiling_would_not_keep_the_coupling_exact(gen, empty_step_cache):
    steps = CompiledSteps()  # gen: the float32 generator, whose compiled step is not batch-invariant
    assert steps.decode(NAME, gen) == "eager" and not steps._children and steps.status(NAME) == ""


def test_auto_starts_one_build_on_idle_cores_and_decodes_eagerly_meanwhile(gen_int4, empty_step_cache):
    steps = CompiledSteps()
    try:
        assert steps.decode(NAME, gen_int4) == "eager"
        child = steps._children[NAME]
        assert steps.decode(NAME, gen_int4) == "eager" and steps._children[NAME] is child  # one build, not two
        assert _idle_soon(child)  # a run on the same cores goes first
        assert steps.status(NAME).startswith("⚙ Preparing a faster path for ")
    finally:
        steps._children[NAME].kill()
        steps._children[NAME].wait()
    # A build that ended without saving the step: runs stay eager and the page says why, once, without retrying.
    assert steps.decode(NAME, gen_int4) == "eager" and steps._children[NAME] is child
    assert "could not be built here" in steps.status(NAME) and compiled_state(gen_int4) is None


def _idle_soon(child: subprocess.Popen) -> bool:
    """The child runs only on idle cores (or at a lower priority than this process) once its first lines ran."""
    for _ in range(100):
        if os.sched_getscheduler(child.pid) == os.SCHED_IDLE or \
                os.getpriority(os.PRIO_PROCESS, child.pid) > os.getpriority(os.PRIO_PROCESS, 0):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.compile
def test_once_the_child_has_built_the_step_runs_decode_compiled_and_record_it(gen_int4, empty_step_cache):
    from sbon.algorithms import RunConfig, events, run
    from sbon.rewards import CallableReward

    steps = CompiledSteps()
    assert steps.decode(NAME, gen_int4) == "eager"
    assert steps._children[NAME].wait(timeout=900) == 0, "the child could not build the step"
    assert compiled_state(gen_int4) == "saved" and steps.status(NAME) == ""
    assert steps.decode(NAME, gen_int4) == "compiled" and compiled_state(gen_int4) == "loaded"
    config = RunConfig(method="bon", n=3, max_new_tokens=6, decode=steps.decode(NAME, gen_int4))
    result = run(events(gen_int4, CallableReward(lambda prompt, responses: [0.0] * len(responses)), "Hi", config))
    assert result.decode == "compiled"
