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
from typing import Any

import pandas as pd

from . import common, efficiency

REWARD = "neg-perplexity"


def perplexity_table(result: dict[str, Any]) -> pd.DataFrame:
    """One line per method: mean perplexity of the returned response (= minus its reward), compute."""
    rows, s = result["rows"], result["summary"]
    lines = [{"method": f"Best-of-{c['n']}", "accelerators": c["accelerators"],
              "perplexity": common.summarize([-r["bon"][c["n"]]["best"] for r in rows])["mean"],
              "score": c["score"], "relative_compute": c["relative_compute"], "compute_ratio": float("nan")}
             for c in s["bon"]]
    lines += [{"method": f"Speculative Rejection (N={c['n']}, alpha={c['alpha']:g})", "accelerators": 1,
               "perplexity": common.summarize([-r["sbon"][c["alpha"]]["best"] for r in rows])["mean"],
               "score": c["score"], "relative_compute": c["relative_compute"], "compute_ratio": c["compute_ratio"]}
              for c in s["sbon"]]
    return pd.DataFrame(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("perplexity", help="the NeurIPS version's Table 2: Best-of-N vs Speculative Rejection "
                       "with -perplexity (prompt + response) as the reward",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    efficiency.add_efficiency_args(p, reward=REWARD, k=8, b=2, n=4, max_new_tokens=96)
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    result, _ = efficiency.run_and_write(args, "perplexity")
    json_path, html_path = common.result_paths(args, "perplexity")
    table = perplexity_table(result)
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
