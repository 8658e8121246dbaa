"""``auto``'s decode path chosen by measurement (sbon.machine, sbon.probe, ``python -m sbon machine``): the choice
follows the measured times and excludes a path whose coupling is not exact on a CPU; it is cached per machine and
torch version, and a choice measured elsewhere is never used; a forced path that cannot run says so in one line; under
each emulated CPU class a tiny run takes a path that runs and keeps the coupling exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.cpu_classes import CPU_CLASSES
from sbon.engine import WEIGHT_FORMATS
from sbon.errors import SBoNError
from sbon.machine import (Measured, cache_key, cached_choice, choose, fingerprint, save_choice)

ROOT = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m"
CPU = fingerprint("cpu")
GPU = {**CPU, "device": "NVIDIA H100 80GB HBM3"}


def timed(weights, decode, ms, exact=True, divergence=0.0):
    return Measured(weights, decode, ms={16: 2 * ms, 7: ms, 1: ms / 2}, exact=exact, divergence=divergence)


def test_the_choice_follows_the_measured_times_and_excludes_an_inexact_path_on_a_cpu():
    paths = [timed("fp32", "eager", 120.5), timed("int4", "eager", 70.0), timed("int4", "compiled", 25.7),
             timed("bf16", "eager", 10.0, exact=False, divergence=0.02)]
    choice = choose(NAME, CPU, paths)
    assert (choice.weights, choice.decode) == ("int4", "compiled")  # bf16 is faster, but not exact here
    assert choice.reason == ("int4 weights, compiled step: 25.7 ms per step at 7 rows (fp32 eager: 120.5), the "
                             "fastest exact path measured on this machine")
    assert choice.words == ("4-bit Linear weights in blocks of 32, one compiled step: 25.7 ms per step at 7 rows, the "
                            "fastest exact path measured on this machine (float32 weights and activations, op by op: "
                            "120.5 ms)")  # in words: no format or step identifiers
    paths[1] = timed("int4", "eager", 20.0)  # the times change: so does the choice
    assert (choose(NAME, CPU, paths).weights, choose(NAME, CPU, paths).decode) == ("int4", "eager")
    # on a GPU the divergence is reported, not a rule: the fastest path, with its divergence in the reason
    gpu = choose(NAME, GPU, paths)
    assert (gpu.weights, gpu.decode) == ("bf16", "eager") and "differ by up to 0.02" in gpu.reason
    # nothing exact: no choice, and runs keep the safe path
    none = choose(NAME, CPU, [paths[3]])
    assert none.weights is None and "runs keep fp32 eager" in none.reason


def test_the_probe_measures_every_weight_format_and_a_failing_one_is_one_line_and_skipped():
    from sbon.probe import probe

    class Loaded:
        def __init__(self, weights):
            self.weights = weights

    def load(name, device, weights):
        if weights == "int8":
            raise SBoNError("int8 weights need a kernel this CPU lacks")
        return Loaded(weights)

    times = {name: 50.0 + i for i, name in enumerate(WEIGHT_FORMATS)}  # every format slower than bf16 but int8's
    times["bf16"] = 30.0
    lines = []
    choice = probe(NAME, "cpu", load=load, save=False, progress=lines.append,
                   measure=lambda gen, decode, rows: timed(gen.weights, decode, times[gen.weights] / (
                       2 if decode == "compiled" else 1)))
    assert [p.name for p in choice.paths] == [f"{w} {d}" for w in WEIGHT_FORMATS for d in ("eager", "compiled")]
    assert (choice.weights, choice.decode) == ("bf16", "compiled")
    assert [line for line in lines if line.startswith("int8")] == [
        "int8: does not load here (int8 weights need a kernel this CPU lacks)"]


def test_step_times_come_from_the_timer(gen):
    """The real step, timed by a stand-in clock that advances 5 ms per reading: 5 ms per step at each row count."""
    from sbon.decoders import EagerDecoder
    from sbon.probe import step_times

    clock = iter(range(10_000))
    times = step_times(gen, EagerDecoder(gen), rows=(3, 1), timer=lambda: 0.005 * next(clock))
    assert list(times) == [3, 1] and times == pytest.approx({3: 5.0, 1: 5.0})


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


def test_a_choice_cached_on_another_machine_or_torch_is_never_used(unmeasured_machine):
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


def test_a_forced_path_that_cannot_run_here_says_so_in_one_line(unmeasured_machine, monkeypatch, capsys):
    from sbon.cli import main
    from sbon.probe import check_forced

    paths = [timed("fp32", "eager", 50.0), timed("int4", "eager", 20.0),
             Measured("int4", "compiled", problem="no C++ compiler for torch.compile's CPU kernels (install g++)"),
             Measured("int8", "eager", problem="does not load here: int8 weights run on the CPU only"),
             Measured("int8", "compiled", problem="does not load here: int8 weights run on the CPU only")]
    save_choice(choose(NAME, fingerprint("cpu"), paths))
    check_forced(NAME, "cpu", "int4", "eager")  # runs here: nothing to say
    monkeypatch.setenv("SBON_WEIGHTS", "int8")
    with pytest.raises(SBoNError) as refused:
        check_forced(NAME, "cpu")
    assert str(refused.value) == ("the decode path 'int8' cannot run on this machine (does not load here: int8 "
                                  "weights run on the CPU only): use one of fp32 eager, int4 eager (python -m sbon "
                                  "machine measures them)")
    monkeypatch.delenv("SBON_WEIGHTS")
    assert main(["run", "--weights", "int4", "--decode", "compiled", "--n", "2", "--max-new-tokens", "2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the decode path 'int4 compiled' cannot run on this machine (no C++ compiler")


def test_python_m_sbon_machine_prints_the_fingerprint_every_path_and_the_choice(unmeasured_machine):
    """The real probe, two formats, one row count: eager paths timed and checked in seconds, compiled ones pending."""
    from sbon.probe import probe, report

    choice = probe(NAME, "cpu", formats=("fp32", "int4"), rows=(2,), progress=lambda line: None)
    text = report(choice)
    assert f"cache key {choice.key}" in text and f"threads: {torch.get_num_threads()}" in text
    assert "int4 eager: " in text and " ms at 2 rows; " in text and "int4 compiled: not built yet" in text
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
from sbon.models import load_generator, load_reward
from sbon.probe import probe
loaded = {}  # the probe's generators, kept for the reference run below (a load is seconds)
def load(name, device, weights):
    if weights not in loaded:
        loaded[weights] = load_generator(name, device=device, weights=weights)
    return loaded[weights]
choice = probe("smollm2-135m", "cpu", formats=("fp32", "int4"), rows=(2,), load=load, progress=lambda line: None)
gen = load_generator("smollm2-135m", device="cpu")  # the measured choice's format (sbon.models.default_weights)
reward = load_reward("likelihood", generator=gen)
budget = 4 * (len(gen.encode_prompt("Hi")) + 4)
config = RunConfig(method="sbon", n=4, alpha=0.5, max_new_tokens=8, kv_budget=budget, decode="auto", seed=3)
comp = drive(comparison_events(gen, reward, "Hi", config, taus=[4]), ComparisonDone).comparison
ref = loaded["fp32"]
ref_run = run(events(ref, load_reward("likelihood", generator=ref), "Hi",
                     config.replace(decode="eager", method="bon", kv_budget=None)))
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "weights": gen.weights,
                  "chosen": [choice.weights, choice.decode], "decode": comp.speculative.decode,
                  "exact": {p.weights: p.exact for p in choice.paths if p.decode == "eager"},
                  "sbon": {c.id: c.token_ids for c in comp.speculative.candidates},
                  "bon": {c.id: c.token_ids for c in comp.bon.candidates},
                  "fp32": {c.id: c.token_ids for c in ref_run.candidates}}))
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
