"""How the app's runs decode (SBON_DECODE, components.decode_paths.DecodePaths): by default on the path a child process
measured fastest (and exact) on this machine, with its compiled step once the child has built it, on the safe path
until then; a run records the path it took.

The test suite itself runs the app eagerly (tests/conftest.py sets SBON_DECODE): the default would start measuring
and a minute-long build beside the tests. The last test here builds the step for real and is in `-m compile`."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from components.decode_paths import DecodePaths, app_decode
from components.model_cache import ModelCache
from sbon.models import generator_title
from sbon.decoders import compiled_state
from sbon.errors import SBoNError
from sbon.models import load_generator

ROOT = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def gen_int4():
    return load_generator(NAME, device="cpu", weights="int4")


def test_sbon_decode_forces_a_path_and_a_mistyped_one_stops_the_app_in_one_line(monkeypatch, gen_int4):
    steps = DecodePaths()
    monkeypatch.setenv("SBON_DECODE", "eager")
    assert steps.decode(NAME, gen_int4) == "eager" and not steps._children
    monkeypatch.setenv("SBON_DECODE", "fast")
    with pytest.raises(SBoNError, match="unknown decode 'fast'"):
        app_decode()
    done = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env={**os.environ, "SBON_DECODE": "fast"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "SBON_DECODE: unknown decode 'fast': use one of auto, eager, compiled"]


def save(choice_paths, name=NAME, provisional=""):
    from sbon.machine import choose, decode_threads, fingerprint, save_choice
    return save_choice(choose(name, fingerprint("cpu", decode_threads()), choice_paths, provisional=provisional))


def measured(weights, decode, ms, exact=True):
    from sbon.machine import Measured
    return Measured(weights, decode, ms={7: ms}, exact=exact)


def test_auto_measures_in_one_child_and_runs_the_safe_path_meanwhile_and_after_it_is_killed(
        gen_fp32, unmeasured_machine, caplog):
    gen = gen_fp32  # the safe path's format, exact without measuring
    steps = DecodePaths()
    try:
        assert steps.decode(NAME, gen) == "eager"
        child = steps._children[NAME]
        assert steps.decode(NAME, gen) == "eager" and steps._children[NAME] is child  # one child, not two
        # it reads the runs' gate, so it times nothing while a run generates here
        # (read again while empty: Popen returns as the child's exec closes its pipe, before the kernel has set the
        # new program's environment, and a busy machine can leave the child there for a while)
        environ, deadline = [b""], time.monotonic() + 10
        while environ == [b""] and time.monotonic() < deadline:
            environ = Path(f"/proc/{child.pid}/environ").read_bytes().split(b"\0")
            time.sleep(0.05)
        assert f"SBON_RUN_GATE={steps.gate.path}".encode() in environ
        assert steps.status(NAME).startswith(f"⚙ {generator_title(NAME)}: measuring how fast each way of decoding "
                                             "runs on this machine in the background") and \
            "full-precision numbers, one operation at a time, exact without measuring" in steps.status(NAME)
        # after a line that named the generator, the only one loaded, the line does not name it again
        assert steps.status(NAME, alone=True).startswith("⚙ Measuring how fast each way of decoding runs on this machine")
    finally:
        child.kill()
        child.wait()
    # A child that ended without a choice (killed): runs stay on the safe path, one logged line, the page says why,
    # no second child.
    import logging
    with caplog.at_level(logging.WARNING, logger="components.decode_paths"):
        assert steps.decode(NAME, gen) == "eager" and steps._children[NAME] is child
        assert steps.decode(NAME, gen) == "eager" and steps._children[NAME] is child
    assert [r.getMessage() for r in caplog.records if r.name == "components.decode_paths"] == [
        f"measuring {NAME}'s decode paths stopped (exit status -9): runs keep fp32 eager"]
    assert "measuring how fast each way of decoding runs here failed" in steps.status(NAME)


def test_a_forced_decode_path_leaves_a_provisional_choice_unmeasured(unmeasured_machine, monkeypatch):
    """SBON_DECODE forces every run's decode path: a provisional choice an earlier start left (its measuring cut short)
    is not measured again when the model line refreshes, so no measuring and no build takes the cores beside the runs.
    With auto, the same refresh starts the child."""
    started = []
    monkeypatch.setattr("components.decode_paths._measure_in_child", lambda name, gate, one_thread=False:
                        started.append(name) or SimpleNamespace(poll=lambda: None, returncode=None))
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)],
         provisional="other work used the cores while the paths were timed")
    steps = DecodePaths()
    monkeypatch.setenv("SBON_DECODE", "eager")
    assert steps.status(NAME).startswith(f"{generator_title(NAME)} decodes with 4-bit weights, one operation at a time")
    assert started == [] and steps.settled(NAME)
    monkeypatch.setenv("SBON_DECODE", "auto")
    assert steps.status(NAME).startswith(f"⚙ {generator_title(NAME)}: ") and started == [NAME]  # in the background


def test_the_model_line_says_a_provisional_choice_is_measured_again_then_that_its_steps_are_compiled(
        unmeasured_machine, monkeypatch):
    """A child started for a provisional choice first times every path again, then builds: the model line says which,
    from whether the child has saved a choice since it started (it saves after timing). A first measuring's look at
    the formats loaded so far (sbon.probe.MEASURING) is still measuring, with the path runs take meanwhile."""
    import time

    from sbon.probe import MEASURING

    class Running:  # a child that is still running
        returncode = None

        def poll(self):
            return None

    monkeypatch.setattr("components.decode_paths._measure_in_child", lambda name, gate, one_thread=False: Running())
    path = save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)],
                provisional="other work used the cores while the paths were timed")
    os.utime(path, (time.time() - 60, time.time() - 60))  # saved by an earlier start
    steps = DecodePaths()
    assert steps.status(NAME).startswith(f"⚙ {generator_title(NAME)}: measuring again how fast each way of decoding "
                                         "runs here in the background")
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 40.0)], provisional="1 compiled step may still "
         "be built")  # the child's own timing, saved
    assert steps.status(NAME, alone=True).startswith("⚙ Compiling its fastest ways of decoding in the background")
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 40.0)], provisional=f"5 more ways of storing "
         f"the weights {MEASURING}")  # a first measuring's look at the two formats it loaded so far
    line = steps.status(NAME, alone=True)
    assert line.startswith("⚙ Measuring how fast each way of decoding runs on this machine in the background") and \
        "runs go first and meanwhile use 4-bit weights, one operation at a time)." in line


def test_auto_takes_the_measured_choice_and_its_compiled_step_only_once_built(gen_int4, unmeasured_machine,
                                                                              monkeypatch):
    monkeypatch.setattr("components.decode_paths._measure_in_child",  # a child for the step for one thread, ended
                        lambda name, gate, one_thread=False: SimpleNamespace(poll=lambda: 0, returncode=0))
    steps = DecodePaths()
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)])  # nothing compiled was measured
    assert steps.decode(NAME, gen_int4) == "eager" and NAME not in steps._children  # measured: no child
    assert steps.status(NAME).startswith(f"{generator_title(NAME)} decodes with 4-bit weights, one operation at a time: "
                                         "50.0 ms per step for 7 candidates")
    assert steps.status(NAME, alone=True).startswith("It decodes with 4-bit weights, one operation at a time: ")
    # a finished run's status line names its path in the model line's words
    from components import runs
    from sbon.results import RunResult
    run = RunResult(method="sbon", prompt="Hi", generator=NAME, reward="minilm-pref", settings={}, prompt_tokens=1,
                    candidates=[], weights="int4", decode="eager")
    assert runs.decoded(run) == "decoded with 4-bit weights, one operation at a time"
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0), measured("int4", "compiled", 20.0)])
    assert compiled_state(gen_int4) is None  # chosen, but its step is not saved on this machine: eager
    assert steps.decode(NAME, gen_int4) == "eager"


def test_a_machine_that_never_saved_a_step_does_not_name_one(gen_int4, unmeasured_machine, monkeypatch):
    """Naming the saved step builds the attention kernel where it is not built yet and hashes the weights (seconds on
    a fresh machine, before its first run): a cache without any saved step answers without naming one."""
    named = []
    monkeypatch.setattr("sbon.aot_step.step_key", lambda gen, options, threads=None: named.append(gen.weights) or "another-step")
    assert compiled_state(gen_int4) is None and named == []
    saved = unmeasured_machine / "inductor" / "sbon-step"  # where this machine's steps are (its inductor cache)
    saved.mkdir(parents=True)
    (saved / "another-step.pt").touch()
    assert compiled_state(gen_int4) == "saved" and named == ["int4"]
    (saved / "another-step.pt").rename(saved / "a-third-step.pt")
    assert compiled_state(gen_int4) is None and named == ["int4", "int4"]



def test_the_path_is_settled_only_once_a_final_choice_is_measured_and_no_child_measures_or_builds(
        unmeasured_machine, monkeypatch):
    """Whether later runs decode as one starting now (what the page says before "Press Run to reproduce"): not while
    nothing is measured, a choice is provisional, or a child measures or builds; yes once a choice is final and its
    child has ended, once measuring has failed (runs keep the safe path), or where the path is forced."""
    class Child:
        returncode = None

        def poll(self):
            return self.returncode

    child = Child()
    monkeypatch.setattr("components.decode_paths._measure_in_child", lambda name, gate, one_thread=False: child)
    steps = DecodePaths()
    assert not steps.settled(NAME)  # nothing measured yet: a child will measure
    steps._measure(NAME)
    assert not steps.settled(NAME)  # measuring
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)], provisional="1 compiled step may still "
         "be built")
    assert not steps.settled(NAME)  # saved, still building
    child.returncode = 0
    assert not steps.settled(NAME)  # ended with a provisional choice: measured again later
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)])
    assert steps.settled(NAME)
    monkeypatch.setenv("SBON_DECODE", "eager")
    assert steps.settled(NAME)
    failed = DecodePaths()  # a machine where measuring failed: no choice, runs stay on the safe path
    monkeypatch.setenv("SBON_CACHE", str(unmeasured_machine / "elsewhere"))
    monkeypatch.delenv("SBON_DECODE")
    child.returncode = 1
    failed._measure(NAME)
    assert failed.choice(NAME) is None and failed.settled(NAME)


def test_a_forced_path_is_the_one_the_model_line_names(gen_int4, unmeasured_machine, monkeypatch):
    monkeypatch.setattr("components.decode_paths._measure_in_child",  # a child for the step for one thread, ended
                        lambda name, gate, one_thread=False: SimpleNamespace(poll=lambda: 0, returncode=0))
    steps = DecodePaths()
    save([measured("fp32", "eager", 100.0), measured("int4", "compiled", 20.0)])
    assert "compiled" in steps.status(NAME) and "SBON_" not in steps.status(NAME)
    monkeypatch.setenv("SBON_DECODE", "eager")  # the runs then decode op by op, whatever was measured fastest
    assert steps.decode(NAME, gen_int4) == "eager"
    assert steps.status(NAME) == f"{generator_title(NAME)} decodes with 4-bit weights, one operation at a time, " \
                                 "as this app was started to."


def test_the_model_cache_loads_the_measured_format_and_switches_at_the_next_load(unmeasured_machine, monkeypatch):
    """Loaded before anything is measured: the safe format; once a choice names another, the next get (a run's
    start, never a run midway) loads the generator in that format, and drops the rewards that score with it."""
    import components.model_cache as mc

    class Fake:
        device = torch.device("cpu")

        def __init__(self, weights):
            self.weights = weights

    loads = []

    def load_gen(name, device, weights="fp32"):
        loads.append(weights)
        return Fake(weights)

    monkeypatch.setattr(mc, "_warm_up", lambda gen: None)
    monkeypatch.setattr(DecodePaths, "_measure", lambda self, name: None)  # no child here
    cache = ModelCache(load_gen=load_gen, load_rew=lambda name, generator, device: ("reward", generator.weights),
                       decode_paths=DecodePaths())
    gen, reward = cache.get(NAME, "likelihood")
    assert gen.weights == "fp32" and cache.is_loaded(NAME, "likelihood") and cache.decode_status(NAME) == ""
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)])
    assert not cache.is_loaded(NAME, "likelihood")  # the next load_async loads again
    assert cache.decode_status(NAME).endswith("the next run loads it (seconds).")
    threads = torch.get_num_threads()
    try:
        gen, reward = cache.get(NAME, "likelihood")
        from sbon.machine import decode_threads
        assert torch.get_num_threads() == decode_threads()  # the thread count the choice was measured at
    finally:
        torch.set_num_threads(threads)  # the load took the choice's thread count
    assert (gen.weights, reward) == ("int4", ("reward", "int4")) and loads == ["fp32", "int4"]
    assert cache.get(NAME, "likelihood")[0] is gen and loads == ["fp32", "int4"]  # loaded once


@pytest.mark.slow
@pytest.mark.compile
def test_once_the_child_has_measured_and_built_the_step_runs_decode_compiled_and_record_it(gen_int4, unmeasured_machine):
    from sbon.algorithms import RunConfig, events, run
    from sbon.rewards import CallableReward

    steps = DecodePaths()
    assert steps.decode(NAME, gen_int4) == "eager"
    assert steps._children[NAME].wait(timeout=1500) == 0, "the child could not measure and build"
    choice = steps.choice(NAME)
    assert choice is not None and not choice.pending or f"{choice.weights} compiled" not in choice.pending
    if (choice.weights, choice.decode) != ("int4", "compiled"):
        pytest.skip(f"this machine's choice is {choice.reason}")
    assert compiled_state(gen_int4) == "saved" and steps.status(NAME).startswith(f"{generator_title(NAME)} decodes with")
    assert steps.decode(NAME, gen_int4) == "compiled" and compiled_state(gen_int4) == "loaded"
    config = RunConfig(method="bon", n=3, max_new_tokens=6, decode=steps.decode(NAME, gen_int4))
    result = run(events(gen_int4, CallableReward(lambda prompt, responses: [0.0] * len(responses)), "Hi", config))
    assert result.decode == "compiled"


@pytest.mark.slow
@pytest.mark.compile
def test_a_run_beside_other_work_decodes_on_the_step_built_for_one_thread_and_keeps_its_candidates(
        gen_int4, unmeasured_machine, monkeypatch):
    """The chosen compiled step built for one thread (sbon.probe.one_thread_step, as the app's child runs it): where it
    gives two threads' bits, a run that starts while other work stalls the team decodes on it, on one thread, with the
    candidates the same run has on two threads on free cores."""
    from sbon import probe
    from sbon.algorithms import RunConfig, events, run
    from sbon.decoders import prepare
    from sbon.machine import on_threads
    from sbon.rewards import CallableReward

    monkeypatch.setattr("sbon.machine.TORCH_THREADS", 2)  # measured on two threads (the suite's workers have one each)
    with on_threads(2):
        assert prepare(gen_int4)  # the choice's own step, built and saved here
    save([measured("int4", "eager", 50.0), measured("int4", "compiled", 20.0)])
    choice = probe.one_thread_step(NAME, load=lambda name, device, weights: gen_int4, progress=lambda line: None)
    assert choice.one_thread and not probe.wants_one_thread_step(choice)
    if choice.one_thread != "same":
        pytest.skip(f"the step built for one thread is not used here: {choice.one_thread}")
    steps = DecodePaths()
    zero = CallableReward(lambda prompt, responses: [0.0] * len(responses))

    def candidates(stalled):
        monkeypatch.setattr(probe, "team_held_back", lambda threads: stalled)
        with on_threads(2):  # the app's count, the one measured
            config = RunConfig(method="bon", n=5, max_new_tokens=24, decode=steps.for_run(NAME, gen_int4))
            result = run(events(gen_int4, zero, "Give three tips for staying healthy.", config))
        return result.threads, result.decode, [c.token_ids for c in result.candidates]

    busy, free = candidates(stalled=True), candidates(stalled=False)
    assert busy[:2] == (1, "compiled") and free[:2] == (2, "compiled")
    assert busy[2] == free[2] and len(busy[2]) == 5 and all(busy[2])


def test_a_provisional_choice_is_taken_and_measured_again_later_and_a_contradicting_run_has_it_measured_again(
        gen_int4, unmeasured_machine, monkeypatch):
    """A choice timed beside other work: runs take it, and a child measures again once RETRY_S has passed (twice as
    long after each try), between runs, not beside one; a quiet run that decoded far slower than its path was
    measured has the choice measured again; a busy one does not."""
    import components.decode_paths as dp
    from sbon.machine import decode_threads
    from sbon.results import RunResult

    started = []
    monkeypatch.setattr(dp, "_measure_in_child", lambda name, gate, one_thread=False: started.append(name) or
                        SimpleNamespace(poll=lambda: 0, returncode=0))
    steps = DecodePaths()
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)],
         provisional="other work used the cores while the paths were timed")
    assert steps.path(NAME).weights == "int4" and steps.decode(NAME, gen_int4) == "eager"
    assert started == [NAME]  # a provisional choice is measured again at once on a start
    assert "provisional: other work used the cores" in steps.status(NAME) and started == [NAME]  # not before RETRY_S
    monkeypatch.setattr(dp, "RETRY_S", 0.0)
    with steps.generating():  # due now, but a run generates: the child's loading would slow it
        assert steps.decode(NAME, gen_int4) == "eager" and "provisional" in steps.status(NAME) and started == [NAME]
    assert started == [NAME, NAME]  # the run's end starts it: a server with no page open measures too
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)])  # final now
    monkeypatch.setattr(dp, "RETRY_S", 1e9)
    steps.status(NAME)
    assert started == [NAME, NAME]

    def run(ms_per_step, others_cores, threads=None):
        return RunResult(method="bon", prompt="Hi", generator=NAME, reward="likelihood", settings={}, prompt_tokens=1,
                         candidates=[], timings={"decode": ms_per_step * 100 / 1e3}, weights="int4", decode="eager",
                         load={"others_cores": others_cores, "cores": 2}, threads=threads)

    monkeypatch.setattr(RunResult, "decode_steps", property(lambda self: 100))
    steps.observe(NAME, run(60.0, 0.0))  # as measured: nothing to do
    steps.observe(NAME, run(400.0, 1.5))  # slow, but beside other work: nothing to do
    steps.observe(NAME, run(400.0, 0.0, threads=decode_threads() + 1))  # slow, on another thread count than measured
    # (a run that starts beside other work decodes on one): nothing to do
    assert started == [NAME, NAME]
    steps.observe(NAME, run(400.0, 0.0))  # slow on a quiet machine: measured again at once
    assert started == [NAME, NAME, NAME]


def test_a_child_that_waited_longer_than_the_retry_for_the_cores_is_followed_at_once(gen_int4, unmeasured_machine,
                                                                                      monkeypatch):
    """The wait before the next child counts from the last one's start: a child that waited minutes, asleep, for
    stalled cores and ended provisional is followed at once by one that waits on, so that cores freed meanwhile are
    noticed within seconds; a child that ended sooner is followed RETRY_S after its start."""
    import components.decode_paths as dp

    started, ended = [], set()

    def child(name, gate, one_thread=False):
        started.append(name)
        i = len(started)
        return SimpleNamespace(poll=lambda: 0 if i in ended else None, returncode=0)

    monkeypatch.setattr(dp, "_measure_in_child", child)
    monkeypatch.setattr(dp, "RETRY_S", 60.0)
    save([measured("fp32", "eager", 100.0)], provisional="other programs kept this machine's cores busy")
    steps = DecodePaths()
    steps.status(NAME)
    ended.add(1)  # the first child ended at once
    steps.status(NAME)
    assert started == [NAME]  # the next one RETRY_S after its start
    steps._started[NAME] -= dp.RETRY_S + 1
    steps.status(NAME)
    assert started == [NAME, NAME]
    steps._started[NAME] -= 3 * dp.RETRY_S  # the second child waits longer than its retry ...
    steps.status(NAME)
    assert started == [NAME, NAME]  # ... while it runs, no other starts
    ended.add(2)
    steps.status(NAME)
    assert started == [NAME, NAME, NAME]  # it ended: the next one starts at once


def test_a_run_holds_the_gate_the_probe_reads(unmeasured_machine):
    from components.runs import MODELS
    from sbon.machine_load import RunGate

    child_view = RunGate(MODELS.decode_paths.gate.path)
    before = child_view.token()
    with MODELS.generating():
        assert child_view.token() is None
    assert child_view.token() == before + 1


# A probe's wait for a gap between runs: it prints when it got one (sbon.probe waits so before every timing).
WAITS_FOR_A_GAP = ("import time\nfrom sbon.machine_load import RunGate, quiet_token\n"
                   "quiet_token(RunGate.from_env())\nprint(time.time(), flush=True)\n")


def test_runs_sent_back_to_back_leave_the_measuring_child_a_few_seconds_between_them(unmeasured_machine, monkeypatch,
                                                                                      request):
    """A queue of visitors sends runs back to back: the measuring child, which times nothing while a run generates,
    would never get a gap, and every run would stay on the slow safe path. Once it has waited through a whole run, the
    next run waits for it (up to SHARE_S, ended early by the child's end) and says so in its status line and
    caption; a run after a gap, or with no child waiting, waits for nothing."""
    import components.decode_paths as dp
    import components.runs as runs
    from components.controls import DEFAULTS, SETTING_NAMES
    from sbon.machine_load import RunGate

    monkeypatch.setattr(runs.MODELS, "decode_paths", steps := DecodePaths())
    env = {**os.environ, RunGate.ENV: str(steps.gate.path)}
    assert list(steps.share()) == []  # no child
    ended_at, started, shares = {}, {}, []
    with steps.gate.generating():  # the first run: the child starts and waits for it
        steps._children[NAME] = child = subprocess.Popen([sys.executable, "-c", WAITS_FOR_A_GAP], cwd=ROOT, env=env,
                                                         stdout=subprocess.PIPE, text=True)
        request.addfinalizer(child.kill)  # a child still waiting when an assert fails
        deadline = time.monotonic() + 60
        while not steps.gate.waiting.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child never waited for the run"
            time.sleep(0.05)
    ended_at[1] = time.time()
    # Run 3 goes through the Run button's slot, with settings it refuses, so that nothing generates after the wait.
    refused = {**DEFAULTS.to_dict(), "n": 0}
    for run in (2, 3, 4):  # sent back to back, each as soon as the one before ends
        share = time.monotonic()
        if run == 3:
            updates = list(runs.Runs(lambda settings: iter(())).run(*[refused[k] for k in SETTING_NAMES],
                                                                     "curves", None, None, None, None))
            started[3] = steps.gate.last_started
            waits = [u for u in updates if "being measured" in str(u.get("status"))]
            assert waits and all(u["caption"] == u["status"] for u in waits), updates[:2]
            assert f"the run starts in {dp.SHARE_S:.0f} s (later runs go faster)" in waits[0]["status"]
            assert updates[-1]["status"].startswith("⚠")  # then the run itself: refused, as it would be without a wait
        else:
            shares.append(len(list(steps.share())))
            with steps.gate.generating():
                time.sleep(0.5)
        shares.append(time.monotonic() - share)
        ended_at[run] = time.time()
        if child.poll() is not None:
            break
    got = float(child.communicate(timeout=10)[0])
    # Run 2 left no gap (the child began waiting during run 1): it waited for nothing; run 3 waited for the child,
    # which got its gap then, before run 3 generated, and ended, which ended the wait well before SHARE_S.
    assert shares[:2] == [0, pytest.approx(0.5, abs=0.2)]
    assert 0.5 < shares[2] < dp.SHARE_S - 3
    assert ended_at[2] < got < started[3]
    assert not steps.gate.waiting.exists() and list(steps.share()) == []  # the child ended: no run waits


def test_a_run_that_starts_while_other_work_stalls_its_threads_decodes_on_one_thread_and_its_candidates_stay_the_same(
        gen_int4, unmeasured_machine, monkeypatch):
    """torch's threads spin at every operation's barrier: beside a process that holds a core, a run on two threads
    waits for it at each one. A run that starts then decodes on one thread, eagerly, where that gives the same bits
    (sbon.probe.run_threads): the candidates stay the same, and its status line says why; SBON_THREADS keeps its
    count; a run that starts on free cores decodes on the measured count again. Whether the team is stalled is given
    here (the suite's other worker shares the cores); docs/method.md has it measured beside a busy loop."""
    import components.runs as runs
    from sbon import probe
    from sbon.algorithms import RunConfig, events, run
    from sbon.rewards import CallableReward

    monkeypatch.setattr("sbon.machine.TORCH_THREADS", 2)  # measured on two threads (the suite's workers have one each)
    monkeypatch.setattr(runs.MODELS, "decode_paths", steps := DecodePaths())
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)])
    assert steps.path(NAME).threads == 2
    same = probe.one_thread_same(gen_int4, 2)
    before = torch.get_num_threads()

    def candidates(stalled):
        monkeypatch.setattr(probe, "team_held_back", lambda threads: stalled)
        try:
            result = run(events(gen_int4, CallableReward(lambda prompt, responses: [0.0] * len(responses)), "Hi",
                                RunConfig(method="bon", n=4, max_new_tokens=8, decode=steps.for_run(NAME, gen_int4))))
        finally:
            torch.set_num_threads(before)
        return result, [c.token_ids for c in result.candidates]

    busy, busy_ids = candidates(stalled=True)
    free, free_ids = candidates(stalled=False)
    assert (busy.threads, free.threads) == (1 if same else 2, 2) and busy.decode == free.decode == "eager"
    assert busy_ids == free_ids and len(busy_ids) == 4 and all(busy_ids)
    assert runs.decoded(busy).endswith(runs.ONE_THREAD) == same and not runs.decoded(free).endswith(runs.ONE_THREAD)
    monkeypatch.setattr(probe, "team_held_back", lambda threads: True)
    monkeypatch.setenv("SBON_THREADS", "2")  # a count the app was started with is kept
    try:
        assert steps.for_run(NAME, gen_int4) == "eager" and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_run_whose_cores_are_taken_then_freed_while_it_decodes_changes_its_threads_and_keeps_its_candidates(
        gen_fp32, unmeasured_machine, monkeypatch):
    """A run's start can misjudge the cores: the app's measuring child loads a format beside the first run, and a
    neighbour comes or goes while a run decodes. So the run looks again between its steps (sbon.probe.ThreadWatch):
    on one thread once other work holds its team back in two looks in a row, on the team again once it is free in
    two, only where both counts give the same bits (measured here, on this CPU), so its candidates are those of a run
    on free cores; where they do not, it stops looking. The safe path's run (nothing measured yet: the first runs of a
    first start) here; whether the team is held back is given (the suite's other worker shares the cores)."""
    from sbon import probe
    from sbon.algorithms import RunConfig, TokensGenerated, events
    from sbon.rewards import CallableReward

    monkeypatch.setattr("sbon.machine.TORCH_THREADS", 2)  # the count measured paths would run on
    monkeypatch.setattr("components.decode_paths._measure_in_child", lambda name, gate, one_thread=False: None)
    monkeypatch.setattr(probe, "WATCH_FIRST_S", 0.0)  # a look after every event
    steps, before = DecodePaths(), torch.get_num_threads()
    reward = CallableReward(lambda prompt, responses: [0.0] * len(responses))

    def decoded(held, watching=True):
        """The thread count each step of a run was decoded on, its candidates and its watch; ``held``: what
        team_held_back answers."""
        monkeypatch.setattr(probe, "team_held_back", held)
        try:
            decode = steps.for_run(NAME, gen_fp32)
            watch = steps.watch(NAME, gen_fp32, decode) if watching else None
            config = RunConfig(method="bon", n=4, max_new_tokens=12, decode=decode)
            counts, result = [], None
            for event in probe.watched(events(gen_fp32, reward, "Hi", config), watch):
                if isinstance(event, TokensGenerated):
                    counts.append(torch.get_num_threads())
                result = getattr(event, "result", result)
        finally:
            torch.set_num_threads(before)
        return counts, [c.token_ids for c in result.candidates], watch

    def answers(*given):  # team_held_back's answers in turn, then: free
        left = iter(given)
        return lambda threads, seconds=None: next(left, False)

    free, free_ids, _ = decoded(answers(), watching=False)
    # free at the start, free, held back twice, free twice
    counts, ids, watch = decoded(answers(False, False, True, True, False, False))
    assert ids == free_ids and len(ids) == 4 and all(ids)
    if probe.counts_agree(gen_fp32, "eager", 2):
        assert set(free) == {2} and watch.changes == [1, 2]
        assert counts[0] == 2 and 1 in counts and counts[-1] == 2  # two, then one, then two again
    else:
        assert watch.changes == [] and len(set(counts)) == 1
    # where the counts do not give the same bits, the run stays on its count and looks no more
    monkeypatch.setattr(probe, "counts_agree", lambda *args: False)
    looked = []
    counts, ids, watch = decoded(lambda threads, seconds=None: looked.append(threads) or len(looked) > 1)
    assert watch.changes == [] and len(set(counts)) == 1 and ids == free_ids
    assert len(looked) == 3  # the start's look, then the watch's two
    # a stopped run (the app closes its events) ends, watched or not
    inner = events(gen_fp32, reward, "Hi", RunConfig(method="bon", n=2, max_new_tokens=4, decode="eager"))
    outer = probe.watched(inner, lambda: None)
    next(outer)
    outer.close()
    assert inspect.getgeneratorstate(inner) == inspect.GEN_CLOSED


def test_a_run_on_one_thread_goes_back_to_its_team_within_seconds_of_the_cores_freeing(monkeypatch):
    """A run that went to one thread beside a neighbour keeps looking at its team every few seconds, however long
    the neighbour stayed, so it goes back to the team soon after the neighbour leaves: each second on one thread
    beside free cores costs it up to a second more. On free cores its looks grow further apart, up to WATCH_MOST_S.
    A clock of its own and given answers: a neighbour from the run's start until 19 s into it."""
    from sbon import probe
    from sbon.machine import on_threads

    clock, looks, leaves = [0.0], [], 19.0
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(probe, "team_held_back", lambda threads, seconds=None: looks.append(clock[0]) or
                        clock[0] < leaves)
    monkeypatch.setattr(probe, "counts_agree", lambda *args: True)
    with on_threads(2):
        watch, threads = probe.ThreadWatch(SimpleNamespace(name=NAME), decode="eager", team=2), []
        while clock[0] < 60:
            watch()
            threads.append((clock[0], torch.get_num_threads()))
            clock[0] += 0.1
    assert watch.changes == [1, 2]
    back = min(t for t, n in threads if t >= leaves and n == 2)
    assert back - leaves <= probe.WATCH_ONE_THREAD_MOST_S + probe.WATCH_FIRST_S + 0.2, (back, looks)
    on_team_again = [t for t in looks if t > back]
    assert max(b - a for a, b in zip(on_team_again, on_team_again[1:])) > probe.WATCH_ONE_THREAD_MOST_S


def test_a_team_beside_a_busy_loop_is_held_back_whatever_one_thread_was_timed_at(monkeypatch):
    """A team of two threads on two cores, one of them held by a busy loop: held back in every look, the short looks
    of a running decode's watch too, even where the most one thread did in this process is too low for the count of
    operations to tell (one thread timed beside other work): its threads waited for a core (ThreadWaits). Else a run
    moves to two threads beside the loop and takes twice as long."""
    import time

    import sbon.probe as probe_module
    from sbon.machine_load import ThreadWaits
    from sbon.probe import WATCH_SAMPLE_S, team_held_back

    if ThreadWaits(team=True).start().stop() is None:
        pytest.skip("this kernel keeps no run-queue delays per thread")
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("one core: no team of two")
    two = sorted(before)[:2]
    spin = "import os, time\nos.sched_setaffinity(0, {%d})\nend = time.time() + 30\nwhile time.time() < end: pass\n" % two[1]
    busy = subprocess.Popen([sys.executable, "-c", spin])
    monkeypatch.setattr(probe_module, "_ONE_THREAD_BEST", [1.0])  # the count of operations says: free
    try:
        os.sched_setaffinity(0, set(two))
        time.sleep(0.5)
        looks = [team_held_back(2, seconds) for seconds in (WATCH_SAMPLE_S, 0.2) for _ in range(3)]
    finally:
        os.sched_setaffinity(0, before)
        busy.kill()
        busy.wait()
    assert all(looks), looks


def test_a_final_compiled_choice_whose_step_is_gone_is_measured_and_built_again_once(gen_int4, unmeasured_machine,
                                                                                     monkeypatch, caplog):
    """An update of sbon changes the code a saved step's name hashes (or its cache is emptied): the final choice still
    names its compiled step, no longer saved here. Runs decode eagerly, and a child measures and builds again, once
    (one logged line); the model line says the paths are being measured, not that runs decode compiled."""
    import logging

    from sbon.machine import choose, decode_threads, fingerprint, save_choice

    started = []
    monkeypatch.setattr("components.decode_paths._measure_in_child", lambda name, gate, one_thread=False:
                        started.append(one_thread) or SimpleNamespace(poll=lambda: None, returncode=None))
    choice = choose(NAME, fingerprint("cpu", decode_threads()), [measured("fp32", "eager", 100.0),
                                                                 measured("int4", "compiled", 20.0)])
    choice.one_thread = "same"  # nothing left to build for one thread either
    save_choice(choice)
    steps = DecodePaths()
    assert steps.status(NAME).startswith(f"{generator_title(NAME)} decodes with 4-bit weights, compiled into one step")
    assert started == []  # a final choice: nothing to measure
    with caplog.at_level(logging.WARNING, logger="components.decode_paths"):
        assert steps.decode(NAME, gen_int4) == "eager"  # its step is not saved here
        assert steps.decode(NAME, gen_int4) == "eager"
    assert started == [False]  # the whole measurement and build, once
    assert [r.getMessage() for r in caplog.records if "not saved on this machine" in r.getMessage()] == [
        f"{NAME}'s chosen compiled step is not saved on this machine (the code it is built from changed, or its cache "
        "was emptied): measuring and building again in the background; runs decode eagerly meanwhile"]
    assert steps.status(NAME).startswith("⚙")


def test_asking_which_step_a_run_would_take_sets_no_thread_count(gen_int4, unmeasured_machine, monkeypatch):
    """A page open asks which step a run starting now would take (DecodePaths.planned, for "Press Run to reproduce")
    on a handler thread, while a run may decode on another: torch's thread count is the process's, so asking finds
    the step saved for the count the choice was measured at without setting it."""
    from sbon import aot_step
    from sbon.decoders import _use_our_inductor_cache

    monkeypatch.setattr("sbon.machine.TORCH_THREADS", 2)  # measured on two threads
    save([measured("fp32", "eager", 100.0), measured("int4", "compiled", 20.0)])
    steps = DecodePaths()
    assert steps.path(NAME).threads == 2
    _use_our_inductor_cache()
    saved = aot_step.step_path(gen_int4, aot_step.INDUCTOR_OPTIONS, threads=2)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_bytes(b"stand-in")  # the choice's step, "saved"
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a run beside other work decodes on one thread
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    try:
        assert steps.planned(NAME, gen_int4) == "compiled" and set_to == [] and torch.get_num_threads() == 1
    finally:
        monkeypatch.undo()
        torch.set_num_threads(before)


def test_a_final_compiled_choice_has_its_step_for_one_thread_built_once_and_runs_beside_other_work_take_it_only_if_same(
        gen_int4, unmeasured_machine, monkeypatch):
    """A compiled step keeps the thread count it was built at, so a run that starts beside other work (above) decodes
    on one thread eagerly, a slower step that gives other candidates, unless the chosen step was also built for one
    thread and gives the same bits (sbon.probe.one_thread_step, run_threads). The app has that built in a child once
    the choice is final, says so on the model line, and tries once: a build that did not finish is recorded, and no
    child starts again. Without a build here: the saved steps are stand-in files, and the builder fails (the
    `-m compile` test above builds them)."""
    import components.decode_paths as dp
    from sbon import aot_step, probe
    from sbon.decoders import _use_our_inductor_cache
    from sbon.machine import on_threads

    monkeypatch.setattr("sbon.machine.TORCH_THREADS", 2)  # measured on two threads (the suite's workers have one each)
    started = []
    monkeypatch.setattr(dp, "_measure_in_child", lambda name, gate, one_thread=False: started.append(one_thread) or
                        SimpleNamespace(poll=lambda: None, returncode=None))
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0), measured("int4", "compiled", 20.0)],
         provisional="1 compiled step may still be built")
    steps = DecodePaths()
    steps.status(NAME)
    assert started == [False]  # a provisional choice: the whole measurement
    save([measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0), measured("int4", "compiled", 20.0)])
    monkeypatch.setenv("SBON_DECODE", "eager")  # runs forced off the choice: no step for one thread
    steps, started[:] = DecodePaths(), []
    steps.status(NAME)
    assert started == []
    monkeypatch.delenv("SBON_DECODE")
    line = steps.status(NAME, alone=True)
    assert started == [True] and line.startswith("⚙ Compiling its step again for a single core, for runs that start "
                                                 "while other programs keep the cores busy, in the background")

    _use_our_inductor_cache()
    saved = {}
    for threads in (2, 1):
        with on_threads(threads):
            saved[threads] = aot_step.step_path(gen_int4, aot_step.INDUCTOR_OPTIONS)
    saved[2].parent.mkdir(parents=True, exist_ok=True)
    saved[2].write_bytes(b"stand-in")  # the choice's own step, "saved"
    built = []
    choice = probe.one_thread_step(NAME, load=lambda name, device, weights: gen_int4,
                                   builder=lambda name, weights: built.append(torch.get_num_threads()) and False,
                                   progress=lambda line: None)
    assert built == [1] and choice.one_thread.startswith("its build for one thread did not finish")
    assert not probe.wants_one_thread_step(steps.choice(NAME))  # tried once: recorded, not again
    steps._children.clear()
    steps.status(NAME)
    assert started == [True]
    assert "the compiled step for one thread is not used: its build" in probe.report(steps.choice(NAME))

    def beside_other_work(one_thread):
        choice = steps.choice(NAME)
        choice.one_thread = one_thread
        monkeypatch.setattr(probe, "team_held_back", lambda threads: True)
        return probe.run_threads(gen_int4, "compiled", 2, choice)

    monkeypatch.setattr(probe, "one_thread_same", lambda gen, threads: True)  # the eager step's bits (tested above)
    assert beside_other_work("same") == (1, "eager")  # not built here
    saved[1].write_bytes(b"stand-in")
    assert beside_other_work("same") == (1, "compiled")
    assert beside_other_work("it gives other bits on one thread than on 2") == (1, "eager")
    # a running decode moves between the two compiled steps only where both are saved and give the same bits
    choice = steps.choice(NAME)
    choice.one_thread = "same"
    assert probe.counts_agree(gen_int4, "compiled", 2, choice)
    choice.one_thread = "it gives other bits on one thread than on 2"
    assert not probe.counts_agree(gen_int4, "compiled", 2, choice)
    choice.one_thread = "same"
    saved[2].unlink()
    assert not probe.counts_agree(gen_int4, "compiled", 2, choice)


def test_a_long_prompt_gives_a_run_on_one_thread_the_candidates_of_a_run_on_two(gen):
    """A run beside other work decodes on one thread (above), where the step gives two threads' bits. Its prompt is
    prefilled on one thread in every run (sbon.machine.prefill_threads): on a CPU that computes bfloat16 natively,
    a prefill of a few hundred tokens on two threads gives other bits than on one, and the run other candidates. On
    the suite's generator (bfloat16 there), with a prompt of about 300 tokens."""
    from sbon import probe
    from sbon.algorithms import RunConfig, events, run
    from sbon.machine import on_threads
    from sbon.rewards import CallableReward

    if not probe.one_thread_same(gen, 2):
        pytest.skip(f"{gen.weights}'s step gives other bits on one thread than on two here: runs stay on two")
    words = "the committee weighs each quarterly budget line against the plans of every department and".split()
    prompt = "Summarise: " + " ".join(words[i % len(words)] for i in range(240))
    assert 260 <= len(gen.encode_prompt(prompt)) <= 340
    zero = CallableReward(lambda prompt, responses: [0.0] * len(responses))
    ids = {}
    for threads in (2, 1):
        with on_threads(threads):
            result = run(events(gen, zero, prompt, RunConfig(method="bon", n=3, max_new_tokens=6, decode="eager")))
        assert result.threads == threads
        ids[threads] = [c.token_ids for c in result.candidates]
    assert ids[1] == ids[2] and all(ids[1])


def test_a_run_on_the_safe_path_takes_the_cores_where_they_are_free_and_one_thread_beside_other_work(
        gen_fp32, unmeasured_machine, monkeypatch):
    """Before anything is measured a run decodes float32 op by op: on the count paths are measured at where the team
    is free and that count is exact and gives one thread's bits on this machine (measured here, once per process), on
    one thread where other work stalls the team (sbon.probe.safe_threads). Either way the same candidates. A forced
    format keeps the count the app started with; SBON_THREADS keeps its own."""
    from sbon import probe
    from sbon.algorithms import RunConfig, events, run
    from sbon.rewards import CallableReward

    gen = gen_fp32  # the safe path's format
    monkeypatch.setattr("sbon.machine.TORCH_THREADS", 2)  # a fresh process's count (the suite's workers have one)
    monkeypatch.setattr("components.decode_paths._measure_in_child", lambda name, gate, one_thread=False: None)
    steps = DecodePaths()
    assert steps.path(NAME).threads is None and (steps.path(NAME).weights, steps.path(NAME).decode) == ("fp32", "eager")
    checked = probe.exact_on(gen, 2) and probe.same_bits(gen, 2)
    before = torch.get_num_threads()

    def candidates(stalled):
        monkeypatch.setattr(probe, "team_held_back", lambda threads: stalled)
        torch.set_num_threads(1)  # as the app starts on a two-core machine with nothing measured
        try:
            result = run(events(gen, CallableReward(lambda prompt, responses: [0.0] * len(responses)), "Hi",
                                RunConfig(method="bon", n=4, max_new_tokens=8, decode=steps.for_run(NAME, gen))))
        finally:
            torch.set_num_threads(before)
        return result.threads, result.decode, [c.token_ids for c in result.candidates]

    free, busy = candidates(stalled=False), candidates(stalled=True)
    assert free[:2] == (2 if checked else 1, "eager") and busy[:2] == (1, "eager")
    assert free[2] == busy[2] and len(free[2]) == 4 and all(free[2])
    monkeypatch.setattr(probe, "team_held_back", lambda threads: False)
    for name, value in (("SBON_WEIGHTS", "fp32"), ("SBON_THREADS", "1")):
        monkeypatch.setenv(name, value)
        torch.set_num_threads(1)
        try:
            steps.for_run(NAME, gen)
            assert torch.get_num_threads() == 1, name
        finally:
            torch.set_num_threads(before)
        monkeypatch.delenv(name)


def test_the_app_starts_on_one_thread_where_no_decode_path_is_chosen(unmeasured_machine, monkeypatch):
    """Float32 op by op, what runs take until a path is chosen, is exact on one thread on any CPU: a two-core machine
    starts on one thread where nothing is measured, and where the saved choice names no path (nothing could be timed
    beside a busy neighbour, or nothing was exact), and each run takes more where they are free and checked (above);
    once a path is chosen, on the count it was measured at."""
    from components.torch_thread import configure_threads
    from sbon.machine import Measured, choose, decode_threads, fingerprint, save_choice
    from sbon.models import DEFAULT_GENERATOR

    monkeypatch.delenv("SBON_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    machine, before = fingerprint("cpu", decode_threads()), torch.get_num_threads()
    try:  # each call as a fresh process makes it: from torch's default count
        torch.set_num_threads(decode_threads())
        assert configure_threads() == 1
        save_choice(choose(DEFAULT_GENERATOR, machine, [], provisional="the cores were busy"))
        torch.set_num_threads(decode_threads())
        assert configure_threads() == 1
        save_choice(choose(DEFAULT_GENERATOR, machine, [Measured("int4", "eager", ms={16: 9.0}, exact=True)]))
        torch.set_num_threads(decode_threads())
        assert configure_threads() == decode_threads()
    finally:
        torch.set_num_threads(before)


def test_where_only_one_thread_could_be_measured_runs_take_that_path_on_one_thread_and_the_line_says_why(
        gen_int4, unmeasured_machine, monkeypatch):
    """A first start beside a busy neighbour measures on one thread (sbon.probe.measures_alone_first) and times
    nothing on the count in use: runs take the path measured on one thread, on one thread, and the model line says
    so; the choice is provisional, so the child measures again once its wait is over."""
    from sbon.machine import ALONE, choose, fingerprint, save_choice
    from sbon.probe import STALLED

    class Child:
        returncode = None

        def poll(self):
            return self.returncode

    children = []
    monkeypatch.setattr("components.decode_paths._measure_in_child",
                        lambda name, gate, one_thread=False: children.append(Child()) or children[-1])
    monkeypatch.setattr("sbon.machine.TORCH_THREADS", 2)  # the count runs take on free cores
    monkeypatch.delenv("SBON_THREADS", raising=False)
    save_choice(choose(NAME, fingerprint("cpu", 2), [], provisional=STALLED))
    save_choice(choose(NAME, fingerprint("cpu", 1), [measured("fp32", "eager", 100.0), measured("int4", "eager", 50.0)],
                       provisional=ALONE))
    steps = DecodePaths()
    path = steps.path(NAME)
    assert (path.weights, path.decode, path.threads) == ("int4", "eager", 1)
    assert steps.status(NAME, alone=True).startswith(
        "⚙ Measuring on one core while other programs keep the others busy, then on all once they are free, in the "
        "background (for 0 s; runs go first and meanwhile use 4-bit weights, one operation at a time).")
    children[-1].returncode = 0
    assert steps.status(NAME, alone=True) == (
        "It decodes with 4-bit weights, one operation at a time: 50.0 ms per step for 7 candidates, the fastest way "
        "measured on this machine that gives each candidate the same text in both methods (full-precision numbers, "
        "one operation at a time: 100.0 ms) (provisional: measured on one core while other programs kept the others "
        "busy).")
    assert len(children) == 1  # measured again once RETRY_S has passed, not at once
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert steps._cpu_threads(NAME, gen_int4, "eager") == "eager" and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
