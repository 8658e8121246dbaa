"""The paper's Figure 3 / Appendix D: how early can a partial reward tell the best response?

N complete responses per prompt are generated once (Best-of-N); every candidate still generating
at a decision point tau (8, 16, 32, 64, 128, ...) gets the reward of its first tau tokens. Replaying
Speculative Rejection with one decision token (sbon.analysis.counterfactual) then gives the normalized
score and token rate of every (tau, alpha) without generating again: for the whole set of N, and
bootstrapped over random subsets of the candidates. The raw candidates are saved, so that
`--from FILE` recomputes the grid without a model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from sbon.algorithms import best_of_n
from sbon.analysis.counterfactual import partial_final_stats, prefix_rewards, tradeoff_grid
from sbon.engine import Generator, SamplingConfig
from sbon.results import RunResult
from sbon.rewards import RewardModel

from . import common, runners

DEFAULT_ALPHAS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
SCORE_FLOOR = 98.0  # the score a proposed setting must keep


def decision_points(max_new_tokens: int, first: int = 8) -> list[int]:
    """8, 16, 32, ... below max_new_tokens."""
    taus, t = [], first
    while t < max_new_tokens:
        taus.append(t)
        t *= 2
    return taus


def generate(gen: Generator, reward: RewardModel, prompts: Sequence[dict], *, n: int = 32, max_new_tokens: int = 256,
             sampling: SamplingConfig | None = None, seed: int = 0, taus: Sequence[int] | None = None,
             quiet: bool = False) -> list[dict[str, Any]]:
    """Best-of-N per prompt plus the partial rewards at each decision point: the raw records."""
    sampling = sampling or SamplingConfig()
    taus = list(taus or decision_points(max_new_tokens))
    raw = []
    bar = common.progress(len(prompts), "counterfactual", disable=quiet)
    for p in prompts:
        bar.set_description(f"counterfactual prompt {p['id']}")
        bon = common.timed_run(best_of_n(gen, reward, p["instruction"], n, max_new_tokens=max_new_tokens,
                                     sampling=sampling, seed=seed))
        partials = prefix_rewards(bon, reward, gen.decode, taus)
        raw.append({"prompt_id": p["id"], "bon": bon.to_dict(), "partials": {str(t): v for t, v in partials.items()}})
        bar.update()
    bar.close()
    return raw


def _subset(bon: RunResult, partials: dict[int, list], idx: Sequence[int]) -> tuple[RunResult, dict[int, list]]:
    """The candidates `idx` as a run of their own (renumbered 0.., as the replay expects)."""
    cands = [dataclasses.replace(bon.candidates[i], id=j) for j, i in enumerate(idx)]
    best = max(range(len(cands)), key=lambda j: (cands[j].final_reward, -j))
    sub = dataclasses.replace(bon, candidates=cands, best_id=best)
    return sub, {t: [v[i] for i in idx] for t, v in partials.items()}


def analyze(raw: Sequence[dict], alphas: Sequence[float] = DEFAULT_ALPHAS, bootstrap: int = 100,
            subset: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The (tau, alpha) grid averaged over prompts, with bootstrap intervals, and the
    partial-vs-final correlations per tau."""
    rng = np.random.default_rng(seed)
    full, boot, stats = [], [], []
    for rec in raw:
        bon = RunResult.from_dict(rec["bon"])
        partials = {int(t): v for t, v in rec["partials"].items()}
        n = len(bon.candidates)
        full.append(tradeoff_grid(bon, partials, alphas).assign(prompt_id=rec["prompt_id"]))
        st = partial_final_stats(bon, partials)
        if len(st):
            stats.append(st.assign(prompt_id=rec["prompt_id"]))
        m = min(subset or max(2, n // 2), n)
        for b in range(bootstrap):
            sub, sub_partials = _subset(bon, partials, sorted(rng.choice(n, size=m, replace=False)))
            boot.append(tradeoff_grid(sub, sub_partials, alphas).assign(prompt_id=rec["prompt_id"], sample=b))
    full_df = pd.concat(full, ignore_index=True)
    grid = full_df.groupby(["tau", "alpha"], as_index=False)[["normalized_score", "token_rate"]].mean()
    grid["score_min_prompt"] = full_df.groupby(["tau", "alpha"])["normalized_score"].min().values
    if boot:
        per_sample = (pd.concat(boot, ignore_index=True)
                      .groupby(["tau", "alpha", "sample"])[["normalized_score", "token_rate"]].mean())
        q = per_sample.groupby(level=["tau", "alpha"]).quantile([0.025, 0.5, 0.975]).unstack()
        for metric in ("normalized_score", "token_rate"):
            grid[f"{metric}_boot_lo"] = q[(metric, 0.025)].values
            grid[f"{metric}_boot_median"] = q[(metric, 0.5)].values
            grid[f"{metric}_boot_hi"] = q[(metric, 0.975)].values
    corr = pd.DataFrame()
    if stats:
        stats_df = pd.concat(stats, ignore_index=True)
        corr = stats_df.groupby("tau", as_index=False)[["candidates", "pearson", "kendall", "oracle_cut"]].mean()
    ok = grid[grid["normalized_score"] >= SCORE_FLOOR]
    best = ok.loc[ok["token_rate"].idxmin()].to_dict() if len(ok) else None
    return {"grid": grid.to_dict("records"), "correlations": corr.to_dict("records"),
            "per_prompt": full_df.to_dict("records"),
            "cheapest_setting_with_score_98": best,
            "bootstrap": {"resamples": bootstrap, "subset": subset or "N/2", "seed": seed}}


def plot(result: dict[str, Any], n: int):
    from plotly.subplots import make_subplots

    grid = pd.DataFrame(result["grid"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Normalized score vs token rate (one decision token)",
                                                        "Partial vs final reward"))
    for alpha, g in grid.groupby("alpha"):
        g = g.sort_values("tau")
        err = {}
        if "normalized_score_boot_lo" in g:
            err = dict(error_y=dict(type="data", symmetric=False,
                                    array=(g["normalized_score_boot_hi"] - g["normalized_score"]).clip(lower=0),
                                    arrayminus=(g["normalized_score"] - g["normalized_score_boot_lo"]).clip(lower=0)))
        fig.add_scatter(x=g["token_rate"], y=g["normalized_score"], mode="lines+markers+text", name=f"alpha={alpha:g}",
                        text=[f"τ={t}" for t in g["tau"]], textposition="top center", row=1, col=1, **err)
    fig.add_hline(y=SCORE_FLOOR, line_dash="dot", row=1, col=1)
    corr = pd.DataFrame(result["correlations"])
    if len(corr):
        for metric in ("pearson", "kendall", "oracle_cut"):
            fig.add_scatter(x=corr["tau"], y=corr[metric], mode="lines+markers", name=metric, row=1, col=2)
    fig.update_xaxes(title_text="token rate (SBoN tokens / BoN tokens)", row=1, col=1)
    fig.update_xaxes(title_text="decision token τ", type="log", row=1, col=2)
    fig.update_yaxes(title_text="normalized score", row=1, col=1)
    fig.update_layout(title=f"Counterfactual Speculative Rejection (N={n}; error bars: bootstrap 95% over subsets of N/2)")
    return fig


def add_parser(sub) -> None:
    p = sub.add_parser("counterfactual", help="the paper's Figure 3: score vs token rate over (alpha, tau), "
                       "and partial/final reward correlation", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_common_args(p)
    g = p.add_argument_group("replay")
    g.add_argument("--alphas", type=float, nargs="+", default=list(DEFAULT_ALPHAS))
    g.add_argument("--taus", type=int, nargs="+", default=None, help="decision points (default 8, 16, 32, ... < max new tokens)")
    g.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples per prompt (0: none)")
    g.add_argument("--subset", type=int, default=None, help="candidates per bootstrap resample (default N/2)")
    g.add_argument("--from", dest="from_file", default=None,
                   help="recompute from a saved raw file (counterfactual_raw*.json) without generating")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    json_path, html_path = common.result_paths(args, "counterfactual")
    raw_path = json_path.with_name(json_path.stem.replace("counterfactual", "counterfactual_raw", 1) + ".json")
    if args.from_file:
        saved = json.loads(Path(args.from_file).read_text())
        raw, settings, env = saved["raw"], saved["settings"], saved["environment"]
    else:
        prompts = common.prompts_from(args)
        gen, reward = runners.setup(args)
        taus = args.taus or decision_points(args.max_new_tokens)
        settings = {**common.base_settings(args, gen, reward, prompts), "taus": taus}
        env = common.environment(gen)
        raw = generate(gen, reward, prompts, n=args.n, max_new_tokens=args.max_new_tokens,
                       sampling=common.sampling_from(args), seed=args.seed, taus=taus, quiet=args.quiet)
        common.write_json({"experiment": "counterfactual_raw", "settings": settings, "environment": env, "raw": raw},
                          raw_path)
        print(f"raw candidates written to {raw_path}")
    result = analyze(raw, args.alphas, args.bootstrap, args.subset, args.seed)
    settings = {**settings, "alphas": args.alphas, "bootstrap": args.bootstrap, "subset": args.subset,
                "from": args.from_file}
    common.write_json({"experiment": "counterfactual", "settings": settings, "environment": env,
                       "analysis_environment": common.environment(), **result}, json_path)
    grid = pd.DataFrame(result["grid"])
    common.print_table(f"score / token rate over (tau, alpha), {len(raw)} prompts, N={settings['n']}:",
                       grid[["tau", "alpha", "normalized_score", "token_rate", "score_min_prompt"]
                            + [c for c in ("normalized_score_boot_lo", "normalized_score_boot_hi") if c in grid]])
    pivot = grid.pivot(index="tau", columns="alpha", values="normalized_score")
    print("\nnormalized score (rows tau, columns alpha):")
    print(pivot.to_string(float_format=lambda x: f"{x:.1f}"))
    pivot = grid.pivot(index="tau", columns="alpha", values="token_rate")
    print("\ntoken rate (rows tau, columns alpha):")
    print(pivot.to_string(float_format=lambda x: f"{x:.3f}"))
    if result["correlations"]:
        common.print_table("partial vs final reward (mean over prompts):", pd.DataFrame(result["correlations"]))
    best = result["cheapest_setting_with_score_98"]
    if best:
        print(f"\ncheapest (tau, alpha) with mean score >= {SCORE_FLOOR:g}: tau={best['tau']:g}, alpha={best['alpha']:g}: "
              f"score {best['normalized_score']:.1f}, token rate {best['token_rate']:.3f}")
    if not args.no_plot:
        common.write_plot(plot(result, settings["n"]), html_path)
    print(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {html_path}"))
    return 0
