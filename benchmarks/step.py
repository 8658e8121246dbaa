"""One decode step of our engine, next to this machine's limits and llama.cpp.

A decode step feeds one token to each of R rows: sample from each row's logits with its coupled
uniform number (`sbon.engine.sample`), check stops, one forward pass of the generator
(`Generator.forward`). This experiment times that step for several row counts and weight formats
(`sbon.engine.WEIGHT_FORMATS`), and in the same run, interleaved so that other load on the cores
hits every column alike:

- the roofline of these cores: a square float32 and bfloat16 matmul (GFLOP/s) and a large copy
  (memory bandwidth, GB/s), with the time a step's weights take to stream at that bandwidth;
- the step's own Linear layers alone (`F.linear` on the model's weights at R rows): what is
  outside them is the cost of attention, the KV cache, sampling and Python;
- each format with the decode-step attention (`sbon.attention`, the CPU default) and with torch's SDPA
  (`transformers`' default): `fp32 sdpa` is the baseline of TARGET_SPEEDUP;
- llama.cpp on the same GGUF file (4-bit), R sequences one token each, where `llama_cpp` imports
  (`pip install llama-cpp-python`; not a requirement of this project: the column is skipped).
- the compiled step (`sbon.decoders`, every bucket compiled first; the cold compile's seconds in the file),
  also with Dynamo's guards checked only where they tell its graphs apart (what the guards cost per step);
- the int4 format (`sbon.int4`: torch's 4-bit weight-only CPU kernel on the GGUF file's own Q4_1 blocks, a
  quarter of bf16's bytes) beside bf16, eager and compiled.

Then each format's divergence rate: the fraction of candidates whose tokens differ between one
batch of N rows and the same candidates decoded in smaller batches. Zero is what coupled
sampling needs (survivor k of Speculative Rejection = Best-of-N's candidate k).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from sbon.attention import NAME as DECODE_ATTENTION
from sbon.decoders import CompiledDecoder, EagerDecoder, decoder
from sbon.engine import WEIGHT_FORMATS, Generator, Prefix, SamplingConfig, coupled_uniforms, sample
from sbon.int4 import Int4Linear
from sbon.probe import MatrixProducts
from sbon.models import DEFAULT_GENERATOR, GENERATORS, _package_dir, load_generator

from . import common
from .cpu_classes import matmul_gflops

TARGET_SPEEDUP = 2.5  # a 16-row step of the CPU default this many times faster than BASELINE's
BASELINE = "fp32 sdpa"  # float32 weights with torch's SDPA attention: transformers' own step on a CPU


@dataclass
class StepSettings:
    rows: list[int] = field(default_factory=lambda: [1, 4, 7, 16, 32], metadata={"help": "rows per step"})
    formats: list[str] = field(default_factory=lambda: ["bf16", "int4"], metadata={
        "help": f"weight formats (of {', '.join(WEIGHT_FORMATS)})"})
    attentions: list[str] = field(default_factory=lambda: [DECODE_ATTENTION], metadata={
        "help": "attention implementations of the eager step, each timed with every format (the divergence check "
                "uses the first)"})
    compiled: list[str] = field(default_factory=lambda: ["bf16", "int4"], metadata={
        "help": "formats also timed with the compiled step over a static KV slab (sbon.decoders; none: --compiled with no format)"})
    threads: int = field(default=2, metadata={"help": "torch (and llama.cpp) CPU threads"})
    warm_steps: int = field(default=4, metadata={"help": "untimed steps before each timing"})
    steps: int = field(default=16, metadata={"help": "timed steps per timing"})
    repeats: int = field(default=3, metadata={"help": "interleaved rounds; each column reports its median"})
    matmul_size: int = field(default=1024, metadata={"help": "side of the square matmul probe"})
    copy_mb: int = field(default=256, metadata={"help": "size of the memory-bandwidth probe's copy"})
    divergence_n: int = field(default=16, metadata={"help": "candidates of the divergence check (one batch)"})
    divergence_split: int = field(default=5, metadata={"help": "rows per batch of the check's second decode"})
    divergence_tokens: int = field(default=48, metadata={"help": "new tokens per candidate in the check"})
    divergence_prompts: int = field(default=2, metadata={"help": "prompts of the check (the prompt file's first)"})
    seed: int = 0


def median_ms(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


# -- the machine ---------------------------------------------------------------------------------

def copy_gbps(mb: int, reps: int = 5) -> float:
    """GB/s of a large copy (bytes read plus bytes written): what streaming the weights can reach."""
    src = torch.ones(mb * 2 ** 20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * src.numel() * 4 / median_ms(lambda: dst.copy_(src), reps) / 1e6


def weights(gen: Generator) -> tuple[int, int]:
    """Numbers and bytes of the Linear weights one step reads, the LM head included (the input
    embedding only gathers one row per token; tied to the LM head, it is counted once)."""
    seen, count, total = set(), 0, 0
    for m in gen.model.modules():
        if isinstance(m, Int4Linear):  # 4-bit weights and each group's scale and zero
            count += m.in_features * m.out_features
            total += sum(b.numel() * b.element_size() for b in (m.packed, m.scales))
        elif isinstance(m, torch.nn.Linear) and m.weight.data_ptr() not in seen:
            seen.add(m.weight.data_ptr())
            count, total = count + m.weight.numel(), total + m.weight.numel() * m.weight.element_size()
    return count, total


# -- our engine --------------------------------------------------------------------------------

def engine_step_ms(gen: Generator, prefix: Prefix, rows: int, s: StepSettings, sampling: SamplingConfig,
                   dec=None) -> float:
    """Milliseconds per decode step of `rows` candidates: sample, stop check, forward (through ``dec``, a
    `sbon.decoders` decoder; default the eager one)."""
    dec = dec or EagerDecoder(gen)
    batch = dec.start(prefix, list(range(rows)), False, s.warm_steps + s.steps)
    uniforms = coupled_uniforms(s.seed, range(rows), s.warm_steps + s.steps)

    def step(t: int) -> None:
        tokens = sample(batch.logits, uniforms[:, t], sampling)
        gen.is_stop(tokens).tolist()
        dec.forward(batch, tokens)

    for t in range(s.warm_steps):
        step(t)
    gen.synchronize()
    start = time.perf_counter()
    for t in range(s.warm_steps, s.warm_steps + s.steps):
        step(t)
    gen.synchronize()
    return 1e3 * (time.perf_counter() - start) / s.steps


@torch.inference_mode()
def linear_ms(gen: Generator, rows: int, reps: int = 3) -> float:
    """Milliseconds for one step's matrix products alone at `rows` rows (sbon.probe.MatrixProducts: every Linear
    layer and the LM head as the format makes them, what the app's probe predicts compiled steps from)."""
    products = MatrixProducts(gen)
    layers = products.start(None, range(rows), False, 0)
    products.forward(layers, None)
    return median_ms(lambda: products.forward(layers, None), reps)


# -- llama.cpp ---------------------------------------------------------------------------------

class LlamaCpp:
    """llama.cpp on a GGUF file through `llama_cpp`'s low-level API: R sequences, one token each
    per `llama_decode`, after a shared prompt (copied to every sequence's KV cells)."""

    def __init__(self, path: str, threads: int, max_rows: int, context: int):
        import llama_cpp as lc

        self.lc = lc
        self._quiet = lc.llama_log_callback(lambda level, text, user_data: None)  # kept: C holds a pointer
        lc.llama_log_set(self._quiet, None)  # its load log is hundreds of lines
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(path.encode(), mparams)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = max_rows * context
        cparams.n_batch = cparams.n_ubatch = max(max_rows, context)
        cparams.n_seq_max = max_rows
        cparams.n_threads = cparams.n_threads_batch = threads
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        self.batch = lc.llama_batch_init(max(max_rows, context), 0, max_rows)
        self.vocab = lc.llama_model_get_vocab(self.model)

    def _decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int]) -> None:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, (tok, pos, seq) in enumerate(zip(tokens, positions, seqs)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = tok, pos, 1, seq, True
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def step_ms(self, prompt_ids: Sequence[int], rows: int, s: StepSettings) -> float:
        lc = self.lc
        mem = lc.llama_get_memory(self.ctx)
        lc.llama_memory_clear(mem, True)
        n = len(prompt_ids)
        self._decode(prompt_ids, range(n), [0] * n)
        for seq in range(1, rows):
            lc.llama_memory_seq_cp(mem, 0, seq, -1, -1)
        token = prompt_ids[-1]  # the token fed does not change the cost of a step
        for t in range(s.warm_steps):
            self._decode([token] * rows, [n + t] * rows, range(rows))
        start = time.perf_counter()
        for t in range(s.warm_steps, s.warm_steps + s.steps):
            self._decode([token] * rows, [n + t] * rows, range(rows))
        return 1e3 * (time.perf_counter() - start) / s.steps

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def open_llama_cpp(generator: str, s: StepSettings, context: int) -> tuple[LlamaCpp | None, str]:
    """llama.cpp on the preset's GGUF file, or None and why not."""
    preset = GENERATORS.get(generator)
    folder = _package_dir(preset.package) if preset and preset.package else None
    if folder is None or not preset.gguf_file:
        return None, f"'{generator}' ships no GGUF file here"
    try:
        import llama_cpp
    except ImportError:
        return None, "llama_cpp does not import (pip install llama-cpp-python)"
    path = str(folder / preset.gguf_file)
    return LlamaCpp(path, s.threads, max(s.rows), context), f"llama-cpp-python {llama_cpp.__version__}, {path}"


# -- divergence ------------------------------------------------------------------------------

def decode_tokens(gen: Generator, prefix: Prefix, candidate_ids: Sequence[int], tokens: int, seed: int,
                  sampling: SamplingConfig, dec=None) -> dict[int, list[int]]:
    """Each candidate's tokens, all decoded in one batch (stops ignored: every row runs `tokens`) through
    ``dec`` (default: the eager decoder)."""
    dec = dec or EagerDecoder(gen)
    batch = dec.start(prefix, list(candidate_ids), False, tokens)
    uniforms = coupled_uniforms(seed, candidate_ids, tokens)
    out = {k: [] for k in candidate_ids}
    for t in range(tokens):
        picked = sample(batch.logits, uniforms[:, t], sampling)
        for k, token in zip(candidate_ids, picked.tolist()):
            out[k].append(token)
        dec.forward(batch, picked)
    return out


def divergence_rate(gen: Generator, prompts: Sequence[str], s: StepSettings, sampling: SamplingConfig,
                    dec=None) -> dict:
    """Fraction of candidates whose tokens differ between one batch of all and batches of
    `divergence_split` rows; also the first token position where they differ."""
    differ, total, first = 0, 0, []
    ids = list(range(s.divergence_n))
    for text in prompts:
        prefix = gen.prefill(gen.encode_prompt(text))
        whole = decode_tokens(gen, prefix, ids, s.divergence_tokens, s.seed, sampling, dec)
        split = {}
        for i in range(0, len(ids), s.divergence_split):
            split.update(decode_tokens(gen, prefix, ids[i:i + s.divergence_split], s.divergence_tokens, s.seed,
                                       sampling, dec))
        for k in ids:
            total += 1
            if whole[k] != split[k]:
                differ += 1
                first.append(next(t for t, (a, b) in enumerate(zip(whole[k], split[k])) if a != b))
    return {"rate": differ / total, "candidates": total, "differ": differ, "first_differing_token": first}


def eager_agreement(gen: Generator, prompts: Sequence[str], s: StepSettings, sampling: SamplingConfig, dec) -> dict:
    """Candidates whose tokens are the same through ``dec`` as through the eager step (one batch each)."""
    same, total = 0, 0
    ids = list(range(s.divergence_n))
    for text in prompts:
        prefix = gen.prefill(gen.encode_prompt(text))
        a = decode_tokens(gen, prefix, ids, s.divergence_tokens, s.seed, sampling)
        b = decode_tokens(gen, prefix, ids, s.divergence_tokens, s.seed, sampling, dec)
        same, total = same + sum(a[k] == b[k] for k in ids), total + len(ids)
    return {"same": same, "candidates": total}


# -- the run -----------------------------------------------------------------------------------

def column_name(fmt: str, attention: str) -> str:
    return f"{fmt} {'sdpa' if attention == 'sdpa' else 'decode-attn' if attention == DECODE_ATTENTION else attention}"


GUARDS_SKIPPED = ", guards skipped"


class SkipGuards:
    """A compiled decoder whose steps check only the guards that tell its graphs apart
    (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``; every bucket compiled before): what checking
    all of them costs per step. Timing only: the decoder the engine uses checks them all."""

    def __init__(self, dec: CompiledDecoder):
        self.dec = dec

    def start(self, *args) -> Any:
        return self.dec.start(*args)

    def forward(self, batch: Any, tokens: torch.Tensor) -> None:
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            self.dec.forward(batch, tokens)


def run_step(gens: dict[str, Generator], prompt_ids: Sequence[int], s: StepSettings, sampling: SamplingConfig,
             llama: LlamaCpp | None, quiet: bool = False) -> dict[str, Any]:
    """Every column (format x attention), round after round; the order of the columns rotates so that none
    always goes first."""
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float | None) -> None:
        if value is not None:
            samples.setdefault(key, []).append(value)

    prefixes = {name: g.prefill(prompt_ids) for name, g in gens.items()}
    columns = {column_name(f, a): (f, a) for f in gens for a in s.attentions}
    compile_s, decoders, warm_start = {}, {}, {}
    for fmt in s.compiled:
        # the first step compiles and saves the step (loads it where it is saved already)
        gens[fmt].model.set_attn_implementation(DECODE_ATTENTION)
        dec = decoder(gens[fmt], "compiled")
        start = time.perf_counter()
        engine_step_ms(gens[fmt], prefixes[fmt], 2, StepSettings(warm_steps=1, steps=1), sampling, dec)
        compile_s[fmt] = time.perf_counter() - start
        start = time.perf_counter()  # every other bucket the row counts use, before any is timed
        for rows in s.rows:
            engine_step_ms(gens[fmt], prefixes[fmt], rows, StepSettings(warm_steps=1, steps=1), sampling, dec)
        compile_s[f"{fmt} other row counts"] = time.perf_counter() - start
        fresh = fresh_process_step(gens[fmt].name, fmt, s.threads)
        compile_s[f"{fmt} warm start"], warm_start[fmt] = fresh["seconds"], fresh["step"]
        columns[f"{fmt} compiled"] = columns[f"{fmt} compiled{GUARDS_SKIPPED}"] = (fmt, DECODE_ATTENTION)
        decoders[f"{fmt} compiled"], decoders[f"{fmt} compiled{GUARDS_SKIPPED}"] = dec, SkipGuards(dec)
    bar = common.progress(s.repeats, "step", disable=quiet)
    for rep in range(s.repeats):
        add("matmul_fp32_gflops", matmul_gflops(torch.float32, s.matmul_size))
        add("matmul_bf16_gflops", matmul_gflops(torch.bfloat16, s.matmul_size))
        add("copy_gbps", copy_gbps(s.copy_mb))
        names = list(columns)[rep % len(columns):] + list(columns)[:rep % len(columns)]
        for rows in s.rows:
            for name in names:
                fmt, attention = columns[name]
                gens[fmt].model.set_attn_implementation(attention)
                add(f"{name}/{rows}", engine_step_ms(gens[fmt], prefixes[fmt], rows, s, sampling, decoders.get(name)))
                add(f"{fmt}/{rows}/linear", linear_ms(gens[fmt], rows))
            if llama is not None:
                add(f"llama.cpp/{rows}", llama.step_ms(prompt_ids, rows, s))
        bar.update()
    bar.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    gbps = med["copy_gbps"]
    table = []
    for rows in s.rows:
        for name, (fmt, attention) in columns.items():
            count, wb = weights(gens[fmt])
            table.append({"format": name, "rows": rows, "ms_per_step": med[f"{name}/{rows}"],
                          "linear_ms": med.get(f"{fmt}/{rows}/linear"),
                          "weights_mb": wb / 2 ** 20, "weights_stream_ms": 1e3 * wb / (gbps * 1e9),
                          "gflops": 2 * count * rows / med[f"{name}/{rows}"] / 1e6})
        if llama is not None:
            table.append({"format": "llama.cpp (GGUF)", "rows": rows, "ms_per_step": med[f"llama.cpp/{rows}"]})
    return {"probes": {k: med[k] for k in ("matmul_fp32_gflops", "matmul_bf16_gflops", "copy_gbps")},
            "table": table, "samples": samples, "compile_s": compile_s, "warm_start_step": warm_start}


def speedups(table: list[dict], rows: int = 16) -> list[str]:
    """One line per column at `rows` rows: its speed-up over BASELINE and over llama.cpp, in the same run."""
    ms = {r["format"]: r["ms_per_step"] for r in table if r["rows"] == rows}
    base, llama = ms.get(BASELINE), ms.get("llama.cpp (GGUF)")
    lines = []
    for name, value in ms.items():
        parts = [f"{base / value:.2f}x {BASELINE}'s step (target: {TARGET_SPEEDUP}x)"] if base else []
        if llama and name != "llama.cpp (GGUF)":
            parts.append(f"{llama / value:.2f}x llama.cpp's")
        if parts:
            lines.append(f"{rows} rows, {name}: {value:.1f} ms, " + ", ".join(parts))
    return lines


# A fresh process's first compiled step, with the disk cache this process filled: what a restarted app waits.
# Arguments: format, threads, generator, then the formats of models it loads first (whatever else a process holds).
FRESH_PROCESS = """
import json, sys, time, torch
from torch._dynamo.utils import counters
from sbon.decoders import decoder
from sbon.models import load_generator
torch.set_num_threads(int(sys.argv[2]))
others = [load_generator(sys.argv[3], device="cpu", weights=w) for w in sys.argv[4:]]
gen = load_generator(sys.argv[3], device="cpu", weights=sys.argv[1])
dec = decoder(gen, "compiled")
batch = dec.start(gen.prefill(gen.encode_prompt("Hello")), [0, 1], False, 8)
start = time.perf_counter()
dec.forward(batch, torch.tensor([100, 200]))
seconds = time.perf_counter() - start
saved = dec.saved_step() if hasattr(dec, "saved_step") else None
print(json.dumps({"seconds": seconds, "inductor": dict(counters["inductor"]),
                  "step": "traced" if saved is None else "built" if saved.built else "loaded"}))
"""


def fresh_process_step(generator: str, fmt: str, threads: int, first: Sequence[str] = (),
                       env: dict[str, str] | None = None) -> dict[str, Any]:
    """A fresh process's first compiled step in ``fmt`` (after loading models in the ``first`` formats): its
    seconds, how it got the step (``step``: ``loaded`` from the disk, ``built``: compiled and saved there,
    ``traced`` in the process where it could not be saved) and inductor's counters (cache hits and misses)."""
    import json
    import subprocess
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, fmt, str(threads), generator, *first], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def inductor_cache() -> str:
    """Where the compiled step's kernels are cached (a fresh folder, TORCHINDUCTOR_CACHE_DIR=$(mktemp -d), times
    a cold compile)."""
    import os
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR", "(inductor's default)")


def add_parser(sub) -> None:
    p = sub.add_parser("step", help="decode step time per weight format and row count, next to the machine's "
                       "matmul and bandwidth probes and llama.cpp; divergence rate of each format",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    defaults = StepSettings()
    for f in StepSettings.__dataclass_fields__.values():
        value = getattr(defaults, f.name)
        kind = dict(nargs="*", type=type(value[0]) if value else str) if isinstance(value, list) else dict(type=type(value))
        p.add_argument(f"--{f.name.replace('_', '-')}", default=value, help=f.metadata.get("help"), **kind)
    p.add_argument("--generator", default=DEFAULT_GENERATOR)
    p.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp column even if it imports")
    p.add_argument("--no-divergence", action="store_true", help="skip the divergence check")
    p.add_argument("--out-dir", default=str(common.DEFAULT_OUT_DIR))
    p.add_argument("--tag", default=None)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    s = StepSettings(**{f: getattr(args, f) for f in StepSettings.__dataclass_fields__})
    torch.set_num_threads(s.threads)
    sampling = SamplingConfig()
    start_env = common.environment()
    print(f"loading '{args.generator}' as {', '.join(s.formats)} ...", file=sys.stderr)
    gens = {name: load_generator(args.generator, device="cpu", weights=name) for name in s.formats}
    prompts = [p["instruction"] for p in common.load_prompts(max(1, s.divergence_prompts))]
    prompt_ids = next(iter(gens.values())).encode_prompt(prompts[0])
    llama, llama_note = (None, "skipped (--no-llama-cpp)") if args.no_llama_cpp else open_llama_cpp(
        args.generator, s, len(prompt_ids) + s.warm_steps + s.steps + 8)
    print(f"llama.cpp: {llama_note}", file=sys.stderr)
    result = run_step(gens, prompt_ids, s, sampling, llama, args.quiet)
    if llama is not None:
        llama.close()
    for g in gens.values():
        g.model.set_attn_implementation(s.attentions[0])
    divergence = {} if args.no_divergence else {
        name: divergence_rate(g, prompts[:s.divergence_prompts], s, sampling) for name, g in gens.items()}
    if divergence:  # the compiled step: candidates in one batch against smaller ones, and against the eager step
        for fmt in s.compiled:
            dec = decoder(gens[fmt], "compiled")
            divergence[f"{fmt} compiled"] = divergence_rate(gens[fmt], prompts[:s.divergence_prompts], s, sampling, dec)
            divergence[f"{fmt} compiled"]["eager_tokens"] = eager_agreement(
                gens[fmt], prompts[:s.divergence_prompts], s, sampling, dec)
    json_path, _ = common.result_paths(args, "step")
    payload = {"experiment": "step", "command": common.command_line(args),
               "settings": {**asdict(s), "generator": args.generator, "prompt_tokens": len(prompt_ids),
                            "sampling": asdict(sampling), "llama_cpp": llama_note, "inductor_cache": inductor_cache(),
                            "batch_invariant": {n: WEIGHT_FORMATS[n].batch_invariant for n in s.formats}},
               "environment_start": start_env, "environment": common.environment(), **result,
               "divergence": divergence}
    common.write_json(payload, json_path)
    p = result["probes"]
    print(f"\nthis machine, {s.threads} threads: matmul {p['matmul_fp32_gflops']:.0f} GFLOP/s fp32, "
          f"{p['matmul_bf16_gflops']:.0f} bf16; copy {p['copy_gbps']:.1f} GB/s; load average "
          f"{start_env['load_average']} at the start (a shared machine: times are upper bounds)")
    df = pd.DataFrame(result["table"])
    if divergence:
        df["divergence"] = df["format"].map({**{column_name(n, s.attentions[0]): d["rate"] for n, d in divergence.items()},
                                             **{n: d["rate"] for n, d in divergence.items() if n.endswith(" compiled")}})
    common.print_table("decode step, median ms (format x rows):", df, "{:.1f}")
    for line in speedups(result["table"]):
        print(line)
    for key, seconds in result["compile_s"].items():
        what = ("the other row counts' first steps" if key.endswith(" other row counts") else
                "a fresh process's first step (the saved step loaded)" if key.endswith(" warm start") else
                "first step (compile and save, or load where saved)")
        name = key.removesuffix(" other row counts").removesuffix(" warm start")
        print(f"{name} compiled: {what}, inductor cache {inductor_cache()}: "
              f"{seconds:.1f} s")
    print(f"wrote {json_path}")
    return 0
