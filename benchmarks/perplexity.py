"""The NeurIPS version's perplexity experiment (Sun et al., NeurIPS 2024, arXiv 2410.20290, Table 2):
Best-of-N and Speculative Rejection with minus the perplexity as the reward, so both look for the
response the generator itself finds most likely. The perplexity is over prompt + response, as the
official postprocess/eval_ppl.py computes it (sbon.rewards.LikelihoodReward, kind "neg-perplexity").

This is the efficiency experiment (benchmarks/efficiency.py: Best-of-N on N/B accelerators,
Speculative Rejection on one) with that reward, reported in Table 2's shape: the mean perplexity of
the response each method returns (lower is better) next to its relative compute.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import pandas as pd

from sbon.metrics import compute_at_score

from . import common, efficiency

REWARD = "neg-perplexity"


def cell(cells: dict, key) -> dict:
    """A row's cell by N or alpha: numbers in memory, strings once read back from JSON."""
    return cells[key] if key in cells else cells[str(key)]


def perplexity_table(result: dict[str, Any]) -> pd.DataFrame:
    """Table 2's shape, one line per method: the perplexity of the returned response (= minus its
    reward; lower is better), mean then median over prompts, and its compute. The compute ratio is
    read off at equal mean perplexity, interpolating Best-of-N's (log compute, mean perplexity)
    curve: the normalized score is not used here, because with a small B the range of Best-of-B's
    perplexities can be tiny and one prompt's score then dominates the mean."""
    rows, s = result["rows"], result["summary"]
    bon_ppl = [[-cell(r["bon"], c["n"])["best"] for r in rows] for c in s["bon"]]
    curve_x = [c["relative_compute"] for c in s["bon"]]
    curve_y = [-float(np.mean(p)) for p in bon_ppl]  # -perplexity grows with N, like a score
    lines = [{"method": f"Best-of-{c['n']}", "accelerators": c["accelerators"], "perplexity": float(np.mean(p)),
              "perplexity_median": float(np.median(p)), "relative_compute": c["relative_compute"],
              "compute_ratio_at_equal_perplexity": float("nan")} for c, p in zip(s["bon"], bon_ppl)]
    for c in s["sbon"]:
        p = [-cell(r["sbon"], c["alpha"])["best"] for r in rows]
        bon_compute, _ = compute_at_score(curve_x, curve_y, -float(np.mean(p)))
        lines.append({"method": f"Speculative Rejection (N={c['n']}, alpha={c['alpha']:g})", "accelerators": 1,
                      "perplexity": float(np.mean(p)), "perplexity_median": float(np.median(p)),
                      "relative_compute": c["relative_compute"],
                      "compute_ratio_at_equal_perplexity": bon_compute / c["relative_compute"]})
    return pd.DataFrame(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("perplexity", help="the NeurIPS version's Table 2: Best-of-N vs Speculative Rejection "
                       "with -perplexity (prompt + response) as the reward",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    efficiency.add_efficiency_args(p, reward=REWARD, k=8, b=2, n=4, max_new_tokens=96, alphas=(0.5, 0.75))
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    result, _ = efficiency.run_and_write(args, "perplexity")
    json_path, html_path = common.result_paths(args, "perplexity")
    table = perplexity_table(result)
    saved = json.loads(json_path.read_text())
    common.write_json({**saved, "table2": table.to_dict("records")}, json_path)
    common.print_table(f"perplexity of the returned response ({result['summary']['prompts']} prompts, B={args.b}, "
                       f"N={args.n}, {args.max_new_tokens} new tokens, reward {args.reward}):", table)
    if result["skipped_prompts"]:
        print(f"  skipped (prompt too long for N={args.n} in the budget): {result['skipped_prompts']}")
    if not args.no_plot:
        fig = efficiency.plot(result, args.b, title=f"-perplexity as the reward (B={args.b})")
        common.write_plot(fig, html_path)
        note = efficiency.write_png(fig, html_path.with_suffix(".png"))
        print(note or f"wrote {html_path.with_suffix('.png')}")
    print(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {html_path}"))
    return 0
