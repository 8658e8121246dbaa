"""How the app's runs decode (`SBON_DECODE`): `app_decode` reads and checks the setting; `DecodePaths` has each
generator's decode paths measured by a child process (`python -m sbon machine --build`), loads the chosen compiled
step once it is saved, keeps the child from timing while a run generates (`RunGate`), measures again where the
choice is provisional or later runs contradict it, and says so in the model line. The path itself is
sbon.machine.auto_path's, the one rule; the models' cache (components/model_cache.py) asks `DecodePaths` for it."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from sbon.cache import cache_dir
from sbon.cuda_graphs import Faster, GraphDecoder, plan
from sbon.decoders import check_decode, compile_problem, compiled_state, graphs, prepare
from sbon.engine import Generator
from sbon.errors import SBoNError, one_line
from sbon.machine import AutoPath, Choice, auto_path, choice_path, decode_threads, on_threads, title
from sbon.machine_load import RunGate, busy
from sbon.probe import MEASURING, ThreadWatch, child_argv, threads_for_run, wants_one_thread_step, watch_for_run
from sbon.models import DEFAULT_GENERATOR, default_device, generator_title
from sbon.results import RunResult
from sbon.zerogpu import on_zerogpu

from .torch_thread import TORCH_THREAD

log = logging.getLogger(__name__)
# The most a run waits for the measuring child where the runs before it left the child no gap (DecodePaths.share):
# enough for a few of its timings or a weight format's load, little beside a run on the safe path.
SHARE_S = 10.0


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


# After a child that ended with a provisional choice (timed beside other work), the next one starts this long after
# that child's start, twice as long after each such try. Counted from the start: a child that waited minutes for
# stalled cores (sbon.probe.TeamWait) costs little while it waits, asleep, and the next one that follows it at once
# notices freed cores within seconds; the growing waits leave a neighbour that stays a child now and then.
RETRY_S = 120.0
# A run on a quiet machine whose steps took this many times the slowest step measured for its path has the choice
# measured again (something on the machine changed since, or the measurement was wrong).
CONTRADICTED = 2.0


class DecodePaths:
    """``auto``'s decode path per generator (sbon.machine.auto_path), measured by a child process once per machine:
    it loads every weight format (saving the fastest eager step timed so far after each, where nothing is chosen yet),
    times their eager steps in rounds and saves a provisional choice (seconds), builds
    the compiled steps predicted fastest on idle cores (a minute or more each, saved to disk), times
    them beside the eager ones and saves the choice after each (sbon.probe). Runs take the saved choice at their
    start (the model cache loads the generator in its format; ``decode`` loads its compiled step once saved), the
    safe path until there is one. Each run records the path it decoded with (RunResult.decode). On a GPU the compiled
    step is CUDA graphs, captured in this process at model load (seconds); inductor's step under them is then built
    on a thread of its own (a minute or so) and adopted at a run's start where it was measured faster.

    A child, not this process: measuring loads every weight format and times them; here it would hold TORCH_THREAD,
    so that no run could start meanwhile. It times at this process's priority, since a timing beside other work would
    measure that work (its imports and loads run on cores nothing else wants: ``_measure_in_child``), but times
    nothing while a run generates here: runs hold ``generating()``, which the child reads
    through a file (sbon.machine_load.RunGate); where runs come back to back, one waits a few seconds for it between
    them (``share``). It ends with the app. A choice the child could only time beside other
    work is provisional: runs take it, and a child measures again RETRY_S after the last one's start, then twice as long
    after each try, started between runs (at a run's end, and when the page's model line asks), never beside one; a
    later start measures again too."""

    def __init__(self, inductor: bool | None = None) -> None:
        """``inductor``: build inductor's step under the CUDA graphs in the background (``_build_faster``; default:
        where the graphs are CUDA's, not the step run eagerly at each replay as off CUDA)."""
        self.inductor = inductor
        self._children: dict[str, subprocess.Popen] = {}
        self._started: dict[str, float] = {}
        self._tries: dict[str, int] = {}  # children started per generator
        self._failed: dict[str, str] = {}  # generator -> why its runs stay on the safe path
        self._stale: set[str] = set()  # generators whose choice a quiet run contradicted, or whose chosen step is gone
        self._gone: set[str] = set()  # generators whose chosen compiled step was found missing (once per process)
        self._one_thread: set[str] = set()  # generators whose child builds only the step for one thread
        self._said: set[str] = set()  # generators whose failed child was logged
        self._gpu_ready: set[str] = set()
        self._asked: set[str] = set()  # generators a run asked auto's path of on a CPU: measured between runs
        self._faster: dict[str, FasterBuild] = {}  # generator -> its build of inductor's step under its graphs
        self._lock = threading.Lock()  # runs start children; so does the model line's timer
        self.gate = RunGate.of_this_process(cache_dir() / "machine")

    def path(self, name: str) -> AutoPath:
        """``auto``'s path for a run of the generator starting now, at the thread count the choice was measured at."""
        device = default_device()
        return auto_path(name, device, decode_threads() if device.type == "cpu" else None)

    def choice(self, name: str) -> Choice | None:
        """This machine's measured choice for the generator (at the thread count it was measured at)."""
        return self.path(name).choice

    @contextmanager
    def generating(self) -> Iterator[None]:
        """Around a run's generation: the child times nothing meanwhile. At its end, a child that waited for the run
        starts (``_measure``): one due while it generated, such as the measuring a step found missing at its start
        asks for. A server that only answers `/compare` has no page whose model line would start it."""
        with self.gate.generating():
            yield
        for name in list(self._asked):
            self._measure(name)

    def share(self) -> Iterator[float]:
        """Before a run takes the generation slot: where a measuring child has waited through a whole run for a gap
        between runs (RunGate.starved: runs sent back to back, as a queue of visitors sends them), the run waits up to
        SHARE_S while the child measures, so that later runs get the faster path it is measuring; yields the seconds
        left, about every second. A child that ends meanwhile ends the wait."""
        with self._lock:
            children = [c for c in self._children.values() if c.poll() is None]
        if not children or not self.gate.starved():
            return
        log.info("runs came back to back while measuring waited for a gap: the next run waits up to %.0f s", SHARE_S)
        end = time.monotonic() + SHARE_S
        while (left := end - time.monotonic()) > 0 and any(c.poll() is None for c in children):
            yield left
            time.sleep(min(1.0, left))

    def _measures(self, name: str) -> bool:
        """Whether this app measures the generator's decode paths at all: not where SBON_DECODE forces them, on
        ZeroGPU, on a GPU (its CUDA graphs need no measuring), or after a child that failed."""
        return (app_decode() == "auto" and not on_zerogpu() and default_device().type == "cpu"
                and name not in self._failed)

    def _measure(self, name: str, path: AutoPath | None = None) -> None:
        """Start the child that measures (and builds) where this machine has no choice, a provisional one, or one a
        quiet run contradicted; one child at a time, none where it measures nothing (``_measures``: where
        SBON_DECODE forces the runs' decode path, their weights stay the saved choice's, and measuring and builds
        would only take the cores beside them). ``path``: ``self.path`` as the caller just read it (default: read
        here)."""
        if not self._measures(name):
            return
        with self._lock:
            child = self._children.get(name)
            if child is not None and child.poll() is None:
                return
            path = path if path is not None else self.path(name)
            if child is not None and child.returncode and name not in self._said:
                self._said.add(name)
                log.warning("measuring %s's decode paths stopped (exit status %s): runs keep %s %s", name,
                            child.returncode, path.weights, path.decode)
            choice = path.choice
            if child is not None and choice is None:
                return  # the child failed: runs stay on the safe path, the model line says why
            contradicted = name in self._stale
            # A final choice of a compiled step: its step for one thread, for runs that start beside other work.
            one_thread = not contradicted and app_decode() == "auto" and wants_one_thread_step(choice)
            if not (choice is None or choice.provisional or contradicted or one_thread):
                return
            if choice is not None and self.gate.generating_now:
                return  # measured again between runs: the child's loading would slow the run beside it
            if child is not None and not contradicted and \
                    time.perf_counter() - self._started[name] < RETRY_S * 2 ** (self._tries[name] - 1):
                return  # a provisional choice: measured again once its wait is over
            self._stale.discard(name)
            self._children[name], self._started[name] = (_measure_in_child(name, self.gate, one_thread),
                                                         time.perf_counter())
            self._tries[name] = self._tries.get(name, 0) + 1
            (self._one_thread.add if one_thread else self._one_thread.discard)(name)

    def decode(self, name: str, gen: Generator) -> str:
        """The decode path of a run of ``gen`` (the preset ``name``) that starts now. Called on TORCH_THREAD: it may
        load the saved step (seconds)."""
        asked = app_decode()
        if asked != "auto":
            return asked
        if gen.device.type == "cuda":
            return self._gpu_decode(name, gen)
        self._asked.add(name)
        self._measure(name)
        return self._cpu_decode(name, gen, load=True)

    def for_run(self, name: str, gen: Generator) -> str:
        """``decode`` for a run that starts now; on a CPU, with auto's path, also its threads (``_cpu_threads``)."""
        decode = self.decode(name, gen)
        if self._sets_threads(gen):
            decode = self._cpu_threads(name, gen, decode)
        return decode

    def watch(self, name: str, gen: Generator, decode: str) -> ThreadWatch | None:
        """What looks at the threads of a run that starts now on ``decode`` (``for_run``'s answer) between its steps,
        where they may change while it runs (sbon.probe.watch_for_run, the command line's rule too)."""
        return watch_for_run(gen, decode, self.path(name)) if self._sets_threads(gen) else None

    @staticmethod
    def _sets_threads(gen: Generator) -> bool:
        """Whether a run of ``gen`` takes the threads auto's path gives it: on a CPU, not on ZeroGPU."""
        return gen.device.type == "cpu" and app_decode() == "auto" and not on_zerogpu()

    def planned(self, name: str, gen: Generator, path: AutoPath | None = None) -> str:
        """The decode path a run of ``gen`` starting now would take, as ``decode`` decides, without measuring,
        building or loading anything. ``path``: ``self.path`` as the caller just read it (default: read here)."""
        asked = app_decode()
        if asked != "auto":
            return asked
        if gen.device.type == "cuda":  # CUDA graphs from the first run after the load (_gpu_decode)
            return "compiled" if name in self._started and name not in self._failed else "eager"
        return self._cpu_decode(name, gen, load=False, path=path)

    def settled(self, name: str, path: AutoPath | None = None) -> bool:
        """Whether later runs of the generator decode as one starting now would: False on a CPU with auto's path
        while its decode paths are still to be measured, provisional, or being measured or built (a choice may take
        another weight format or step, which rounds differently). The step built for one thread gives the same
        bits, so building it leaves the path settled. ``path``: as in ``planned``."""
        if not self._measures(name):
            return True
        child = self._children.get(name)
        if child is not None and child.poll() is None and name not in self._one_thread:
            return False
        choice = (path if path is not None else self.path(name)).choice
        if choice is None and child is not None and child.returncode:
            return True  # measuring failed: runs stay on the safe path
        return choice is not None and not choice.provisional

    def _cpu_decode(self, name: str, gen: Generator, load: bool, path: AutoPath | None = None) -> str:
        """Compiled where auto's path is this format's compiled step and that step is saved here (``load``: loaded
        into this process now); eager otherwise: a run never waits for a build. ``path``: as in ``planned``."""
        path = path if path is not None else self.path(name)
        if name in self._failed or (path.weights, path.decode) != (gen.weights, "compiled"):
            return "eager"
        threads = path.threads or torch.get_num_threads()  # its step for the count it was measured at
        state = compiled_state(gen, threads)  # sets no thread count: a page open may ask while a run decodes
        if state == "loaded" or (state == "saved" and not load):
            return "compiled"
        if state == "saved":
            with on_threads(threads):  # on TORCH_THREAD, at a run's start
                if prepare(gen):
                    return "compiled"
            self._failed[name] = "its compiled decode step did not load (the app's log says why)"
        elif load and path.choice is not None and not path.choice.provisional:
            self._step_gone(name)
        return "eager"

    def _step_gone(self, name: str) -> None:
        """A final choice whose compiled step is not saved here: the code the step is built from changed since (its
        name hashes that code: an update of sbon), or its cache was emptied. Measured and built again in a child,
        once per process; runs decode eagerly meanwhile, and the model line says the paths are measured again."""
        if name in self._gone:
            return
        self._gone.add(name)
        log.warning("%s's chosen compiled step is not saved on this machine (the code it is built from changed, or "
                    "its cache was emptied): measuring and building again in the background; runs decode eagerly "
                    "meanwhile", name)
        self._stale.add(name)
        self._measure(name)

    def _cpu_threads(self, name: str, gen: Generator, decode: str) -> str:
        """Set torch's CPU threads for a run of ``gen`` starting now, on TORCH_THREAD, and return its decode step:
        the thread count auto's path was measured at, or one thread where other work holds the cores now (on the
        compiled step built for one thread where it gives the same bits, else eagerly); where nothing is measured
        yet, the safe path's; a forced format keeps the count the app started with (sbon.probe.threads_for_run, the
        command line's rule too)."""
        path = self.path(name)
        measured = path.threads
        threads, run_decode = threads_for_run(gen, decode, path)
        if threads is None:
            return decode
        if measured is not None and threads != measured:
            log.info("other work holds this machine's cores: this run of %s decodes on one thread, %s (%d threads "
                     "would wait for the cores at every operation)", name,
                     "on the compiled step built for one thread" if run_decode == "compiled" else "eagerly", measured)
        torch.set_num_threads(threads)
        return run_decode

    def observe(self, name: str, result: RunResult) -> None:
        """A finished run: where it decoded on the chosen path at the thread count it was measured at, on a quiet
        machine, CONTRADICTED times slower than the slowest step measured for that path, the choice is measured
        again."""
        choice = self.choice(name)
        seconds, steps = result.timings.get("decode"), result.decode_steps
        if choice is None or not choice.weights or choice.provisional or busy(result.load) or not seconds \
                or not steps or (result.weights, result.decode) != (choice.weights, choice.decode) \
                or result.threads not in (None, choice.fingerprint.get("threads")):
            return
        chosen = choice.chosen()
        per_step = 1e3 * seconds / steps
        if per_step > CONTRADICTED * max(chosen.ms.values()):
            log.warning("%s decoded at %.0f ms per step on a quiet machine, against %.0f ms measured for %s: "
                        "measuring this machine's decode paths again", name, per_step, max(chosen.ms.values()),
                        chosen.name)
            self._stale.add(name)
            self._measure(name)

    def _gpu_decode(self, name: str, gen: Generator) -> str:
        """On a GPU: CUDA graphs from the first run on (sbon.cuda_graphs). The page-default run's graphs are
        captured at model load, one graph per task on TORCH_THREAD, so that a run asked for meanwhile goes between
        two captures; a run captures any other graph it needs before its timers start (well under a second each).
        A run's start also adopts inductor's step under the graphs where ``_build_faster`` has built it since.
        Eagerly where the step cannot be captured (the page says why), and on ZeroGPU (untried there)."""
        if on_zerogpu() or name in self._failed or compile_problem(gen) is not None:
            return "eager"
        if graphs(gen).failed:
            self._failed[name] = f"its CUDA graphs could not be captured ({graphs(gen).failed})"
            return "eager"
        if name not in self._started:
            self._started[name] = time.perf_counter()
            TORCH_THREAD.submit(self._build_gpu, name, gen, gpu_graphs(gen))
        build = self._faster.get(name)
        if build is not None and build.state == "built":  # a run's start: both methods of a comparison replay it
            build.adopt(graphs(gen), name)
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
            inductor = self.inductor if self.inductor is not None else gen.device.type == "cuda"
            if inductor:
                threading.Thread(target=self._build_faster, args=(name, gen), name="sbon-faster", daemon=True).start()

    def _build_faster(self, name: str, gen: Generator) -> None:
        """On a thread of its own, once the page-default graphs are captured: inductor's step under them where it is
        measured faster (sbon.cuda_graphs.GraphDecoder.build_faster; a minute or so, timed only between runs), for the
        next run's start to adopt (``_gpu_decode``). Runs go on meanwhile on the graphs they have."""
        build = self._faster[name] = FasterBuild(time.perf_counter())
        try:
            built = graphs(gen).build_faster(gpu_graphs(gen), self.gate)
        except Exception as e:  # noqa: BLE001 - runs keep the plain step's graphs
            why = one_line(e)
            log.warning("inductor's step under the CUDA graphs of %s was not built (%s); runs keep the graphs they "
                        "have", name, why)
            build.fail(why)  # after the line: whoever sees the state failed finds why in the log
            return
        build.built, build.state = built, "built"  # in this order: a run's start reads the state first
        log.info("inductor's step under the CUDA graphs of %s is built (%.0f s; %s); the next run adopts it", name,
                 built.seconds, _measured(built))

    def faster(self, name: str) -> dict | None:
        """Where the build of inductor's step under this generator's CUDA graphs stands (None: none was started):
        ``state`` ("building", "built", "adopted" or "failed"), ``started`` (its time.perf_counter()), ``build``
        (what it measured: sbon.cuda_graphs.Faster.summary) and ``failed`` (why not, in one line)."""
        build = self._faster.get(name)
        return None if build is None else {"state": build.state, "started": build.started, "failed": build.failed,
                                           "build": build.built.summary() if build.built else None}

    def _faster_status(self, name: str) -> str:
        """The end of the model line's sentence about CUDA graphs: where the faster step under them stands."""
        build = self._faster.get(name)
        if build is None or build.state == "failed":
            return ""  # none tried, or it failed (the log says why): runs use the graphs they have
        if build.state == "adopted":
            return ", each step compiled into fewer, faster GPU kernels" if build.built.inductor_rows else ""
        if build.state == "built":
            return "; a faster step for them is ready for the next run"
        return (f"; compiling a faster step for them in the background (for "
                f"{time.perf_counter() - build.started:.0f} s; runs go on meanwhile)")

    def status(self, name: str, alone: bool = False) -> str:
        """One line for the page about this generator's decode path ('' where it has nothing to say). ``alone``: the
        line follows one that named this generator, the only one loaded, so it says "It" instead of the name again."""
        who, lead = subject(name, alone)
        path = self.path(name)  # the choice file, read once per tick
        choice = path.choice
        if name in self._children or choice is not None:
            self._measure(name, path)  # a provisional choice is measured again between runs, once its wait is over
        if name in self._failed:
            return f"{who} decodes one operation at a time (slower): {self._failed[name]}."
        child = self._children.get(name)
        running = child is not None and child.poll() is None
        now = title(path.weights, path.decode, str(default_device()))
        if running:
            doing = ("measuring how fast each way of decoding runs on this machine"
                     if choice is None or MEASURING in choice.provisional else
                     "compiling its step again for a single core, for runs that start while other programs keep "
                     "the cores busy,"
                     if name in self._one_thread else
                     "measuring on one core while other programs keep the others busy, then on all once they are free,"
                     if choice.fingerprint.get("threads") != decode_threads() else
                     "compiling its fastest ways of decoding" if self._saved_since_start(name, choice) else
                     "measuring again how fast each way of decoding runs here")
            return (f"⚙ {sentence(lead + doing)} in the background (for "
                    f"{time.perf_counter() - self._started[name]:.0f} s; runs go first and meanwhile use {now}"
                    + ("" if path.measured else ", exact without measuring") + ").")
        if child is not None and child.returncode and choice is None:
            return (f"{who} decodes with {now}: measuring how fast each way of decoding runs here failed "
                    f"(exit status {child.returncode}; the app's log says why).")
        if name in self._gpu_ready:
            return f"{who} decodes with CUDA graphs{self._faster_status(name)}."
        if name in self._started and default_device().type == "cuda":
            return f"⚙ {sentence(lead + 'capturing its CUDA graphs')} (seconds)."
        if path.forced:  # the path the runs take, not the measured choice they were told to leave
            return f"{who} decodes with {now}, as this app was started to."
        if choice is not None:
            return f"{who} decodes with {choice.words}."
        return ""

    def _saved_since_start(self, name: str, choice: Choice) -> bool:
        """Whether the running child saved ``choice`` (it saves after timing, then builds); a choice saved before it
        started is what it measures again first."""
        try:
            saved = choice_path(name, choice.fingerprint).stat().st_mtime
        except OSError:
            return False
        # A file's time comes from the kernel's coarse clock, which may lag time.time() by a tick: a second's slack
        # (a choice saved before the child started is from an earlier start, minutes older).
        return saved >= time.time() - (time.perf_counter() - self._started[name]) - 1.0


@dataclass
class FasterBuild:
    """One generator's build of inductor's step under its CUDA graphs (DecodePaths._build_faster): ``state``
    "building", then "built" (``built``: what it built) and "adopted" at a run's start, or "failed" (``failed``: why,
    in one line)."""
    started: float  # its time.perf_counter() at the start
    state: str = "building"
    built: Faster | None = None
    failed: str | None = None

    def fail(self, why: str) -> None:
        self.state, self.built, self.failed = "failed", None, why

    def adopt(self, dec: GraphDecoder, name: str) -> None:
        """At a run's start, on the runs' thread: hand the build to ``dec``, the generator's graph decoder now."""
        dec.adopt(self.built)
        if dec.faster is not self.built:
            self.fail("built for the model as it was loaded before")
            return
        self.state = "adopted"
        log.info("%s's runs replay %s (%s)", name, f"inductor's step under the CUDA graphs of "
                 f"{', '.join(map(str, self.built.inductor_rows))} rows" if self.built.inductor_rows else
                 "the plain step's CUDA graphs: inductor's was not faster", _measured(self.built))


def _measured(built: Faster) -> str:
    """What a build of faster graphs measured, for a log line: each row count's milliseconds per replay."""
    return "; ".join(f"{rows} rows: {ms['plain']:.2f} ms plain, {ms['inductor']:.2f} ms with inductor"
                     for rows, ms in sorted(built.ms.items()))


def subject(name: str, alone: bool) -> tuple[str, str]:
    """How a model line names the generator ``name``: as the subject of a sentence, and as the lead before a colon ('' =
    the line starts with what follows, made a sentence). ``alone``: the line before named it, the only one loaded."""
    return ("It", "") if alone else (generator_title(name), f"{generator_title(name)}: ")


def sentence(text: str) -> str:
    """``text`` with a capital first letter: where a line drops the name it would have started with."""
    return text[:1].upper() + text[1:]


def _measure_in_child(name: str, gate: RunGate, one_thread: bool = False) -> subprocess.Popen:
    """A child process that measures the generator's decode paths and builds the compiled steps predicted fastest
    (``python -m sbon machine --build``), or with ``one_thread`` only builds the chosen step for one thread and checks
    its bits (``--one-thread``, sbon.probe.one_thread_step), reading ``gate`` to compute nothing while a run generates
    here, and ending with this process (its lines go to this process's stderr). What it does before it times
    anything, its imports and loads, runs on cores nothing else wants (sbon.machine_load.at_idle_priority)."""
    code = ("import importlib, sys\nfrom sbon.machine_load import at_idle_priority\n"
            # its imports (seconds of CPU, torch's) time nothing: a run that starts meanwhile keeps its cores
            "at_idle_priority(lambda: [importlib.import_module(m) for m in ('sbon.cli', 'sbon.probe')])\n"
            "from sbon.cli import main\n"
            f"sys.exit(main(['machine', {'--one-thread' if one_thread else '--build'!r}, '--generator', {name!r}, "
            "'--device', 'cpu']))\n")
    log.info("measuring %s's decode paths in a child process (runs go on meanwhile, on the path chosen so far or, "
             "before any, the safe path)", name)
    return subprocess.Popen(child_argv(code), cwd=Path(__file__).resolve().parent.parent,
                            env={**os.environ, RunGate.ENV: str(gate.path)}, stdout=subprocess.DEVNULL)
