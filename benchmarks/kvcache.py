"""A proposed engine change, measured: KV rows that grow in place instead of by concatenation.

`transformers`' DynamicLayer appends each new token with `torch.cat`, which copies a layer's
whole cache every step: O(length) memory traffic per token, a fifth of decode time on a 2-core
CPU at 256 new tokens. GrowableLayer keeps each layer's rows in a buffer with headroom, writes
the new token in place, and reallocates (live rows only) once every max(64, length / 2) tokens;
its `keys`/`values` are views, so attention reads exactly what it read before and the outputs
are bit-identical. Rows pruned by `batch_select_indices` still leave the buffer, so memory
tracks the live candidates as before (plus the headroom).

`python -m benchmarks kvcache` runs Best-of-N both ways on the same prompts (alternating order)
and checks that the candidates are identical. The engine has since adopted it (`sbon.engine.GrowableLayer`);
the "dynamic" side here is `Generator.start` as it was before (`dynamic_start`).
"""

from __future__ import annotations

import argparse
import copy
import time
from contextlib import contextmanager
from typing import Any, Sequence

import pandas as pd

from sbon.algorithms import best_of_n
from sbon.engine import KV_MIN_HEADROOM, Batch, Generator, Prefix, SamplingConfig, growable_cache

from . import common, runners
from .engine_vs_generate import NO_REWARD

MIN_HEADROOM = KV_MIN_HEADROOM  # each buffer's first headroom (a test lowers it to force a reallocation)


def growable_start(gen: Generator, prefix: Prefix, candidate_ids: Sequence[int], keep_hidden: bool = False) -> Batch:
    """`Generator.start` with GrowableLayer rows: one row per candidate, each a copy of the prompt."""
    n = len(candidate_ids)
    cache = growable_cache(prefix.cache, n, MIN_HEADROOM)
    return Batch(list(candidate_ids), cache, prefix.logits.expand(n, -1), keep_hidden)


@contextmanager
def growable_kv(gen: Generator):
    """Within the block, this generator's batches use GrowableLayer (the class is not touched)."""
    gen.start = lambda prefix, ids, keep_hidden=False: growable_start(gen, prefix, ids, keep_hidden)
    try:
        yield gen
    finally:
        del gen.start


def dynamic_start(prefix: Prefix, candidate_ids: Sequence[int], keep_hidden: bool = False) -> Batch:
    """`Generator.start` before the engine adopted GrowableLayer: rows that grow by concatenation."""
    cache = copy.deepcopy(prefix.cache)
    cache.batch_repeat_interleave(len(candidate_ids))
    return Batch(list(candidate_ids), cache, prefix.logits.expand(len(candidate_ids), -1), keep_hidden)


@contextmanager
def dynamic_kv(gen: Generator):
    """Within the block, this generator's batches use transformers' DynamicLayer rows."""
    gen.start = dynamic_start
    try:
        yield gen
    finally:
        del gen.start


def run_kvcache(gen: Generator, prompts: Sequence[dict], *, n: int = 32, max_new_tokens: int = 256,
                sampling: SamplingConfig | None = None, seed: int = 0, quiet: bool = False) -> dict[str, Any]:
    sampling = sampling or SamplingConfig()
    with dynamic_kv(gen):
        common.warm_up(gen, NO_REWARD, sampling)
    with growable_kv(gen):
        common.warm_up(gen, NO_REWARD, sampling)
    rows = []
    bar = common.progress(2 * len(prompts), "kvcache", disable=quiet)
    for i, p in enumerate(prompts):
        row: dict[str, Any] = {"prompt_id": p["id"]}
        texts = {}
        for who in (("dynamic", "growable") if i % 2 == 0 else ("growable", "dynamic")):
            bar.set_description(f"kvcache prompt {p['id']} {who}")
            start = time.perf_counter()
            if who == "growable":
                with growable_kv(gen):
                    r = common.timed_run(best_of_n(gen, NO_REWARD, p["instruction"], n, max_new_tokens=max_new_tokens,
                                                   sampling=sampling, seed=seed))
            else:
                with dynamic_kv(gen):
                    r = common.timed_run(best_of_n(gen, NO_REWARD, p["instruction"], n, max_new_tokens=max_new_tokens,
                                                   sampling=sampling, seed=seed))
            elapsed = time.perf_counter() - start
            texts[who] = [c.token_ids for c in r.candidates]
            row.update({f"{who}_time": elapsed, f"{who}_tokens": r.total_tokens,
                        f"{who}_tok_per_s": r.total_tokens / elapsed})
            bar.update()
        row["identical"] = texts["dynamic"] == texts["growable"]
        row["speedup"] = row["dynamic_time"] / row["growable_time"]
        rows.append(row)
        bar.set_postfix(speedup=f"{row['speedup']:.2f}")
    bar.close()
    pooled = sum(r["dynamic_time"] for r in rows) / sum(r["growable_time"] for r in rows)
    return {"rows": rows, "summary": {"speedup_pooled": pooled, "speedup": common.summarize([r["speedup"] for r in rows]),
                                      "all_identical": all(r["identical"] for r in rows)}}


def add_parser(sub) -> None:
    p = sub.add_parser("kvcache", help="the engine's in-place growing KV cache (adopted) vs DynamicCache's "
                       "concatenation (Best-of-N both ways)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_common_args(p, k=3)
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    prompts = common.prompts_from(args)
    gen, reward = runners.setup(args)
    result = run_kvcache(gen, prompts, n=args.n, max_new_tokens=args.max_new_tokens,
                         sampling=common.sampling_from(args), seed=args.seed, quiet=args.quiet)
    json_path, _ = common.result_paths(args, "kvcache")
    common.write_json({"experiment": "kvcache", "settings": common.base_settings(args, gen, reward, prompts),
                       "environment": common.environment(gen), **result}, json_path)
    common.print_table("Best-of-N, DynamicCache vs GrowableLayer:", pd.DataFrame(result["rows"]))
    s = result["summary"]
    print(f"\ngrowable KV is {s['speedup_pooled']:.2f}x as fast (pooled); identical candidates: {s['all_identical']}")
    print(f"wrote {json_path}")
    return 0
