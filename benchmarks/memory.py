"""The paper's Section 6.3 / Figure 4: what a fixed KV-cache budget buys.

Best-of-N gets a budget that holds B candidates to the end, B x (prompt + max_new_tokens) tokens,
so Best-of-kB runs k batches of B one after the other. Speculative Rejection starts 8B candidates
in the same budget and prunes whenever the next token would overflow it. With coupled sampling,
Best-of-kB's candidates are BoN's first kB, so one BoN run of 8B candidates in batches of B gives
Best-of-B, 2B, 4B and 8B: their rewards (sbon.metrics.best_of_m_reward) and their wall times
(the moment their last batch was scored).
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

import pandas as pd

from sbon.algorithms import CandidatesScored, Done, best_of_n, speculative_rejection
from sbon.engine import Generator, SamplingConfig
from sbon.metrics import best_of_m_reward, normalized_score
from sbon.rewards import RewardModel

from . import common, runners


def sizes(b: int, factor: int) -> list[int]:
    """B, 2B, 4B, ... up to factor x B."""
    out, k = [], 1
    while k <= factor:
        out.append(k * b)
        k *= 2
    if out[-1] != factor * b:
        out.append(factor * b)
    return out


def run_memory(gen: Generator, reward: RewardModel, prompts: Sequence[dict], *, b: int = 4, factor: int = 8,
               max_new_tokens: int = 256, sampling: SamplingConfig | None = None, seed: int = 0,
               alpha: float = 0.5, quiet: bool = False) -> dict[str, Any]:
    sampling = sampling or SamplingConfig()
    common.warm_up(gen, reward, sampling)
    n = factor * b
    ks = sizes(b, factor)
    rows, skipped = [], []
    bar = common.progress(2 * len(prompts), "memory", disable=quiet)
    for p in prompts:
        text = p["instruction"]
        prompt_tokens = len(gen.encode_prompt(text))
        budget = b * (prompt_tokens + max_new_tokens)
        if n * (prompt_tokens + 1) > budget:  # a prompt this long leaves no room for n candidates
            skipped.append(p["id"])
            bar.update(2)
            continue

        batch_end: list[float] = []  # seconds from the start until each batch of B was scored
        elapsed: dict[str, float] = {}

        def on_bon(event, t):
            if isinstance(event, CandidatesScored):
                batch_end.append(t)
            elif isinstance(event, Done):
                elapsed["bon"] = t

        def on_sbon(event, t):
            if isinstance(event, Done):
                elapsed["sbon"] = t

        bar.set_description(f"memory prompt {p['id']} BoN")
        with common.PeakRSS(gen.device) as mem_bon:
            bon = common.timed_run(best_of_n(gen, reward, text, n, batch_size=b, max_new_tokens=max_new_tokens,
                                         sampling=sampling, seed=seed), on_bon)
        bar.update()
        bar.set_description(f"memory prompt {p['id']} SBoN")
        with common.PeakRSS(gen.device) as mem_sbon:
            sbon = common.timed_run(speculative_rejection(gen, reward, text, n, alpha=alpha, kv_budget=budget,
                                                      max_new_tokens=max_new_tokens, sampling=sampling, seed=seed),
                                on_sbon)
        bar.update()
        sbon_reward = sbon.best.final_reward
        t_b = batch_end[0]
        row = {"prompt_id": p["id"], "prompt_tokens": prompt_tokens, "kv_budget": budget,
               "sbon_reward": sbon_reward, "sbon_time": elapsed["sbon"], "sbon_time_vs_bo_b": elapsed["sbon"] / t_b,
               "sbon_score": normalized_score(bon.final_rewards, sbon_reward),
               "sbon_tokens": sbon.total_tokens, "sbon_decision_points": len(sbon.decision_points),
               "sbon_reward_share": sbon.timings["reward"] / sbon.wall_time,
               "equivalent_n": next((k for k in range(1, n + 1) if best_of_m_reward(bon, k) >= sbon_reward), n),
               "bon_peak_rss_growth": mem_bon.growth, "sbon_peak_rss_growth": mem_sbon.growth}
        for k in ks:
            r = best_of_m_reward(bon, k)
            row[f"bo{k}_reward"] = r
            row[f"bo{k}_score"] = normalized_score(bon.final_rewards, r)
            row[f"bo{k}_time"] = batch_end[k // b - 1]
            row[f"bo{k}_time_vs_bo_b"] = batch_end[k // b - 1] / t_b
            row[f"sbon_beats_bo{k}"] = sbon_reward >= r
        rows.append(row)
        bar.set_postfix(equiv_n=row["equivalent_n"], time_vs_bo_b=f"{row['sbon_time_vs_bo_b']:.2f}")
    bar.close()
    if not rows:
        # n (p + 1) <= b (p + max_new_tokens)  <=>  p <= (max_new_tokens - factor) / (factor - 1)
        longest = (max_new_tokens - factor) // (factor - 1) if factor > 1 else max_new_tokens
        raise SystemExit(f"error: no prompt is short enough for {n} candidates in a budget of {b} x (prompt + "
                         f"{max_new_tokens}) tokens: with --factor {factor} a prompt may have at most {longest} "
                         f"tokens; lower --factor (4 allows {(max_new_tokens - 4) // 3}) or raise --max-new-tokens")

    def s(name):
        return common.summarize([r[name] for r in rows])

    summary = {"prompts": len(rows), "skipped_prompts": skipped, "sbon_score": s("sbon_score"), "sbon_time_vs_bo_b": s("sbon_time_vs_bo_b"),
               "equivalent_n": s("equivalent_n"), "sbon_reward_share": s("sbon_reward_share"),
               "memory_method": common.PeakRSS(gen.device).method,
               "bon_peak_rss_growth": s("bon_peak_rss_growth"), "sbon_peak_rss_growth": s("sbon_peak_rss_growth")}
    for k in ks:
        summary[f"bo{k}"] = {"score": s(f"bo{k}_score")["mean"], "time_vs_bo_b": s(f"bo{k}_time_vs_bo_b")["mean"],
                             "sbon_at_least_as_good": sum(r[f"sbon_beats_bo{k}"] for r in rows) / len(rows)}
    return {"rows": rows, "summary": summary, "sizes": ks}


def curve_table(result: dict[str, Any], b: int, factor: int) -> pd.DataFrame:
    s = result["summary"]
    lines = [{"method": f"Best-of-{k}", "time_vs_best_of_B": s[f"bo{k}"]["time_vs_bo_b"], "score": s[f"bo{k}"]["score"],
              "SBoN_at_least_as_good": s[f"bo{k}"]["sbon_at_least_as_good"]} for k in result["sizes"]]
    lines.append({"method": f"Speculative Rejection from {factor * b}", "time_vs_best_of_B": s["sbon_time_vs_bo_b"]["mean"],
                  "score": s["sbon_score"]["mean"], "SBoN_at_least_as_good": float("nan")})
    return pd.DataFrame(lines)


def plot(result: dict[str, Any], b: int, factor: int):
    import plotly.graph_objects as go

    table = curve_table(result, b, factor)
    bon = table.iloc[:-1]
    fig = go.Figure()
    fig.add_scatter(x=bon["time_vs_best_of_B"], y=bon["score"], mode="lines+markers+text", name="Best-of-N (budget of B)",
                    text=bon["method"], textposition="bottom right")
    sb = table.iloc[-1]
    fig.add_scatter(x=[sb["time_vs_best_of_B"]], y=[sb["score"]], mode="markers+text", name=sb["method"],
                    text=[sb["method"]], textposition="top center", marker=dict(size=14, symbol="star"))
    fig.update_layout(title=f"Same KV budget (B={b} full candidates): score vs wall time",
                      xaxis_title=f"wall time / Best-of-{b}'s", yaxis_title=f"normalized score (within the {factor * b} candidates)")
    return fig


def add_parser(sub) -> None:
    p = sub.add_parser("memory", help="the paper's Figure 4: Speculative Rejection from 8B candidates in the KV "
                       "budget of Best-of-B", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_common_args(p)
    g = p.add_argument_group("budget")
    g.add_argument("--b", type=int, default=4, help="candidates Best-of-N holds to the end in the budget")
    g.add_argument("--factor", type=int, default=8, help="Speculative Rejection starts factor x B candidates")
    g.add_argument("--alpha", type=float, default=0.5, help="rejection rate")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    prompts = common.prompts_from(args)
    gen, reward = runners.setup(args)
    result = run_memory(gen, reward, prompts, b=args.b, factor=args.factor, max_new_tokens=args.max_new_tokens,
                        sampling=common.sampling_from(args), seed=args.seed, alpha=args.alpha, quiet=args.quiet)
    settings = {**common.base_settings(args, gen, reward, prompts), "n": args.b * args.factor, "b": args.b,
                "factor": args.factor, "alpha": args.alpha}
    json_path, html_path = common.result_paths(args, "memory")
    common.write_json({"experiment": "memory", "settings": settings, "environment": common.environment(gen), **result},
                      json_path)
    df = pd.DataFrame(result["rows"])
    cols = ["prompt_id", "kv_budget", "sbon_score", "sbon_time_vs_bo_b", "equivalent_n", "sbon_decision_points"]
    cols += [f"bo{k}_score" for k in result["sizes"]]
    common.print_table("per prompt:", df[cols])
    common.print_table(f"same KV budget as Best-of-{args.b} ({len(prompts)} prompts; times relative to Best-of-{args.b}):",
                       curve_table(result, args.b, args.factor))
    print(f"  mean equivalent N of Speculative Rejection: {result['summary']['equivalent_n']['mean']:.1f}")
    if not args.no_plot:
        common.write_plot(plot(result, args.b, args.factor), html_path)
    print(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {html_path}"))
    return 0
