"""One line per candidate setting from measure.py's result files:

    python benchmarks/results/cpu-2core-epyc/defaults/summarize.py FILE.json [FILE.json ...]

Kendall at the first decision point is averaged over the prompts that had one (prompts whose
candidates all finished before the KV budget filled have none; they are counted in "no DP")."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pandas as pd


def summarize(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    out = []
    for label, g in df.groupby("setting", sort=False):
        k1 = [x for x in g["kendall_first_decision"] if x is not None and not (isinstance(x, float) and math.isnan(x))]
        out.append({
            "setting": label, "prompts": len(g),
            "kendall_1st_mean": np.mean(k1) if k1 else float("nan"),
            "kendall_1st_median": np.median(k1) if k1 else float("nan"),
            "no_DP": int((g["decision_points"] == 0).sum()),
            "DP_mean": g["decision_points"].mean(), "DP>=3": f"{int((g['decision_points'] >= 3).sum())}/{len(g)}",
            "sbon_score": g["normalized_score"].mean(),
            "bom_score_steps": g["bom_step_score"].mean(), "bom_score_tokens": g["bom_token_score"].mean(),
            "sbon>=bom_steps": f"{int((g['normalized_score'] >= g['bom_step_score']).sum())}/{len(g)}",
            "winner_pruned": f"{int(g['bon_winner_pruned'].sum())}/{len(g)}",
            "step_speedup_med": g["step_speedup"].median(), "token_speedup_med": g["token_speedup"].median(),
            "diverged": int(g["diverged"].sum()),
            "load_1min_mean": np.mean([r[0] for r in g["load_average"]]),
        })
    return pd.DataFrame(out)


def main(paths: list[str]) -> None:
    rows = []
    for p in paths:
        rows += json.load(open(p))["rows"]
    with pd.option_context("display.width", 250, "display.max_columns", 50):
        print(summarize(rows).to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main(sys.argv[1:])
