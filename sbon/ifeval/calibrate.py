"""Estimate the open pass rates of the IFEval reward: how often the embedded generator's complete
responses follow each instruction type.

    OMP_NUM_THREADS=1 python -m sbon.ifeval.calibrate --minutes 15

Samples ``--samples`` complete responses of ``--max-new-tokens`` tokens (Best-of-N's sampler, default
sampling settings, seed = the prompt's key) for prompts of the calibration split (odd key, see
``data.is_calibration``; even keys are left for evaluation), next the one carrying the least-checked
instruction type, until ``--minutes`` have passed,
checks each response strictly, and writes ``pass_rates.json``: per type the passes and the count, the
rate used, the prior (the pooled rate of all checks), and for information the pass rate among responses still open at the first decision point
(``--decision-tokens``), with the command, settings and load average that produced them.

The rate of a type is smoothed toward the prior: (passes + m * prior) / (checks + m), m = ``--pseudo-count``;
a type never checked gets the prior. A few checks then move its rate only part of the way, instead of a
type seen once at 0 of 4 being treated as hopeless. ``--rates-only`` recomputes the rates of an existing
file from its counts (no generation).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

from ..algorithms import best_of_n, run
from ..models import load_generator
from ..rewards import CallableReward
from .checkers import OPEN
from .data import SHIPPED_FILE, is_calibration, load_prompts
from .reward import PASS_RATES_FILE


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sbon.ifeval.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=4, help="complete responses per prompt")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--minutes", type=float, default=15.0, help="stop starting new prompts after this long")
    p.add_argument("--pseudo-count", type=float, default=8.0, help="weight of the prior in each type's rate")
    p.add_argument("--rates-only", action="store_true", help="recompute the rates of --out from its counts")
    p.add_argument("--decision-tokens", type=int, default=32, help="where the 'open' pass rate is measured")
    p.add_argument("--data", type=Path, default=SHIPPED_FILE)
    p.add_argument("--out", type=Path, default=PASS_RATES_FILE)
    return p.parse_args(argv)


def sample_responses(gen, prompt: str, args, seed: int) -> list[tuple[list[int], str]]:
    """Complete responses of the generator (token ids, text); the reward is unused by Best-of-N's sampling."""
    zero = CallableReward(lambda p, rs: [0.0] * len(rs), name="none")
    result = run(best_of_n(gen, zero, prompt, n=args.samples, max_new_tokens=args.max_new_tokens, seed=seed))
    return [(c.token_ids, c.text) for c in result.candidates]


def next_prompt(remaining: list, counts: collections.Counter):
    """The prompt carrying the least-checked instruction type (file order among equals): a short run
    then covers every type instead of the first prompts' types only."""
    return min(remaining, key=lambda row: min(counts[i] for i in row.instruction_ids))


def tally(gen, prompts, args, deadline: float):
    """Per type: checks, passes, and (open at the decision point) checks and passes."""
    counts, passes = collections.Counter(), collections.Counter()
    open_counts, open_passes = collections.Counter(), collections.Counter()
    used, remaining = 0, list(prompts)
    while remaining and time.time() < deadline:
        row = next_prompt(remaining, counts)
        remaining.remove(row)
        instructions = row.instructions()
        for token_ids, text in sample_responses(gen, row.prompt, args, seed=row.key):
            early = gen.decode(token_ids[:args.decision_tokens])
            for ins in instructions:
                ok = bool(text.strip()) and ins.check(text)
                counts[ins.id] += 1
                passes[ins.id] += ok
                if ins.partial(early).status == OPEN:
                    open_counts[ins.id] += 1
                    open_passes[ins.id] += ok
        used += 1
    return used, counts, passes, open_counts, open_passes


def smoothed_rates(counts: dict, passes: dict, pseudo: float) -> tuple[dict[str, float], float]:
    """(rate per type, prior): each type's pass rate pulled toward the pooled rate by ``pseudo`` checks."""
    prior = sum(passes.values()) / max(1, sum(counts.values()))
    rates = {k: round((passes[k] + pseudo * prior) / (counts[k] + pseudo), 4) for k in sorted(counts)}
    return rates, round(prior, 4)


def rates_only(args) -> int:
    data = json.loads(args.out.read_text())
    data["rates"], data["prior"] = smoothed_rates(data["counts"], data["passes"], args.pseudo_count)
    data["settings"]["pseudo_count"] = args.pseudo_count
    data["rates_command"] = "python -m sbon.ifeval.calibrate --rates-only --pseudo-count " + str(args.pseudo_count)
    data.get("settings", {}).pop("min_count", None)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"rates recomputed from the counts of {args.out} (pseudo-count {args.pseudo_count})")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rates_only:
        return rates_only(args)
    prompts = [p for p in load_prompts(args.data) if is_calibration(p.key)]
    load_before = os.getloadavg()
    gen = load_generator(device="cpu")
    start = time.time()
    used, counts, passes, open_counts, open_passes = tally(gen, prompts, args, start + 60 * args.minutes)
    elapsed = time.time() - start
    rates, prior = smoothed_rates(counts, passes, args.pseudo_count)
    out = {
        "about": "open pass rates of the ifeval reward: fraction of the embedded generator's complete responses "
                 "following each instruction type (strict), on the calibration split (odd keys)",
        "command": "OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "?") + " python -m sbon.ifeval.calibrate "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {"generator": gen.name, "samples_per_prompt": args.samples, "max_new_tokens": args.max_new_tokens,
                     "sampling": "Best-of-N defaults", "seed": "prompt key", "pseudo_count": args.pseudo_count,
                     "decision_tokens": args.decision_tokens},
        "prompts_used": used, "prompts_available": len(prompts), "seconds": round(elapsed, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "prior": prior,
        "rates": rates,
        "counts": dict(sorted(counts.items())), "passes": dict(sorted(passes.items())),
        "open_at_decision": {k: {"count": open_counts[k], "passes": open_passes[k]} for k in sorted(open_counts)},
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{used} prompts, {sum(counts.values())} checks in {elapsed:.0f} s; prior {prior:.3f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
