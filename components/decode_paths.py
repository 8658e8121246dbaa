"""How the app's runs decode (`SBON_DECODE`): `app_decode` reads and checks the setting; `DecodePaths` measures
each generator's decode paths in a child process on cores the app leaves idle (`python -m sbon machine --build`),
loads the chosen compiled step once it is saved, and says so in the model line. The models' cache
(components/model_cache.py) asks it for each run's path."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from sbon.cuda_graphs import plan
from sbon.decoders import check_decode, compile_problem, compiled_state, graphs, prepare
from sbon.engine import Generator
from sbon.errors import SBoNError
from sbon.machine import Choice, cached_choice, decode_threads, eligible, safe_path, title
from sbon.models import DEFAULT_GENERATOR, default_device, generator_title
from sbon.zerogpu import on_zerogpu

from .torch_thread import TORCH_THREAD

log = logging.getLogger(__name__)


def gpu_graphs(gen: Generator) -> list[tuple[int, int]]:
    """The CUDA graphs (rows, slab length) a GPU captures at model load: those a page-default run replays."""
    from .controls import DEFAULTS
    return plan(DEFAULTS.n, len(gen.encode_prompt(DEFAULTS.prompt)), DEFAULTS.max_new_tokens)


def app_decode() -> str:
    """How the app's runs decode, SBON_DECODE: ``auto`` (the default) on the path measured fastest on this machine
    (exact, on a CPU: sbon.machine) once measured, its compiled step once built, on the path that is exact without
    measuring until then; ``eager`` or ``compiled`` for every run (``compiled`` compiles in the first run that needs
    it, where it is not saved yet)."""
    asked = os.environ.get("SBON_DECODE") or "auto"
    check_decode(asked)
    return asked


def check_forced_paths(generator: str = DEFAULT_GENERATOR) -> None:
    """At start: a mistyped SBON_DECODE, or a path SBON_WEIGHTS/SBON_DECODE forces that was measured not to run on
    this machine, stops the app in one line naming the paths that can (sbon.probe.check_forced)."""
    from sbon.probe import check_forced
    try:
        app_decode()
    except SBoNError as e:
        raise SBoNError(f"SBON_DECODE: {e}") from None
    check_forced(generator, default_device())


class DecodePaths:
    """``auto``'s decode path per generator, chosen by measurement (sbon.probe) once per machine by a child process:
    it times every path this machine can run (seconds each), chooses the fastest exact one and saves the choice, then
    builds that format's compiled step if it is not saved yet (minutes) and measures it too. Meanwhile runs take the
    path that is safe now (sbon.machine.safe_path), then the chosen one: the model cache loads the generator in the
    chosen format at the start of the next run (``ModelCache.get``). Each run records the path it decoded with
    (RunResult.decode). On a GPU the compiled step is CUDA graphs, captured in this process at model load (seconds).

    A child, not this process: measuring loads every weight format, and building a compiled step takes a minute or
    more on two cores; here it would hold TORCH_THREAD, so that no run could start meanwhile. The child runs only on
    cores the app leaves idle (Linux's SCHED_IDLE; else the lowest priority) and ends with the app."""

    def __init__(self) -> None:
        self._children: dict[str, subprocess.Popen] = {}
        self._started: dict[str, float] = {}
        self._failed: dict[str, str] = {}  # generator -> why its runs stay on the safe path
        self._gpu_ready: set[str] = set()

    def choice(self, name: str) -> Choice | None:
        """This machine's measured choice for the generator (at the thread count it was measured at)."""
        device = default_device()
        return cached_choice(name, device, decode_threads() if device.type == "cpu" else None)

    def wanted(self, name: str) -> tuple[str, int] | None:
        """The weight format and CPU threads the generator loads with, where this machine's choice names them and
        SBON_WEIGHTS forces none (None: as loading decides)."""
        if os.environ.get("SBON_WEIGHTS") or app_decode() != "auto":
            return None
        choice = self.choice(name)
        return (choice.weights, choice.fingerprint["threads"]) if choice and choice.weights else None

    def _measure(self, name: str) -> None:
        """Start the child that measures (and builds) where this machine has no choice yet, or where its choice
        waits for the compiled step of its fastest exact format; once per process."""
        if name in self._children or on_zerogpu():
            return
        choice = self.choice(name)
        if choice is not None and not _build_pending(choice):
            return
        self._children[name], self._started[name] = _measure_in_child(name), time.perf_counter()

    def decode(self, name: str, gen: Generator) -> str:
        """The decode path of a run of ``gen`` (the preset ``name``) that starts now. Called on TORCH_THREAD: it may
        load the saved step (seconds)."""
        asked = app_decode()
        if asked != "auto":
            return asked
        if gen.device.type == "cuda":
            return self._gpu_decode(name, gen)
        self._measure(name)
        choice = self.choice(name)
        if name in self._failed or choice is None or (choice.weights, choice.decode) != (gen.weights, "compiled"):
            return "eager"
        state = compiled_state(gen)
        if state == "loaded":
            return "compiled"
        if state == "saved":
            if prepare(gen):
                return "compiled"
            self._failed[name] = "its compiled decode step did not load (the app's log says why)"
        return "eager"

    def _gpu_decode(self, name: str, gen: Generator) -> str:
        """On a GPU: CUDA graphs from the first run on (sbon.cuda_graphs). The page-default run's graphs are
        captured at model load, one graph per task on TORCH_THREAD, so that a run asked for meanwhile goes between
        two captures; a run captures any other graph it needs where it first needs it (well under a second each).
        Eagerly where the step cannot be captured (the page says why), and on ZeroGPU (untried there)."""
        if on_zerogpu() or name in self._failed or compile_problem(gen) is not None:
            return "eager"
        if graphs(gen).failed:
            self._failed[name] = f"its CUDA graphs could not be captured ({graphs(gen).failed})"
            return "eager"
        if name not in self._started:
            self._started[name] = time.perf_counter()
            TORCH_THREAD.submit(self._build_gpu, name, gen, gpu_graphs(gen))
        return "compiled"

    def _build_gpu(self, name: str, gen: Generator, todo: list[tuple[int, int]]) -> None:
        """Capture the first graph of ``todo``, then queue the rest behind whatever was asked for meanwhile."""
        dec = graphs(gen)
        try:
            rows, length = todo[0]
            dec.capture_ahead(rows, length, gen.prefill(gen.encode_prompt("Hi")))
            gen.synchronize()
        except Exception as e:  # noqa: BLE001 - runs capture on demand, or stay eager, and the page says why
            log.warning("the CUDA graphs of %s were not captured: %s: %s", name, type(e).__name__, e)
            self._failed[name] = f"its CUDA graphs could not be captured ({type(e).__name__})"
            return
        if dec.failed:
            self._failed[name] = f"its CUDA graphs could not be captured ({dec.failed})"
        elif todo[1:]:
            TORCH_THREAD.submit(self._build_gpu, name, gen, todo[1:])
        else:
            self._gpu_ready.add(name)
            log.info("the CUDA graphs of %s are captured (%.1f s after its load; %.1f s capturing)", name,
                     time.perf_counter() - self._started[name], dec.capture_s)

    def status(self, name: str) -> str:
        """One line for the page about this generator's decode path ('' where it has nothing to say)."""
        if name in self._failed:
            return f"{generator_title(name)} runs on the plain (slower) path: {self._failed[name]}."
        child = self._children.get(name)
        running = child is not None and child.poll() is None
        choice = self.choice(name)
        if running:
            weights, decode = (choice.weights, choice.decode) if choice and choice.weights else \
                safe_path(default_device())
            doing = ("building the compiled step of the fastest exact path" if choice else
                     "measuring every decode path of this machine")
            return (f"⚙ {generator_title(name)}: {doing} in the background, once on this machine (for "
                    f"{time.perf_counter() - self._started[name]:.0f} s; runs go first): meanwhile runs use "
                    f"{title(weights, decode, str(default_device()))}"
                    + ("" if choice else ", exact without measuring") + ".")
        if child is not None and child.returncode and choice is None:
            return (f"{generator_title(name)} decodes op by op with float32 weights: measuring this machine's decode paths failed "
                    f"(exit status {child.returncode}; the app's log says why).")
        if name in self._gpu_ready:
            return f"{generator_title(name)} decodes with CUDA graphs."
        if name in self._started and default_device().type == "cuda":
            return f"⚙ {generator_title(name)}: capturing its CUDA graphs (seconds)."
        if choice is not None:
            return f"{generator_title(name)} decodes with {choice.words}." if choice.weights else f"{generator_title(name)}: {choice.words}."
        return ""


def _build_pending(choice: Choice) -> bool:
    """The choice waits for the compiled step of its fastest exact eager format (sbon.probe's ``build``)."""
    exact = sorted((p for p in choice.paths if p.decode == "eager" and eligible(p, choice.device)),
                   key=lambda p: p.per_step())
    return bool(exact) and f"{exact[0].weights} compiled" in choice.pending


def _measure_in_child(name: str) -> subprocess.Popen:
    """A child process that measures the generator's decode paths and builds the chosen format's compiled step
    (``python -m sbon machine --build``) on idle cores, ending with this process (its lines go to this process's
    stderr)."""
    code = ("import ctypes, os, signal, sys\n"
            "try:\n"
            "    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: it ends with the app\n"
            "except (AttributeError, OSError):\n"
            "    pass\n"
            "try:  # it runs only on cores the app leaves idle: a run's threads wait on each other behind any other\n"
            "    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "except (AttributeError, OSError):\n"
            "    os.nice(19)\n"
            "from sbon.cli import main\n"
            f"sys.exit(main(['machine', '--build', '--generator', {name!r}, '--device', 'cpu']))\n")
    log.info("measuring %s's decode paths in a child process (runs use the safe path until it has chosen)", name)
    return subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                            stdout=subprocess.DEVNULL)
