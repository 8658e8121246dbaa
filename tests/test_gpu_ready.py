"""GPU-ready without a GPU: the ZeroGPU wiring (duration, what crosses the worker's process boundary,
the `spaces` package present or absent), the device and dtype checks, and bfloat16 end to end on the
real SmolLM2. `python -m benchmarks gpu-check` has its own tests (test_gpu_check.py)."""

import ast
import dataclasses
import json
import pickle
import re
import sys
import typing
from pathlib import Path

import pytest
import torch

from components.controls import MAX_N, MAX_NEW_TOKENS, RunSettings
from sbon import algorithms, zerogpu
from sbon.analysis import comparison
from sbon.cli import main as cli_main
from sbon.engine import check_device
from sbon.errors import SBoNError
from sbon.models import load_generator, load_reward

ROOT = Path(__file__).resolve().parents[1]
# The torch versions ZeroGPU documents (hub-docs, "spaces-zerogpu": "almost all versions from 2.1.0 to latest").
ZEROGPU_TORCH = ("2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.2", "2.4.0", "2.5.1", "2.6.0", "2.7.1", "2.8.0")
PROMPT = "What are the names of some famous actors that started their careers on Broadway?"


def settings(**kw) -> RunSettings:
    return RunSettings(prompt=PROMPT, **kw)


# -- the duration a run asks ZeroGPU for ------------------------------------------------------------

def test_duration_of_the_page_defaults_is_a_whole_number_within_the_limit():
    seconds = zerogpu.gpu_duration(settings())
    assert isinstance(seconds, int) and zerogpu.MIN_DURATION_S <= seconds <= zerogpu.max_duration()


def test_duration_grows_with_n_tokens_and_the_memory_bound_baseline():
    base = zerogpu.gpu_duration(settings())
    assert zerogpu.gpu_duration(settings(n=64)) > base
    assert zerogpu.gpu_duration(settings(max_new_tokens=256)) > base
    assert zerogpu.gpu_duration(settings(bon_same_memory=False)) < base  # Best-of-N in one batch
    assert zerogpu.gpu_duration(settings(method="sbon-tau")) < base  # one decision point, not several
    assert zerogpu.gpu_duration(settings(generator="llama-3-8b-instruct")) > base
    assert zerogpu.gpu_duration(settings(generator="some/unknown-model")) == \
        zerogpu.gpu_duration(settings(generator="llama-3-8b-instruct"))  # unknown: costed as the largest


def test_the_cost_model_never_prices_a_step_below_what_an_h100_measured():
    """The per-step costs against the GPU check's eager steps on an H100: the SmolLM2 stand-in's (both engines,
    every N) for the small preset, the 8B-architecture stand-in's (every row count) for the 8b one. An estimate
    below them would ask ZeroGPU for too little time and the run would be aborted."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu-h100" / "gpu-check"
    engine = json.loads((folder / "engine.json").read_text())["summary"]
    paper = json.loads((folder / "paper-scale.json").read_text())["decode_steps"]
    measured = [("small", o["n"], o["ms_per_step"]) for o in engine if o.get("decode_chunk") in (None, 1)] + \
        [("8b", st["rows"], st["ms_per_step"]) for st in paper]
    assert len(measured) >= 6
    for preset, rows, ms in measured:
        cost = zerogpu.GPU_COSTS[preset]
        assert 1000 * (cost.step_s + rows * cost.row_step_s) >= ms, (preset, rows, ms)


def test_memory_bound_best_of_n_batches_follow_the_budget():
    s = settings(n=16, max_new_tokens=128)
    prompt = 40
    per_batch = 16 * (prompt + 32) // (prompt + 128)
    assert zerogpu.bon_batches(s, prompt) == -(-16 // per_batch)
    assert zerogpu.bon_batches(settings(bon_same_memory=False), prompt) == 1


def test_a_run_past_the_spaces_limit_is_one_line_naming_what_to_lower():
    with pytest.raises(SBoNError) as e:
        zerogpu.gpu_duration(settings(n=MAX_N, max_new_tokens=MAX_NEW_TOKENS))
    message = str(e.value)
    assert "\n" not in message and f"N (now {MAX_N})" in message and f"max new tokens (now {MAX_NEW_TOKENS})" in message
    assert "Best-of-N all at once" in message  # the same-memory baseline was on: turning it off is named too


def test_the_limit_can_be_lowered_for_a_free_visitors_quota(monkeypatch):
    default = zerogpu.gpu_duration(settings())
    monkeypatch.setenv("SBON_ZEROGPU_MAX_S", str(default - 1))
    with pytest.raises(SBoNError, match=f"allows per run \\({default - 1} s\\)"):
        zerogpu.gpu_duration(settings())
    monkeypatch.setenv("SBON_ZEROGPU_MAX_S", "soon")
    with pytest.raises(SBoNError, match="SBON_ZEROGPU_MAX_S must be a number"):
        zerogpu.max_duration()


# -- what crosses ZeroGPU's process boundary ---------------------------------------------------------

def _tensors_in(obj, seen=None) -> list:
    """Every torch tensor reachable from obj through dataclass fields, containers and attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if torch.is_tensor(obj):
        return [obj]
    if isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple, set)):
        children = list(obj)
    elif dataclasses.is_dataclass(obj):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        children = list(vars(obj).values())
    else:
        return []
    return [t for c in children for t in _tensors_in(c, seen)]


def test_every_event_a_run_yields_pickles_as_plain_data(comparison_events):
    """ZeroGPU pickles each yielded value out of its GPU worker: every event type of the algorithms and
    of a comparison must survive that unchanged and hold no tensor (a CUDA tensor would hang the pipe)."""
    inner = [e.event for e in comparison_events if isinstance(e, comparison.MethodEvent)]
    seen = {type(e) for e in inner} | {type(e) for e in comparison_events}
    assert set(typing.get_args(algorithms.Event)) <= seen
    assert set(typing.get_args(comparison.ComparisonEvent)) <= seen
    for event in comparison_events:
        assert _tensors_in(event) == []
        copy = pickle.loads(pickle.dumps(event))
        assert type(copy) is type(event) and copy == event


def test_run_result_and_comparison_pickle_with_their_json(comparison):
    for obj in (comparison, comparison.speculative, comparison.bon):
        copy = pickle.loads(pickle.dumps(obj))
        assert copy.to_json() == obj.to_json()


def test_the_gpu_function_takes_only_plain_settings():
    """The app's decorated function takes the settings, not the models (which would be pickled into
    the worker on every call): RunSettings round-trips through pickle."""
    tree = ast.parse((ROOT / "app.py").read_text())
    decorated = [f for f in tree.body if isinstance(f, ast.FunctionDef)
                 and any("GPU" in ast.unparse(d) for d in f.decorator_list)]
    assert [f.name for f in decorated] == ["comparison_on_gpu"]
    assert [a.arg for a in decorated[0].args.args] == ["settings"]
    s = settings(n=5)
    assert pickle.loads(pickle.dumps(s)) == s


@pytest.mark.slow  # imports the app: gradio and the page
def test_the_apps_gpu_function_runs_a_comparison_from_settings_alone(monkeypatch, gen, likelihood):
    """app.comparison_on_gpu gets its models from the cache (which a ZeroGPU worker inherits), not as
    arguments, and everything it yields pickles."""
    import app

    asked = []
    monkeypatch.setattr(app.MODELS, "get", lambda g, r: asked.append((g, r)) or (gen, likelihood))
    events = list(app.comparison_on_gpu(settings(n=3, max_new_tokens=8, alpha=0.5, reward="likelihood")))
    assert asked == [("smollm2-135m", "likelihood")]
    assert isinstance(events[-1], comparison.ComparisonDone) and events[-1].comparison.n == 3
    assert all(pickle.loads(pickle.dumps(e)) == e for e in events)


# -- the `spaces` package, installed or not ----------------------------------------------------------

def test_app_imports_spaces_before_anything_that_imports_torch():
    """Only the standard library may come before `import spaces` in app.py: every other import there
    (gradio, components, sbon) may pull in torch, after which ZeroGPU refuses to start."""
    def top(node) -> str:
        return (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]

    tree = ast.parse((ROOT / "app.py").read_text())
    nodes = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.Try))]
    first = next(i for i, node in enumerate(nodes)
                 if isinstance(node, ast.Try) or top(node) not in (*sys.stdlib_module_names, "__future__"))
    guard = nodes[first]
    assert isinstance(guard, ast.Try) and ast.unparse(guard.body[0]) == "import spaces"
    assert [h.type.id for h in guard.handlers] == ["ImportError"]  # absent elsewhere: the app still runs


def _without_spaces(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", None)  # `import spaces` now raises ImportError


def test_without_spaces_the_decorator_is_a_no_op(monkeypatch):
    _without_spaces(monkeypatch)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")  # even where the variable says ZeroGPU
    assert zerogpu.spaces_module() is None and not zerogpu.on_zerogpu()

    def run(x):
        yield x

    assert zerogpu.GPU(duration=zerogpu.gpu_duration)(run) is run
    assert zerogpu.load_before_launch(lambda: pytest.fail("nothing loads before launch off ZeroGPU")) is False


def test_with_spaces_installed_off_zerogpu_the_decorator_is_a_no_op(monkeypatch):
    spaces = pytest.importorskip("spaces")  # pip install spaces; it imports offline
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert zerogpu.spaces_module() is spaces and not zerogpu.on_zerogpu()

    def run(settings):
        yield from range(settings.n)

    decorated = zerogpu.GPU(duration=zerogpu.gpu_duration)(run)
    assert decorated is run and list(decorated(settings(n=3))) == [0, 1, 2]


def test_on_zerogpu_the_default_models_load_before_launch(monkeypatch):
    monkeypatch.setattr(zerogpu, "spaces_module", lambda: object())
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    loaded = []
    assert zerogpu.load_before_launch(lambda: loaded.append(1)) is True and loaded == [1]


def _requirements(name: str) -> dict[str, str]:
    # pip reads " # ..." after a requirement as a comment, so the comparison does too
    lines = [line.split(" #")[0].strip() for line in (ROOT / name).read_text().splitlines()]
    reqs = [line for line in lines if line and not line.startswith("#")]
    return {re.split(r"[=<>!~ ]", r, maxsplit=1)[0].lower(): r for r in reqs}


def test_space_requirements_are_the_apps_with_a_zerogpu_torch_and_spaces():
    """requirements-space.txt stays requirements.txt but for torch (a version on ZeroGPU's list, at least
    what transformers 5 needs) and the added `spaces`: a package added to one is added to the other."""
    app, space = _requirements("requirements.txt"), _requirements("requirements-space.txt")
    assert set(space) == set(app) | {"spaces"}
    assert {k: v for k, v in space.items() if k not in ("torch", "spaces")} == \
        {k: v for k, v in app.items() if k != "torch"}
    version = space["torch"].split("==")[1]
    assert version in ZEROGPU_TORCH and tuple(map(int, version.split("."))) >= (2, 6)
    assert "docs/space.md" in (ROOT / "requirements-space.txt").read_text()


# -- devices and dtypes -----------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu_is_one_line_naming_what_to_change(capsys):
    with pytest.raises(SBoNError, match="sees no CUDA GPU: use --device cpu"):
        load_generator("smollm2-135m", device="cuda")
    with pytest.raises(SBoNError, match="sees no CUDA GPU"):
        load_reward("some/reward-model", device="cuda")
    assert cli_main(["run", "--device", "cuda", "--n", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: device cuda asked for") and "--device cpu" in err[-1]


def test_unknown_device_and_dtype_are_one_line(capsys):
    with pytest.raises(SBoNError, match="unknown device 'gpu0'"):
        check_device("gpu0")
    assert cli_main(["run", "--device", "gpu0", "--n", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: unknown device 'gpu0': use cpu, cuda or cuda:N"
    with pytest.raises(SBoNError, match="dtype torch.int8 is not supported"):
        check_device("cpu", torch.int8)
    assert check_device("cpu", torch.bfloat16) == torch.device("cpu")


def test_a_gpu_without_bfloat16_names_float16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    with pytest.raises(SBoNError, match="Tesla T4 cannot run bfloat16: use --dtype float16"):
        check_device("cuda", torch.bfloat16)
    assert check_device("cuda", torch.float16) == torch.device("cuda")
    with pytest.raises(SBoNError, match="only 1 CUDA GPU"):
        check_device("cuda:3", torch.float16)


# -- bfloat16 end to end on the real SmolLM2 ---------------------------------------------------------

@pytest.fixture(scope="module")
def gen_bf16():
    return load_generator("smollm2-135m", device="cpu", dtype=torch.bfloat16)


def test_bfloat16_generator_runs_speculative_rejection(gen_bf16):
    assert gen_bf16.model.dtype == torch.bfloat16
    assert gen_bf16.kv_bytes_per_token() * 2 == load_generator("smollm2-135m", device="cpu",
                                                             dtype=torch.float32).kv_bytes_per_token()
    reward = load_reward("likelihood", generator=gen_bf16)
    result = algorithms.run(algorithms.events(gen_bf16, reward, "Name a colour.",
                                              algorithms.RunConfig(n=4, alpha=0.5, max_new_tokens=12, seed=3)))
    assert len(result.candidates) == 4 and result.best.text and result.best.final_reward is not None
    assert any(c.pruned_round is not None for c in result.candidates)


def test_cli_dtype_bfloat16_end_to_end(capsys):
    code = cli_main(["run", "--prompt", "Name a colour.", "--dtype", "bfloat16", "--reward", "likelihood",
                     "--n", "3", "--max-new-tokens", "8", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0 and "best response (candidate" in out
