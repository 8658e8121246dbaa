"""The NeurIPS version's efficiency metric (Sun et al., NeurIPS 2024, arXiv 2410.20290, Section 5,
Figures 1 and 4): accelerator-seconds for the same score.

Best-of-N is run as if on k = N/B accelerators, each generating one batch of B candidates (the
official code runs Best-of-120 per H100 and Best-of-960 on 8 of them); Speculative Rejection runs on
one accelerator, starting from the largest N in a KV budget that holds B complete candidates,
B x (prompt + max_new_tokens) tokens. With coupled sampling, Best-of-kB's candidates are the first kB
of Best-of-N, so one Best-of-N run of the largest N in batches of B, each batch timed, gives every
smaller N: Best-of-kB's wall time is the slowest of its k batches (each accelerator prefills the
prompt for itself) and its compute k times that.

Scores and compute follow the official postprocess/plot_compare.py: per prompt, a method's best
reward is normalized to the range of the Best-of-B candidates (the one-accelerator baseline),
score = 100 x (1 + mean over prompts of (best - max_B) / (max_B - min_B)) = the mean of
sbon.metrics.normalized_score against Best-of-B's rewards, so Best-of-B scores 100 and a larger N
more; relative compute = (total accelerator-seconds over prompts) / (total Best-of-B seconds).
Speculative Rejection's compute ratio is the Best-of-N compute at its score, interpolated in
log(compute) along the Best-of-N curve (sbon.metrics.compute_at_score), over its own compute.

`perplexity` (the NeurIPS version's Table 2) is this experiment with the reward `neg-perplexity`,
reported as the mean perplexity of the response each method returns.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from sbon.algorithms import CandidatesScored, best_of_n, speculative_rejection
from sbon.engine import Generator, SamplingConfig
from sbon.metrics import best_of_m_reward, compute_at_score, normalized_score
from sbon.rewards import RewardModel

from . import common, distributed, runners, vllm_bon
from .memory import sizes


def longest_prompt(b: int, n: int, max_new_tokens: int) -> int:
    """The longest prompt (tokens) for which n candidates fit their first token in a budget of
    b complete ones: n (p + 1) <= b (p + max_new_tokens)."""
    return (b * max_new_tokens - n) // (n - b) if n > b else 10**9


def time_prefill(gen: Generator, prompt_ids: Sequence[int]) -> float:
    """Seconds of one prompt prefill: what every accelerator but the first would add to its batch
    (one Best-of-N run prefills once for all its batches)."""
    start = time.perf_counter()
    gen.prefill(prompt_ids)
    gen.synchronize()
    return time.perf_counter() - start


def run_bon_batches(gen: Generator, reward: RewardModel, text: str, n: int, b: int, *, max_new_tokens: int,
                    sampling: SamplingConfig, seed: int):
    """Best-of-n in batches of b; returns the run and each batch's seconds (from its start to its
    candidates scored)."""
    ends: list[float] = []

    def on_event(event, t):
        if isinstance(event, CandidatesScored):
            ends.append(t)

    bon = common.timed_run(best_of_n(gen, reward, text, n, batch_size=b, max_new_tokens=max_new_tokens,
                                 sampling=sampling, seed=seed), on_event)
    return bon, [end - start for start, end in zip([0.0] + ends[:-1], ends)]


def run_prompt(gen: Generator, reward: RewardModel, p: dict, *, b: int, n: int, alphas: Sequence[float],
               max_new_tokens: int, sampling: SamplingConfig, seed: int, bar=None,
               saved: dict | None = None) -> dict[str, Any] | None:
    """Every method's best reward, score and seconds on one prompt; None when n candidates do not
    fit in the budget of b (the prompt is too long). With `saved` (this prompt's row of an earlier
    result), Best-of-N is not run again: its numbers are reused and only Speculative Rejection runs."""
    text = p["instruction"]
    prompt_ids = gen.encode_prompt(text)
    budget = b * (len(prompt_ids) + max_new_tokens)
    if n * (len(prompt_ids) + 1) > budget:
        return None
    row = dict(saved, sbon={}) if saved is not None else best_of_n_row(gen, reward, p, prompt_ids, budget, b=b, n=n,
                                                                       max_new_tokens=max_new_tokens,
                                                                       sampling=sampling, seed=seed, bar=bar)
    baseline = [row["baseline_min"], row["baseline_max"]]
    for alpha in alphas:
        if bar is not None:
            bar.set_description(f"efficiency prompt {p['id']} SBoN a={alpha:g}")
        sbon = common.timed_run(speculative_rejection(gen, reward, text, n, alpha=alpha, kv_budget=budget,
                                                  max_new_tokens=max_new_tokens, sampling=sampling, seed=seed))
        best = sbon.best.final_reward
        row["sbon"][alpha] = {"best": best, "score": normalized_score(baseline, best), "wall_s": sbon.wall_time,
                              "accelerator_s": sbon.wall_time, "accelerators": 1, "tokens": sbon.total_tokens,
                              "steps": max(len(c.token_ids) for c in sbon.candidates),
                              "decision_points": [d.tokens for d in sbon.decision_points],
                              "reward_share": sbon.timings["reward"] / sbon.wall_time, "best_id": sbon.best_id}
        if bar is not None:
            bar.update()
    return row


def prompt_row(gen: Generator, reward: RewardModel, p: dict, *, saved: dict[Any, dict] | None, bar=None,
               **settings) -> dict[str, Any] | None:
    """run_prompt, reusing this prompt's Best-of-N from `saved` (rows of an earlier run by prompt id)
    when it is there; the progress bar moves 1 + len(alphas) per prompt, run or skipped."""
    reuse = saved.get(p["id"]) if saved else None
    if reuse is not None and bar is not None:
        bar.update()
    row = run_prompt(gen, reward, p, bar=bar, saved=reuse, **settings)
    if row is None and bar is not None:
        bar.update(1 + len(settings["alphas"]))
    return row


def best_of_n_row(gen: Generator, reward: RewardModel, p: dict, prompt_ids: Sequence[int], budget: int, *, b: int,
                  n: int, max_new_tokens: int, sampling: SamplingConfig, seed: int, bar=None) -> dict[str, Any]:
    """Best-of-n in batches of b, each timed: the reward, score and compute of Best-of-B, 2B, ..., n."""
    prefill_s = time_prefill(gen, prompt_ids)
    if bar is not None:
        bar.set_description(f"efficiency prompt {p['id']} BoN")
    bon, batch_s = run_bon_batches(gen, reward, p["instruction"], n, b, max_new_tokens=max_new_tokens,
                                   sampling=sampling, seed=seed)
    batch_s = [s + (prefill_s if j else 0.0) for j, s in enumerate(batch_s)]
    # decode steps of each batch: its longest candidate (the batch steps until every candidate has finished)
    batch_steps = [max(len(c.token_ids) for c in bon.candidates[j:j + b]) for j in range(0, n, b)]
    if bar is not None:
        bar.update()
    baseline = [c.final_reward for c in bon.candidates[:b]]  # Best-of-B: the one-accelerator reference
    row: dict[str, Any] = {"prompt_id": p["id"], "prompt_tokens": len(prompt_ids), "kv_budget": budget,
                           "prefill_s": prefill_s, "batch_s": batch_s, "batch_steps": batch_steps,
                           "baseline_min": min(baseline),
                           "baseline_max": max(baseline), "bon_best_id": bon.best_id, "bon": {}, "sbon": {}}
    for k in sizes(b, n // b):
        best = best_of_m_reward(bon, k)
        wall = max(batch_s[:k // b])
        row["bon"][k] = {"best": best, "score": normalized_score(baseline, best), "wall_s": wall,
                         "accelerator_s": (k // b) * wall, "accelerators": k // b,
                         "steps": (k // b) * max(batch_steps[:k // b])}
    return row


def saved_rows(path: str) -> tuple[dict[str, Any], dict[Any, dict]]:
    """An earlier efficiency result's settings and its rows by prompt id (JSON keys back to numbers)."""
    saved = json.loads(Path(path).read_text())
    rows = {}
    for r in saved["rows"]:
        first = next(iter(r["sbon"].values()), {})  # early files kept Best-of-N's best id with each alpha
        rows[r["prompt_id"]] = {**r, "bon": {int(k): v for k, v in r["bon"].items()},
                                "bon_best_id": r.get("bon_best_id", first.get("bon_best_id"))}
    return saved["settings"], rows


def summarize(rows: Sequence[dict], b: int, n: int, alphas: Sequence[float]) -> dict[str, Any]:
    """The official aggregation: score = mean per-prompt normalized score, compute = ratio of totals.

    Compute is measured twice: in accelerator-seconds (wall time, as the paper; on shared CPU cores
    it moves with the load) and in decode steps (forward passes, summed over accelerators: what
    accelerator time is proportional to where a step costs the same for B or N candidates, as on a
    memory-bound GPU; deterministic for a seed; reward-model calls not counted)."""
    base_total = sum(r["bon"][b]["accelerator_s"] for r in rows)
    # files written before decode steps were counted have none: steps are then left out
    has_steps = all("steps" in r["bon"][b] for r in rows)
    base_steps = sum(r["bon"][b]["steps"] for r in rows) if has_steps else float("nan")
    bon = []
    for k in sizes(b, n // b):
        cells = [r["bon"][k] for r in rows]
        bon.append({"n": k, "accelerators": k // b,
                    "score": common.summarize([c["score"] for c in cells])["mean"],
                    "score_median": common.summarize([c["score"] for c in cells])["median"],
                    "best_reward": common.summarize([c["best"] for c in cells])["mean"],
                    "relative_compute": sum(c["accelerator_s"] for c in cells) / base_total,
                    "relative_wall_time": sum(c["wall_s"] for c in cells) / base_total,
                    "relative_steps": sum(c.get("steps", 0) for c in cells) / base_steps})
    curve_x, curve_y = [c["relative_compute"] for c in bon], [c["score"] for c in bon]
    curve_steps = [c["relative_steps"] for c in bon]
    sbon = []
    for alpha in alphas:
        cells = [r["sbon"][alpha] for r in rows]
        score = common.summarize([c["score"] for c in cells])["mean"]
        compute = sum(c["accelerator_s"] for c in cells) / base_total
        bon_compute, extrapolated = compute_at_score(curve_x, curve_y, score)
        bon_n, _ = compute_at_score([c["n"] for c in bon], curve_y, score)
        steps = sum(c["steps"] for c in cells) / base_steps
        bon_steps = compute_at_score(curve_steps, curve_y, score)[0] if has_steps else float("nan")
        sbon.append({"alpha": alpha, "n": n, "accelerators": 1, "score": score,
                     "score_median": common.summarize([c["score"] for c in cells])["median"],
                     "best_reward": common.summarize([c["best"] for c in cells])["mean"],
                     "relative_compute": compute, "relative_wall_time": compute,
                     "bon_compute_at_equal_score": bon_compute, "compute_ratio": bon_compute / compute,
                     "bon_n_at_equal_score": bon_n, "extrapolated": extrapolated,
                     "relative_steps": steps, "step_ratio": bon_steps / steps,
                     "picked_bon_best": sum(c["best_id"] == r["bon_best_id"] for c, r in zip(cells, rows)) / len(rows),
                     "reward_share": common.summarize([c["reward_share"] for c in cells])["mean"]})
    return {"prompts": len(rows), "baseline": f"Best-of-{b} on one accelerator", "bon": bon, "sbon": sbon,
            "best_of_b_seconds": common.summarize([r["bon"][b]["accelerator_s"] for r in rows])}


def run_efficiency(gen: Generator, reward: RewardModel, prompts: Sequence[dict], *, b: int = 4, n: int = 8,
                   alphas: Sequence[float] = (0.5, 0.75), max_new_tokens: int = 128,
                   sampling: SamplingConfig | None = None, seed: int = 0, quiet: bool = False, runner: common.Runner = common.LOCAL,
                   saved: dict[Any, dict] | None = None, on_prompt=None) -> dict[str, Any]:
    """Run Best-of-N in batches of b and Speculative Rejection (one run per alpha) on every prompt
    short enough for n candidates in the budget of b; returns per-prompt rows and the summary.
    `saved` (rows of an earlier run by prompt id) reuses their Best-of-N numbers; `on_prompt(partial
    result)` is called after every prompt (the command line writes the result file each time, so a
    run cut short keeps the prompts it finished)."""
    if n % b or n < 2 * b:
        raise SystemExit(f"error: N={n} must be a multiple of B={b}, at least 2B (the curve needs two points)")
    sampling = sampling or SamplingConfig()
    common.warm_up(gen, reward, sampling, runner)
    rows, skipped = [], []
    bar = common.progress(len(prompts) * (1 + len(alphas)), "efficiency", disable=quiet)
    work = partial(prompt_row, b=b, n=n, alphas=alphas, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                   saved=saved)
    for p, row in common.map_prompts(work, prompts, gen, reward, bar=bar, steps=1 + len(alphas), runner=runner):
        if row is None:
            skipped.append(p["id"])
            continue
        rows.append(row)
        if on_prompt is not None:
            on_prompt({"rows": rows, "skipped_prompts": skipped, "summary": summarize(rows, b, n, alphas),
                       "complete": False})
        s = row["sbon"][alphas[0]]
        bar.set_postfix(score=f"{s['score']:.1f}", time_vs_bo_b=f"{s['accelerator_s'] / row['batch_s'][0]:.2f}")
    bar.close()
    if not rows:
        raise SystemExit(f"error: no prompt is short enough for N={n} candidates in a budget of B={b} complete ones "
                         f"at {max_new_tokens} new tokens (a prompt may have at most "
                         f"{longest_prompt(b, n, max_new_tokens)} tokens): lower --n or raise --max-new-tokens")
    return {"rows": rows, "skipped_prompts": skipped, "summary": summarize(rows, b, n, alphas), "complete": True}


def curve_table(result: dict[str, Any]) -> pd.DataFrame:
    s = result["summary"]
    lines = [{"method": f"Best-of-{c['n']}", "accelerators": c["accelerators"], "score": c["score"],
              "relative_compute": c["relative_compute"], "compute_ratio": float("nan"),
              "relative_steps": c["relative_steps"], "step_ratio": float("nan")} for c in s["bon"]]
    lines += [{"method": f"Speculative Rejection (N={c['n']}, alpha={c['alpha']:g})", "accelerators": 1,
               "score": c["score"], "relative_compute": c["relative_compute"],
               "compute_ratio": c["compute_ratio"], "relative_steps": c["relative_steps"],
               "step_ratio": c["step_ratio"]} for c in s["sbon"]]
    return pd.DataFrame(lines)


def plot(result: dict[str, Any], b: int, title: str | None = None, y_title: str | None = None):
    """Figures 1 and 4 of the NeurIPS version: score against relative compute, in accelerator-seconds
    (left) and in decode steps (right), both on a log2 axis."""
    from plotly.subplots import make_subplots

    s = result["summary"]
    measures = [("relative_compute", "compute_ratio", "accelerator-seconds")]
    if all(np.isfinite(c.get("relative_steps", np.nan)) for c in s["bon"]):
        measures.append(("relative_steps", "step_ratio", "decode steps"))
    fig = make_subplots(rows=1, cols=len(measures), subplot_titles=[m[2] for m in measures], shared_yaxes=True)
    for col, (x, ratio, _) in enumerate(measures, start=1):
        fig.add_scatter(x=[c[x] for c in s["bon"]], y=[c["score"] for c in s["bon"]], mode="lines+markers+text",
                        name="Best-of-N (N/B accelerators)", line=dict(dash="dash", color="#fc8d62"),
                        text=[f"N={c['n']}" for c in s["bon"]], textposition="middle left", showlegend=col == 1,
                        row=1, col=col)
        fig.add_scatter(x=[c[x] for c in s["sbon"]], y=[c["score"] for c in s["sbon"]], mode="markers+text",
                        name=f"Speculative Rejection (1 accelerator, N={s['sbon'][0]['n']})",
                        text=[f"α={c['alpha']:g}: {c[ratio]:.2f}x" for c in s["sbon"]], textposition="top right",
                        marker=dict(size=14, symbol="star", color="#66c2a5"), showlegend=col == 1, row=1, col=col)
        fig.update_xaxes(type="log", dtick=0.30103, title_text=f"compute relative to Best-of-{b}", row=1, col=col)
    fig.update_yaxes(title_text=y_title or f"score (Best-of-{b} = 100, normalized to its reward range)", row=1, col=1)
    fig.update_layout(title=title or f"Score vs compute (B={b}, {s['prompts']} prompts; star label: compute ratio "
                                     f"at equal score)", legend=dict(orientation="h", y=-0.2), width=1000, height=560)
    return fig


def write_png(fig, path) -> str | None:
    """A PNG beside the HTML when plotly can export images here (kaleido); None otherwise."""
    try:
        fig.write_image(str(path), scale=2)
    except Exception as e:  # kaleido missing or without a browser: the HTML is the plot
        return f"no PNG ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return None


def add_parser(sub) -> None:
    p = sub.add_parser("efficiency", help="the NeurIPS version's metric: Best-of-N on N/B accelerators vs "
                       "Speculative Rejection on one, compute at equal score (Figure 1/4)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_efficiency_args(p)
    p.set_defaults(main=main)


def add_efficiency_args(p: argparse.ArgumentParser, reward: str | None = None, *, k: int = 20, b: int = 4, n: int = 8,
                        max_new_tokens: int = 128, alphas: Sequence[float] = (0.5,)) -> None:
    """Defaults sized for 2 CPU cores (the committed runs): with the SmolLM2 chat template a prompt
    has 30+ tokens, and n candidates fit their first token in the budget of b complete ones only
    for prompts of at most (b x max_new_tokens - n) / (n - b) tokens (41 for N=16, B=4, 128 tokens)."""
    common.add_common_args(p, k=k, n=n, max_new_tokens=max_new_tokens, protocol="neurips")
    distributed.add_ray_args(p)
    vllm_bon.add_baseline_args(p)
    if reward:
        p.set_defaults(reward=reward)
    g = p.add_argument_group("efficiency")
    g.add_argument("--b", type=int, default=b, help="candidates one accelerator holds to the end (Best-of-B's batch)")
    g.add_argument("--alphas", type=float, nargs="+", default=list(alphas), help="Speculative Rejection's rejection rates")
    g.add_argument("--replace-long", action="store_true",
                   help="draw further prompts (in the protocol's order) to replace those too long for N in the budget")
    g.add_argument("--bon-from", default=None, metavar="FILE",
                   help="reuse Best-of-N (rewards and batch times) from an earlier result file of this experiment and "
                        "run only Speculative Rejection, with that file's prompts, lengths, sampling and seed (e.g. "
                        "other --alphas, or after an algorithm change); its times were measured then, not now")


def prompts_for(args: argparse.Namespace, gen: Generator) -> list[dict]:
    """The run's prompts; with --replace-long, prompts too long for N candidates in the budget are
    replaced by the next ones in the same order, so that k prompts are run."""
    if not args.replace_long:
        return common.prompts_from(args)
    limit = longest_prompt(args.b, args.n, args.max_new_tokens)
    k = args.k
    args.k = 10**9
    everything = common.prompts_from(args)
    args.k = k
    return [p for p in everything if len(gen.encode_prompt(p["instruction"])) <= limit][:k]


def adopt_saved_settings(args: argparse.Namespace) -> dict[Any, dict] | None:
    """With --bon-from, take the earlier run's lengths, sampling, seed and prompts; its rows by prompt id."""
    if not args.bon_from:
        return None
    settings, rows = saved_rows(args.bon_from)
    for name in ("b", "n", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "generator", "reward",
                 "prompts_file", "prompt_order", "prompt_seed", "offset", "replace_long"):
        setattr(args, name, settings.get(name, getattr(args, name)))
    args.protocol = settings["protocol"]["name"]
    args.prompt_ids = settings["prompt_ids"]
    return rows


def run_and_write(args: argparse.Namespace, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    vllm_bon.check_available(args)
    saved = adopt_saved_settings(args)
    gen, reward = runners.setup(args)
    if saved is not None:
        args.k = 10**9
        by_id = {p["id"]: p for p in common.prompts_from(args)}
        prompts = [by_id[i] for i in args.prompt_ids]
        args.k = len(prompts)
    else:
        prompts = prompts_for(args, gen)
    settings = {**common.base_settings(args, gen, reward, prompts), "b": args.b, "alphas": args.alphas,
                "replace_long": args.replace_long, "bon_from": args.bon_from,
                "longest_prompt_tokens": longest_prompt(args.b, args.n, args.max_new_tokens)}
    json_path, _ = common.result_paths(args, name)
    start_env = common.environment(gen, args.runner)

    def write(result):
        common.write_json({"experiment": name, "settings": settings, "environment_at_start": start_env,
                           "environment": common.environment(gen, args.runner), **result}, json_path)

    result = run_efficiency(gen, reward, prompts, b=args.b, n=args.n, alphas=args.alphas,
                            max_new_tokens=args.max_new_tokens, sampling=common.sampling_from(args), seed=args.seed,
                            quiet=args.quiet, saved=saved, on_prompt=write, runner=args.runner)
    if args.baseline == "vllm":
        ran = {r["prompt_id"] for r in result["rows"]}
        result["vllm_baseline"] = vllm_bon.run_vllm_bon(gen, reward, [p for p in prompts if p["id"] in ran], n=args.n,
                                                        max_new_tokens=args.max_new_tokens,
                                                        sampling=common.sampling_from(args), seed=args.seed,
                                                        gpu_memory=args.vllm_gpu_memory, quiet=args.quiet)
        vllm_bon.against_efficiency(result["vllm_baseline"], result["rows"])
    write(result)
    return result, settings


def main(args: argparse.Namespace) -> int:
    result, _ = run_and_write(args, "efficiency")
    json_path, html_path = common.result_paths(args, "efficiency")
    common.print_table(f"score vs accelerator compute ({result['summary']['prompts']} prompts, B={args.b}, "
                       f"{args.max_new_tokens} new tokens; compute relative to Best-of-{args.b}):", curve_table(result))
    if "vllm_baseline" in result:
        v = result["vllm_baseline"]["summary"]
        print(f"  vLLM Best-of-{args.n} on one accelerator: score {v['score']['mean']:.1f}, "
              f"{v['time_vs_best_of_b']['mean']:.2f}x Best-of-{args.b}'s seconds")
    if result["skipped_prompts"]:
        print(f"  skipped (prompt too long for N={args.n} in the budget): {result['skipped_prompts']}")
    for c in result["summary"]["sbon"]:
        print(f"  alpha={c['alpha']:g}: Best-of-N needs {c['compute_ratio']:.2f}x Speculative Rejection's compute "
              f"for its score {c['score']:.1f} (Best-of-{c['bon_n_at_equal_score']:.1f})"
              + (" [extrapolated beyond the Best-of-N curve]" if c["extrapolated"] else ""))
    if not args.no_plot:
        fig = plot(result, args.b)
        common.write_plot(fig, html_path)
        note = write_png(fig, html_path.with_suffix(".png"))
        print(note or f"wrote {html_path.with_suffix('.png')}")
    print(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {html_path}"))
    return 0
