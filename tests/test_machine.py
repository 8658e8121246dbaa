"""``auto``'s decode path chosen by measurement (sbon.machine, sbon.probe, ``python -m sbon machine``): the choice
follows the measured times and excludes a path whose coupling is not exact on a CPU; it is cached per machine and
torch version, and a choice measured elsewhere is never used; a forced path that cannot run says so in one line; under
each emulated CPU class a tiny run takes a path that runs and keeps the coupling exact."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.cpu_classes import CPU_CLASSES
from sbon.config import RunConfig
from sbon.engine import WEIGHT_FORMATS
from sbon.errors import SBoNError
from sbon.machine import (Measured, cache_key, cached_choice, choose, fingerprint, save_choice)

ROOT = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m"
CPU = fingerprint("cpu")
GPU = {**CPU, "device": "NVIDIA H100 80GB HBM3"}
NOISE = 1.05  # two steps of a committed step table closer than this are a tie it cannot order


@pytest.fixture(autouse=True)
def free_team(monkeypatch):
    """The probe's threads are free: beside the suite's other worker a measured answer could make a probe wait for
    minutes. The tests of a stalled team say so themselves (sbon.probe.TeamWait)."""
    monkeypatch.setattr("sbon.probe.team_held_back", lambda threads: False)


def timed(weights, decode, ms, exact=True, divergence=0.0):
    return Measured(weights, decode, ms={16: 2 * ms, 7: ms, 1: ms / 2}, exact=exact, divergence=divergence)


def test_the_choice_follows_the_measured_times_and_excludes_an_inexact_path_on_a_cpu():
    paths = [timed("fp32", "eager", 120.5), timed("int4", "eager", 70.0), timed("int4", "compiled", 25.7),
             timed("bf16", "eager", 10.0, exact=False, divergence=0.02)]
    choice = choose(NAME, CPU, paths)
    assert (choice.weights, choice.decode) == ("int4", "compiled")  # bf16 is faster, but not exact here
    assert choice.reason == ("int4 weights, compiled step: 25.7 ms per step at 7 rows (fp32 eager: 120.5), the "
                             "fastest exact path measured on this machine")
    assert choice.words == ("4-bit weights, compiled into one step: 25.7 ms per step for 7 candidates, the fastest "
                            "way measured on this machine that gives each candidate the same text in both methods "
                            "(full-precision numbers, one operation at a time: 120.5 ms)")  # no identifiers
    paths[1] = timed("int4", "eager", 20.0)  # the times change: so does the choice
    assert (choose(NAME, CPU, paths).weights, choose(NAME, CPU, paths).decode) == ("int4", "eager")
    # on a GPU the divergence is reported, not a rule: the fastest path, with its divergence in the reason
    gpu = choose(NAME, GPU, paths)
    assert (gpu.weights, gpu.decode) == ("bf16", "eager") and "differ by up to 0.02" in gpu.reason
    # nothing exact: no choice, and runs keep the safe path
    none = choose(NAME, CPU, [paths[3]])
    assert none.weights is None and "runs keep fp32 eager" in none.reason
    assert none.words == ("full-precision numbers, one operation at a time, exact without measuring: no way measured "
                          "here gives each candidate the same text in both methods")
    # nothing timed (the cores stayed busy: sbon.probe.STALLED): the same path, and the page says why
    untimed = choose(NAME, CPU, [Measured("int4", "eager", exact=True)], provisional="the cores were busy")
    assert untimed.weights is None and untimed.reason == (
        "no path timed here: runs keep fp32 eager (provisional: the cores were busy)")
    assert untimed.words == ("full-precision numbers, one operation at a time, exact without measuring: nothing was "
                             "timed here yet (provisional: the cores were busy)")
    # nothing ran on a GPU: runs keep what auto takes there unmeasured, bfloat16 on CUDA graphs
    assert "runs keep bf16 compiled" in choose(NAME, GPU, [Measured("bf16", "eager", problem="out of memory")]).reason


class Loaded:
    """A stand-in generator: only its weight format."""

    def __init__(self, weights):
        self.weights = weights


def stand_in_probe(monkeypatch, times, compiled_saved=(), exact=lambda weights: True, products=None):
    """sbon.probe with stand-ins for everything that needs a model: ``ready`` (a compiled step is ready where its
    format is in ``compiled_saved``, pending elsewhere) and the timing (``times``: weight format -> ms per step
    eager; ``products``: its matrix products alone, a third of that by default; a compiled step takes half the
    eager step); returns the paths timed in each timing. The thread team is free whatever runs beside the test (a
    busy neighbour would make the probe measure on one thread first): a test of a stalled team passes its TeamWait.
    Its tests take ``machine_without_choice``: the probe starts from the saved choice (its build tries), which any
    measuring on this machine before the suite (an app's start, `python -m sbon machine`) leaves in its cache."""
    from sbon.probe import PRODUCTS
    import sbon.probe as probe_module
    timed_sets = []

    def ready(gen, decode, tries=None, gate=None):
        path = Measured(gen.weights, decode)
        if decode == "compiled" and gen.weights not in compiled_saved:
            if (tries or {}).get(gen.weights, 0) >= probe_module.BUILD_TRIES:
                path.problem = "its build did not finish"
            return None, path
        path.exact, path.divergence = exact(gen.weights), 0.0
        return object(), path

    def timing(subjects, rows, gate):
        timed_sets.append([s.measured.name for s in subjects])
        for s in subjects:
            weights = s.measured.weights
            ms = ((products or {}).get(weights, times[weights] / 3) if s.measured.decode == PRODUCTS
                  else times[weights] / (2 if s.measured.decode == "compiled" else 1))
            s.measured.ms, s.measured.trusted = {r: ms for r in rows}, 3
        return ""

    monkeypatch.setattr(probe_module, "ready", ready)
    monkeypatch.setattr(probe_module, "team_held_back", lambda threads, seconds=0: False)
    return timing, timed_sets


def test_the_probe_loads_every_weight_format_and_a_failing_one_is_one_line_and_skipped(
        monkeypatch, machine_without_choice):
    from sbon.probe import probe

    def load(name, device, weights):
        if weights == "int4-bf16dot":
            raise SBoNError("int4-bf16dot needs AVX-512 BF16, which this CPU lacks")
        return Loaded(weights)

    times = {name: 50.0 + i for i, name in enumerate(WEIGHT_FORMATS)}
    times["bf16"] = 30.0
    timing, timed_sets = stand_in_probe(monkeypatch, times, compiled_saved=("bf16",))
    lines = []
    choice = probe(NAME, "cpu", load=load, save=False, progress=lines.append, timing=timing)
    assert [p.name for p in choice.paths] == [f"{w} {d}" for w in WEIGHT_FORMATS for d in ("eager", "compiled")]
    assert (choice.weights, choice.decode) == ("bf16", "compiled") and not choice.provisional
    assert "int4-bf16dot: does not load here (int4-bf16dot needs AVX-512 BF16, which this CPU lacks)" in lines
    # every ready path in one timing, the saved compiled step beside the eager ones; the unbuilt steps pending
    assert timed_sets == [["fp32 eager", "bf16 eager", "bf16 compiled",
                           *(f"{w} eager" for w in WEIGHT_FORMATS if w not in ("fp32", "bf16", "int4-bf16dot"))]]
    assert "int4 compiled" in choice.pending and "bf16 compiled" not in choice.pending


def test_a_probe_loads_each_format_at_the_lowest_priority_and_times_at_its_own(monkeypatch, machine_without_choice):
    """Loading a format times nothing, and a run the app starts meanwhile must keep its cores: the load runs only
    where nothing else wants a core (SCHED_IDLE), and so do the processes it starts (a kernel's first build: a C++
    compiler). The timing, which must not run so, runs at the probe's own priority."""
    import threading

    from sbon.probe import probe

    def policy() -> int:
        return os.sched_getscheduler(threading.get_native_id())

    seen = {}

    def load(name, device, weights):
        compiler = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                                  capture_output=True, text=True, check=True)
        seen[weights] = (policy(), int(compiler.stdout))
        return Loaded(weights)

    timing, _ = stand_in_probe(monkeypatch, {"fp32": 40.0, "int4": 20.0})

    def timed(*args):
        seen["timing"] = policy()
        return timing(*args)

    own = policy()
    assert own != os.SCHED_IDLE  # else there is nothing to tell apart
    probe(NAME, "cpu", formats=("fp32", "int4"), load=load, save=False, progress=lambda line: None, timing=timed)
    idle = (os.SCHED_IDLE, os.SCHED_IDLE)
    assert seen == {"fp32": idle, "int4": idle, "timing": own}
    assert policy() == own


def test_the_probe_builds_first_the_step_its_matrix_products_predict_fastest_and_only_those_that_can_win(
        monkeypatch, machine_without_choice):
    """The eager steps rank neither what to choose nor what to build: a format's compiled step is predicted from its
    matrix products (timed alone) plus the rest of a step as the built steps measured it. The best predicted is
    built first even where its eager step is the slowest; after it, only formats predicted within MARGIN of the
    fastest path are built (int4-bf16dot, not int4-fp32, int4-fma nor bf16), and fp32, not exact, never is. The choice is
    the fastest of what was built, saved provisional until no build is left worth beginning."""
    import sbon.probe as probe_module
    from sbon.probe import MARGIN, probe

    eager = {"fp32": 10.0, "bf16": 80.0, "int4-bf16dot": 25.0, "int4-fp32": 30.0, "int4": 40.0, "int4-fma": 35.0}
    products = {"fp32": 5.0, "bf16": 60.0, "int4": 12.0, "int4-fp32": 20.0, "int4-fma": 60.0}
    rest = 3.0  # what a compiled step takes beyond its matrix products
    best = products["int4"] + rest
    products["int4-bf16dot"] = best * (1 + MARGIN) - rest - 0.5  # predicted just within MARGIN of int4's step
    built, saved, ready_now = [], [], set()

    def builder(name, weights):
        built.append(weights)
        ready_now.add(weights)
        return weights != "int4-bf16dot"  # its build did not finish (killed, say)

    timing, timed_sets = stand_in_probe(monkeypatch, eager, compiled_saved=ready_now, products=products,
                                        exact=lambda weights: weights != "fp32")

    def timing_compiled(subjects, rows, gate):
        timing(subjects, rows, gate)
        for s in subjects:
            if s.measured.decode == "compiled":
                s.measured.ms = {r: products[s.measured.weights] + rest for r in rows}
        return ""

    monkeypatch.setattr(probe_module, "save_choice", saved.append)
    choice = probe(NAME, "cpu", build=True, formats=tuple(eager), load=lambda name, device, weights: Loaded(weights),
                   progress=lambda line: None, timing=timing_compiled, builder=builder)
    assert built == ["int4", "int4-bf16dot"]
    assert (choice.weights, choice.decode) == ("int4", "compiled") and not choice.provisional
    assert choice.tries == {"int4-bf16dot": 1}  # the build that did not finish is counted; the other is done
    # nothing was chosen before: each exact format's first look (fp32 is not exact; the last format loaded has none)
    looks = len(eager) - 2
    assert timed_sets[:looks] == [[f"{w} eager"] for w in eager if w not in ("fp32", "int4-fma")]
    # saved after each timing, before each build (its try counted) and after the failed one; before the first build
    # the prediction is a bound (three formats within it), after it a measure (one)
    assert [c.provisional for c in saved[looks:]] == ["3 compiled steps may still be built"] * 2 + [
        "1 compiled step may still be built"] * 2 + [""]
    assert {"bf16 compiled", "int4-fp32 compiled", "fp32 compiled"} <= set(choice.pending)
    assert next(p for p in choice.paths if p.name == "int4 eager").products_ms == {r: 12.0 for r in (16, 7, 1)}
    assert len(timed_sets) == looks + 2 and "int4 compiled" in timed_sets[-1]  # timed again after the build


def test_where_nothing_is_chosen_yet_runs_take_the_fastest_format_timed_so_far_while_the_others_load(
        monkeypatch, machine_without_choice):
    """A first measuring (an app's first start) loads every format before it times them all in rounds: minutes on
    two cores. Each format is timed as soon as it is loaded, and the fastest so far saved, provisional, so that a run
    that starts while the others load leaves float32 op by op, and keeps it where other work then stalls the threads
    and the probe ends. A machine that has a choice keeps it until the new one is measured: a first look at fewer
    formats must not replace it."""
    from itertools import chain, repeat

    from sbon.machine import auto_path
    from sbon.probe import MEASURING, TeamWait, probe

    times = {"fp32": 60.0, "int4": 50.0, "bf16": 40.0, "int4-fp32": 45.0}
    seen = []  # the path a run that starts as each format loads takes

    def load(name, device, weights):
        seen.append(auto_path(NAME).weights if auto_path(NAME).measured else None)
        return Loaded(weights)

    timing, timed_sets = stand_in_probe(monkeypatch, times)
    choice = probe(NAME, "cpu", formats=tuple(times), load=load, progress=lambda line: None, timing=timing)
    assert seen == [None, "fp32", "int4", "bf16"]
    assert timed_sets == [["fp32 eager"], ["int4 eager"], ["bf16 eager"], [f"{w} eager" for w in times]]
    assert (choice.weights, choice.decode) == ("bf16", "eager") and not choice.provisional
    # each first look's choice says why it is measured again
    saved = []
    monkeypatch.setattr("sbon.probe.save_choice", saved.append)
    save_choice(choose(NAME, fingerprint("cpu"), []))  # an earlier probe that timed nothing: nothing chosen
    probe(NAME, "cpu", formats=tuple(times), load=load, progress=lambda line: None, timing=timing)
    assert [c.provisional for c in saved[:3]] == [f"{k} more way{'s' * (k > 1)} of storing the weights {MEASURING}"
                                                  for k in (3, 2, 1)]
    assert [c.weights for c in saved[:3]] == ["fp32", "int4", "bf16"]
    # other work stalls the threads once the first format is loaded: the probe ends, and runs keep its first look
    save_choice(choose(NAME, fingerprint("cpu"), []))
    monkeypatch.setattr("sbon.probe.save_choice", save_choice)
    answers = chain([False], repeat(True))
    monkeypatch.setenv("SBON_THREADS", str(torch.get_num_threads()))  # no measuring on one thread first
    stopped = probe(NAME, "cpu", formats=tuple(times), load=load, progress=lambda line: None, timing=timing,
                    team=TeamWait(stalled=lambda: next(answers), sleep=lambda s: None))
    assert stopped.weights == "fp32" and MEASURING in stopped.provisional
    assert cached_choice(NAME, "cpu").to_json() == stopped.to_json()
    monkeypatch.setattr("sbon.probe.save_choice", saved.append)
    # a machine with a choice: no first look, and its runs keep that choice while the formats load
    save_choice(choose(NAME, fingerprint("cpu"), [timed("int4-fp32", "eager", 30.0)]))
    for kept in (seen, timed_sets, saved):
        kept.clear()
    probe(NAME, "cpu", formats=tuple(times), load=load, progress=lambda line: None, timing=timing)
    assert seen == ["int4-fp32"] * len(times) and timed_sets == [[f"{w} eager" for w in times]] and len(saved) == 1


def test_a_format_that_leaves_too_little_memory_free_is_left_out_in_one_line(monkeypatch, machine_without_choice):
    import psutil
    from types import SimpleNamespace

    from sbon.probe import probe

    loaded = []

    def load(name, device, weights):
        loaded.append(weights)
        return Loaded(weights)

    # the second format loaded leaves 1 GiB of 16 free
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(
        total=16 * 2 ** 30, available=(8 if len(loaded) < 2 else 1) * 2 ** 30))
    timing, _ = stand_in_probe(monkeypatch, {w: 10.0 for w in WEIGHT_FORMATS})
    lines = []
    choice = probe(NAME, "cpu", formats=("int4", "fp32"), load=load, save=False, progress=lines.append,
                   timing=timing)
    assert "fp32: left out (1.0 GiB of 16 GiB free beside the formats loaded before it)" in lines
    assert [p.problem for p in choice.paths if p.weights == "fp32"] == [
        "left out: 1.0 GiB of 16 GiB free beside the formats loaded before it"] * 2
    assert choice.weights == "int4"


def test_a_build_that_did_not_finish_twice_is_not_begun_again(monkeypatch, unmeasured_machine):
    from sbon.machine import choose, save_choice
    from sbon.probe import BUILD_TRIES, probe

    timing, _ = stand_in_probe(monkeypatch, {w: 10.0 for w in WEIGHT_FORMATS})
    save_choice(choose(NAME, fingerprint("cpu"), [], tries={"int4": BUILD_TRIES}))  # an earlier probe's tries
    built = []
    choice = probe(NAME, "cpu", build=True, formats=("fp32", "int4"), load=lambda name, device, weights: Loaded(weights),
                   progress=lambda line: None, timing=timing, builder=lambda name, weights: built.append(weights))
    assert built == ["fp32"]  # the stand-in builder returns None: not finished, counted
    assert cached_choice(NAME, "cpu").tries == {"int4": BUILD_TRIES, "fp32": 1}
    int4 = next(p for p in choice.paths if p.name == "int4 compiled")
    assert int4.problem == "its build did not finish"


def test_paths_are_timed_in_rounds_and_keep_their_best_trusted_time():
    """Rounds A B A B ...; a timing taken while the process waited for its cores is not kept where every path has
    a trusted one; a path with none makes every path keep its best of all rounds, and the timing says so."""
    from sbon.machine_load import Contention
    from sbon.probe import CONTENDED, Subject, time_paths

    order, waits = [], iter([])

    class Meter(Contention):
        def start(self):
            return self

        def stop(self):
            self.waited_cores = next(waits)
            return self.waited_cores

    def block(gen, dec, prefix, rows, timer):
        order.append(gen.weights)
        return {"a": [9.0, 4.0, 5.0, 6.0], "b": [3.0, 7.0, 8.0, 9.0]}[gen.weights][order.count(gen.weights) - 1]

    class Gen(Loaded):
        def prefill(self, ids):
            return None

        def encode_prompt(self, text):
            return []

    subjects = [Subject(Measured(w, "eager"), Gen(w), None) for w in ("a", "b")]
    # b's 3.0 ms was taken beside other work (waited 1.0 core): its trusted best is 7.0
    waits = iter([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert time_paths(subjects, rows=(2,), contention=Meter, block=block, rounds=(2, 5)) == ""
    assert order == ["a", "b", "a", "b", "a", "b"]  # interleaved; the third round gave b its second trusted one
    assert subjects[0].measured.ms == {2: 4.0} and subjects[1].measured.ms == {2: 7.0}
    assert [s.measured.trusted for s in subjects] == [3, 2]
    # b never trusted: every path keeps its best of all rounds, and the timing is not calm
    order.clear()
    waits = iter([0.0, 1.0] * 5)
    assert time_paths(subjects, rows=(2,), contention=Meter, block=block, rounds=(2, 3)) == CONTENDED
    assert subjects[0].measured.ms == {2: 4.0} and subjects[1].measured.ms == {2: 3.0} and subjects[1].measured.trusted == 0


def test_a_team_that_other_work_stalls_is_not_timed_the_probe_waits_for_it_idle_then_ends_with_what_it_had():
    """A timing taken while other work stalls the thread team measures the neighbour: it is not kept. The probe
    waits, sleeping (it takes no core), and times again once the team is free; where the team stays stalled for
    STALLED_WAIT_S in all, the timing ends at once: a path keeps what it had, and it says STALLED."""
    from sbon.machine_load import Contention
    from sbon.probe import BUSY_RECHECK_S, STALLED, STALLED_POLL_S, STALLED_WAIT_S, Subject, TeamWait, time_paths

    class Gen(Loaded):
        def prefill(self, ids):
            return None

        def encode_prompt(self, text):
            return []

    class Meter(Contention):  # the team waited for its cores at the first timing only
        def start(self):
            return self

        def stop(self):
            self.waited_cores = 1.0 if len(taken) == 1 else 0.0
            return self.waited_cores

    taken, slept = [], []

    def block(gen, dec, prefix, rows, timer):
        taken.append(gen.weights)
        return 900.0 if len(taken) == 1 else 5.0  # the first, beside the neighbour, many times slower

    # stalled after the first timing; while waiting: stalled, free but stalled again half a second later, then free
    # twice (a team that a neighbour stalls is sometimes fast in one sample)
    answers = iter([True, True, False, True, False, False])
    subjects = [Subject(Measured(w, "eager"), Gen(w), None) for w in ("a", "b")]
    assert time_paths(subjects, rows=(2,), contention=Meter, block=block, rounds=(1, 1),
                      team=TeamWait(stalled=lambda: next(answers), sleep=slept.append)) == ""
    assert slept == [STALLED_POLL_S, STALLED_POLL_S, BUSY_RECHECK_S, STALLED_POLL_S, BUSY_RECHECK_S]
    assert taken == ["a", "a", "b"]  # a timed again once the team was free
    assert [s.measured.ms for s in subjects] == [{2: 5.0}, {2: 5.0}]

    # stalled for good: the budget is slept, not spent timing; b, never timed, stays untimed, a keeps its time
    taken.clear()
    slept.clear()
    subjects[1].measured.ms = {}
    assert time_paths(subjects[::-1], rows=(2,), contention=Meter, block=block, rounds=(3, 12),
                      team=TeamWait(stalled=lambda: True, sleep=slept.append)) == STALLED
    assert taken == ["b"] and sum(slept) == STALLED_WAIT_S
    assert subjects[0].measured.ms == {2: 5.0} and subjects[1].measured.ms == {}


def test_a_probe_whose_timing_the_busy_cores_ended_builds_nothing_and_saves_a_provisional_choice(
        monkeypatch, machine_without_choice):
    """The cores stayed busy (time_paths says STALLED): nothing is built (a build beside the neighbour would take its
    cores for minutes, ranked by times that measure it), and the choice is saved provisional, so the app measures
    again later; with nothing timed, runs keep the safe path and the page says why."""
    from sbon.probe import STALLED, probe

    timing, _ = stand_in_probe(monkeypatch, {w: 10.0 for w in WEIGHT_FORMATS})
    built = []

    def load(name, device, weights):
        return Loaded(weights)

    def stalled_probe(timing):
        return probe(NAME, "cpu", build=True, formats=("fp32", "int4"), load=load, save=False,
                     progress=lambda line: None, timing=timing, builder=lambda name, w: built.append(w))

    choice = stalled_probe(lambda subjects, rows, gate: STALLED)
    assert built == [] and choice.weights is None and choice.provisional == STALLED
    assert "nothing was timed here yet" in choice.words

    def timed_then_stalled(subjects, rows, gate):  # every path timed before the cores were taken
        timing(subjects, rows, gate)
        return STALLED

    choice = stalled_probe(timed_then_stalled)
    assert built == [] and choice.weights in ("fp32", "int4") and choice.provisional == STALLED


def test_a_probe_that_starts_while_other_work_stalls_its_threads_loads_nothing_and_keeps_an_earlier_choice(
        monkeypatch, unmeasured_machine):
    """Checking a format's exactness beside the neighbour takes minutes of its cores too: a probe that starts while
    the team is stalled waits for it, asleep; where it stays stalled, nothing is loaded and the choice measured before
    stays; with none (and runs that cannot take one thread, here SBON_THREADS), one that names no path is saved,
    provisional, so that the app measures again later."""
    from sbon.probe import STALLED, STALLED_POLL_S, STALLED_WAIT_S, TeamWait, probe

    loaded, slept = [], []

    def load(name, device, weights):
        loaded.append(weights)
        return Loaded(weights)

    def stalled_probe():
        return probe(NAME, "cpu", formats=("fp32",), load=load, progress=lambda line: None,
                     team=TeamWait(stalled=lambda: True, sleep=slept.append))

    monkeypatch.setenv("SBON_THREADS", str(torch.get_num_threads()))  # no measuring on one thread first
    choice = stalled_probe()
    assert loaded == [] and slept == [STALLED_POLL_S] * int(STALLED_WAIT_S / STALLED_POLL_S)
    assert choice.weights is None and choice.provisional == STALLED and choice.paths == []
    assert cached_choice(NAME, "cpu").to_json() == choice.to_json()
    earlier = choose(NAME, fingerprint("cpu"), [timed("int4", "eager", 30.0)])
    save_choice(earlier)
    assert stalled_probe().to_json() == earlier.to_json() == cached_choice(NAME, "cpu").to_json() and loaded == []
    # stalled after the first format was checked: the second is not loaded
    from itertools import chain, repeat
    answers = chain([False], repeat(True))
    save_choice(choose(NAME, fingerprint("cpu"), []))
    choice = probe(NAME, "cpu", formats=("fp32", "int4"), load=load, progress=lambda line: None,
                   team=TeamWait(stalled=lambda: next(answers), sleep=slept.append))
    assert loaded == ["fp32"] and choice.weights is None
    loaded.clear()
    # free after a look: measured as ever
    timing, _ = stand_in_probe(monkeypatch, {"fp32": 10.0})
    answers = iter([True, False, False])
    choice = probe(NAME, "cpu", formats=("fp32",), load=load, progress=lambda line: None, timing=timing,
                   team=TeamWait(stalled=lambda: next(answers), sleep=slept.append))
    assert loaded == ["fp32"] and choice.weights == "fp32" and not choice.provisional


def test_a_probe_that_starts_while_other_work_stalls_its_threads_measures_and_builds_on_one_thread_first(
        monkeypatch, unmeasured_machine):
    """A machine with nothing chosen yet, whose thread team other work stalls: before the probe waits for the team, it
    measures and builds on one thread, the count a run takes beside the neighbour, and saves that choice, provisional.
    Until a path is chosen at the count in use, runs take it on one thread (auto_path) and the report says so. A probe
    that starts while the team is still stalled does not measure on one thread again; once the count in use has a
    path, runs take that one, on that count, except while it is provisional and measured slower per step."""
    from sbon.machine import ALONE, auto_path, on_threads
    from sbon.probe import BUSY_RECHECK_S, STALLED, TeamWait, measures_alone_first, probe, report

    saved, loaded, built, slept = [], [], [], []
    timing, _ = stand_in_probe(monkeypatch, {"fp32": 40.0, "int4": 20.0}, compiled_saved=saved)

    def load(name, device, weights):
        loaded.append((weights, torch.get_num_threads()))
        return Loaded(weights)

    def builder(name, weights):
        built.append((weights, torch.get_num_threads()))
        saved.append(weights)
        return True

    def stalled_probe():
        return probe(NAME, "cpu", build=True, formats=("fp32", "int4"), load=load, progress=lambda line: None,
                     timing=timing, builder=builder, team=TeamWait(stalled=lambda: True, sleep=slept.append))

    monkeypatch.delenv("SBON_THREADS", raising=False)
    with on_threads(2):
        for looks, alone in (([False, True, True], True), ([True, False, False], False), ([True, True], True)):
            sleeps = []  # the team stalled in most of three looks: one look that finds it free does not decide
            answers = iter(looks)
            assert measures_alone_first(NAME, torch.device("cpu"), None, TeamWait(
                stalled=lambda: next(answers), sleep=sleeps.append)) is alone
            assert sleeps == [BUSY_RECHECK_S] * (len(looks) - 1)
        path = auto_path(NAME, "cpu", 2)
        assert (path.weights, path.decode, path.threads) == ("fp32", "eager", None)  # nothing measured: the safe path
        choice = stalled_probe()
        assert loaded == [("fp32", 1), ("int4", 1)] and built == [("int4", 1)]  # then the team of two: waited for
        assert choice.weights is None and choice.provisional == STALLED and choice.fingerprint["threads"] == 2
        alone = cached_choice(NAME, "cpu", 1)
        assert (alone.weights, alone.decode, alone.provisional) == ("int4", "compiled", ALONE)
        path = auto_path(NAME, "cpu", 2)
        assert (path.weights, path.decode, path.threads, path.choice.provisional) == ("int4", "compiled", 1, ALONE)
        assert f"meanwhile, {ALONE}: int4 weights, compiled step: 10.0 ms per step" in report(choice)
        loaded.clear()
        assert stalled_probe().weights is None and loaded == []  # still stalled: one thread is measured already
        # The cores free again, the count in use is measured while its compiled steps are still built: its
        # provisional choice is taken only where its path is measured faster than the one-thread one (10 ms).
        building = "1 compiled step may still be built"
        save_choice(choose(NAME, fingerprint("cpu", 2), [timed("int4", "eager", 15.0)], provisional=building))
        path = auto_path(NAME, "cpu", 2)
        assert (path.weights, path.decode, path.threads, path.choice.provisional) == ("int4", "compiled", 1, ALONE)
        save_choice(choose(NAME, fingerprint("cpu", 2), [timed("int4", "eager", 8.0)], provisional=building))
        path = auto_path(NAME, "cpu", 2)
        assert (path.weights, path.decode, path.threads) == ("int4", "eager", 2)
        save_choice(choose(NAME, fingerprint("cpu", 2), [timed("fp32", "eager", 30.0)]))  # final, though slower
        path = auto_path(NAME, "cpu", 2)
        assert (path.weights, path.decode, path.threads) == ("fp32", "eager", 2)


def test_a_timing_a_run_started_during_is_thrown_away_and_none_is_taken_while_a_run_generates(tmp_path, monkeypatch):
    from sbon.machine_load import RunGate
    import sbon.probe as probe_module
    from sbon.probe import Subject, time_paths

    app = RunGate(tmp_path / "runs")
    probe_gate = RunGate(tmp_path / "runs")  # the child reads the same file
    assert probe_gate.token() == 0  # no file yet: no run known
    run = app.generating()
    taken = []

    class Gen(Loaded):
        def prefill(self, ids):
            return None

        def encode_prompt(self, text):
            return []

    def block(gen, dec, prefix, rows, timer):
        taken.append(probe_gate.token())
        if len(taken) == 1:
            run.__enter__()  # a run starts while the first timing goes on
        return 5.0

    slept = []

    def sleep(seconds):  # the run ends while the probe waits for it
        slept.append(seconds)
        run.__exit__(None, None, None)

    monkeypatch.setattr(probe_module.time, "sleep", sleep)
    subject = Subject(Measured("a", "eager"), Gen("a"), None)
    time_paths([subject], rows=(2,), gate=probe_gate, block=block, rounds=(1, 1))
    assert taken == [0, 1] and slept  # the first timing thrown away; the second after the run, never during it
    assert subject.measured.ms == {2: 5.0}


def test_a_run_started_during_a_check_of_a_path_s_bits_shares_the_cores_with_one_batch_of_it_at_most(gen, tmp_path,
                                                                                                    monkeypatch):
    """The probe's check of whether a path is exact (sbon.probe.exactness: batches of coupled decoding, seconds on a
    slow path) begins no batch while a run of the app generates: a run that starts during one batch has the cores to
    itself from the next on, until it ends. The answer is the one the check gives undisturbed."""
    from sbon.decoders import EagerDecoder
    from sbon.machine_load import RunGate
    import sbon.probe as probe_module
    from sbon.probe import exact_on, exactness

    app, probe_gate = RunGate(tmp_path / "runs"), RunGate(tmp_path / "runs")
    run, begun, slept = app.generating(), [], []

    class Watched(EagerDecoder):
        def start(self, *args):
            begun.append(probe_gate.token())  # None: a run generates as this batch begins
            return super().start(*args)

        def forward(self, batch, tokens):
            if len(begun) == 1 and not app.generating_now:
                run.__enter__()  # a run starts during the first batch
            return super().forward(batch, tokens)

    def sleep(seconds):  # the run ends while the probe waits for it
        slept.append(seconds)
        if app.generating_now:
            run.__exit__(None, None, None)

    monkeypatch.setattr(probe_module.time, "sleep", sleep)
    exact, _ = exactness(gen, Watched(gen), probe_gate)
    assert slept and len(begun) > 2 and None not in begun  # waited once, and every batch began with no run going
    assert exact == exact_on(gen, torch.get_num_threads())


def test_a_look_at_the_thread_team_that_a_run_began_during_does_not_count(tmp_path, monkeypatch):
    """The probe's look at its thread team (TeamWait.stalled) beside a run of the app that began during it measured
    the run, not a neighbour: it does not count, and the team is looked at again once the run ends. Else a lecturer's
    runs pressed one after another read as a busy neighbour, and the probe measures and builds on one thread first."""
    from sbon.machine_load import RunGate
    import sbon.probe as probe_module
    from sbon.probe import TeamWait

    app = RunGate(tmp_path / "runs")
    run, looks, slept = app.generating(), [], []

    def look():  # the first look: a run starts during it and holds the cores; the second: nothing else runs
        looks.append(len(looks))
        if len(looks) == 1:
            run.__enter__()
        return len(looks) == 1

    def sleep(seconds):  # the run ends while the probe waits for it
        slept.append(seconds)
        run.__exit__(None, None, None)

    monkeypatch.setattr(probe_module.time, "sleep", sleep)
    assert TeamWait(RunGate(tmp_path / "runs"), stalled=look, sleep=sleep).stalled() is False
    assert looks == [0, 1] and slept  # looked again, after the run


def test_waiting_for_a_core_is_measured():
    """Three busy processes on this process's first core, and this thread timing a busy loop there: its threads
    waited for the core for most of the timing (the contention measure reads the kernel's run-queue delays)."""
    from sbon.machine_load import Contention, _threads_waited

    if _threads_waited() is None:
        pytest.skip("this kernel keeps no run-queue delays per thread")
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spin = "import os, time\nos.sched_setaffinity(0, {%d})\nend = time.time() + 5\nwhile time.time() < end: pass\n" % core
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3)]
    try:
        os.sched_setaffinity(0, {core})
        import time
        time.sleep(0.5)
        meter = Contention().start()
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
        assert meter.stop() > 0.3 and not meter.trusted
    finally:
        os.sched_setaffinity(0, before)
        for p in busy:
            p.kill()
            p.wait()


def test_block_ms_comes_from_the_timer(gen):
    """The real step, timed by a stand-in clock that advances 5 ms per reading: 5 ms per step."""
    from sbon.decoders import EagerDecoder
    from sbon.probe import block_ms

    clock = iter(range(10_000))
    prefix = gen.prefill(gen.encode_prompt("Hi"))
    assert block_ms(gen, EagerDecoder(gen), prefix, 3, timer=lambda: 0.005 * next(clock)) == pytest.approx(5.0)


def test_the_cache_key_changes_with_the_machine_the_limits_the_threads_and_torch(monkeypatch):
    base = cache_key(fingerprint("cpu", threads=2))
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert cache_key(fingerprint("cpu", threads=2)) != base
    monkeypatch.undo()
    assert cache_key(fingerprint("cpu", threads=2)) == base
    assert cache_key(fingerprint("cpu", threads=1)) != base
    # a limit other than the one in force (the suite may itself run under an emulated class's limit)
    other = "AVX2" if os.environ.get("ONEDNN_MAX_CPU_ISA") != "AVX2" else "AVX512_CORE_VNNI"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", other)
    assert cache_key(fingerprint("cpu", threads=2)) != base
    monkeypatch.undo()
    monkeypatch.setattr("sbon.machine.cpu_model", lambda: "Intel(R) Xeon(R) Platinum 8375C")
    assert cache_key(fingerprint("cpu", threads=2)) != base


def test_a_choice_cached_on_another_machine_torch_or_set_of_formats_is_never_used(unmeasured_machine, monkeypatch):
    from sbon.machine import choice_path
    from sbon.models import default_weights

    assert cached_choice(NAME, "cpu") is None and default_weights(torch.device("cpu"), NAME) == "fp32"  # the safe path
    here = choose(NAME, fingerprint("cpu"), [timed("int4", "eager", 20.0), timed("fp32", "eager", 50.0)])
    save_choice(here)
    assert cached_choice(NAME, "cpu").weights == "int4" and default_weights(torch.device("cpu"), NAME) == "int4"
    # the same file name with another machine's fingerprint inside (copied over): not used
    path = choice_path(NAME, fingerprint("cpu"))
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "fingerprint": {**data["fingerprint"], "torch": "2.0.0"}}))
    assert cached_choice(NAME, "cpu") is None and default_weights(torch.device("cpu"), NAME) == "fp32"
    # a choice measured under other instruction-set limits is in its own file, never read here
    save_choice(choose(NAME, {**fingerprint("cpu"), "limits": {"ATEN_CPU_CAPABILITY": "avx2"}},
                       [timed("bf16", "eager", 5.0)]))
    assert cached_choice(NAME, "cpu") is None
    # and so is one measured before a weight format was added: it is measured again, with it
    save_choice(here)
    assert cached_choice(NAME, "cpu").weights == "int4"
    monkeypatch.setitem(WEIGHT_FORMATS, "int4-new", WEIGHT_FORMATS["int4"])
    assert cached_choice(NAME, "cpu") is None and default_weights(torch.device("cpu"), NAME) == "fp32"


def test_the_command_line_and_the_library_decode_on_the_measured_path_by_default(unmeasured_machine):
    """Unless told otherwise a run decodes on auto's path, as the app's do: op by op before anything is measured,
    the compiled step once the measured choice is it (the weights already followed the choice; the step did not)."""
    from sbon.cli import build_parser, run_config
    from sbon.decoders import CompiledDecoder, EagerDecoder, decoder
    from sbon.models import load_generator

    config = run_config(build_parser().parse_args(["run"]))
    gen = load_generator(NAME, device="cpu")
    assert gen.weights == "fp32" and isinstance(decoder(gen, config.decode), EagerDecoder)
    save_choice(choose(NAME, fingerprint("cpu"), [timed("fp32", "eager", 50.0), timed("int4", "eager", 20.0),
                                                  timed("int4", "compiled", 10.0)]))
    gen = load_generator(NAME, device="cpu")
    assert gen.weights == "int4"
    assert isinstance(decoder(gen, config.decode), CompiledDecoder)
    assert isinstance(decoder(gen, RunConfig().decode), CompiledDecoder)


def test_the_command_line_starts_a_run_on_the_app_s_threads(gen_fp32, unmeasured_machine, monkeypatch, tmp_path,
                                                            capsys):
    """``python -m sbon run`` takes the app's thread rule (sbon.machine.start_threads, sbon.probe.run_threads and
    safe_threads): on a two-core machine where nothing is measured, float32 op by op on two threads where they are
    free and give one thread's bits, else on one; SBON_THREADS where set; once a path is measured, the count it was
    measured at, or one thread and the eager step, with one line saying why, where other work holds the cores at the
    run's start."""
    from sbon import probe
    from sbon.cli import main
    from sbon.results import RunResult

    monkeypatch.delenv("SBON_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr("sbon.machine.TORCH_THREADS", 2)  # a fresh process's count (the suite's workers have one)
    monkeypatch.setattr(probe, "one_thread_same", lambda gen, threads: True)
    before, out = torch.get_num_threads(), tmp_path / "run.json"

    def run(stalled=False):
        monkeypatch.setattr(probe, "team_held_back", lambda threads, seconds=None: stalled)
        try:
            assert main(["run", "--method", "bon", "--n", "2", "--max-new-tokens", "2", "--reward", "likelihood",
                         "--out", str(out)]) == 0
        finally:
            torch.set_num_threads(before)
        result = RunResult.from_json(out.read_text())
        return (result.threads, result.weights, result.decode), capsys.readouterr().err

    two = 2 if probe.exact_on(gen_fp32, 2) and probe.same_bits(gen_fp32, 2) else 1  # measured here
    assert run()[0] == (two, "fp32", "eager")  # nothing measured: float32 op by op, on free cores
    assert run(stalled=True)[0] == (1, "fp32", "eager")  # ... and on one thread beside other work
    monkeypatch.setenv("SBON_THREADS", "2")
    assert run(stalled=True)[0] == (2, "fp32", "eager")  # a count asked for is kept
    monkeypatch.delenv("SBON_THREADS")
    save_choice(choose(NAME, fingerprint("cpu", 2), [timed("fp32", "eager", 50.0), timed("int4", "eager", 20.0)]))
    assert run()[0] == (2, "int4", "eager")  # the measured path, on the count it was measured at
    busy, said = run(stalled=True)
    assert busy == (1, "int4", "eager") and "other work holds this machine's cores" in said


def test_a_forced_path_that_cannot_run_here_says_so_in_one_line(unmeasured_machine, monkeypatch, capsys):
    from sbon.cli import main
    from sbon.probe import check_forced

    paths = [timed("fp32", "eager", 50.0), timed("int4", "eager", 20.0),
             Measured("int4", "compiled", problem="no C++ compiler for torch.compile's CPU kernels (install g++)"),
             Measured("int4-bf16dot", "eager", problem="does not load here: this CPU has no AVX-512 BF16"),
             Measured("int4-bf16dot", "compiled", problem="does not load here: this CPU has no AVX-512 BF16")]
    save_choice(choose(NAME, fingerprint("cpu"), paths))
    check_forced(NAME, "cpu", "int4", "eager")  # runs here: nothing to say
    monkeypatch.setenv("SBON_WEIGHTS", "int4-bf16dot")
    with pytest.raises(SBoNError) as refused:
        check_forced(NAME, "cpu")
    assert str(refused.value) == ("the decode path 'int4-bf16dot' cannot run on this machine (does not load here: "
                                  "this CPU has no AVX-512 BF16): use one of fp32 eager, int4 eager (python -m sbon "
                                  "machine measures them)")
    monkeypatch.delenv("SBON_WEIGHTS")
    assert main(["run", "--weights", "int4", "--decode", "compiled", "--n", "2", "--max-new-tokens", "2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the decode path 'int4 compiled' cannot run on this machine (no C++ compiler")


def test_python_m_sbon_machine_prints_the_fingerprint_every_path_and_the_choice(unmeasured_machine):
    """The real probe, two formats, one row count: eager paths timed and checked in seconds, compiled ones pending."""
    from sbon.probe import probe, report

    import re
    from functools import partial

    from sbon.probe import time_paths

    choice = probe(NAME, "cpu", formats=("fp32", "int4"), rows=(2,), progress=lambda line: None,
                   timing=partial(time_paths, rounds=(1, 2)))
    text = report(choice)
    assert f"cache key {choice.key}" in text and f"threads: {torch.get_num_threads()}" in text
    assert re.search(r"int4 eager: [0-9.]+ ms at 2 rows( \(timed beside other work\))?; (NOT )?exact", text)
    assert "int4 compiled: not built yet" in text
    assert bool(choice.provisional) == ("provisional: " in text) == any(p.trusted == 0 for p in choice.paths if p.ms)
    eager = {p.weights: p for p in choice.paths if p.decode == "eager"}
    assert eager["int4"].exact is not None and eager["fp32"].exact is not None
    assert cached_choice(NAME, "cpu").to_json() == choice.to_json()  # saved under this machine's key
    if choice.weights:
        assert choice.decode == "eager" and eager[choice.weights].exact and f"choice: {choice.reason}" in text


# The classes this CPU emulates, with the limits `python -m benchmarks machines` uses (benchmarks/cpu_classes.py).
EMULATED = {name: cls for name, cls in CPU_CLASSES.items() if not cls.bf16}
TINY_RUN = r"""
import json, sys, torch
torch.set_num_threads(1)
from sbon.algorithms import RunConfig, events, run
from sbon.analysis.comparison import ComparisonDone, comparison_events
from sbon.algorithms import drive
from sbon.models import default_weights, load_generator, load_reward
from sbon.probe import TeamWait, probe, time_paths
loaded = {}  # the probe's generators, kept for the reference run below (a load is seconds)
def load(name, device, weights):
    if weights not in loaded:
        loaded[weights] = load_generator(name, device=device, weights=weights)
    return loaded[weights]
# one round, and no wait for a stalled team: what this test checks (which paths are exact, and that the chosen one
# keeps the coupling) does not depend on the times, and beside the suite's other worker the rounds would never be
# trusted (then: 90 s of them)
choice = probe("smollm2-135m", "cpu", formats=("fp32", "int4"), rows=(2,), load=load, progress=lambda line: None,
               timing=lambda subjects, rows, gate: time_paths(subjects, rows, gate, rounds=(1, 1),
                                                              team=TeamWait(stalled=lambda: False)),
               team=TeamWait(stalled=lambda: False))
# the format a load without one takes (sbon.models.default_weights): the measured choice's; the probe loaded it already
gen = load("smollm2-135m", "cpu", default_weights(torch.device("cpu"), "smollm2-135m"))
reward = load_reward("likelihood", generator=gen)
budget = 4 * (len(gen.encode_prompt("Hi")) + 4)
config = RunConfig(method="sbon", n=4, alpha=0.5, max_new_tokens=8, kv_budget=budget, decode="auto", seed=3)
comp = drive(comparison_events(gen, reward, "Hi", config, taus=[4]), ComparisonDone).comparison
ref = loaded["fp32"]
ref_run = gen.weights == "fp32" and run(events(ref, load_reward("likelihood", generator=ref), "Hi",
                                               config.replace(decode="eager", method="bon", kv_budget=None)))
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "weights": gen.weights,
                  "chosen": [choice.weights, choice.decode], "decode": comp.speculative.decode,
                  "exact": {p.weights: p.exact for p in choice.paths if p.decode == "eager"},
                  "sbon": {c.id: c.token_ids for c in comp.speculative.candidates},
                  "bon": {c.id: c.token_ids for c in comp.bon.candidates},
                  "fp32": ref_run and {c.id: c.token_ids for c in ref_run.candidates}}))
"""


@pytest.mark.parametrize("cls", list(EMULATED))
def test_under_each_emulated_cpu_class_a_tiny_run_takes_a_measured_path_that_keeps_the_coupling(cls, unmeasured_machine):
    """A fresh process under the class's instruction-set limits: the limit holds (torch's capability, oneDNN's ISA),
    the probe excludes what is not exact there, and a tiny comparison on the chosen path runs with every survivor's
    tokens those of Best-of-N's same candidate; on the float32 path, those of eager float32."""
    if EMULATED[cls].capability != "AVX2" and torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip(f"this CPU (or the class it emulates) has no AVX-512 to emulate {cls} with")
    env = {**EMULATED[cls].environ(), "SBON_CACHE": str(unmeasured_machine), "OMP_NUM_THREADS": "1",
           "ONEDNN_VERBOSE": "1"}
    done = subprocess.run([sys.executable, "-c", TINY_RUN], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    isa = {line.split("isa:", 1)[1] for line in done.stdout.splitlines() if "isa:" in line}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if EMULATED[cls].capability == "AVX2":
        assert out["capability"] == "AVX2"
    else:
        assert out["capability"] == "AVX512" and isa and not any("bfloat16" in i for i in isa)
    if out["chosen"][0] is not None:
        assert out["exact"][out["chosen"][0]] is True and out["weights"] == out["chosen"][0]
    assert out["decode"] == "eager"  # nothing compiled in a fresh cache
    survivors = [k for k in out["sbon"] if len(out["sbon"][k]) == len(out["bon"][k])]
    assert survivors and all(out["sbon"][k] == out["bon"][k] for k in survivors)
    if out["weights"] == "fp32":
        assert out["bon"] == out["fp32"]


def test_a_half_written_choice_is_ignored_in_one_line_and_measured_again(unmeasured_machine, caplog, monkeypatch):
    """A choice file cut short (a process killed while writing it elsewhere, a full disk): not used, one logged line
    however often it is asked, and the app's decode paths start measuring again."""
    import logging

    from components.decode_paths import DecodePaths
    from sbon.machine import choice_path, decode_threads

    choice = choose(NAME, fingerprint("cpu", decode_threads()), [timed("int4", "eager", 20.0)])
    path = save_choice(choice)
    assert path == choice_path(NAME, fingerprint("cpu", decode_threads()))
    path.write_text(choice.to_json()[:100])
    with caplog.at_level(logging.WARNING, logger="sbon.machine"):
        assert cached_choice(NAME, "cpu", decode_threads()) is None
        assert cached_choice(NAME, "cpu", decode_threads()) is None
    assert len([r for r in caplog.records if r.name == "sbon.machine"]) == 1
    started = []
    monkeypatch.setattr("components.decode_paths._measure_in_child",
                        lambda name, gate, one_thread=False: started.append(name))
    steps = DecodePaths()
    steps._measure(NAME)
    assert started == [NAME] and steps.path(NAME).weights == "fp32"  # the safe path meanwhile


def test_a_run_gate_is_removed_with_its_process_and_gates_of_ended_processes_are_swept(tmp_path):
    import subprocess
    import sys
    from sbon.machine_load import RunGate

    code = ("import sys\nfrom sbon.machine_load import RunGate\n"
            "gate = RunGate.of_this_process(sys.argv[1])\n"
            "with gate.generating():\n    print(gate.path.name, RunGate(gate.path).token())\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    name, token = done.stdout.split()
    assert name.startswith("runs-") and token == "None"  # its file said a run was generating ...
    assert not list(tmp_path.glob("runs-*"))  # ... and is gone with the process
    # a gate left by a process killed before it could remove it: swept by the next start; a live one's stays
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f"runs-{ended.stdout.strip()}").write_text("1 1")
    (tmp_path / f"runs-{os.getppid()}").write_text("0 3")
    mine = RunGate.of_this_process(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("runs-*")) == [f"runs-{os.getppid()}"]
    assert mine.path.name == f"runs-{os.getpid()}" and mine.token() == 0


def _alive(pid: int) -> bool:
    """The process runs (a zombie left for a parent that never waits for it has ended)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_child_that_measures_or_builds_outlives_the_thread_that_started_it_and_ends_with_its_process():
    """The app starts its measuring child from a web server's handler thread, which ends once idle: the child must go
    on (a build is minutes long), and end only with the app."""
    import threading
    import time
    from sbon.probe import PARENT_POLL_S, child_argv

    ready = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    box = {}

    def handler():  # starts the child, waits until its code runs, then ends as an idle handler thread does
        box["child"] = subprocess.Popen(child_argv(ready), stdout=subprocess.PIPE, text=True)
        assert box["child"].stdout.readline().strip() == "ready"

    thread = threading.Thread(target=handler)
    thread.start()
    thread.join()
    time.sleep(2 * PARENT_POLL_S)
    child = box["child"]
    try:
        assert child.poll() is None, f"the child ended with the thread that started it (exit status {child.returncode})"
    finally:
        child.kill()
        child.wait()
    # a process that starts such a child and is killed: its child ends too, within a few of its looks
    code = ("import os, subprocess, sys\nfrom sbon.probe import child_argv\n"
            f"child = subprocess.Popen(child_argv({ready!r}), stdout=subprocess.PIPE, text=True)\n"
            "child.stdout.readline()\nprint(child.pid, flush=True)\nos.kill(os.getpid(), 9)\n")
    parent = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    grandchild = int(parent.stdout.split()[0])
    deadline = time.time() + 20 * PARENT_POLL_S
    while _alive(grandchild) and time.time() < deadline:
        time.sleep(PARENT_POLL_S / 5)
    assert not _alive(grandchild), "the child lived on after its process was killed"


def step_table(cls: str) -> tuple[dict, dict[str, dict[int, dict]]]:
    """A CPU class's committed machines record, and its step table's rows by path name and row count."""
    record = json.loads((ROOT / "benchmarks/results/cpu-2core-epyc/machines" / f"{cls}.json").read_text())
    rows: dict[str, dict[int, dict]] = {}
    for r in record["table"]:
        rows.setdefault(r["format"], {})[r["rows"]] = r
    return record, rows


@pytest.mark.parametrize("cls", list(CPU_CLASSES))
def test_the_step_tables_noise_bound_holds_on_every_measured_cpu_class(cls):
    """NOISE, the bound the build rule's test allows, is within the table's own repeat noise: one compiled step
    measured with and without its guards (the same kernels), averaged over the row counts as that test does, differs
    by less."""
    _, rows = step_table(cls)
    ms = {name: [r["ms_per_step"] for r in by.values()] for name, by in rows.items()}
    twins = [(statistics.mean(ms[f]), statistics.mean(ms[f + ", guards skipped"]))
             for f in ms if f.endswith(" compiled") and f + ", guards skipped" in ms]
    assert twins
    assert max(max(a, b) / min(a, b) for a, b in twins) <= NOISE


@pytest.mark.parametrize("cls", list(CPU_CLASSES))
def test_on_every_measured_cpu_class_the_first_build_is_the_fastest_compiled_step_or_ties_it(cls):
    """The build rule (sbon.probe.to_build) on each CPU class's committed step table (benchmarks machines: every
    format's eager step, its compiled step and its matrix products alone, measured in one run): the first build is
    the step that was fastest or one the table cannot tell from it (NOISE), no format slower than the rule's margin
    behind the fastest is built, and the chosen step is within NOISE of the fastest; so is the page-default
    comparison on the app's path, against it on each other exact compiled step."""
    from sbon.machine import Measured
    from sbon.probe import MARGIN, to_build

    record, rows = step_table(cls)
    exact = {f for f, d in record["divergence"].items() if d["rate"] == 0}
    compiled = {name.split()[0]: {n: r["ms_per_step"] for n, r in by.items()}
                for name, by in rows.items() if name.endswith(" compiled")}
    paths = []
    for name, by in rows.items():
        weights = name.split()[0]
        if name.endswith("decode-attn"):
            paths.append(Measured(weights, "eager", {n: r["ms_per_step"] for n, r in by.items()},
                                  exact=weights in exact, products_ms={n: r["linear_ms"] for n, r in by.items()}))
            paths.append(Measured(weights, "compiled", problem=None if weights in compiled else "not measured"))
    mean = {w: sum(ms.values()) / len(ms) for w, ms in compiled.items() if w in exact}
    built = []
    while todo := [w for w in to_build(paths, {}) if w not in built]:
        built.append(todo[0])
        step = next(p for p in paths if (p.weights, p.decode) == (todo[0], "compiled"))
        step.ms, step.exact = compiled[todo[0]], True
    assert len(mean) >= 2  # a choice to make
    assert mean[built[0]] <= NOISE * min(mean.values()), (built, mean)
    # a build is worth its minutes: no format the table puts slower than the rule's margin (and the table's noise)
    # behind the fastest is built
    assert all(mean[w] <= (1 + MARGIN) * NOISE * min(mean.values()) for w in built), (built, mean)
    assert min(mean[w] for w in built) <= NOISE * min(mean.values())
    # the page-default comparison on the app's path against it on every other exact compiled step (--every-path)
    others = [statistics.median(r["seconds"]) for r in record["compare_every_path"].values()]
    assert others and statistics.median(record["compare"]["seconds"]) <= NOISE * min(others)
