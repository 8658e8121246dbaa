"""`python -m benchmarks gpu-check`: everything this project claims about GPUs, in one command of at most
ten minutes on one GPU (SESSION_S).

It runs on a bare, offline GPU machine: it needs torch, transformers and this repository, nothing else (no
embedded model package, no hub, no gradio or plotly). Its models are stand-ins with random weights and the real
tokenizers of the embedded models (benchmarks/gpu_stand_ins.py): SmolLM2-135M's architecture for the engine,
coupling, compiled and app parts (``--generator NAME`` runs a real model in the first three), Llama-3-8B's for the
paper-scale part. Its parts (``--parts``; ``all`` is engine, compiled, coupling and app, the quarter-hour set):

- ``app``: the page-default comparison through the app's own run path (its model cache and decode paths, what
  `/compare` runs; benchmarks/gpu_app.py) with the packaged models where installed, else the stand-ins: the path
  the app chose, the seconds from start to the first run on CUDA graphs, and the warm runs' wall times;
- ``compiled``: the ``compiled`` decode step (on a GPU CUDA graphs captured from the eager step, sbon.cuda_graphs)
  against the eager step on the SmolLM2 stand-in in bfloat16, at a few row counts: the capture's seconds,
  milliseconds per step, how far the first step's logits are from eager's; with ``--size inductor=1`` also
  inductor's step under the same graphs;
- ``coupling``: how often bfloat16 / float16 break coupled sampling, eagerly and through the graphs' one shape:
  the fraction of Speculative Rejection survivors whose text differs from Best-of-N's candidate with the same id
  and seed, and of pruned candidates that are not a prefix of it;
- ``engine``: this project's Best-of-N against `transformers`' ``generate`` at N = 32 and 128 in bfloat16, our
  engine with and without chunked decoding (``decode_chunk`` 1 and 8);
- ``paper-scale``: with 8B-architecture models, Speculative Rejection against memory-bound Best-of-N on the same
  KV budget (the paper's Table 1 setting, timing only), and the decode milliseconds per step next to the floor
  that the device's measured memory bandwidth puts under them;
- ``vllm``: Best-of-N on vLLM (benchmarks/vllm_bon.py), where vLLM imports and a real ``--generator`` is named.

Random weights never choose to stop, so in the engine, coupling and paper-scale parts every candidate stops at a
length drawn from a long-tailed distribution, the same in both engines (graphs do not force lengths: there every
candidate runs to the limit). Each part has its own limit (``PART_LIMIT_S`` in benchmarks/gpu_budget.py, in
proportion to ``--time-limit``): a part starts only where its limit fits in the time left, else it is not run, with
a line saying so; a part still running at its limit stops there with what it has and the next part starts. Each
part's file is written as it ends, in one folder (``--out-dir``), with ``summary.json``, which says of every part
asked for whether it ran to its end, stopped at its limit, failed or was not run, and why.

``--tiny`` runs the same code on tiny random configs and sizes, in a minute or two on a CPU, where graphs replay
by running the step eagerly: that is its test (tests/test_gpu_check.py, which also runs it with the packages a GPU
machine lacks blocked). Tiny numbers measure nothing but that the code runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

import torch

from sbon import algorithms
from sbon.algorithms import best_of_n, speculative_rejection
from sbon.analysis.comparison import peak_kv_tokens, same_memory_batch_size
from sbon.config import RunConfig
from sbon.cuda_graphs import GraphDecoder
from sbon.decoders import EagerDecoder, _step, compile_problem, graphs
from sbon.engine import DTYPES, Generator, SamplingConfig
from sbon.models import default_device, load_generator, load_reward
from sbon.options import resolved
from sbon.rewards import SequenceClassifierReward

from . import common
from .gpu_app import part_app
from .gpu_budget import (DEFAULT_TIME_LIMIT_S, GPU, RESERVE_S, TINY, Sizes, machine_name, measure_bandwidth,
                         part_limits, run_parts, sync, weight_bytes)
from .gpu_stand_ins import (LLAMA_3_8B, SMOLLM2_135M, STAND_IN, ForcedLengthGenerator, forced_lengths, random_llama,
                            smollm2_tokenizer, stand_in)

# -- the parts --------------------------------------------------------------------------------------

@dataclass
class Context:
    """What every part gets: the parsed command line, the sizes, the device and the prompts."""
    args: argparse.Namespace
    sizes: Sizes
    device: torch.device
    prompts: list[dict]
    sampling: SamplingConfig

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
        gen = ctx.generator(dtype)
        common.warm_up(gen, NO_REWARD, ctx.sampling, decode="eager")
        hf_generate(gen, gen.encode_prompt("Say hello."), 2, 4, ctx.sampling, ctx.args.seed)
        for n in s.engine_n:
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
                   sampling: SamplingConfig, seed: int, decode: str = "eager") -> dict[str, Any]:
    """Speculative Rejection and Best-of-N with the same seed on each prompt, both decoding by ``decode``: how many
    survivors' texts differ from their Best-of-N twins', and how many pruned candidates are not a prefix of theirs;
    then Best-of-N again, and how many of its texts differ from the first Best-of-N's (``repeat_differ``: a path that
    is not deterministic from run to run, which no batch layout can make exact)."""
    def run(method: str):
        config = RunConfig.build(sampling, method=method, n=n, alpha=0.5, max_new_tokens=max_new_tokens, seed=seed,
                                 decode=decode)
        return common.timed_run(algorithms.events(gen, reward, p["instruction"], config))

    rows = []
    for p in prompts:
        sbon, bon = run("sbon"), {c.id: c for c in run("bon").candidates}
        again = run("bon").candidates
        survivors = [c for c in sbon.candidates if c.pruned_round is None]
        pruned = [c for c in sbon.candidates if c.pruned_round is not None]
        rows.append({"prompt_id": p["id"], "survivors": len(survivors), "pruned": len(pruned), "decode": sbon.decode,
                     "survivors_differ": sum(c.token_ids != bon[c.id].token_ids for c in survivors),
                     "pruned_not_prefix": sum(c.token_ids != bon[c.id].token_ids[:len(c.token_ids)] for c in pruned),
                     "repeat_differ": sum(c.token_ids != bon[c.id].token_ids for c in again)})
    survivors = sum(r["survivors"] for r in rows)
    pruned = sum(r["pruned"] for r in rows)
    return {"rows": rows, "survivors": survivors, "pruned": pruned,
            "survivor_divergence_rate": sum(r["survivors_differ"] for r in rows) / max(1, survivors),
            "pruned_divergence_rate": sum(r["pruned_not_prefix"] for r in rows) / max(1, pruned),
            "repeat_divergence_rate": sum(r["repeat_differ"] for r in rows) / max(1, n * len(rows))}


def part_coupling(ctx: Context, record: dict) -> None:
    """``by_dtype``: eager decoding, ``graphs``: the ``compiled`` step (on a GPU its CUDA graphs: both methods through
    one shape at N <= sbon.cuda_graphs.GRAPH_MIN_ROWS), each by dtype."""
    s = ctx.sizes
    by_decode: dict[str, dict[str, Any]] = {decode: {} for decode in s.coupling_decodes}
    record.update(generator=ctx.model_record(), reward="likelihood", alpha=0.5, n=s.coupling_n,
                  tokens=s.coupling_tokens, by_dtype=by_decode.get("eager", {}), graphs=by_decode.get("compiled", {}))
    for dtype in s.coupling_dtypes:
        gen = ctx.generator(dtype)
        # Most candidates are still going at the first decision point.
        ctx.force(gen, s.coupling_n, s.coupling_tokens * 3 // 4, s.coupling_tokens)
        reward = load_reward("likelihood", generator=gen)
        if "compiled" in by_decode:
            graphs(gen)  # the compiled step is the graphs' here, also without CUDA (where they run eagerly)
        for decode, results in by_decode.items():
            r = results[dtype] = coupling_rates(gen, reward, ctx.prompts[:s.coupling_prompts], s.coupling_n,
                                                s.coupling_tokens, ctx.sampling, ctx.args.seed, decode)
            print(f"coupling {dtype} {decode}: {r['survivor_divergence_rate']:.1%} of {r['survivors']} survivors "
                  f"differ from their Best-of-N twin; {r['pruned_divergence_rate']:.1%} of {r['pruned']} pruned are "
                  f"not its prefix; Best-of-N run twice: {r['repeat_divergence_rate']:.1%} differ")
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
    reward = SequenceClassifierReward(random_llama(tokenizer, ctx.device, torch.bfloat16, arch, classifier=True),
                                      tokenizer, name="random-llama-3-8b-classifier", batch_size=32)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0)
    # Op by op: the forced lengths are applied in the generator's own forward (ForcedLengthGenerator).
    common.warm_up(gen, reward, sampling, decode="eager")
    sbon = common.timed_run(speculative_rejection(gen, reward, prompt, s.paper_n, alpha=0.5,
                                                  max_new_tokens=s.paper_tokens, sampling=sampling,
                                                  seed=ctx.args.seed, decode="eager"))
    batch = same_memory_batch_size(sbon)  # Best-of-N gets the KV memory Speculative Rejection peaked at
    record.update(peak_kv_tokens=peak_kv_tokens(sbon), bon_batch_size=batch,
                  sbon={"wall_time": sbon.wall_time, "timings": sbon.timings, "tokens": sbon.total_tokens})
    bon = common.timed_run(best_of_n(gen, reward, prompt, s.paper_n, batch_size=batch,
                                     max_new_tokens=s.paper_tokens, sampling=sampling, seed=ctx.args.seed,
                                     decode="eager"))
    record.update(bon={"wall_time": bon.wall_time, "timings": bon.timings, "tokens": bon.total_tokens},
                  speedup=bon.wall_time / sbon.wall_time)
    print(f"paper scale: Speculative Rejection {sbon.wall_time:.1f} s, memory-bound Best-of-N "
          f"{bon.wall_time:.1f} s (batches of {batch}): speedup {record['speedup']:.2f}x")
    del reward  # the classifier's memory goes to the decode measurement's caches
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
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
    """The ``compiled`` decode step on the SmolLM2 stand-in in bfloat16 against the eager one (sbon.cuda_graphs: on a
    GPU CUDA graphs captured from the eager step; elsewhere the same layout run eagerly): the first step's seconds
    (the capture), milliseconds per step, how far the first step's logits are from eager's; with ``inductor`` also
    inductor's step under the same graphs (``inductor_ms``, ``inductor_compile_s``)."""
    s = ctx.sizes
    gen = stand_in(smollm2_tokenizer(), ctx.device, "bfloat16", {**SMOLLM2_135M, **(s.arch or {})}, cls=Generator)
    if why := compile_problem(gen):
        record["skipped"] = why
        return
    compiled, eager = GraphDecoder(gen, _step), EagerDecoder(gen)
    inductor = GraphDecoder(gen, _step, inductor=True) if s.inductor else None
    prefix = gen.prefill(list(range(1, s.compiled_context + 1)))
    steps: list[dict] = []
    record.update(generator=f"{STAND_IN} in bfloat16", context=s.compiled_context, repeats=s.compiled_repeats,
                  graphs=ctx.device.type == "cuda", steps=steps)
    for rows in s.compiled_rows:
        e = time_steps(eager, prefix, rows, s.compiled_repeats)
        c = time_steps(compiled, prefix, rows, s.compiled_repeats)
        diff = (c["logits"] - e["logits"]).abs()
        steps.append({"rows": rows, "computed_rows": compiled.rows(rows), "eager_ms": e["ms_per_step"],
                      "compiled_ms": c["ms_per_step"], "speedup": e["ms_per_step"] / c["ms_per_step"],
                      "compile_s": c["first_step_s"], "capture_s": compiled.capture_s, "failed": compiled.failed,
                      "max_abs_logit_diff": diff.max().item(),
                      "top1_agreement": (c["logits"].argmax(-1) == e["logits"].argmax(-1)).float().mean().item()})
        if inductor is not None:
            i = time_steps(inductor, prefix, rows, s.compiled_repeats)
            steps[-1].update(inductor_ms=i["ms_per_step"], inductor_compile_s=i["first_step_s"])
        print(f"compiled step {rows} rows: eager {e['ms_per_step']:.2f} ms, graphs {c['ms_per_step']:.2f} ms "
              f"({steps[-1]['speedup']:.2f}x), first step with its capture {c['first_step_s']:.2f} s, top-1 agreement "
              f"{steps[-1]['top1_agreement']:.0%}" + (f"; failed: {compiled.failed}" if compiled.failed else "")
              + (f"; inductor under the graphs {steps[-1]['inductor_ms']:.2f} ms (first step "
                 f"{steps[-1]['inductor_compile_s']:.1f} s)" if inductor is not None else ""))


def part_vllm(ctx: Context, record: dict) -> None:
    why = ("vLLM is not installed" if importlib.util.find_spec("vllm") is None else
           "vLLM needs a CUDA GPU" if ctx.device.type != "cuda" else
           "vLLM loads a model's files: name a real --generator" if ctx.stand_in else None)
    if why:
        record["skipped"] = why
        return
    from .vllm_bon import run_vllm_bon

    gen = ctx.generator("bfloat16")
    reward = load_reward("likelihood", generator=gen)
    record.update(run_vllm_bon(gen, reward, ctx.prompts[:ctx.sizes.engine_prompts], n=ctx.sizes.engine_n[0],
                               max_new_tokens=ctx.sizes.engine_tokens, sampling=ctx.sampling, seed=ctx.args.seed,
                               quiet=ctx.args.quiet))


PARTS: dict[str, Callable[[Context, dict], None]] = {
    "app": part_app, "compiled": part_compiled, "coupling": part_coupling, "engine": part_engine,
    "paper-scale": part_paper_scale, "vllm": part_vllm}
# `--parts all`: what one quarter hour of GPU time proves, most important first.
ALL = ["app", "compiled", "coupling", "engine"]
# Without --parts: every part but the app (`--parts app` asks for it, or `all`).
DEFAULT_PARTS = ["engine", "paper-scale", "coupling", "compiled", "vllm"]


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
        elif isinstance(current, bool):
            changes[name] = value.lower() in ("1", "true", "yes")
        else:
            changes[name] = type(current)(value)
    return replace(sizes, **changes)


def add_parser(sub) -> None:
    p = sub.add_parser("gpu-check", help="one command on a GPU machine, offline, within --time-limit: the app's "
                                         "page-default run, CUDA graphs, coupling, engine vs generate, 8B-architecture "
                                         "paper-scale timing, vLLM; --tiny on a CPU",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=[*PARTS, "all"], default=DEFAULT_PARTS,
                   help=f"which parts to run (all: {' '.join(ALL)}; app: only when named)")
    p.add_argument("--stand-ins", action="store_true",
                   help="the app part loads the stand-in models even where the packaged ones are installed")
    p.add_argument("--tiny", action="store_true", help="tiny random configs and sizes: a CPU test of a minute or two")
    p.add_argument("--size", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="override a size, e.g. coupling_n=16 coupling_dtypes=bfloat16,float16 (fields of Sizes)")
    p.add_argument("--generator", default=STAND_IN,
                   help=f"generator of the engine, coupling and vllm parts ({STAND_IN}: SmolLM2-135M's architecture "
                        "with random weights and its tokenizer, needing no download; or a preset, folder or hub id)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
                   help="seconds from the check's start (after Python's imports); each part's own limit is in "
                        "proportion to it, and a part starts only where its limit fits in the time left")
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
    if "all" in args.parts:
        args.parts = list(dict.fromkeys(p for name in args.parts for p in (ALL if name == "all" else [name])))
    out = Path(args.out_dir or common.DEFAULT_OUT_DIR / (args.machine or machine_name()) / "gpu-check")
    protocol = common.PROTOCOLS[common.DEFAULT_PROTOCOL]
    sampling = SamplingConfig(protocol.temperature, protocol.top_p, protocol.top_k)
    prompts = common.load_prompts(max(sizes.engine_prompts, sizes.coupling_prompts, 1))
    ctx = Context(args, sizes, device, prompts, sampling)
    environment = {**common.environment(), "device": str(device)}
    if device.type == "cuda":
        environment["gpu"] = torch.cuda.get_device_name(device)
    parts = run_parts(ctx, {name: PARTS[name] for name in args.parts}, out, started + args.time_limit - RESERVE_S,
                      environment, part_limits(args.time_limit))
    summary = {"command": common.command_line(args), "environment": environment,
               "device": str(device), "tiny": args.tiny, "generator": ctx.model_record(), "sizes": asdict(sizes),
               "time_limit": args.time_limit, "reserve_s": RESERVE_S, "parts": parts,
               "seconds": time.monotonic() - started}
    common.write_json(summary, out / "summary.json")
    ran = ", ".join(f"{name} {o['outcome']} {o['seconds']:.0f} s" for name, o in parts.items())
    print(f"wrote {out}/ ({ran}; {summary['seconds']:.0f} s in all)")
    return 0
