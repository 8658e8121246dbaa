"""Table 1 of the paper: Best-of-N vs Speculative Rejection vs Best-of-M at equal cost.

Per prompt, with the same seed: Best-of-N, Speculative Rejection, then (once the mean speedup is
known) Best-of-M with M = round(N / mean speedup). Coupled sampling makes Best-of-M's candidates
BoN's first M, so its score comes from the BoN run (sbon.metrics.best_of_m_reward); it is also run
for real, to time it (and to check that it picks the same reward).
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any, Sequence

import pandas as pd

from sbon.algorithms import best_of_n, events, plan_budget
from sbon.config import PRUNING_METHODS, RunConfig
from sbon.engine import Generator, SamplingConfig
from sbon.metrics import (best_of_m_reward, best_of_m_size, compare, decision_quality, normalized_score, speedup,
                          token_rate)
from sbon.results import RunResult
from sbon.options import add_options
from sbon.rewards import RewardModel

from . import common, distributed, runners, vllm_bon

TARGET_SPEEDUP, TARGET_SCORE = 4.0, 98.0


def sbon_budget(gen: Generator, prompt: str, n: int, *, first_decision: int | None, kv_budget: int | None,
                max_new_tokens: int) -> int:
    """The KV budget (tokens) Speculative Rejection runs in for this prompt."""
    return plan_budget(gen, len(gen.encode_prompt(prompt)), n, kv_budget, max_new_tokens, first_decision)[1]


def bon_batch_size(gen: Generator, prompt: str, n: int, bon_memory: str, *, method: str, first_decision: int | None,
                   kv_budget: int | None, max_new_tokens: int) -> int:
    """Candidates Best-of-N runs at once: all N ("all"), or as many as hold to the end in Speculative
    Rejection's KV budget ("budget": the paper's setting, where Best-of-N is memory-bound)."""
    if bon_memory == "all":
        return n
    if method != "sbon":
        raise SystemExit("error: --bon-memory budget needs --method sbon (sbon-tau has no KV budget)")
    budget = sbon_budget(gen, prompt, n, first_decision=first_decision, kv_budget=kv_budget,
                         max_new_tokens=max_new_tokens)
    return max(1, min(n, budget // (len(gen.encode_prompt(prompt)) + max_new_tokens)))


def sbon_events(gen: Generator, reward: RewardModel, prompt: str, n: int, *, method: str, alpha: float,
                first_decision: int | None, kv_budget: int | None, tau: int, max_new_tokens: int,
                sampling: SamplingConfig, seed: int, prune_by: str = "reward"):
    """Speculative Rejection's events with the benchmark's settings (one RunConfig; ``events`` picks the
    method). `first_decision` sets the KV budget per prompt to N candidates of (prompt + first_decision) tokens."""
    return events(gen, reward, prompt, RunConfig.build(sampling, method=method, n=n, alpha=alpha, tau=tau,
                                                       kv_budget=kv_budget, first_decision=first_decision,
                                                       max_new_tokens=max_new_tokens, seed=seed, prune_by=prune_by))


def prompt_runs(gen: Generator, reward: RewardModel, p: dict, *, n: int, bon_memory: str, sb: dict[str, Any],
                bar=None) -> tuple[dict[str, Any], RunResult]:
    """Best-of-N and Speculative Rejection on one prompt: its row of the table, and the Best-of-N run
    (whose first M candidates are Best-of-M's)."""
    text = p["instruction"]
    if bar is not None:
        bar.set_description(f"table1 prompt {p['id']} BoN")
    batch = bon_batch_size(gen, text, n, bon_memory, method=sb["method"], first_decision=sb["first_decision"],
                           kv_budget=sb["kv_budget"], max_new_tokens=sb["max_new_tokens"])
    bon = common.timed_run(best_of_n(gen, reward, text, n, batch_size=batch, max_new_tokens=sb["max_new_tokens"],
                                 sampling=sb["sampling"], seed=sb["seed"]))
    if bar is not None:
        bar.update()
        bar.set_description(f"table1 prompt {p['id']} SBoN")
    sbon = common.timed_run(sbon_events(gen, reward, text, n, **sb))
    if bar is not None:
        bar.update()
    m = compare(bon, sbon)
    quality = decision_quality(bon, sbon)
    row = {
        "prompt_id": p["id"], "prompt_tokens": bon.prompt_tokens, "bon_batch_size": batch,
        "bon_time": m["bon_time"], "sbon_time": m["sbon_time"], "speedup": m["speedup"],
        "bon_tokens": m["bon_tokens"], "sbon_tokens": m["sbon_tokens"], "token_rate": m["token_rate"],
        "bon_tok_per_s": m["bon_tokens"] / m["bon_time"], "sbon_tok_per_s": m["sbon_tokens"] / m["sbon_time"],
        "sbon_score": m["normalized_score"], "bon_best": m["bon_best"], "sbon_best": m["sbon_best"],
        "sbon_best_id": sbon.best_id, "bon_best_id": bon.best_id,
        "decision_points": len(sbon.decision_points),
        "decision_tokens": [d.tokens for d in sbon.decision_points],
        # What pruning cost (coupled sampling makes it exact): per decision point the Kendall of the
        # signal against the final rewards, the oracle cut and the fate of Best-of-N's winner.
        "decision_quality": quality,
        "kendall_first_decision": m["kendall_first_decision"],
        "oracle_cut_first_decision": quality[0]["oracle_cut"] if quality else float("nan"),
        "bon_winner_pruned": m["bon_winner_pruned"],
        "kv_budget": sbon.settings.get("kv_budget"),
        "bon_finished_early": sum(c.stop_reason == "eos" for c in bon.candidates),
        "bon_mean_length": bon.total_tokens / len(bon.candidates),
        "bon_timings": bon.timings, "sbon_timings": sbon.timings,
        "sbon_reward_share": sbon.timings["reward"] / sbon.wall_time,
    }
    return row, bon


def best_of_m_run(gen: Generator, reward: RewardModel, p: dict, *, m_size: int, max_new_tokens: int,
                  sampling: SamplingConfig, seed: int, bar=None) -> RunResult:
    """Best-of-M on one prompt, run for real to time it, in batches no larger than Best-of-N's."""
    if bar is not None:
        bar.set_description(f"table1 prompt {p['id']} BoM (M={m_size})")
    bom = common.timed_run(best_of_n(gen, reward, p["instruction"], m_size, batch_size=min(p["bon_batch_size"], m_size),
                                 max_new_tokens=max_new_tokens, sampling=sampling, seed=seed))
    if bar is not None:
        bar.update()
    return bom


def run_table1(gen: Generator, reward: RewardModel, prompts: Sequence[dict], *, n: int = 32,
               max_new_tokens: int = 256, sampling: SamplingConfig | None = None, seed: int = 0,
               method: str = "sbon", alpha: float = 0.5, first_decision: int | None = None,
               kv_budget: int | None = None, tau: int = 32, best_of_m: bool = True, bon_memory: str = "all",
               prune_by: str = "reward", quiet: bool = False, runner: common.Runner = common.LOCAL) -> dict[str, Any]:
    """Run the three methods on every prompt; returns per-prompt rows and the averages.

    bon_memory="all": Best-of-N (and Best-of-M) hold all their candidates at once, as memory allows
    on a small model; "budget": only as many as fit to the end in Speculative Rejection's KV budget,
    in sequential batches, as in the paper (where Best-of-N needs more GPUs or more time)."""
    sampling = sampling or SamplingConfig()
    common.warm_up(gen, reward, sampling, runner)
    sb = dict(method=method, alpha=alpha, first_decision=first_decision, kv_budget=kv_budget, tau=tau,
              max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, prune_by=prune_by)
    rows, bons, batches, ran = [], [], [], []
    bar = common.progress(len(prompts) * (3 if best_of_m else 2), "table1", disable=quiet)
    work = partial(prompt_runs, n=n, bon_memory=bon_memory, sb=sb)
    for p, (row, bon) in common.map_prompts(work, prompts, gen, reward, bar=bar, steps=2, runner=runner):
        rows.append(row)
        bons.append(bon)
        batches.append(row["bon_batch_size"])
        ran.append({**p, "bon_batch_size": row["bon_batch_size"]})  # a prompt lost with its Ray worker is not here
        bar.set_postfix(speedup=f"{row['speedup']:.2f}", score=f"{row['sbon_score']:.1f}")

    speedups = [r["speedup"] for r in rows]
    mean_speedup = common.summarize(speedups)["mean"]
    m_size = best_of_m_size(n, mean_speedup)
    if best_of_m:
        work = partial(best_of_m_run, m_size=m_size, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed)
        by_id = {row["prompt_id"]: (row, bon) for row, bon in zip(rows, bons)}
        for p, bom in common.map_prompts(work, ran, gen, reward, bar=bar, runner=runner):
            row, bon = by_id[p["id"]]
            coupled = best_of_m_reward(bon, m_size)
            row.update({"bom_time": bom.wall_time, "bom_speedup": speedup(bon.wall_time, bom.wall_time),
                        "bom_tokens": bom.total_tokens, "bom_token_rate": token_rate(bom.total_tokens, bon.total_tokens),
                        "bom_tok_per_s": bom.total_tokens / bom.wall_time,
                        "bom_score": normalized_score(bon.final_rewards, coupled),
                        "bom_run_best": bom.best.final_reward,
                        # coupled sampling: the run wrote Best-of-N's first M texts. Its rewards are not compared:
                        # one computed in bfloat16 or int4 rounds otherwise in a batch of another size.
                        "bom_run_agrees": [c.text for c in bom.candidates] == [c.text for c in bon.candidates[:m_size]],
                        "bom_timings": bom.timings})
    else:
        for bon, row in zip(bons, rows):
            row["bom_score"] = normalized_score(bon.final_rewards, best_of_m_reward(bon, m_size))
    bar.close()

    def col(name):
        return [r.get(name) for r in rows]

    # Kendall and the oracle cut: over the runs that had a decision point (nan where none did).
    summarized = ["sbon_score", "bom_score", "token_rate", "sbon_reward_share", "bon_time", "sbon_time",
                  "bon_tok_per_s", "sbon_tok_per_s", "decision_points", "kendall_first_decision",
                  "oracle_cut_first_decision"] + (["bom_speedup", "bom_time"] if best_of_m else [])
    summary = {
        "prompts": len(rows), "best_of_m": m_size, "bon_memory": bon_memory,
        "bon_batch_size": common.summarize(batches), "speedup": common.summarize(speedups),
        **{name: common.summarize(col(name)) for name in summarized},
        "runs_with_3_or_more_decision_points": sum(d >= 3 for d in col("decision_points")) / len(rows),
        "bon_winner_pruned": sum(col("bon_winner_pruned")) / len(rows),
    }
    if best_of_m:
        summary["bom_runs_agree"] = sum(bool(a) for a in col("bom_run_agrees")) / len(rows)
    targets = {
        f"median speedup >= {TARGET_SPEEDUP}": summary["speedup"]["median"] >= TARGET_SPEEDUP,
        f"mean normalized score >= {TARGET_SCORE}": summary["sbon_score"]["mean"] >= TARGET_SCORE,
    }
    return {"rows": rows, "summary": summary, "targets": targets}


def methods_table(result: dict[str, Any], n: int) -> pd.DataFrame:
    """The paper's Table 1 layout: one line per method, averaged over prompts."""
    s = result["summary"]
    lines = [{"method": f"Best-of-{n}", "time_s": s["bon_time"]["mean"], "speedup_mean": 1.0, "speedup_median": 1.0,
              "token_rate": 1.0, "tok_per_s": s["bon_tok_per_s"]["mean"], "score": 100.0}]
    if "bom_speedup" in s:
        lines.append({"method": f"Best-of-{s['best_of_m']}", "time_s": s["bom_time"]["mean"],
                      "speedup_mean": s["bom_speedup"]["mean"], "speedup_median": s["bom_speedup"]["median"],
                      "token_rate": common.summarize([r["bom_token_rate"] for r in result["rows"]])["mean"],
                      "tok_per_s": common.summarize([r["bom_tok_per_s"] for r in result["rows"]])["mean"],
                      "score": s["bom_score"]["mean"]})
    lines.append({"method": "Speculative Rejection", "time_s": s["sbon_time"]["mean"],
                  "speedup_mean": s["speedup"]["mean"], "speedup_median": s["speedup"]["median"],
                  "token_rate": s["token_rate"]["mean"], "tok_per_s": s["sbon_tok_per_s"]["mean"],
                  "score": s["sbon_score"]["mean"]})
    return pd.DataFrame(lines)


def prompts_table(result: dict[str, Any]) -> pd.DataFrame:
    cols = ["prompt_id", "prompt_tokens", "bon_batch_size", "bon_time", "sbon_time", "bom_time", "speedup", "bom_speedup", "bon_tokens",
            "sbon_tokens", "bom_tokens", "token_rate", "sbon_score", "bom_score", "decision_points",
            "kendall_first_decision", "oracle_cut_first_decision", "bon_winner_pruned", "sbon_reward_share"]
    df = pd.DataFrame(result["rows"])
    return df[[c for c in cols if c in df.columns]]


def plot(result: dict[str, Any], n: int):
    from plotly.subplots import make_subplots

    df = pd.DataFrame(result["rows"])
    ids = df["prompt_id"].astype(str)
    m = result["summary"]["best_of_m"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Speedup over Best-of-N (wall time)", "Normalized score"))
    fig.add_bar(x=ids, y=df["speedup"], name="Speculative Rejection", marker_color="#1f77b4", row=1, col=1)
    if "bom_speedup" in df:
        fig.add_bar(x=ids, y=df["bom_speedup"], name=f"Best-of-{m}", marker_color="#ff7f0e", row=1, col=1)
    fig.add_bar(x=ids, y=df["sbon_score"], name="Speculative Rejection", marker_color="#1f77b4", showlegend=False, row=1, col=2)
    fig.add_bar(x=ids, y=df["bom_score"], name=f"Best-of-{m}", marker_color="#ff7f0e", showlegend=False, row=1, col=2)
    fig.add_hline(y=TARGET_SPEEDUP, line_dash="dot", row=1, col=1)
    fig.add_hline(y=TARGET_SCORE, line_dash="dot", row=1, col=2)
    fig.update_xaxes(title_text="prompt id")
    fig.update_layout(title=f"Table 1: Best-of-{n} vs Speculative Rejection vs Best-of-{m}", barmode="group")
    return fig


def add_parser(sub) -> None:
    p = sub.add_parser("table1", help="the paper's Table 1: BoN vs Speculative Rejection vs Best-of-M",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_common_args(p)
    distributed.add_ray_args(p)
    vllm_bon.add_baseline_args(p)
    g = p.add_argument_group("speculative rejection")
    # The method's settings come from RunConfig (help, types, choices): one settings path.
    add_options(g, RunConfig(), only=("method", "alpha", "first_decision", "kv_budget", "tau", "prune_by"),
                overrides={"method": {"choices": list(PRUNING_METHODS)}}, show_default=False)
    g.add_argument("--no-best-of-m", action="store_true", help="skip the timed Best-of-M runs")
    g.add_argument("--bon-memory", choices=["all", "budget"], default="all",
                   help="all: Best-of-N holds all N candidates at once; budget: only as many as fit to the end in "
                        "Speculative Rejection's KV budget, in sequential batches (the paper's memory-bound setting)")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    vllm_bon.check_available(args)
    prompts = common.prompts_from(args)
    gen, reward = runners.setup(args)
    result = run_table1(gen, reward, prompts, n=args.n, max_new_tokens=args.max_new_tokens,
                        sampling=common.sampling_from(args), seed=args.seed, method=args.method, alpha=args.alpha,
                        first_decision=args.first_decision, kv_budget=args.kv_budget, tau=args.tau,
                        best_of_m=not args.no_best_of_m, bon_memory=args.bon_memory, prune_by=args.prune_by,
                        quiet=args.quiet, runner=args.runner)
    if args.baseline == "vllm":
        result["vllm_baseline"] = vllm_bon.run_vllm_bon(gen, reward, prompts, n=args.n,
                                                        max_new_tokens=args.max_new_tokens,
                                                        sampling=common.sampling_from(args), seed=args.seed,
                                                        gpu_memory=args.vllm_gpu_memory, quiet=args.quiet)
        vllm_bon.against_table1(result["vllm_baseline"], result["rows"])
    settings = {**common.base_settings(args, gen, reward, prompts), "method": args.method, "alpha": args.alpha,
                "first_decision": args.first_decision, "kv_budget": args.kv_budget, "tau": args.tau,
                "bon_memory": args.bon_memory, "prune_by": args.prune_by}
    json_path, html_path = common.result_paths(args, "table1")
    common.write_json({"experiment": "table1", "settings": settings, "environment": common.environment(gen, args.runner),
                       **result}, json_path)
    common.print_table("per prompt:", prompts_table(result))
    common.print_table(f"Table 1 ({result['summary']['prompts']} prompts, N={args.n}, "
                       f"{args.max_new_tokens} new tokens):", methods_table(result, args.n))
    for name, ok in result["targets"].items():
        print(f"  target {name}: {'met' if ok else 'NOT met'}")
    if "vllm_baseline" in result:
        v = result["vllm_baseline"]["summary"]
        print(f"  vLLM Best-of-{args.n}: {v['vllm_time']['mean']:.3f} s per prompt; Speculative Rejection's speedup "
              f"over it {v['sbon_speedup_vs_vllm']['mean']:.2f} (mean), ours Best-of-N's "
              f"{v['bon_speedup_vs_vllm']['mean']:.2f}")
    if not args.no_plot:
        common.write_plot(plot(result, args.n), html_path)
    print(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {html_path}"))
    return 0
