"""The GPU check's sizes and budget: how big each part runs (``Sizes``: the GPU defaults, ``TINY`` for a CPU), what
the device does (measured in seconds before the run), the estimated seconds of each piece of work, and which pieces
fit the time limit, most important first. Each part also has its own limit (``PART_LIMIT_S``): a part that runs
past it stops there, and the parts after it still run."""

from __future__ import annotations

import functools
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from sbon.algorithms import best_of_n
from sbon.config import resolve_first_decision
from sbon.engine import DTYPES, Generator

from . import common
from .gpu_stand_ins import LLAMA_3_8B, SMOLLM2_135M, TINY_ARCH, forced_lengths, random_llama, smollm2_tokenizer, stand_in

# The check fits one command of SESSION_S on a lent GPU machine (rented and shared GPUs often cap a command or a
# job at ten minutes, and a check that stops early leaves every later part unmeasured). The limit counts from the
# command's start, after Python's imports (STARTUP_S at most), and RESERVE_S of it is kept for writing the result files.
SESSION_S = 600
STARTUP_S = 30
DEFAULT_TIME_LIMIT_S = 540
RESERVE_S = 10
SETUP_S = 15  # the device measurements and the tokenizer, before the plan is printed
MODEL_BUILD_S = 5.0  # allowance for building one random model on the device (its modules and initial weights)
VLLM_S = 120.0  # allowance for loading vLLM and its run
APP_S = 150.0  # allowance for the app part: building its models, capturing its graphs, one untimed and the timed runs
CAPTURE_S = 5.0  # allowance for capturing the CUDA graph of one row bucket (warm-up steps included)
INDUCTOR_S = 60.0  # allowance for compiling the step with inductor for one row bucket (an H100 took 45 s)
# Each part's own limit, in seconds: past it the part stops with what it has and the next part starts.
PART_LIMIT_S = {"app": 210.0, "compiled": 90.0, "coupling": 90.0, "engine": 120.0, "paper-scale": 240.0, "vllm": 150.0}


@dataclass(frozen=True)
class Sizes:
    """How big each part runs: the GPU defaults, or ``TINY`` for a CPU test."""
    engine_n: tuple[int, ...] = (32, 128)  # candidates for the engine comparison
    engine_tokens: int = 256
    engine_median_length: int = 128  # median of the stand-in's forced lengths (log-normal, at most engine_tokens)
    engine_prompts: int = 1
    dtypes: tuple[str, ...] = ("bfloat16",)  # the engine part's dtypes
    engine_chunks: tuple[int, ...] = (1, 8)  # our engine's decode_chunk: 8 checks for finished rows once per 8 tokens
    coupling_dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    coupling_n: int = 16  # at most the smallest CUDA-graph bucket: both methods share one shape
    coupling_tokens: int = 64
    coupling_prompts: int = 1
    coupling_decodes: tuple[str, ...] = ("eager", "compiled")  # compiled: on a GPU its CUDA graphs
    paper_n: int = 512  # Speculative Rejection's candidates at paper scale
    paper_tokens: int = 256  # the length limit; forced lengths are drawn below it
    paper_median_length: int = 128  # median of the forced lengths (log-normal)
    step_batches: tuple[int, ...] = (1, 64, 256)  # rows for the decode ms/step measurement: the
    # largest one's caches (rows x step_context tokens of an 8B model) must fit beside its weights on one GPU
    step_context: int = 512  # tokens in each row's cache for that measurement
    step_repeats: int = 20
    compiled_rows: tuple[int, ...] = (1, 8)  # live rows for the compiled-step part (each a CUDA-graph bucket)
    compiled_context: int = 256  # prompt tokens in each row's cache for that part
    compiled_repeats: int = 50
    inductor: bool = False  # the compiled part also times inductor's step under the same graphs (a minute per bucket)
    app_runs: int = 2  # timed page-default comparisons of the app part (after one untimed)
    app_n: int = 0  # the app part's N and max new tokens (0: the page's defaults)
    app_max_new_tokens: int = 0
    bandwidth_bytes: int = 2 ** 30  # buffer copied to measure memory bandwidth
    arch: dict | None = None  # config overrides of both stand-in architectures (the tiny mode shrinks them)


GPU = Sizes()
TINY = Sizes(engine_n=(4,), engine_tokens=8, engine_median_length=4, engine_prompts=1, dtypes=("float32", "bfloat16"),
             coupling_dtypes=("float32", "bfloat16"), coupling_n=4, coupling_tokens=12, coupling_prompts=1,
             paper_n=8, paper_tokens=16, paper_median_length=16, step_batches=(1, 4), step_context=16,
             step_repeats=2, compiled_rows=(1, 4), compiled_context=16, compiled_repeats=2,
             app_runs=1, app_n=2, app_max_new_tokens=4, bandwidth_bytes=2 ** 22, arch=TINY_ARCH)



# -- measuring the device ---------------------------------------------------------------------------

def machine_name() -> str:
    """A results folder name: gpu-<model> from the device name (gpu-h100, gpu-a100 ...), else cpu-<cores>core."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0).lower()
        model = re.search(r"\b([a-z]\d{2,4}[a-z]?|rtx[\w -]*?\d{3,4})\b", name)
        return "gpu-" + re.sub(r"[^a-z0-9]+", "-", model.group(1) if model else name).strip("-")
    import os

    return f"cpu-{os.cpu_count()}core"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(device: torch.device, work: Callable[[], Any], repeats: int = 5) -> float:
    """The fastest of a few timed calls of ``work``, after one untimed call."""
    work()
    best = math.inf
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        work()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second the device moves in a large copy (read + write counted), best of a few."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_seconds(device, lambda: dst.copy_(src))


def measure_matmul(device: torch.device, dtype: str, size: int) -> float:
    """FLOP/s of a square matrix product in this dtype, best of a few."""
    a = torch.randn(size, size, device=device).to(DTYPES[dtype])
    return 2 * size ** 3 / best_seconds(device, lambda: a @ a, repeats=3)


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# -- the budget -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Figures:
    """What the budget assumes of a device."""
    device: str
    bandwidth: float = field(metadata={"help": "bytes per second a large copy moves (read + write)"})
    flops: dict[str, float] = field(metadata={"help": "FLOP/s of a large matrix product, by dtype"})
    layer_step_s: float = field(metadata={"help": "fixed seconds per layer per decode step of a whole run "
                                                  "(kernel launches, Python, sampling): what bounds small batches"})
    source: str = ""


H100_ENGINE_FILE = common.DEFAULT_OUT_DIR / "gpu-h100" / "engine.json"


def h100_figures() -> Figures:
    """An H100's figures for the budget test: its nominal bandwidth and the bfloat16 rate its large matmuls reach
    in practice (below the data sheet's), and the fixed cost per layer and step of the slower engine in the H100 engine
    run committed here (SmolLM2-135M, both engines eager)."""
    d = json.loads(H100_ENGINE_FILE.read_text())
    per_step = max(sum(r[f"{who}_time"] for r in d["rows"]) / sum(r[f"{who}_steps"] for r in d["rows"])
                   for who in ("ours", "hf"))
    return Figures("NVIDIA H100 (nominal)", 3.3e12, {"bfloat16": 800e12, "float16": 800e12, "float32": 50e12},
                   per_step / SMOLLM2_135M["num_hidden_layers"],
                   f"bandwidth and bfloat16 rate nominal; fixed cost per layer and step from {H100_ENGINE_FILE.name}")


def measure_figures(device: torch.device, sizes: Sizes, dtypes: Sequence[str], prompt: str) -> Figures:
    """This device's figures, measured in a few seconds: a large copy, a matrix product per dtype, and a short
    Best-of-N run of the SmolLM2 stand-in (its wall time per step and layer)."""
    from .engine_vs_generate import NO_REWARD

    size = 8192 if device.type == "cuda" else 256
    flops = {dtype: measure_matmul(device, dtype, size) for dtype in dtypes}
    arch = {**SMOLLM2_135M, **(sizes.arch or {})}
    gen = stand_in(smollm2_tokenizer(), device, dtypes[0], arch)
    steps = 16 if device.type == "cuda" else 4
    run = functools.partial(best_of_n, gen, NO_REWARD, prompt, 2, max_new_tokens=steps)
    common.timed_run(run())  # warm-up
    per_step = common.timed_run(run()).wall_time / steps
    del gen
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else common.cpu_model()
    return Figures(name, measure_bandwidth(device, sizes.bandwidth_bytes), flops,
                   per_step / arch["num_hidden_layers"], "measured on this device before the run")


def meta_generator(arch: dict, dtype: str) -> Generator:
    """A stand-in built on the meta device: its sizes and its prompts' tokens, without memory or weights."""
    return Generator(random_llama(smollm2_tokenizer(), torch.device("meta"), DTYPES[dtype], arch), smollm2_tokenizer())


def prompt_tokens(prompt: str) -> int:
    """Tokens of the prompt as the stand-ins see it (a user turn of the chat template)."""
    return len(meta_generator(TINY_ARCH, "float32").encode_prompt(prompt))


@dataclass(frozen=True)
class Arch:
    """What the budget needs of a model."""
    params: int
    layers: int
    hidden: int
    kv_bytes: int  # KV cache bytes per token
    itemsize: int

    @classmethod
    def of(cls, arch: dict, dtype: str) -> "Arch":
        gen = meta_generator(arch, dtype)
        cfg = gen.model.config
        return cls(sum(p.numel() for p in gen.model.parameters()), cfg.num_hidden_layers, cfg.hidden_size,
                   gen.kv_bytes_per_token(), DTYPES[dtype].itemsize)


def step_s(a: Arch, f: Figures, dtype: str, rows: int, context: int) -> float:
    """One decode step of ``rows`` rows whose caches hold ``context`` tokens: the longer of moving the weights
    and caches once and of its matmuls, plus the fixed cost of its layers."""
    moved = a.params * a.itemsize + rows * context * a.kv_bytes
    flops = 2 * rows * (a.params + 2 * context * a.hidden * a.layers)
    return max(moved / f.bandwidth, flops / f.flops[dtype]) + a.layers * f.layer_step_s


def forward_s(a: Arch, f: Figures, dtype: str, tokens: int, calls: int = 1) -> float:
    """``calls`` full forward passes over ``tokens`` tokens in all (a prefill, a reward's scoring)."""
    return max(calls * a.params * a.itemsize / f.bandwidth, 2 * tokens * a.params / f.flops[dtype]) + \
        calls * a.layers * f.layer_step_s


def alive(lengths: Sequence[int]) -> list[int]:
    """Rows still generating at each step: a candidate of length L is in the batch at steps 1..L."""
    lengths = np.asarray(list(lengths))
    return [int((lengths >= t).sum()) for t in range(1, int(lengths.max(initial=0)) + 1)]


def decode_s(a: Arch, f: Figures, dtype: str, rows: Sequence[int], prompt_tokens: int) -> float:
    """Decoding with ``rows[t - 1]`` rows at step t."""
    return sum(step_s(a, f, dtype, r, prompt_tokens + t) for t, r in enumerate(rows, 1) if r)


@dataclass(frozen=True)
class Unit:
    """One piece of work the plan keeps or leaves out."""
    part: str
    key: str
    seconds: float
    rank: int  # the lower, the sooner it is kept when not everything fits


def estimate(sizes: Sizes, f: Figures, parts: Sequence[str], prompt_tokens: int, seed: int = 0,
             stand_in_generator: bool = True) -> list[Unit]:
    """Every piece of work of these parts with its estimated seconds, in running order. Speculative Rejection's
    decoding is costed as Best-of-N's with all its candidates at once (an upper bound), its scoring as twice
    that of all candidates (its decision points score fewer and fewer); a real --generator as the SmolLM2
    stand-in with every candidate at the length limit."""
    units: list[Unit] = []
    arch = sizes.arch or {}
    P = prompt_tokens

    def lengths(n: int, median: int, limit: int) -> list[int]:
        return list(forced_lengths(n, median, limit, seed).values()) if stand_in_generator else [limit] * n

    if "engine" in parts:
        for i, dtype in enumerate(sizes.dtypes):
            a = Arch.of({**SMOLLM2_135M, **arch}, dtype)
            for j, n in enumerate(sizes.engine_n):
                ls = lengths(n, sizes.engine_median_length, sizes.engine_tokens)
                runs = decode_s(a, f, dtype, [n] * max(ls), P) + \
                    len(sizes.engine_chunks) * decode_s(a, f, dtype, alive(ls), P)
                prefills = (1 + len(sizes.engine_chunks)) * forward_s(a, f, dtype, P)
                units.append(Unit("engine", f"{dtype} N={n}", MODEL_BUILD_S + sizes.engine_prompts * (runs + prefills),
                                  0 if i == j == 0 else 3))
    if "paper-scale" in parts:
        a = Arch.of({**LLAMA_3_8B, **arch}, "bfloat16")
        n, ls = sizes.paper_n, lengths(sizes.paper_n, sizes.paper_median_length, sizes.paper_tokens)
        first = resolve_first_decision(None, sizes.paper_tokens)
        batch = max(1, min(n, n * (P + first) // (P + sizes.paper_tokens)))  # same_memory_batch_size's rule
        score_all = forward_s(a, f, "bfloat16", n * (P + sizes.paper_median_length), calls=math.ceil(n / 32))
        sbon = decode_s(a, f, "bfloat16", alive(ls), P) + 2 * score_all
        bon = sum(decode_s(a, f, "bfloat16", alive(ls[k:k + batch]), P) + forward_s(a, f, "bfloat16", P)
                  for k in range(0, n, batch)) + score_all
        units.append(Unit("paper-scale", "Speculative Rejection vs memory-bound Best-of-N",
                          2 * MODEL_BUILD_S + sbon + bon, 2))
        steps = sum(forward_s(a, f, "bfloat16", sizes.step_context) +
                    (sizes.step_repeats + 1) * step_s(a, f, "bfloat16", rows, sizes.step_context)
                    for rows in sizes.step_batches)
        units.append(Unit("paper-scale", "decode ms per step", MODEL_BUILD_S + steps, 1))
    if "coupling" in parts:
        for dtype in sizes.coupling_dtypes:
            a = Arch.of({**SMOLLM2_135M, **arch}, dtype)
            n, ls = sizes.coupling_n, lengths(sizes.coupling_n, coupling_median(sizes), sizes.coupling_tokens)
            score = forward_s(a, f, dtype, n * (P + max(ls)))
            both = len(sizes.coupling_decodes) * (2 * decode_s(a, f, dtype, alive(ls), P) + 3 * score)
            units.append(Unit("coupling", dtype, MODEL_BUILD_S + sizes.coupling_prompts * both, 4))
    if "compiled" in parts:
        a = Arch.of({**SMOLLM2_135M, **arch}, "bfloat16")
        for rows in sizes.compiled_rows:
            steps = (2 + sizes.inductor) * (sizes.compiled_repeats + 3) * step_s(a, f, "bfloat16", rows,
                                                                                 P + sizes.compiled_context)
            units.append(Unit("compiled", f"rows={rows}", CAPTURE_S + INDUCTOR_S * sizes.inductor + steps, 1))
    if "app" in parts:
        units.append(Unit("app", "page-default comparison, warm", APP_S, 0))
    if "vllm" in parts:
        units.append(Unit("vllm", "Best-of-N on vLLM", VLLM_S if vllm_runs(stand_in_generator) is None else 0.0, 5))
    return units


def choose(units: Sequence[Unit], budget: float) -> tuple[list[Unit], list[Unit]]:
    """The units kept, most important first while they fit in the budget (seconds), and those left out."""
    kept, left, total = [], [], 0.0
    for u in sorted(units, key=lambda u: u.rank):
        if total + u.seconds <= budget:
            kept.append(u)
            total += u.seconds
        else:
            left.append(u)
    return kept, left


def budget_s(time_limit: float, spent: float) -> float:
    """Seconds the plan may fill: the limit, less what was spent before it and the reserve for the files."""
    return time_limit - spent - RESERVE_S


def print_plan(f: Figures, kept: Sequence[Unit], left: Sequence[Unit], budget: float, limit: float) -> None:
    flops = ", ".join(f"{v / 1e12:.3g} TFLOP/s {k}" for k, v in f.flops.items())
    print(f"gpu-check budget on {f.device} ({f.source}): {f.bandwidth / 1e12:.3g} TB/s, {flops}, "
          f"{1000 * f.layer_step_s:.3g} ms per layer per decode step")
    for u in kept:
        print(f"  {u.part:<12} {u.key:<48} ~{u.seconds:6.0f} s")
    for u in left:
        print(f"  left out: {u.part} {u.key} (~{u.seconds:.0f} s): it would not fit in the {limit:g} s limit "
              f"(raise --time-limit or lower --size)")
    print(f"  planned ~{sum(u.seconds for u in kept):.0f} s of the {budget:.0f} s left")


def coupling_median(sizes: Sizes) -> int:
    """The coupling part's median forced length: most candidates are still going at the first decision point."""
    return sizes.coupling_tokens * 3 // 4


def vllm_runs(stand_in_generator: bool) -> str | None:
    """Why the vllm part cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    if not torch.cuda.is_available():
        return "vLLM needs a CUDA GPU"
    if stand_in_generator:
        return "vLLM loads a model's files: name a real --generator"
    return None
