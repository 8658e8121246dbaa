"""Per generator + reward tuning: the rejection rate alpha and first decision point that
cost the fewest tokens while keeping a mean normalized score >= 98, from counterfactual data.

Reads a saved raw file -- `signals_raw*.json` (python -m benchmarks signals: every pruning signal) or
`counterfactual_raw*.json` (python -m benchmarks counterfactual: the reward model's partial rewards,
tuned as the `reward` signal) -- and replays a single cut at every (t, alpha): no model is loaded.
The speedup is the token speedup, Best-of-N tokens / pruned tokens (1 / token rate): wall-clock
speedup also depends on batch efficiency and the reward model's cost at decision points.
Writes `tune*.json`, which the app's trade-off view can load (format in the README).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sbon.results import RunResult
from sbon.analysis.signal_matrix import cheapest_setting, mean_grid, scores_from_json

from . import common

DEFAULT_ALPHAS = tuple(round(a, 2) for a in np.arange(0.05, 1.0, 0.05))
SCORE_FLOOR = 98.0


def load_raw(paths: list[str | Path], final_reward: str | None = None) -> tuple[list[RunResult], list[dict], dict, dict]:
    """Best-of-N runs and per-signal scores from signals or counterfactual raw files (pooled);
    with `final_reward`, the candidates are judged by that recorded extra final reward."""
    from .signals_compared import with_final_reward

    bons, scores = [], []
    for path in paths:
        saved = json.loads(Path(path).read_text())
        for rec in saved["raw"]:
            bon = RunResult.from_dict(rec["bon"])
            bon.settings["run_reward"] = bon.reward  # the reward that scored the reward signal's partial texts
            if final_reward:
                if final_reward not in rec.get("final_rewards", {}):
                    raise SystemExit(f"error: {path} has no recorded {final_reward!r} final reward")
                bon = with_final_reward(bon, rec["final_rewards"][final_reward], final_reward)
            bons.append(bon)
        if saved.get("experiment") == "counterfactual_raw":
            scores += [scores_from_json({"reward": rec["partials"]}) for rec in saved["raw"]]
        else:
            scores += [scores_from_json(rec["scores"]) for rec in saved["raw"]]
    first = json.loads(Path(paths[0]).read_text())
    return bons, scores, first["settings"], first["environment"]


def tune(bons, scores, signals=None, alphas=DEFAULT_ALPHAS, floor: float = SCORE_FLOOR) -> dict:
    """The grid per signal and the cheapest setting of each that keeps the floor; `best` over them."""
    if signals:
        scores = [{k: v for k, v in s.items() if k in signals} for s in scores]
    grid = mean_grid(bons, scores, alphas, [b.settings.get("run_reward") for b in bons])
    per_signal = {name: cheapest_setting(g, floor) for name, g in grid.groupby("signal")}
    found = [s for s in per_signal.values() if s]
    best = min(found, key=lambda s: s["token_rate"]) if found else None
    return {"floor": floor, "best": best, "per_signal": per_signal, "grid": grid.to_dict("records")}


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="pick the alpha and first decision point with the fewest tokens at normalized "
                       "score >= 98, from a saved signals/counterfactual raw file", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--from", dest="from_file", nargs="+", required=True, metavar="RAW",
                   help="signals_raw*.json or counterfactual_raw*.json (several are pooled)")
    p.add_argument("--signals", nargs="+", default=None, help="signals to tune (default: all in the file)")
    p.add_argument("--alphas", type=float, nargs="+", default=list(DEFAULT_ALPHAS))
    p.add_argument("--floor", type=float, default=SCORE_FLOOR, help="mean normalized score to keep")
    p.add_argument("--final-reward", default=None, metavar="REWARD",
                   help="judge candidates by this extra final reward recorded in the raw file (signals --extra-rewards)")
    p.add_argument("--out", default=None, help="output JSON (default: tune.json beside the raw file)")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    bons, scores, settings, env = load_raw(args.from_file, args.final_reward)
    result = tune(bons, scores, args.signals, args.alphas, args.floor)
    best = result["best"]
    out = Path(args.out) if args.out else Path(args.from_file[0]).with_name("tune.json")
    payload = {"experiment": "tune", "source": [str(f) for f in args.from_file],
               "generator": settings.get("generator"), "reward": args.final_reward or settings.get("reward"),
               "prompts": len(bons), "n": settings.get("n"), "max_new_tokens": settings.get("max_new_tokens"),
               "speedup": "token speedup: Best-of-N tokens / pruned tokens",
               "run_config": None if best is None else {
                   "method": "sbon-tau", "n": settings.get("n"), "tau": int(best["tau"]), "alpha": best["alpha"],
                   "first_decision": int(best["tau"]), "prune_by": best["signal"],
                   "max_new_tokens": settings.get("max_new_tokens")},
               **result, "settings": {**settings, "alphas": args.alphas}, "environment": env}
    common.write_json(payload, out)
    rows = pd.DataFrame([{"signal": k, **v} if v else {"signal": k} for k, v in result["per_signal"].items()])
    common.print_table(f"cheapest (t, alpha) per signal with mean normalized score >= {args.floor:g} "
                       f"({len(bons)} prompts):", rows, "{:.3f}")
    if best:
        print(f"\nbest: prune by {best['signal']} at tau={best['tau']:g}, alpha={best['alpha']:g}: score "
              f"{best['normalized_score']:.1f}, token rate {best['token_rate']:.3f} ({best['token_speedup']:.2f}x tokens)")
    else:
        print(f"\nno setting keeps a mean normalized score >= {args.floor:g}")
    print(f"wrote {out}")
    return 0
