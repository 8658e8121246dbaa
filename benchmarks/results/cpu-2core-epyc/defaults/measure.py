"""Which embedded reward should the app's defaults use? Issue 13's "demo tells the truth" targets, measured
on held-out prompts through the app's own comparison path.

    OMP_NUM_THREADS=1 python benchmarks/results/cpu-2core-epyc/defaults/measure.py --threads 1 --k 8 \
        --settings minilm-pref:reward:0.2 likelihood:reward:0.2 ... --out FILE.json

Each setting is reward:prune_by:alpha[:first_decision]. Per prompt and setting it runs
``sbon.comparison.comparison_events`` exactly as the page's Run button does with "Best-of-N under the same
memory" on (Speculative Rejection, then Best-of-N in batches that fit the KV cache Speculative Rejection
peaked at), without the counterfactual prefix scoring (taus=[]), and records ``sbon.metrics.compare`` and
``decision_quality``: Kendall of partial vs final rewards at every decision point, the number of decision
points, the normalized score against Best-of-M's (M = round(N / wall-clock speedup), coupled: Best-of-N's
first M candidates), the wall-clock speedup, and two measures that do not depend on how busy the shared
cores were: the token speedup (Best-of-N tokens / Speculative Rejection tokens) and the step speedup
(sequential decode steps of memory-bound Best-of-N / those of Speculative Rejection).

A Best-of-N run depends only on the prompt, the final reward and its batch size (coupled sampling), so it
is run once per (prompt, final reward, batch size) and reused across settings.

Prompts: AlpacaEval instructions (benchmarks/data/alpaca_eval_prompts.jsonl) held out from every model
trained in this project (sha1(instruction) % 100 < 20, minilm-pref's validation fold, never trained on,
and the value head's held-out set), minus the first 20 (the benchmarks' prompts) and the app's example
prompts (assets/examples.json), shuffled with --prompt-seed; --offset skips the first of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks import common  # noqa: E402
from sbon.algorithms import Done, TokensGenerated  # noqa: E402
from sbon.comparison import Comparison, MethodEvent, same_memory_batch_size  # noqa: E402
from sbon.algorithms import events  # noqa: E402
from sbon.config import RunConfig  # noqa: E402
from sbon.metrics import compare, decision_quality  # noqa: E402
from sbon.models import load_generator, load_reward  # noqa: E402


def held_out_prompts(k: int, offset: int, seed: int, source: str) -> list[dict]:
    rows = [json.loads(line) for line in (REPO / "benchmarks" / "data" / source).read_text().splitlines() if line.strip()]
    examples = {e["prompt"] for e in json.loads((REPO / "assets" / "examples.json").read_text())["examples"]}
    if source.startswith("alpaca"):
        rows = [r for r in rows if r["id"] >= 20
                and int(hashlib.sha1(r["instruction"].encode()).hexdigest(), 16) % 100 < 20]
    rows = [r for r in rows if r["instruction"] not in examples]
    random.Random(seed).shuffle(rows)
    return rows[offset:offset + k]


def timed_run(gen, reward, prompt, config):
    """Run one algorithm; returns (RunResult, sequential decode steps)."""
    steps, result = 0, None
    import gc
    gc.collect()
    for event in events(gen, reward, prompt, config):
        if isinstance(event, TokensGenerated):
            steps += 1
        elif isinstance(event, Done):
            result = event.result
    return result, steps


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--settings", nargs="+", required=True, help="reward:prune_by:alpha[:first_decision]")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--prompt-seed", type=int, default=13)
    p.add_argument("--prompts-file", default="alpaca_eval_prompts.jsonl")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as tf_logging
    tf_logging.set_verbosity_error()

    prompts = held_out_prompts(args.k, args.offset, args.prompt_seed, args.prompts_file)
    settings = []
    for s in args.settings:
        parts = s.split(":")
        settings.append({"reward": parts[0], "prune_by": parts[1], "alpha": float(parts[2]),
                         "first_decision": int(parts[3]) if len(parts) > 3 else None, "label": s})
    gen = load_generator()
    rewards = {name: load_reward(name, generator=gen) for name in {s["reward"] for s in settings}}
    for r in rewards.values():
        common.warm_up(gen, r, RunConfig().sampling)
    out = Path(args.out)
    record = {"experiment": "defaults (issue 13: the demo tells the truth)",
              "command": "OMP_NUM_THREADS=1 python " + " ".join([str(Path(sys.argv[0]).resolve().relative_to(REPO))] + sys.argv[1:]),
              "settings": {"n": args.n, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                           "temperature": RunConfig.temperature, "top_p": RunConfig.top_p, "top_k": RunConfig.top_k,
                           "bon": "same memory: batches that fit Speculative Rejection's peak KV (sbon.comparison.same_memory_batch_size)",
                           "prompts": f"{args.prompts_file}: held-out fold, id >= 20, not an app example, shuffled with seed {args.prompt_seed}, offset {args.offset}",
                           "prompt_ids": [q["id"] for q in prompts], "candidates": settings},
              "environment_start": common.environment(gen), "rows": []}
    bon_cache: dict[tuple, tuple] = {}
    for q in prompts:
        for s in settings:
            reward = rewards[s["reward"]]
            config = RunConfig("sbon", n=args.n, alpha=s["alpha"], first_decision=s["first_decision"],
                               prune_by=s["prune_by"], max_new_tokens=args.max_new_tokens, seed=args.seed)
            load = list(__import__("os").getloadavg())
            sbon, sbon_steps = timed_run(gen, reward, q["instruction"], config)
            batch = same_memory_batch_size(sbon)
            key = (q["id"], s["reward"], batch)
            reused = key in bon_cache
            if not reused:
                bon_cache[key] = timed_run(gen, reward, q["instruction"],
                                           config.replace(method="bon", batch_size=batch, prune_by="reward"))
            bon, bon_steps = bon_cache[key]
            Comparison(bon, sbon, {})  # the checks a saved run passes
            m = compare(bon, sbon)
            quality = decision_quality(bon, sbon)
            row = {"prompt_id": q["id"], "setting": s["label"], **{k: s[k] for k in ("reward", "prune_by", "alpha", "first_decision")},
                   "prompt_tokens": sbon.prompt_tokens, "bon_batch_size": batch, **m,
                   "bon_steps": bon_steps, "sbon_steps": sbon_steps, "step_speedup": bon_steps / sbon_steps,
                   "token_speedup": m["bon_tokens"] / m["sbon_tokens"],
                   "decision_tokens": [d["tokens"] for d in quality], "quality": quality,
                   "winner_first_decision": quality[0]["winner"] if quality else None,
                   "bon_reused": reused, "load_average": load,
                   "sbon_timings": sbon.timings, "bon_timings": bon.timings}
            record["rows"].append(row)
            record["environment_end"] = common.environment(gen)
            common.write_json(record, out)
            print(f"prompt {q['id']:>3} {s['label']:<28} dp={m['decision_points']} "
                  f"kendall1={m['kendall_first_decision']:+.2f} score={m['normalized_score']:.1f} "
                  f"bom={m['best_of_m_normalized_score']:.1f} (M={m['best_of_m']}) speedup={m['speedup']:.2f} "
                  f"steps={bon_steps / sbon_steps:.2f} tokens={m['bon_tokens'] / m['sbon_tokens']:.2f} "
                  f"batch={batch} load={load[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
