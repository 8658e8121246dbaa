"""`python -m benchmarks gpu-check`: everything this project claims about GPUs, in one command.

Written and tested on a machine without a GPU: on a GPU machine it is the one command to run (about
20 minutes on one H100 with the defaults), and its result files under
``benchmarks/results/<machine>/gpu-check/`` are the measurements. Its parts (``--parts``):

- ``engine``: this project's Best-of-N against `transformers`' ``generate`` (benchmarks/engine.py) at
  N = 32 and 128, 256 tokens, float32 and bfloat16, on the generator named by ``--generator``;
- ``coupling``: how often bfloat16 / float16 break coupled sampling: the fraction of Speculative
  Rejection survivors whose text differs from Best-of-N's candidate with the same id and seed (0 in
  float32, which tests/test_algorithms.py asserts), and of pruned candidates that are not a prefix of it;
- ``paper-scale``: a model of Llama-3-8B's architecture with random bfloat16 weights, every candidate
  forced to stop at a length drawn from a long-tailed distribution, scored by a random classifier of the
  same architecture: Speculative Rejection against memory-bound Best-of-N on the same KV budget (the
  paper's Table 1 setting, timing only: random weights mean nothing about quality), and the decode
  milliseconds per step next to the floor that the device's measured memory bandwidth puts under them;
- ``vllm``: Best-of-N on vLLM (benchmarks/vllm_bon.py) on the ``engine`` generator, where vLLM imports.

``--tiny`` runs the same code on tiny random configs and sizes, in a few minutes on a CPU: that is
its test (tests/test_gpu_ready.py). Tiny numbers measure nothing but that the code runs.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from sbon.algorithms import best_of_n, speculative_rejection
from sbon.analysis.comparison import peak_kv_tokens, same_memory_batch_size
from sbon.engine import DTYPES, Generator, SamplingConfig
from sbon.models import default_device, load_generator, load_reward
from sbon.options import resolved
from sbon.rewards import SequenceClassifierReward

from . import common


@dataclass(frozen=True)
class Sizes:
    """How big each part runs: the GPU defaults, or ``TINY`` for a CPU test."""
    engine_n: tuple[int, ...] = (32, 128)  # candidates for the engine comparison
    engine_tokens: int = 256
    engine_prompts: int = 2
    dtypes: tuple[str, ...] = ("float32", "bfloat16")  # the engine part's dtypes
    engine_chunks: tuple[int, ...] = (1, 8)  # our engine's decode_chunk: 8 checks for finished rows once per 8 tokens
    coupling_dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    coupling_n: int = 32
    coupling_tokens: int = 128
    coupling_prompts: int = 5
    paper_n: int = 512  # Speculative Rejection's candidates at paper scale
    paper_tokens: int = 512  # the length limit; forced lengths are drawn below it
    paper_median_length: int = 256  # median of the forced lengths (log-normal)
    step_batches: tuple[int, ...] = (1, 64, 256)  # rows for the decode ms/step measurement: the
    # largest one's caches (rows x step_context tokens of an 8B model) must fit beside its weights on one GPU
    step_context: int = 512  # tokens in each row's cache for that measurement
    step_repeats: int = 20
    bandwidth_bytes: int = 2 ** 30  # buffer copied to measure memory bandwidth
    llama: dict | None = None  # config overrides of the 8B architecture (the tiny mode shrinks it)


# Llama-3-8B's published config.json (meta-llama/Meta-Llama-3-8B), less its vocabulary: the stand-in
# takes the SmolLM2 tokenizer's (the one available offline), which trims the embedding and head.
LLAMA_3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                  hidden_act="silu", tie_word_embeddings=False)

GPU = Sizes()
TINY = Sizes(engine_n=(4,), engine_tokens=8, engine_prompts=1, dtypes=("float32", "bfloat16"),
             coupling_dtypes=("float32", "bfloat16"), coupling_n=4, coupling_tokens=12, coupling_prompts=1,
             paper_n=8, paper_tokens=48, paper_median_length=48, step_batches=(1, 4), step_context=16,
             step_repeats=2, bandwidth_bytes=2 ** 22,
             llama=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2))


# -- shared pieces ----------------------------------------------------------------------------------

def machine_name() -> str:
    """A results folder name: gpu-<model> from the device name (gpu-h100, gpu-a100 ...), else cpu-<cores>core."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0).lower()
        model = re.search(r"\b([a-z]\d{2,4}[a-z]?|rtx[\w -]*?\d{3,4})\b", name)
        return "gpu-" + re.sub(r"[^a-z0-9]+", "-", model.group(1) if model else name).strip("-")
    import os

    return f"cpu-{os.cpu_count()}core"


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """The tokenizer the stand-in models use: SmolLM2's, from the embedded package (offline)."""
    return load_generator("smollm2-135m", device="cpu").tokenizer


def random_llama(tokenizer, device: torch.device, dtype: torch.dtype, overrides: dict | None = None,
                 classifier: bool = False):
    """A Llama-3-8B-architecture model (or a shrunk one) with random weights, built on the device
    directly in its dtype: no download, no 16 GB host copy."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    config = LlamaConfig(**{**LLAMA_3_8B, **(overrides or {})}, vocab_size=len(tokenizer),
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
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


class ForcedLengthGenerator(Generator):
    """A generator whose candidate k stops after ``lengths[k]`` tokens: random weights never choose to
    stop, so the paper-scale timing forces the long-tailed lengths real responses have. The stop is
    the only logit left at a candidate's last step; every other step samples as usual."""

    def __init__(self, model, tokenizer, lengths: dict[int, int], name: str = "forced-length"):
        super().__init__(model, tokenizer, name=name)
        self.lengths = lengths
        self.stop_id = tokenizer.eos_token_id

    def forward(self, batch, tokens: torch.Tensor) -> None:
        super().forward(batch, tokens)
        generated = batch.cache.get_seq_length() - self.prompt_tokens + 1  # the token now being chosen
        rows = [i for i, k in enumerate(batch.candidate_ids) if self.lengths.get(k, math.inf) <= generated]
        logits = batch.logits.clone()
        logits[:, self._stop_tensor] = float("-inf")  # no stop drawn by chance before a candidate's length
        if rows:
            logits[rows] = float("-inf")
            logits[rows, self.stop_id] = 0.0
        batch.logits = logits

    def prefill(self, prompt_ids):
        self.prompt_tokens = len(prompt_ids)
        return super().prefill(prompt_ids)


def forced_lengths(n: int, median: int, limit: int, seed: int) -> dict[int, int]:
    """Long-tailed response lengths (log-normal around ``median``), between 2 tokens and the limit."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(rng.normal(math.log(median), 0.6, n)).round(), 2, limit).astype(int)
    return {k: int(v) for k, v in enumerate(lengths)}


def measure_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second the device moves in a large copy (read + write counted), best of a few."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decode_ms_per_step(gen: Generator, rows: int, context: int, repeats: int) -> float:
    """Milliseconds of one decoding step of ``rows`` candidates whose caches hold ``context`` tokens."""
    prefix = gen.prefill(list(range(1, context + 1)))
    batch = gen.start(prefix, list(range(rows)))
    tokens = torch.ones(rows, dtype=torch.long, device=gen.device)
    gen.forward(batch, tokens)  # the first step allocates
    sync(gen.device)
    start = time.perf_counter()
    for _ in range(repeats):
        gen.forward(batch, tokens)
    sync(gen.device)
    return 1000 * (time.perf_counter() - start) / repeats


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# -- the parts --------------------------------------------------------------------------------------

@dataclass
class Context:
    """What every part gets: the parsed command line, the sizes, the device and the prompts."""
    args: argparse.Namespace
    sizes: Sizes
    device: torch.device
    prompts: list[dict]
    sampling: SamplingConfig
    tiny_folder: Path | None = None  # --tiny: a saved tiny random generator standing in for --generator

    def generator(self, dtype: str) -> Generator:
        """The --generator (or, with --tiny, the tiny stand-in) in this dtype on the device."""
        return load_generator(str(self.tiny_folder) if self.tiny_folder else self.args.generator,
                              device=self.device, dtype=DTYPES[dtype])


def part_engine(ctx: Context) -> dict[str, Any]:
    from .engine import NO_REWARD, run_engine

    runs = []
    for dtype in ctx.sizes.dtypes:
        gen = ctx.generator(dtype)
        for n in ctx.sizes.engine_n:
            for chunk in ctx.sizes.engine_chunks:
                result = run_engine(gen, NO_REWARD, ctx.prompts[:ctx.sizes.engine_prompts], n=n,
                                    max_new_tokens=ctx.sizes.engine_tokens, sampling=ctx.sampling, seed=ctx.args.seed,
                                    reward_share=False, quiet=ctx.args.quiet, decode_chunk=chunk)
                s = result["summary"]
                runs.append({"dtype": dtype, "n": n, "decode_chunk": chunk, "ours_tok_per_s": s["ours_tok_per_s"],
                             "hf_tok_per_s": s["hf_tok_per_s"], "ratio": s["tok_per_s_ratio_pooled"],
                             "hf_padding_waste": s["hf_padding_waste"], "rows": result["rows"]})
                print(f"engine {dtype} N={n} decode_chunk={chunk}: ours {s['ours_tok_per_s']:.0f} tok/s, generate "
                      f"{s['hf_tok_per_s']:.0f} tok/s (ratio {s['tok_per_s_ratio_pooled']:.2f})")
        del gen
    return {"tokens": ctx.sizes.engine_tokens, "runs": runs}


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


def part_coupling(ctx: Context) -> dict[str, Any]:
    out = {}
    for dtype in ctx.sizes.coupling_dtypes:
        gen = ctx.generator(dtype)
        reward = load_reward("likelihood", generator=gen)
        r = coupling_rates(gen, reward, ctx.prompts[:ctx.sizes.coupling_prompts], ctx.sizes.coupling_n,
                           ctx.sizes.coupling_tokens, ctx.sampling, ctx.args.seed)
        out[dtype] = r
        print(f"coupling {dtype}: {r['survivor_divergence_rate']:.1%} of {r['survivors']} survivors differ from "
              f"their Best-of-N twin; {r['pruned_divergence_rate']:.1%} of {r['pruned']} pruned are not its prefix")
    return {"reward": "likelihood", "alpha": 0.5, "n": ctx.sizes.coupling_n, "tokens": ctx.sizes.coupling_tokens,
            "by_dtype": out}


def part_paper_scale(ctx: Context) -> dict[str, Any]:
    """Speculative Rejection against memory-bound Best-of-N on one KV budget, with 8B-architecture
    random models and forced lengths; then decode ms/step against the bandwidth floor."""
    s, dtype = ctx.sizes, torch.bfloat16
    tokenizer = smollm2_tokenizer()
    lengths = forced_lengths(s.paper_n, s.paper_median_length, s.paper_tokens, ctx.args.seed)
    gen = ForcedLengthGenerator(random_llama(tokenizer, ctx.device, dtype, s.llama), tokenizer, lengths,
                                name="random-llama-3-8b-architecture")
    reward = SequenceClassifierReward(random_llama(tokenizer, ctx.device, dtype, s.llama, classifier=True),
                                      tokenizer, name="random-llama-3-8b-classifier", batch_size=32)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0)
    prompt = ctx.prompts[0]["instruction"]
    prompt_tokens = len(gen.encode_prompt(prompt))
    common.warm_up(gen, reward, sampling)
    sbon = common.timed_run(speculative_rejection(gen, reward, prompt, s.paper_n, alpha=0.5,
                                              max_new_tokens=s.paper_tokens, sampling=sampling, seed=ctx.args.seed))
    budget = peak_kv_tokens(sbon)  # Best-of-N gets the KV memory Speculative Rejection peaked at
    batch = same_memory_batch_size(sbon)
    bon = common.timed_run(best_of_n(gen, reward, prompt, s.paper_n, batch_size=batch, max_new_tokens=s.paper_tokens,
                                 sampling=sampling, seed=ctx.args.seed))
    del reward  # the classifier's memory goes to the decode measurement's caches
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    bandwidth = measure_bandwidth(ctx.device, s.bandwidth_bytes)
    weights = weight_bytes(gen.model)
    steps = []
    for rows in s.step_batches:
        ms = decode_ms_per_step(gen, rows, s.step_context, s.step_repeats)
        kv = rows * (s.step_context + 1) * gen.kv_bytes_per_token()
        floor = 1000 * (weights + kv) / bandwidth
        steps.append({"rows": rows, "context": s.step_context, "ms_per_step": ms, "floor_ms": floor,
                      "of_floor": ms / floor})
        print(f"decode {rows} rows x {s.step_context} tokens: {ms:.1f} ms/step; bandwidth floor {floor:.1f} ms "
              f"({ms / floor:.1f}x)")
    speedup = bon.wall_time / sbon.wall_time
    print(f"paper scale: Speculative Rejection {sbon.wall_time:.1f} s, memory-bound Best-of-N {bon.wall_time:.1f} s "
          f"(batches of {batch}): speedup {speedup:.2f}x")
    return {"model": "Llama-3-8B architecture, random bfloat16 weights, SmolLM2's vocabulary",
            "config": {**LLAMA_3_8B, **(s.llama or {}), "vocab_size": len(tokenizer)},
            "parameters": sum(p.numel() for p in gen.model.parameters()),
            "n": s.paper_n, "max_new_tokens": s.paper_tokens, "prompt_tokens": prompt_tokens,
            "forced_length_median": s.paper_median_length, "peak_kv_tokens": budget, "bon_batch_size": batch,
            "sbon": {"wall_time": sbon.wall_time, "timings": sbon.timings, "tokens": sbon.total_tokens},
            "bon": {"wall_time": bon.wall_time, "timings": bon.timings, "tokens": bon.total_tokens},
            "speedup": speedup, "bandwidth_bytes_per_s": bandwidth, "weight_bytes": weights, "decode_steps": steps}


def part_vllm(ctx: Context) -> dict[str, Any]:
    if importlib.util.find_spec("vllm") is None or ctx.device.type != "cuda":
        return {"skipped": "vLLM is not installed" if importlib.util.find_spec("vllm") is None
                else "vLLM needs a CUDA GPU"}
    from .vllm_bon import run_vllm_bon

    gen = ctx.generator("bfloat16")
    reward = load_reward("likelihood", generator=gen)
    n = ctx.sizes.engine_n[0]
    return run_vllm_bon(gen, reward, ctx.prompts[:ctx.sizes.engine_prompts], n=n,
                        max_new_tokens=ctx.sizes.engine_tokens, sampling=ctx.sampling, seed=ctx.args.seed,
                        quiet=ctx.args.quiet)


PARTS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "engine": part_engine, "coupling": part_coupling, "paper-scale": part_paper_scale, "vllm": part_vllm}


# -- the command ------------------------------------------------------------------------------------

def save_tiny_generator(folder: Path) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer and chat template, saved where load_generator can
    load it as a folder: the --tiny stand-in for the real generator."""
    tokenizer = smollm2_tokenizer()
    model = random_llama(tokenizer, torch.device("cpu"), torch.float32, TINY.llama)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def with_overrides(sizes: Sizes, items: list[str]) -> Sizes:
    """Sizes with FIELD=VALUE overrides: a number, or a comma-separated tuple for tuple fields."""
    from sbon.errors import SBoNError

    kinds = {f.name: getattr(sizes, f.name) for f in fields(Sizes)}
    changes: dict[str, Any] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in kinds or name == "llama" or not value:
            raise SBoNError(f"--size {item!r}: expected FIELD=VALUE with FIELD one of "
                            f"{', '.join(k for k in kinds if k != 'llama')}")
        current = kinds[name]
        if isinstance(current, tuple):
            cast = type(current[0]) if current else str
            changes[name] = tuple(cast(v) for v in value.split(","))
        else:
            changes[name] = type(current)(value)
    return replace(sizes, **changes)


def add_parser(sub) -> None:
    p = sub.add_parser("gpu-check", help="one command on a GPU machine: engine vs generate, bfloat16 coupling, "
                                         "8B-architecture paper-scale timing, vLLM; --tiny on a CPU",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS), help="which parts to run")
    p.add_argument("--tiny", action="store_true", help="tiny random configs and sizes: a minutes-long CPU test")
    p.add_argument("--size", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="override a size, e.g. coupling_n=16 coupling_dtypes=bfloat16,float16 (fields of Sizes)")
    p.add_argument("--generator", default="smollm2-135m", help="generator of the engine, coupling and vllm parts")
    resolved(p.add_argument("--device", default=None, help="cpu, cuda ... (by default cuda where there is one)"), default_device)
    p.add_argument("--machine", default=None, help="results folder name (default: from the device, e.g. gpu-h100)")
    p.add_argument("--out-dir", default=None, help="default: benchmarks/results/<machine>/gpu-check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    from transformers.utils import logging as tf_logging

    tf_logging.set_verbosity_error()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sizes = with_overrides(TINY if args.tiny else GPU, args.size)
    out = Path(args.out_dir or common.DEFAULT_OUT_DIR / (args.machine or machine_name()) / "gpu-check")
    protocol = common.PROTOCOLS[common.DEFAULT_PROTOCOL]
    sampling = SamplingConfig(protocol.temperature, protocol.top_p, protocol.top_k)
    prompts = common.load_prompts(max(sizes.engine_prompts, sizes.coupling_prompts, 1))
    with tempfile.TemporaryDirectory(prefix="sbon-gpu-check-") as tmp:
        folder = save_tiny_generator(Path(tmp) / "tiny-llama") if args.tiny else None
        ctx = Context(args, sizes, device, prompts, sampling, folder)
        summary = {"environment": common.environment(), "device": str(device), "tiny": args.tiny,
                   "sizes": asdict(sizes), "parts": {}}
        if device.type == "cuda":
            summary["environment"]["gpu"] = torch.cuda.get_device_name(device)
        for name in args.parts:
            start = time.perf_counter()
            print(f"== {name}", file=sys.stderr)
            result = PARTS[name](ctx)
            result["seconds"] = time.perf_counter() - start
            common.write_json({"part": name, "environment": summary["environment"], **result}, out / f"{name}.json")
            summary["parts"][name] = result["seconds"]
    common.write_json(summary, out / "summary.json")
    print(f"wrote {out}/ ({', '.join(f'{k} {v:.0f} s' for k, v in summary['parts'].items())})")
    return 0
