"""Pruning signals side by side: which signal, at which decision point, keeps the response
Best-of-N would have picked?

Per prompt, Best-of-N runs once with every signal watching (sbon.analysis.signal_matrix); each signal scores
the candidates still generating at each decision point t. A single cut at t by each signal (keep
round((1 - alpha) * live), finished candidates stay eligible) then gives, for every signal x t x alpha:
winner kept (% of prompts where Best-of-N's winner by final reward survives), mean normalized score,
Kendall of the signal with the final reward, and the token rate (tokens saved = 1 - rate). A `random`
row (mean of 20 seeded random rankings) is the baseline every signal must beat. The raw scores are
saved, so that `--from RAW.json` recomputes everything without a model; `python -m benchmarks tune`
reads the same raw file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from sbon.config import RunConfig
from sbon.engine import Generator, SamplingConfig
from sbon.results import RunResult
from sbon.rewards import RewardModel
from sbon.analysis.signal_matrix import scores_from_json, signal_grid, signal_scores
from sbon.signals import SIGNALS

from . import common, runners

DEFAULT_SIGNALS = ("reward", "logprob", "deepconf", "self-certainty", "consistency")
DEFAULT_TAUS = (8, 16, 32, 64)
DEFAULT_ALPHAS = (0.5, 0.75, 0.9)
HH_FILE = "hh_harmless_prompts.jsonl"
RANDOM_DRAWS = 20
METRICS = ["winner_kept", "normalized_score", "kendall", "token_rate", "tokens_saved"]


def load_prompt_sets(args: argparse.Namespace) -> list[dict]:
    """`--k` AlpacaEval prompts and `--hh-k` HH-RLHF harmless prompts, each tagged with its set."""
    alpaca = common.load_prompts(args.k, args.data_dir, args.prompts_file, args.offset) if args.k else []
    hh = common.load_prompts(args.hh_k, args.data_dir, args.hh_file, args.offset) if args.hh_k else []
    return [{**p, "set": "alpaca_eval"} for p in alpaca] + [{**p, "set": "hh"} for p in hh]


def generate(gen: Generator, reward: RewardModel, prompts: Sequence[dict], signals: Sequence[str],
             taus: Sequence[int], *, n: int = 32, max_new_tokens: int = 128, sampling: SamplingConfig | None = None,
             seed: int = 0, quiet: bool = False, extra_rewards: dict[str, RewardModel] | None = None
             ) -> list[dict[str, Any]]:
    """The raw records: per prompt, Best-of-N's candidates and every signal's scores at every t, and
    each of `extra_rewards`' final scores of the complete candidates (one scoring pass per prompt), so
    that the matrix can also be read against another final reward (`--final-reward`)."""
    sampling = sampling or SamplingConfig()
    config = RunConfig(method="bon", n=n, max_new_tokens=max_new_tokens, temperature=sampling.temperature,
                       top_p=sampling.top_p, top_k=sampling.top_k, seed=seed)
    raw = []
    bar = common.progress(len(prompts), "signals", disable=quiet)
    for p in prompts:
        bar.set_description(f"signals {p['set']} {p['id']}")
        bon, scores = signal_scores(gen, reward, p["instruction"], config, signals, taus)
        texts = [c.text for c in bon.candidates]
        extra = {name: r.score(p["instruction"], texts) for name, r in (extra_rewards or {}).items()}
        raw.append({"prompt_id": p["id"], "set": p["set"], "bon": bon.to_dict(), "scores": scores,
                    **({"final_rewards": extra} if extra else {})})
        bar.update()
    bar.close()
    return raw


def random_grid(bon: RunResult, scores: dict, alphas: Sequence[float], rng: np.random.Generator) -> pd.DataFrame:
    """The same cuts with random rankings of the live candidates (mean of RANDOM_DRAWS draws)."""
    any_signal = next(iter(scores.values()))
    draws = []
    for d in range(RANDOM_DRAWS):
        fake = {"random": {t: [None if s is None else float(rng.random()) for s in v] for t, v in any_signal.items()}}
        draws.append(signal_grid(bon, fake, alphas).assign(draw=d))
    df = pd.concat(draws, ignore_index=True)
    return df.groupby(["signal", "tau", "alpha"], as_index=False).mean(numeric_only=True).drop(columns="draw")


def with_final_reward(bon: RunResult, rewards: Sequence[float], name: str | None = None) -> RunResult:
    """The same candidates judged by another final reward (named ``name``): final rewards replaced, winner
    re-picked."""
    bon.reward = name or bon.reward
    for c, r in zip(bon.candidates, rewards):
        c.final_reward = float(r)
    bon.best_id = max(range(len(bon.candidates)), key=lambda k: (bon.candidates[k].final_reward, -k))
    return bon


def per_prompt(raw: Sequence[dict], alphas: Sequence[float], seed: int = 0,
               final_reward: str | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for rec in raw:
        bon = RunResult.from_dict(rec["bon"])
        run_reward = bon.reward  # the reward that scored the reward signal's partial texts
        if final_reward:
            if final_reward not in rec.get("final_rewards", {}):
                raise SystemExit(f"error: prompt {rec['prompt_id']} has no recorded {final_reward!r} final reward "
                                 f"(recorded: {', '.join(rec.get('final_rewards', {})) or 'none'})")
            bon = with_final_reward(bon, rec["final_rewards"][final_reward], final_reward)
        scores = scores_from_json(rec["scores"])
        grid = pd.concat([signal_grid(bon, scores, alphas, run_reward), random_grid(bon, scores, alphas, rng)], ignore_index=True)
        rows.append(grid.assign(prompt_id=rec["prompt_id"], set=rec.get("set", "alpaca_eval")))
    df = pd.concat(rows, ignore_index=True)
    df["tokens_saved"] = 1 - df["token_rate"]
    return df


def matrix(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over prompts per signal x t x alpha; winner kept and tokens saved in %."""
    m = df.groupby(["signal", "tau", "alpha"], as_index=False, sort=False)[METRICS].mean()
    m["prompts"] = df.groupby(["signal", "tau", "alpha"], sort=False).size().values
    m["winner_kept"] *= 100
    m["tokens_saved"] *= 100
    return m


def analyze(raw: Sequence[dict], alphas: Sequence[float] = DEFAULT_ALPHAS, seed: int = 0,
            final_reward: str | None = None) -> dict[str, Any]:
    df = per_prompt(raw, alphas, seed, final_reward)
    by_set = {name: matrix(g).to_dict("records") for name, g in df.groupby("set")}
    return {"matrix": matrix(df).to_dict("records"), "by_set": by_set, "per_prompt": df.to_dict("records")}


def plot(result: dict[str, Any], n: int, alpha: float):
    """One figure: winner kept vs decision point at one alpha (left), and normalized score vs token
    rate over every (t, alpha) (right), one colour per signal."""
    import plotly.express as px
    from plotly.subplots import make_subplots

    m = pd.DataFrame(result["matrix"])
    final = result.get("final_reward")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"Best-of-N winner kept at alpha={alpha:g} (%)",
                                                        "Normalized score vs token rate (every t, alpha)"))
    colors = dict(zip(m["signal"].unique(), px.colors.qualitative.Plotly))
    for name, g in m.groupby("signal", sort=False):
        at = g[np.isclose(g["alpha"], alpha)].sort_values("tau")
        fig.add_scatter(x=at["tau"], y=at["winner_kept"], mode="lines+markers", name=name, legendgroup=name,
                        line=dict(color=colors[name], dash="dot" if name == "random" else None), row=1, col=1)
        fig.add_scatter(x=g["token_rate"], y=g["normalized_score"], mode="markers", name=name, legendgroup=name,
                        showlegend=False, marker=dict(color=colors[name]),
                        text=[f"τ={t}, α={a:g}" for t, a in zip(g["tau"], g["alpha"])], row=1, col=2)
    fig.add_hline(y=98, line_dash="dot", row=1, col=2)
    taus = sorted(m["tau"].unique())
    fig.update_xaxes(title_text="decision point t (tokens)", type="log", tickvals=taus, ticktext=[str(t) for t in taus],
                     row=1, col=1)
    fig.update_xaxes(title_text="token rate (pruned tokens / Best-of-N tokens)", row=1, col=2)
    fig.update_yaxes(title_text="winner kept (%)", row=1, col=1)
    fig.update_yaxes(title_text="normalized score", row=1, col=2)
    fig.update_layout(title=f"Pruning signals on the same Best-of-{n} candidates"
                            + (f" (final reward: {final})" if final else ""))
    return fig


def add_parser(sub) -> None:
    p = sub.add_parser("signals", help="pruning signals side by side: winner kept, normalized score, Kendall and "
                       "tokens saved per signal x decision point x alpha", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_common_args(p, k=20, n=32, max_new_tokens=128)
    g = p.add_argument_group("signals")
    g.add_argument("--hh-k", type=int, default=20, help="number of HH-RLHF harmless prompts (from --hh-file)")
    g.add_argument("--hh-file", default=HH_FILE)
    g.add_argument("--signals", nargs="+", default=list(DEFAULT_SIGNALS), choices=list(SIGNALS))
    g.add_argument("--taus", type=int, nargs="+", default=list(DEFAULT_TAUS), help="decision points (tokens)")
    g.add_argument("--alphas", type=float, nargs="+", default=list(DEFAULT_ALPHAS))
    g.add_argument("--plot-alpha", type=float, default=None, help="alpha of the winner-kept panel (default: first)")
    g.add_argument("--from", dest="from_file", nargs="+", default=None, metavar="RAW",
                   help="recompute from saved raw files (signals_raw*.json; several are pooled) without generating")
    g.add_argument("--extra-rewards", nargs="+", default=[], metavar="REWARD",
                   help="also record these rewards' final scores of every candidate (e.g. likelihood)")
    g.add_argument("--final-reward", default=None, metavar="REWARD",
                   help="read the matrix against this recorded extra final reward instead of --reward")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    json_path, html_path = common.result_paths(args, "signals")
    raw_path = json_path.with_name(json_path.stem.replace("signals", "signals_raw", 1) + ".json")
    if args.from_file:
        saved = [json.loads(Path(f).read_text()) for f in args.from_file]
        raw = [rec for s in saved for rec in s["raw"]]
        settings, env = saved[0]["settings"], saved[0]["environment"]
        if len(saved) > 1:  # pooled runs: say which prompts came from where
            settings = {**settings, "k": sum(s["settings"]["k"] for s in saved),
                        "hh_k": sum(s["settings"].get("hh_k", 0) for s in saved),
                        "pooled": [{"file": f, "k": s["settings"]["k"], "hh_k": s["settings"].get("hh_k"),
                                    "offset": s["settings"]["offset"]} for f, s in zip(args.from_file, saved)]}
            env = {**env, "pooled_environments": [s["environment"] for s in saved]}
    else:
        prompts = load_prompt_sets(args)
        gen, reward = runners.setup(args)
        from sbon.models import load_reward

        settings = {**common.base_settings(args, gen, reward), "hh_k": args.hh_k, "hh_file": args.hh_file,
                    "data_dir": str(common.data_dir(args.data_dir)), "signals": args.signals, "taus": args.taus,
                    "extra_rewards": args.extra_rewards}
        env = common.environment(gen)
        extra = {name: load_reward(name, generator=gen) for name in args.extra_rewards}
        raw = generate(gen, reward, prompts, args.signals, args.taus, n=args.n, max_new_tokens=args.max_new_tokens,
                       sampling=common.sampling_from(args), seed=args.seed, quiet=args.quiet, extra_rewards=extra)
        env["load_average_after"] = common.environment()["load_average"]
        common.write_json({"experiment": "signals_raw", "settings": settings, "environment": env, "raw": raw},
                          raw_path)
        print(f"raw scores written to {raw_path}")
    result = analyze(raw, args.alphas, args.seed, args.final_reward)
    result["final_reward"] = args.final_reward or settings["reward"]
    settings = {**settings, "final_reward_read": args.final_reward or settings["reward"], "alphas": args.alphas, "random_draws": RANDOM_DRAWS, "from": args.from_file,
                "cut": "single decision point at t: keep round((1 - alpha) * live) live candidates by the signal; "
                       "candidates finished before t stay eligible"}
    common.write_json({"experiment": "signals", "settings": settings, "environment": env,
                       "analysis_environment": common.environment(), **result}, json_path)
    m = pd.DataFrame(result["matrix"])
    csv_path = json_path.with_suffix(".csv")
    m.to_csv(csv_path, index=False, float_format="%.4g")
    common.print_table(f"signals x t x alpha, {len(raw)} prompts, N={settings['n']} "
                       "(winner kept and tokens saved in %):", m, "{:.2f}")
    for alpha, g in m.groupby("alpha"):
        print(f"\nwinner kept (%) at alpha={alpha:g} (rows: signal, columns: t)")
        print(g.pivot(index="signal", columns="tau", values="winner_kept").to_string(float_format=lambda x: f"{x:.0f}"))
    written = [json_path, csv_path]
    if not args.no_plot:
        fig = plot(result, settings["n"], args.plot_alpha or args.alphas[0])
        written.append(common.write_plot(fig, html_path))
        try:  # a static copy for the README; kaleido needs a Chrome, which not every machine has
            fig.write_image(str(html_path.with_suffix(".png")), width=1300, height=520, scale=1.5)
            written.append(html_path.with_suffix(".png"))
        except Exception as e:  # noqa: BLE001 -- the HTML is the figure; the PNG is a convenience
            print(f"no PNG ({type(e).__name__}: {e}); the HTML has the figure")
    print("\nwrote " + ", ".join(map(str, written)))
    return 0
