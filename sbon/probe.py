"""Measure every decode path this machine can run and choose ``auto``'s (``python -m sbon machine``; the app runs it
in a child process on its first start).

A path is a weight format of ``sbon.engine.WEIGHT_FORMATS`` (every entry: a new one joins here without a change) and
a decode step of ``sbon.decoders`` (``eager``; ``compiled``, with CUDA graphs on a GPU). For each, whether a row's
logits are the same bits alone and within a batch is measured (not taken from the format's ``batch_invariant`` flag:
bfloat16 is exact where the CPU computes it natively, and may not be where it is emulated), and the paths that may be
chosen are timed at the row counts a page-default run decodes at (``sbon.machine.ROWS``).

The timing is made to survive shared cores:

- every path is loaded first, then all are timed in rounds, one after another (A B C ... A B C ...), and each keeps
  its best time of the rounds: a neighbour that comes and goes slows every path alike instead of one;
- where nothing is chosen here yet, each format's paths are also timed as soon as it is loaded (a first look), and
  the fastest so far is saved, provisional (MEASURING): runs that start while the other formats load leave the safe
  path (float32 op by op) as soon as a faster one is measured, not minutes later, once every format is;
- a round's timing of a path counts as trusted only where this process's threads did not wait for a core meanwhile
  (``sbon.machine_load.Contention``); rounds go on until every path has ``ROUNDS_TRUSTED`` trusted ones, or
  ``ROUNDS_MAX`` rounds, or ``ROUNDS_BUDGET_S`` once ``ROUNDS_TRUSTED`` rounds are done; where some path has none,
  every path keeps its best of all rounds and the choice is provisional (measured again later);
- while a run generates in the app beside it (``sbon.machine_load.RunGate``), nothing is timed, and a timing that a
  run started during is thrown away and taken again;
- while other work stalls the thread team (``team_held_back``), no format is loaded and nothing is timed: the probe
  waits, asleep (``TeamWait``), up to STALLED_WAIT_S, then ends with what it had, provisional, and builds nothing;
  one that starts so with no path chosen yet first measures and builds on one thread, the count a run takes beside
  other work, whose core the neighbour leaves free (``measures_alone_first``, sbon.machine.alone_choice).

On a CPU ``build=True`` then ranks what will really run: it builds compiled steps (each in a child process on idle
cores, saved to disk: ``sbon.aot_step``) and times the built steps beside the eager ones; after each build the choice
is saved again, provisional until the last. A build costs minutes, so the eager steps do not decide which to build:
a compiled step runs its format's matrix products unchanged (kernels the compiler calls, not code it fuses) and
little else, so each format's products are timed alone beside the paths (``MatrixProducts``), and a format's step is
predicted as its products plus the rest of a step as the built steps measured it. The best predicted is built first;
after each build, only formats predicted within ``MARGIN`` of the fastest path measured are built (``to_build``).
A build that did not finish ``BUILD_TRIES`` times (killed, out of memory) is not begun again. A path that cannot run
here (no compiler, a kernel this CPU lacks) is one logged line.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

import torch

from .decoders import DECODE_PATHS, EagerDecoder, _compiled, compile_problem, compiled_state, prepare
from .engine import WEIGHT_FORMATS, Generator, Prefix, SamplingConfig, coupled_uniforms, sample
from .errors import SBoNError, one_line
from .machine import (ALONE, REPORT_ROWS, ROWS, AutoPath, Choice, Measured, alone_choice, cached_choice, choose,
                      decode_threads, eligible, fingerprint, on_threads, save_choice, threads_may_change)
from .machine_load import Contention, RunGate, ThreadWaits, at_idle_priority, quiet_token
from .models import DEFAULT_GENERATOR, load_generator

log = logging.getLogger(__name__)
T = TypeVar("T")

PROMPT = "Give three tips for staying healthy."
WARM_STEPS, TIMED_STEPS = 1, 3  # per row count and round: the first step pays for lazy initialisation
ROUNDS_TRUSTED = 3  # a path's timing is done once this many rounds were trusted at every row count ...
ROUNDS_MAX = 12  # ... or after this many rounds, whatever the machine did meanwhile (then: provisional) ...
ROUNDS_BUDGET_S = 90.0  # ... or once this long has passed after ROUNDS_TRUSTED rounds: a loaded machine waits less
# On a CPU, a format's compiled step is built where it is predicted within this share of the fastest path measured:
# room for what the prediction misses (a format's own elementwise work, noise), little enough that a format that
# cannot win costs no build.
MARGIN = 0.1
BUILD_TRIES = 2
# Every format stays loaded while the paths are timed in turn: one that leaves less than this share of the memory
# free is left out (a large generator's float32 copy on a small machine), with one line.
MEMORY_FREE_SHARE = 0.2
# A batch of 6 rows over 6 steps against its rows decoded one and five, four and two: where a kernel's sums change
# with the row count, some logit of some row differs in its last bits (tests/test_step_formats.py asserts what it
# finds per format: float32 activations exact on every CPU).
EXACT_ROWS, EXACT_STEPS = 6, 6
EXACT_SPLITS = ([[0], [1, 2, 3, 4, 5]], [[0, 1, 2, 3], [4, 5]])
EXACT_SEED = 7
DECODES = tuple(d for d in DECODE_PATHS if d != "auto")
PRODUCTS = "matrix products"  # what a format's MatrixProducts are measured as (not a path: never chosen)
CONTENDED = "other work used the cores while the paths were timed, so their times are upper bounds"
# A thread team that other work stalls (``team_held_back``) is not timed: its times measure the neighbour, many times
# slower than the path and in no order between row counts, and timing it takes cores the neighbour wants. The probe
# waits for the team, idle, looking again every STALLED_POLL_S, for STALLED_WAIT_S in all; then it ends with what it
# had timed (provisional: the app measures again later) and builds nothing.
STALLED_WAIT_S, STALLED_POLL_S = 300.0, 5.0
STALLED = "other programs kept this machine's cores busy while it measured"
MEASURING = "still to be measured"  # a first look's: "3 more ways of storing the weights still to be measured"


# -- one path: whether it is exact, and one timing ---------------------------------------------------------------

def _logits(dec, prefix, ids: Sequence[int], steps: int, gate: RunGate | None = None) -> torch.Tensor:
    """Each row's logits over ``steps`` steps of coupled sampling (rows × steps × vocabulary), in one batch: the
    tokens a run would decode (fixed made-up tokens can miss a difference that real text shows). It begins once no
    run of the app generates (``gate``): bits do not depend on when they are computed, so a check of them pauses
    between its batches, and a run that starts during one competes with that batch alone."""
    quiet_token(gate)
    batch = dec.start(prefix, list(ids), False, steps + 1)
    uniforms = coupled_uniforms(EXACT_SEED, ids, steps)
    out = []
    for t in range(steps):
        dec.forward(batch, sample(batch.logits, uniforms[:, t], SamplingConfig()))
        out.append(batch.logits.float().clone())
    return torch.stack(out, 1)


def _in_parts(dec, prefix, gate: RunGate | None = None) -> list[torch.Tensor]:
    """The logits of EXACT_ROWS rows decoded in the parts of each of EXACT_SPLITS, in the rows' order (to compare
    with the same rows decoded in one batch)."""
    with torch.inference_mode():
        return [torch.cat([_logits(dec, prefix, ids, EXACT_STEPS, gate) for ids in split]) for split in EXACT_SPLITS]


def exactness(gen: Generator, dec, gate: RunGate | None = None) -> tuple[bool, float]:
    """Whether a row's logits are the same bits decoded alone and within a batch (the coupling is exact), and the
    largest difference of a logit between the two; each batch decoded while no run of the app generates (``gate``)."""
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    with torch.inference_mode():
        whole = _logits(dec, prefix, range(EXACT_ROWS), EXACT_STEPS, gate)
    parts = _in_parts(dec, prefix, gate)
    return all(torch.equal(whole, p) for p in parts), max(float((whole - p).abs().max()) for p in parts)


def block_ms(gen: Generator, dec, prefix: Prefix, rows: int, timer: Callable[[], float] = time.perf_counter) -> float:
    """Milliseconds per decode step at ``rows`` rows: the fastest of TIMED_STEPS steps after WARM_STEPS."""
    with torch.inference_mode():
        batch = dec.start(prefix, list(range(rows)), False, WARM_STEPS + TIMED_STEPS + 1)
        tokens = prefix.logits.argmax(-1).expand(rows).clone()
        times = []
        for t in range(WARM_STEPS + TIMED_STEPS):
            start = timer()
            dec.forward(batch, tokens + t)
            gen.synchronize()
            if t >= WARM_STEPS:
                times.append(1e3 * (timer() - start))
    return min(times)


def ready(gen: Generator, decode: str, tries: dict[str, int] | None = None, gate: RunGate | None = None
          ) -> tuple[object | None, Measured]:
    """One path of a loaded generator made ready to time: its decoder (None where it cannot run or is not built)
    and what is known of it: its exactness, or why it cannot run (``compiled`` on a CPU is ready only where its step
    is saved: otherwise pending, or a problem where its build did not finish BUILD_TRIES times)."""
    path = Measured(gen.weights, decode)
    try:
        if decode == "eager":
            dec = EagerDecoder(gen)
        else:
            if problem := compile_problem(gen):
                path.problem = problem
                return None, path
            if gen.device.type == "cpu":
                if compiled_state(gen) is None:
                    if (tries or {}).get(gen.weights, 0) >= BUILD_TRIES:
                        path.problem = (f"its build did not finish in {BUILD_TRIES} tries here (stopped, or out of "
                                        "memory); python -m sbon machine --build tries again")
                    return None, path  # not built yet: pending
                if not prepare(gen):
                    path.problem = "its saved compiled step did not load"
                    return None, path
            dec = _compiled(gen)
        path.exact, path.divergence = exactness(gen, dec, gate)
    except Exception as e:  # noqa: BLE001 - any path that fails is one line, and the probe goes on
        path.problem = one_line(e)
        return None, path
    return dec, path


class MatrixProducts:
    """A format's matrix products alone, in the decoder protocol ``block_ms`` times: every Linear layer of its model
    (its LM head and 4- or 8-bit layers too) on one row per candidate. A compiled step calls these kernels as they
    are, so its time is theirs plus the rest of a step, which is much the same in every format (sbon.probe's
    docstring)."""

    def __init__(self, gen: Generator):
        self.gen = gen

    def start(self, prefix: Prefix, candidate_ids: Sequence[int], keep_hidden: bool, max_new_tokens: int
              ) -> list[tuple[torch.nn.Module, torch.Tensor]]:
        """Each layer with its input: one row per candidate, the model's activations' type."""
        layers = [m for m in self.gen.model.modules()
                  if hasattr(m, "in_features") and hasattr(m, "out_features") and next(m.children(), None) is None]
        seed = torch.Generator().manual_seed(EXACT_SEED)
        inputs = {width: torch.randn(len(candidate_ids), 1, width, generator=seed).to(self.gen.model.dtype)
                  for width in {m.in_features for m in layers}}
        return [(m, inputs[m.in_features]) for m in layers]

    def forward(self, layers: list[tuple[torch.nn.Module, torch.Tensor]], tokens: torch.Tensor) -> None:
        for layer, x in layers:
            layer(x)


# -- timing paths in rounds --------------------------------------------------------------------------------------

@dataclass
class Subject:
    """A path ready to time: what is measured of it, its generator and decoder."""
    measured: Measured
    gen: Generator
    dec: object


class TeamWait:
    """Waiting, asleep, while other work stalls this process's thread team (``stalled``: default ``team_held_back``
    at the thread count in use), for STALLED_WAIT_S in all; looking only where no run generates in the app
    (``gate``)."""

    def __init__(self, gate: RunGate | None = None, stalled: Callable[[], bool] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.gate, self.sleep, self.waited = gate, sleep, 0.0
        self._stalled = stalled or (lambda: team_held_back(torch.get_num_threads()))

    def stalled(self) -> bool:
        """Whether other work stalls the team now. A look that a run of the app began during measured that run, not
        a neighbour: it does not count, and the team is looked at again once no run generates."""
        while True:
            token = quiet_token(self.gate)
            held = self._stalled()
            if self.gate is None or self.gate.token() == token:
                return held

    def wait(self) -> bool:
        """Wait until the team is free (True: found free twice, BUSY_RECHECK_S apart, as a run's start asks), or until
        STALLED_WAIT_S of waiting are spent (False)."""
        if not self.waited:
            log.warning("other programs hold this machine's cores: measuring waits for them (up to %.0f s)",
                        STALLED_WAIT_S)
        while self.waited < STALLED_WAIT_S:
            self.sleep(STALLED_POLL_S)
            self.waited += STALLED_POLL_S
            if twice(lambda: not self.stalled(), self.sleep):
                log.warning("the cores are free again after %.0f s: measuring goes on", self.waited)
                return True
        return False


def time_paths(subjects: Sequence[Subject], rows: Sequence[int] = ROWS, gate: RunGate | None = None,
               timer: Callable[[], float] = time.perf_counter, contention: Callable[[], Contention] = Contention,
               block: Callable[..., float] = block_ms, rounds: tuple[int, int] = (ROUNDS_TRUSTED, ROUNDS_MAX),
               team: TeamWait | None = None) -> str:
    """Time every subject in rounds and set each one's ``ms`` (its best per row count) and ``trusted`` (rounds
    timed at every row count while this process had its cores). Returns why the times are provisional: '' where
    every path has a trusted round (its best trusted times are kept); CONTENDED where some path has none (every path
    keeps its best of all rounds); STALLED where other work stalled the thread team until ``team`` (default: a
    TeamWait of its own) had waited STALLED_WAIT_S: a timing taken while it was stalled is not kept, and a path that
    has no time at some row count keeps what it had (nothing, the first time)."""
    trusted_wanted, rounds_max = rounds
    team = team or TeamWait(gate)
    deadline = time.monotonic() + ROUNDS_BUDGET_S
    samples = {(i, r): [] for i in range(len(subjects)) for r in rows}  # (ms, trusted)
    prefixes = {}
    for s in subjects:
        if id(s.gen) not in prefixes:
            prefixes[id(s.gen)] = s.gen.prefill(s.gen.encode_prompt(PROMPT))

    def timed(s: Subject, r: int) -> tuple[float, bool] | None:
        """One timing of a path at a row count, taken where no run generates and the team is not stalled (None:
        the team stayed stalled until STALLED_WAIT_S was spent)."""
        while True:
            token = quiet_token(gate)
            meter = contention().start()
            ms = block(s.gen, s.dec, prefixes[id(s.gen)], r, timer)
            meter.stop()
            if gate is not None and gate.token() != token:
                continue  # a run started meanwhile: thrown away, timed again once it ends
            if meter.trusted or not team.stalled():
                return ms, meter.trusted
            if not team.wait():  # else the team is free again: timed again
                return None

    given_up = False
    for done in range(1, rounds_max + 1):
        for i, s in enumerate(subjects):
            for r in rows:
                if (got := timed(s, r)) is None:
                    given_up = True
                    break
                samples[i, r].append(got)
            if given_up:
                break
        if given_up or all(sum(t for _, t in got) >= trusted_wanted for got in samples.values()) or (
                done >= trusted_wanted and time.monotonic() > deadline):
            break
    every_one = all(any(t for _, t in got) for got in samples.values() if got)
    for i, s in enumerate(subjects):
        if all(samples[i, r] for r in rows):
            s.measured.trusted = min(sum(t for _, t in samples[i, r]) for r in rows)
            s.measured.ms = {r: min(ms for ms, t in samples[i, r] if t or not every_one) for r in rows}
    return STALLED if given_up else "" if every_one else CONTENDED


# -- the probe ---------------------------------------------------------------------------------------------------

def probe(generator: str = DEFAULT_GENERATOR, device: str | torch.device = "cpu", build: bool = False,
          formats: Sequence[str] | None = None, rows: Sequence[int] = ROWS,
          load: Callable[..., Generator] = load_generator, save: bool = True,
          progress: Callable[[str], None] = log.warning, gate: RunGate | None = None,
          timing: Callable[..., str] = time_paths, builder: Callable[[str, str], bool] | None = None,
          team: TeamWait | None = None, alone: bool = False) -> Choice:
    """Measure every path (every weight format × eager and compiled) of ``generator`` on ``device`` at the thread
    count in use, choose, and save the choice (``sbon.machine.cached_choice`` finds it); with ``build``, on a CPU,
    build and time the compiled steps worth building as the module says. ``formats``: the weight formats to measure
    (default: all); ``rows``: the row counts timed; ``gate``: the app's runs (default: SBON_RUN_GATE's);
    ``load``/``timing``/``builder``: what loads a format, times the paths and builds a compiled step (the tests give
    stand-ins). On a CPU whose thread team other work stalls, no format is loaded until it is free (``team``, default
    a TeamWait of the gate); where it stays stalled, the probe ends there: with the choice measured before, or a
    provisional one that names no path (STALLED), saved. Where the team is stalled as it starts and no path is chosen
    at its thread count yet, it first measures (and builds) on one thread, for runs beside other work (``alone``: this
    is that probe: ``measures_alone_first``). Where nothing is chosen, each format has a first look: ``first_looks``."""
    device = torch.device(device)
    machine = fingerprint(device)
    gate = gate if gate is not None else RunGate.from_env()
    builder = builder or build_in_child
    previous = cached_choice(generator, device)
    tries = dict(previous.tries) if previous is not None else {}
    team = (team or TeamWait(gate)) if device.type == "cpu" else None
    if measures_alone_first(generator, device, previous, team):
        progress("other programs keep this machine's cores busy: measuring on one thread first, for runs beside them")
        with on_threads(1):
            probe(generator, device, build, formats, rows, load, save, progress, gate, timing, builder, alone=True)
    looks = first_looks(generator, machine, previous, tries, rows, gate, timing, alone) if save else None
    loaded = load_paths(generator, device, formats or WEIGHT_FORMATS, tries, load, gate, progress, team, looks)
    if loaded is None:  # checking each format beside the neighbour would take its cores for minutes
        return nothing_timed(generator, machine, cached_choice(generator, device) or previous, tries, save, progress)
    paths, subjects, gens = loaded

    building = build and device.type == "cpu"
    products = [Subject(Measured(s.measured.weights, PRODUCTS), s.gen, MatrixProducts(s.gen))
                for s in subjects if building and s.measured.decode == "eager"]
    unsettled, begun = "", set()  # why the times so far are provisional (time_paths)

    def decide() -> tuple[Choice, list[str]]:
        """Choose from what is measured so far and save; the builds still worth beginning (``to_build``)."""
        todo = [w for w in to_build(paths, tries) if w not in begun] if building and unsettled != STALLED else []
        why = ([ALONE] if alone else []) + ([unsettled] if unsettled else []) + \
            ([f"{len(todo)} compiled step{'s' if len(todo) > 1 else ''} may still be built"] if todo else [])
        choice = choose(generator, machine, paths, pending=_pending(paths), provisional="; ".join(why), tries=tries)
        if save:
            save_choice(choice)
        return choice, todo

    def settle() -> tuple[Choice, list[str]]:
        """Time every path ready now (and each format's matrix products, where steps are built), then decide."""
        nonlocal unsettled
        unsettled = timing(subjects + products, rows, gate) if subjects else ""
        for m in products:
            next(p for p in paths if (p.weights, p.decode) == (m.measured.weights, "eager")).products_ms = m.measured.ms
        for s in subjects:
            progress(_line(s.measured))
        return decide()

    choice, todo = settle()
    while todo:
        weights = todo[0]
        begun.add(weights)
        tries[weights] = tries.get(weights, 0) + 1
        if save:  # the try is counted before the build: a build that kills this process is not begun forever
            save_choice(choose(generator, machine, paths, pending=choice.pending, provisional=choice.provisional,
                               tries=tries))
        progress(f"{weights} compiled: building its step (once on this machine; a minute or more)")
        if not builder(generator, weights):
            progress(f"{weights} compiled: its build did not finish")
            choice, todo = decide()
            continue
        tries.pop(weights, None)
        at = next(j for j, p in enumerate(paths) if (p.weights, p.decode) == (weights, "compiled"))
        dec, paths[at] = ready(gens[weights], "compiled", tries, gate)
        if dec is not None and eligible_untimed(paths[at], device):
            subjects.append(Subject(paths[at], gens[weights], dec))
        else:
            progress(_line(paths[at]))
        choice, todo = settle()
    return choice


def first_looks(generator: str, machine: dict, previous: Choice | None, tries: dict[str, int], rows: Sequence[int],
                gate: RunGate | None, timing: Callable[..., str], alone: bool
                ) -> Callable[[list[Measured], list[Subject], int], None] | None:
    """What ``load_paths`` calls after each format where nothing is chosen here yet (a first look): with ``left``
    more to load, the paths it just made ready are timed at the row count nearest the one a choice's reason quotes
    (a look, not the ranking: the rounds at every row count come once all are loaded), and the fastest timed so far
    is saved, provisional (MEASURING), for the runs that start meanwhile. None where ``previous``, the choice
    measured before, names a path: it stays until the new one is measured (a look at fewer formats is no better)."""
    if previous is not None and previous.weights:
        return None
    look = [min(rows, key=lambda r: abs(r - REPORT_ROWS))]

    def after(paths: list[Measured], new: list[Subject], left: int) -> None:
        if not (new and left) or timing(new, look, gate) == STALLED:
            return
        ways = f"{left} more way{'s' if left > 1 else ''} of storing the weights"
        why = ([ALONE] if alone else []) + [f"{ways} {MEASURING}"]
        save_choice(choose(generator, machine, paths, pending=_pending(paths), provisional="; ".join(why),
                           tries=tries))
    return after


def nothing_timed(generator: str, machine: dict, previous: Choice | None, tries: dict[str, int], save: bool,
                  progress: Callable[[str], None]) -> Choice:
    """A probe whose thread team stayed stalled before it loaded a format: the choice measured before (a first
    look's, where it had one: ``first_looks``), or a provisional one that names no path (STALLED), saved."""
    progress(f"nothing measured: {STALLED}")
    if previous is not None:
        return previous
    choice = choose(generator, machine, [], provisional=STALLED, tries=tries)
    if save:
        save_choice(choice)
    return choice


def measures_alone_first(generator: str, device: torch.device, previous: Choice | None, team: TeamWait | None) -> bool:
    """Whether a probe that starts now measures on one thread first: on a CPU whose runs may take one thread
    (``threads_may_change``), where no path is chosen at the count in use (``previous``) and the one measured on one
    thread names none, or names compiled steps still worth building, while other work stalls the thread team now
    (``team``, in ``most`` of three looks: one look beside a busy loop now and then finds the team free, and a miss
    costs minutes). Its runs then decode on one thread with a measured path within minutes, not on float32 op by op for
    as long as the neighbour stays."""
    if team is None or (previous is not None and previous.weights) \
            or not threads_may_change(device, torch.get_num_threads()):
        return False
    measured = cached_choice(generator, device, 1)
    if measured is not None and measured.weights and not to_build(measured.paths, measured.tries):
        return False
    return most(team.stalled, team.sleep)


def load_paths(generator: str, device: torch.device, formats: Sequence[str], tries: dict[str, int],
               load: Callable[..., Generator], gate: RunGate | None, progress: Callable[[str], None],
               team: TeamWait | None = None,
               loaded: Callable[[list[Measured], list[Subject], int], None] | None = None
               ) -> tuple[list[Measured], list[Subject], dict[str, Generator]] | None:
    """Load every format and make each of its paths ready (``ready``): every path as known so far, those worth
    timing, and the generators they hold by format (kept loaded while the probe runs). Each format waits while other
    work stalls the thread team (``team``, on a CPU): None where it stayed stalled. ``loaded``, after each format:
    called with the paths so far, the format's paths worth timing and the number of formats still to load."""
    paths: list[Measured] = []
    subjects: list[Subject] = []
    gens: dict[str, Generator] = {}
    for done, weights in enumerate(formats, 1):
        before = len(subjects)
        quiet_token(gate)
        if team is not None and team.stalled() and not team.wait():
            return None
        try:
            gen = at_idle_priority(lambda: load(generator, device=device, weights=weights))
        except Exception as e:  # noqa: BLE001 - a format that does not load here: one line, the next one
            progress(f"{weights}: does not load here ({one_line(e)})")
            paths += [Measured(weights, d, problem=f"does not load here: {one_line(e)}") for d in DECODES]
            continue
        if (short := memory_short()) is not None:
            progress(f"{weights}: left out ({short})")
            paths += [Measured(weights, d, problem=f"left out: {short}") for d in DECODES]
            del gen
            gc.collect()
            continue
        for decode in DECODES:
            quiet_token(gate)
            dec, path = ready(gen, decode, tries, gate)
            paths.append(path)
            if dec is not None and eligible_untimed(path, device):
                subjects.append(Subject(path, gen, dec))
                gens[weights] = gen
            else:
                progress(_line(path))
        del gen
        gc.collect()
        if loaded is not None:
            loaded(paths, subjects[before:], len(formats) - done)
    return paths, subjects, gens


def memory_short() -> str | None:
    """Why no more formats fit beside the ones loaded (None: they do)."""
    import psutil
    memory = psutil.virtual_memory()
    if memory.available >= MEMORY_FREE_SHARE * memory.total:
        return None
    return (f"{memory.available / 2 ** 30:.1f} GiB of {memory.total / 2 ** 30:.0f} GiB free beside the formats "
            "loaded before it")


def eligible_untimed(path: Measured, device: torch.device) -> bool:
    """A ready path worth timing: on a CPU only an exact one may be chosen."""
    return path.problem is None and (path.exact is True or device.type != "cpu")


def to_build(paths: Sequence[Measured], tries: dict[str, int]) -> list[str]:
    """The weight formats whose compiled step is worth building, the fastest predicted first: exact formats whose
    step is pending (and did not fail BUILD_TRIES times) and is predicted within MARGIN of the fastest path measured.
    A format's step is predicted as its matrix products (``Measured.products_ms``) plus the rest of a step: the least
    that a built compiled step took beyond its own format's products, at each row count; nothing before any is
    built, so that the first prediction is a bound no step beats."""
    eager = {p.weights: p for p in paths if p.decode == "eager" and eligible(p, "cpu") and p.products_ms}
    built = [p for p in paths if p.decode == "compiled" and eligible(p, "cpu") and p.weights in eager]
    ok = [p.per_step() for p in paths if eligible(p, "cpu")]
    if not eager or not ok:
        return []
    rest = {r: min((max(0.0, p.ms[r] - eager[p.weights].products_ms[r]) for p in built if r in p.ms), default=0.0)
            for r in next(iter(eager.values())).products_ms}

    def predicted(weights: str) -> float:
        return sum(ms + rest.get(r, 0.0) for r, ms in eager[weights].products_ms.items()) / len(rest)

    pending = [p.weights for p in paths if p.decode == "compiled" and p.pending and p.weights in eager
               and tries.get(p.weights, 0) < BUILD_TRIES]
    return sorted((w for w in pending if predicted(w) <= (1 + MARGIN) * min(ok)), key=predicted)


def build_step(generator: str, weights: str, threads: int) -> None:
    """Build and save one format's compiled step at ``threads`` CPU threads."""
    torch.set_num_threads(threads)
    if not prepare(load_generator(generator, device="cpu", weights=weights)):
        raise SBoNError(f"the compiled step of {weights} was not saved")


def child_argv(code: str, idle: bool = False) -> list[str]:
    """A Python child running ``code`` that ends with this process and, with ``idle``, runs only on cores nothing else
    wants (sbon.machine_load.lower_to_idle): the probe's builds'.

    The child watches for itself whether this process is still its parent (``os.getppid``, every PARENT_POLL_S) and
    ends as SIGTERM ends it, where this process has gone. Linux's own way, PR_SET_PDEATHSIG, signals the child when the
    *thread* that started it ends, not the process: a web server's handler threads end when idle, and would take a
    measurement or a build started from one with them, half done."""
    preamble = ("import os, signal, threading, time\n"
                f"def _end_with_parent(parent={os.getpid()}):\n"
                "    while os.getppid() == parent:\n"
                f"        time.sleep({PARENT_POLL_S})\n"
                "    os.kill(os.getpid(), signal.SIGTERM)\n"
                "threading.Thread(target=_end_with_parent, name='end-with-parent', daemon=True).start()\n")
    if idle:
        preamble += "from sbon.machine_load import lower_to_idle\nlower_to_idle()\n"
    return [sys.executable, "-c", preamble + code]


PARENT_POLL_S = 0.5  # how soon a child of the app notices that the app has gone


def build_in_child(generator: str, weights: str) -> bool:
    """``build_step`` in a child process that runs only on cores nothing else wants (Linux's SCHED_IDLE; else the
    lowest priority) and ends with this process: a build takes a minute or more and must not slow a run, while the
    timing here must not run at that priority (beside any other work, its threads would wait for whole time slices).
    True where the step was saved."""
    code = f"from sbon.probe import build_step\nbuild_step({generator!r}, {weights!r}, {torch.get_num_threads()})\n"
    try:
        done = subprocess.run(child_argv(code, idle=True), cwd=Path(__file__).resolve().parent.parent,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        log.warning("%s compiled: the build could not start (%s)", weights, one_line(e))
        return False
    if done.returncode:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        why = f"stopped by signal {signal.Signals(-done.returncode).name}" if done.returncode < 0 else last[:200]
        log.warning("%s compiled: the build failed (%s)", weights, why)
    return done.returncode == 0


def _pending(paths: list[Measured]) -> list[str]:
    return [p.name for p in paths if p.pending]


def _line(p: Measured) -> str:
    if p.problem:
        return f"{p.name}: cannot run here ({p.problem})"
    if p.exact is None:
        return f"{p.name}: not built yet"
    exact = "exact" if p.exact else f"NOT exact (a logit differs by up to {p.divergence:.2g})"
    if not p.ms:
        return f"{p.name}: {exact}; not timed"
    trust = "" if p.trusted else " (timed beside other work)"
    products = (f" (its matrix products alone: {', '.join(f'{ms:.1f}' for ms in p.products_ms.values())})"
                if p.products_ms else "")
    times = ", ".join(f"{ms:.1f} ms at {r} row{'s' * (r != 1)}" for r, ms in p.ms.items())
    return f"{p.name}: {times}{trust}{products}; {exact}"


def report(choice: Choice) -> str:
    """The fingerprint, every path's times and exactness, and the choice with its reason (``python -m sbon
    machine``)."""
    fp = choice.fingerprint
    lines = [f"machine: {fp['cpu']}; instructions in force: {fp['capability']}"
             + (f" (limited by {', '.join(f'{k}={v}' for k, v in fp['limits'].items())})" if fp["limits"] else "")
             + f"; flags: {' '.join(fp['flags']) or 'none read'}",
             f"threads: {fp['threads']}; torch {fp['torch']}; device: {fp['device']}; cache key {choice.key}",
             f"paths of {choice.generator} (ms per decode step, each path's best of rounds timed in turn; exact: a "
             "row's logits the same bits alone and in a batch):"]
    lines += [f"  {_line(p)}" for p in choice.paths]
    lines.append(f"choice: {choice.reason}" if choice.weights else f"choice: none ({choice.reason})")
    if choice.provisional:
        lines.append(f"provisional: {choice.provisional}; the app measures again (python -m sbon machine does now)")
    if choice.pending:
        lines.append(f"not built yet: {', '.join(choice.pending)} (python -m sbon machine --build builds those "
                     f"predicted within {MARGIN:.0%} of the fastest path, a minute or more each)")
    if choice.device == "cpu" and (alone := alone_choice(choice.generator, choice, fp["threads"])) is not None:
        lines.append(f"meanwhile, {ALONE}: {alone.reason}; runs take it, on one thread, until a path is chosen on "
                     f"{fp['threads']} threads")
    if leaves_compiled_threads(choice):
        lines.append("beside other work: " + (
            f"a run decodes on one thread, on this step built for one thread (the same bits as on {fp['threads']})"
            if choice.one_thread == "same" else "a run decodes on one thread, eagerly, where that gives the same bits "
            + (f"(the compiled step for one thread is not used: {choice.one_thread})" if choice.one_thread else
               "(python -m sbon machine --one-thread builds the compiled step for one thread and checks its bits)")))
    return "\n".join(lines)


# -- a run that starts beside other work: one thread -----------------------------------------------------------

# torch's CPU threads (an OpenMP team) spin at the barrier after every operation, waiting for each other. Beside a
# process that holds one of the cores, a team of two waits there for a whole time slice of the scheduler at each of a
# step's hundreds of operations, so a run takes many times longer than on one thread. Work that comes in bursts (a
# browser drawing the page on the same cores) costs the team little. So what is measured is the team itself: small
# operations like a step's, timed on the measured thread count and on one thread (``team_held_back``). A run decodes
# on one thread where the team did fewer than one thread's, in two such measurements BUSY_RECHECK_S apart: on free
# cores a team of two does more than one thread (rarely less, for a moment); beside a busy loop it does less, in
# nearly every measurement. A run kept on the team beside a loop takes from twice to many times as long as on one
# thread; one sent to one thread on free cores, less than half as long again: so the test leans to one thread.
BUSY_SAMPLE_S, BUSY_RECHECK_S = 0.2, 0.5
# A running decode's looks at its team (ThreadWatch): shorter than a start's, since a quiet run pays for each; the
# team's waits for a core (below) tell a busy loop from free cores within a twentieth of a second.
WATCH_SAMPLE_S, WATCH_FIRST_S, WATCH_MOST_S = 0.05, 2.0, 16.0
# On one thread the waits grow to this at most: a run kept on one thread once the cores are free again takes up to
# twice as long per step for every second it stays there, while a look costs one thread WATCH_SAMPLE_S.
WATCH_ONE_THREAD_MOST_S = 4.0
# The count of operations misleads where a look finds the team's second thread rested (the run was on one thread) or
# one thread was timed beside other work: beside a busy loop the team then does about one thread's operations in a
# look, and a run sent back to the team takes twice as long. What the kernel counts does not mislead: beside a
# neighbour that holds one of the team's cores, the team's threads wait for a core, runnable, for a large share of
# the look (the kernel's run-queue delays: sbon.machine_load.ThreadWaits); on free cores and beside bursts, for a
# small one. A team whose threads waited this share of the look's wall time, per thread, is held back, whatever it
# counted.
TEAM_WAITED_SHARE = 0.2
_ONE_THREAD_BEST = [0.0]  # the most operations per second one thread has done in this process
_SAME_BITS: dict[tuple[str, str | None, int], bool] = {}  # generator, format, threads -> same_bits
_EXACT_ON: dict[tuple[str, str | None, int], bool] = {}  # generator, format, threads -> exact_on


def ops_per_s(threads: int, seconds: float = BUSY_SAMPLE_S) -> float:
    """Small matrix products (192 x 192, a step's operations are of that size) per second on ``threads`` torch
    threads, over ``seconds``."""
    a = torch.ones(192, 192)
    with on_threads(threads), torch.inference_mode():
        a @ a  # the team starts
        done, start = 0, time.perf_counter()
        while (now := time.perf_counter()) - start < seconds:
            a @ a
            done += 1
        rate = done / (now - start)
    if threads == 1:
        _ONE_THREAD_BEST[0] = max(rate, _ONE_THREAD_BEST[0])
    return rate


def team_held_back(threads: int, seconds: float = BUSY_SAMPLE_S) -> bool:
    """Whether ``threads`` threads are held back now, timed over ``seconds``: their threads waited for a core for
    TEAM_WAITED_SHARE of the time or more (``ThreadWaits``), or they did fewer operations than one thread: than the most
    one thread has done in this process, or, before one thread has been timed, than one thread now. The question of a
    run's start (which thread count it decodes on: ``run_threads``, ``safe_threads``), of a running decode
    (``ThreadWatch``) and of the probe's (whether its timings would measure a neighbour). One thread is never held
    back."""
    if threads <= 1:
        return False
    waits = ThreadWaits(team=True).start()
    team = ops_per_s(threads, seconds)
    if (waited := waits.stop()) is not None and waited >= TEAM_WAITED_SHARE * threads:
        return True
    if _ONE_THREAD_BEST[0]:
        return team < _ONE_THREAD_BEST[0]
    return team < ops_per_s(1, seconds)


def twice(look: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether ``look`` holds now and again BUSY_RECHECK_S later: one timing of a team beside other work varies a
    lot, so whether it is stalled, or free again, is decided on two."""
    if not look():
        return False
    sleep(BUSY_RECHECK_S)
    return look()


def most(look: Callable[[], bool], sleep: Callable[[float], None] = time.sleep, looks: int = 3) -> bool:
    """Whether ``look`` holds in most of ``looks`` looks BUSY_RECHECK_S apart, looking no more once that is settled:
    for a decision that costs minutes where one look misleads it (``twice`` costs a run's start less)."""
    needed, held, missed = looks // 2 + 1, 0, 0
    while held < needed and missed < needed:
        if held or missed:
            sleep(BUSY_RECHECK_S)
        if look():
            held += 1
        else:
            missed += 1
    return held >= needed


def exact_on(gen: Generator, threads: int) -> bool:
    """Whether ``gen``'s eager step on ``threads`` threads gives a row the same bits alone and within a batch
    (``exactness``); measured once per process, generator, weight format and thread count."""
    key = (gen.name, gen.weights, threads)
    if key not in _EXACT_ON:
        with on_threads(threads):
            _EXACT_ON[key] = exactness(gen, EagerDecoder(gen))[0]
    return _EXACT_ON[key]


def same_bits(gen: Generator, threads: int) -> bool:
    """Whether ``gen``'s eager step gives a batch the same bits on one thread as on ``threads`` threads; measured once
    per process, generator, weight format and thread count."""
    key = (gen.name, gen.weights, threads)
    if key not in _SAME_BITS:
        dec = EagerDecoder(gen)
        prefix = gen.prefill(gen.encode_prompt(PROMPT))
        logits = []
        for count in (threads, 1):
            with on_threads(count), torch.inference_mode():
                logits.append(_logits(dec, prefix, range(EXACT_ROWS), EXACT_STEPS))
        _SAME_BITS[key] = torch.equal(*logits)
        if not _SAME_BITS[key]:
            log.info("%s %s gives other bits on one thread than on %d", gen.name, gen.weights, threads)
    return _SAME_BITS[key]


def compiled_same_bits(gen: Generator, threads: int, gate: RunGate | None = None) -> bool:
    """Whether ``gen``'s compiled step built for one thread gives a batch, and the batch's rows decoded in parts
    (``EXACT_SPLITS``), the bits its step for ``threads`` threads gives the whole batch: then a run may decode on it
    without changing one candidate (and it is exact where that step is). Both steps must be saved: each is loaded
    here (seconds)."""
    dec = _compiled(gen)
    with on_threads(1):
        prefix = gen.prefill(gen.encode_prompt(PROMPT))
    with on_threads(threads), torch.inference_mode():
        dec.ready()
        whole = _logits(dec, prefix, range(EXACT_ROWS), EXACT_STEPS, gate)
    with on_threads(1), torch.inference_mode():
        dec.ready()
        one = [_logits(dec, prefix, range(EXACT_ROWS), EXACT_STEPS, gate), *_in_parts(dec, prefix, gate)]
    return all(torch.equal(whole, logits) for logits in one)


def one_thread_compiled(gen: Generator, choice: Choice | None) -> bool:
    """Whether a run of ``gen`` that starts beside other work may decode on the chosen compiled step built for one
    thread: measured to give the bits of the count the choice was measured at (``Choice.one_thread``), and saved."""
    if choice is None or choice.one_thread != "same" or (choice.weights, choice.decode) != (gen.weights, "compiled"):
        return False
    with on_threads(1):
        return compiled_state(gen) is not None


def leaves_compiled_threads(choice: Choice | None) -> bool:
    """Whether runs of this choice may leave the thread count its compiled step was built at: a choice of a compiled
    step on a CPU, measured at a thread count runs may leave (``threads_may_change``)."""
    return (choice is not None and choice.device == "cpu" and choice.decode == "compiled"
            and threads_may_change("cpu", choice.fingerprint["threads"]))


def wants_one_thread_step(choice: Choice | None, again: bool = False) -> bool:
    """Whether ``one_thread_step`` has work for this choice: a final one that ``leaves_compiled_threads``, whose step
    for one thread was not tried yet (``again``: or was, without giving the same bits)."""
    return (leaves_compiled_threads(choice) and not choice.provisional
            and (not choice.one_thread or (again and choice.one_thread != "same")))


def one_thread_step(generator: str = DEFAULT_GENERATOR, device: str | torch.device = "cpu",
                    load: Callable[..., Generator] = load_generator, builder: Callable[[str, str], bool] | None = None,
                    progress: Callable[[str], None] = log.warning, gate: RunGate | None = None,
                    again: bool = False) -> Choice | None:
    """Where this machine's choice wants it (``wants_one_thread_step``, with ``again``): build the chosen compiled step
    for one thread where it is not saved yet (``builder`` at one thread: a minute or more, on idle cores), measure
    whether it gives the bits of the count the choice was measured at (``compiled_same_bits``), and save the answer
    in the choice (``Choice.one_thread``). A run that starts beside other work then decodes on it (``run_threads``),
    with the candidates of a run on free cores, instead of on the eager step, which is slower and gives other
    candidates.
    Returns the choice (None: nothing measured here); nothing is computed while a run generates (``gate``)."""
    device = torch.device(device)
    choice = cached_choice(generator, device, decode_threads())  # the count runs take, as the app's (DecodePaths.path)
    if not wants_one_thread_step(choice, again):
        return choice
    gate = gate if gate is not None else RunGate.from_env()
    builder = builder or build_in_child
    threads, weights = choice.fingerprint["threads"], choice.weights
    quiet_token(gate)
    gen = at_idle_priority(lambda: load(generator, device=device, weights=weights))
    with on_threads(threads):
        chosen = compiled_state(gen) is not None  # else the chosen step is gone: the next probe builds it again
    with on_threads(1):
        saved = compiled_state(gen) is not None
        if chosen and not saved:
            progress(f"{weights} compiled, one thread: building its step (once on this machine; a minute or more)")
            saved = builder(generator, weights) and compiled_state(gen) is not None
    if not chosen:
        answer = f"the chosen step for {threads} threads is not saved here (python -m sbon machine --build builds it)"
    elif not saved:
        answer = "its build for one thread did not finish (python -m sbon machine --one-thread tries again)"
    else:
        quiet_token(gate)
        answer = ("same" if compiled_same_bits(gen, threads, gate)
                  else f"it gives other bits on one thread than on {threads}")
    progress(f"{weights} compiled, one thread: " + (f"the same bits as on {threads} threads: runs that start beside "
                                                    "other work decode on it" if answer == "same" else
                                                    f"not used: {answer}"))
    now = cached_choice(generator, device, threads)  # measured again meanwhile (another process): that one, untouched
    if now is not None and (now.weights, now.decode, now.provisional) == (weights, "compiled", ""):
        now.one_thread = answer
        save_choice(now)
    return now


def one_thread_same(gen: Generator, threads: int) -> bool:
    """Whether ``gen``'s eager step on one thread is exact and gives the bits it gives on ``threads`` threads (then a
    run may decode on one thread without changing one candidate)."""
    return exact_on(gen, 1) and same_bits(gen, threads)


def run_threads(gen: Generator, decode: str, threads: int, choice: Choice | None = None) -> tuple[int, str]:
    """The CPU threads and decode step a run of ``gen`` that starts now takes, where its path was measured at
    ``threads`` threads with the step ``decode`` (``choice``: the measured choice): where other work stalls the team
    of ``threads`` now (``team_held_back``, twice), one thread, on the compiled step built for one thread where the
    choice's step is compiled and that one gives its bits (``one_thread_compiled``; a compiled step keeps the thread
    count it was built at), else on the eager step where one thread gives the same candidates (``one_thread_same``);
    else ``threads`` and ``decode``. SBON_THREADS, where set, is kept as it is."""
    if not threads_may_change(gen.device, threads) or not twice(lambda: team_held_back(threads)):
        return threads, decode
    if decode in ("compiled", "auto") and one_thread_compiled(gen, choice):
        return 1, "compiled"
    if not one_thread_same(gen, threads):
        log.info("%s %s on one thread is not exact, or not the bits of %d threads: this run stays on %d beside other "
                 "work", gen.name, gen.weights, threads, threads)
        return threads, decode
    return 1, "eager"


def safe_threads(gen: Generator, threads: int) -> int:
    """The CPU threads a run of ``gen`` on the safe path (float32 op by op, before anything is measured) takes, where
    measured paths would run on ``threads``: one thread, on which float32 is exact on any CPU, where other work stalls
    the team of ``threads`` now (``team_held_back``, twice); else ``threads`` where the eager step is exact on that many
    and gives one thread's bits (``exact_on``, ``same_bits``: seconds, once per process), so the run's candidates are
    those of one thread whichever it takes. SBON_THREADS, where set, is kept as it is."""
    if not threads_may_change(gen.device, threads):
        return threads
    if twice(lambda: team_held_back(threads)):
        return 1
    return threads if exact_on(gen, threads) and same_bits(gen, threads) else 1


def threads_for_run(gen: Generator, decode: str, path: AutoPath) -> tuple[int | None, str]:
    """The CPU threads and decode step of a run of ``gen`` with auto's ``path`` that starts now, the app's and the
    command line's alike: where a path is measured, ``run_threads`` at the count it was measured at; before that, the
    safe path's (``safe_threads``), except that a forced format keeps the count the process has (None)."""
    if path.threads is not None:
        return run_threads(gen, decode, path.threads, path.choice)
    return (None if path.forced else safe_threads(gen, decode_threads())), decode


class ThreadWatch:
    """A running decode's CPU threads, looked at between its steps on the thread that decodes (``watched``): a run
    may start in a moment that misleads ``run_threads`` (the app's measuring child loading a format beside it, a
    neighbour that starts or stops during the run), and a run kept on a held-back team takes twice as long or more.

    It decodes on its ``team`` of threads while the team is free, and on one thread while other work holds it back
    (``team_held_back``), each decided on two looks in a row. A look costs WATCH_SAMPLE_S; the first comes
    WATCH_FIRST_S into the run, and each look that changes nothing doubles the wait, up to WATCH_MOST_S on the team
    and WATCH_ONE_THREAD_MOST_S on one thread (a look that leans to a change is checked again WATCH_FIRST_S later).
    The count changes only where both counts give the same bits (``counts_agree``), so no candidate changes and
    Best-of-N's twins stay the same; where they do not, it stops looking."""

    def __init__(self, gen: Generator, decode: str, team: int, choice: Choice | None = None):
        self.gen, self.decode, self.team, self.choice = gen, decode, team, choice
        self.wait, self.leaning = WATCH_FIRST_S, False
        self.next_look = time.perf_counter() + self.wait
        self.changes: list[int] = []  # the counts it changed to, in order

    def __call__(self) -> None:
        if time.perf_counter() < self.next_look:
            return
        now = torch.get_num_threads()
        wanted = 1 if team_held_back(self.team, WATCH_SAMPLE_S) else self.team
        if wanted == now:
            most = WATCH_MOST_S if now >= self.team else WATCH_ONE_THREAD_MOST_S
            self.leaning, self.wait = False, min(2 * self.wait, most)
        elif not self.leaning:
            self.leaning, self.wait = True, WATCH_FIRST_S
        elif counts_agree(self.gen, self.decode, self.team, self.choice):
            torch.set_num_threads(wanted)
            self.changes.append(wanted)
            self.leaning, self.wait = False, WATCH_FIRST_S
            log.info("%s: this run decodes on %s from here", self.gen.name, "one thread (other work holds the "
                     "cores)" if wanted == 1 else f"{wanted} threads (the cores are free again)",
                     extra={"threads": wanted})  # for whoever records the moves (the machines benchmark)
        else:
            self.next_look = float("inf")
            return
        self.next_look = time.perf_counter() + self.wait


def counts_agree(gen: Generator, decode: str, team: int, choice: Choice | None = None) -> bool:
    """Whether a run of ``gen`` on the step ``decode`` may change between one thread and ``team`` threads without
    changing one candidate: eagerly, where the step is exact on both counts and gives the same bits on both
    (``exact_on``, ``one_thread_same``: seconds, once per process); compiled, where the chosen step for one thread
    is measured to give the bits of the team's (``one_thread_compiled``) and the team's step is saved here too (a
    compiled step keeps the count it was built at, and a run never waits for a build)."""
    if decode == "eager":
        return exact_on(gen, team) and one_thread_same(gen, team)
    if not one_thread_compiled(gen, choice):
        return False
    with on_threads(team):
        return compiled_state(gen) is not None


def watch_for_run(gen: Generator, decode: str, path: AutoPath) -> ThreadWatch | None:
    """The ``ThreadWatch`` of a run of ``gen`` on the step ``decode`` with auto's ``path`` that starts now, the
    app's and the command line's alike: on a CPU, where runs may leave the count the path was measured at (before
    anything is measured: the count measured paths would run on); None where a forced format keeps its count."""
    team = path.threads if path.threads is not None else decode_threads()
    if path.forced or not threads_may_change(gen.device, team):
        return None
    return ThreadWatch(gen, decode, team, path.choice)


def watched(events: Iterator[T], watch: Callable[[], None] | None) -> Iterator[T]:
    """``events``, with ``watch`` called before each next one is computed, on the thread that computes it; closing
    this closes ``events`` (a stopped run ends there, as without the watch)."""
    if watch is None:
        yield from events
        return
    try:
        for event in events:
            yield event
            watch()
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def check_forced(generator: str, device: str | torch.device, weights: str | None = None,
                 decode: str | None = None) -> None:
    """A forced path (``weights``/``decode`` asked for, SBON_WEIGHTS/SBON_DECODE by default) that was measured and
    cannot run here is refused in one line naming the paths that can."""
    weights = weights or os.environ.get("SBON_WEIGHTS") or None
    decode = decode or os.environ.get("SBON_DECODE") or None
    if decode == "auto":
        decode = None
    if not (weights or decode):
        return
    choice = cached_choice(generator, device)
    if choice is None:
        return
    asked = [p for p in choice.paths if (weights in (None, p.weights)) and (decode in (None, p.decode))]
    if asked and all(p.problem for p in asked):
        runs = ", ".join(p.name for p in choice.paths if p.runs) or "none measured"
        name = " ".join(x for x in (weights, decode) if x)
        raise SBoNError(f"the decode path '{name}' cannot run on this machine ({asked[0].problem}): use one of "
                        f"{runs} (python -m sbon machine measures them)")
