"""`python -m benchmarks ifeval-tie-keys`: on the calibration split only, would another tie-break of the ifeval
reward's partial value rank each prompt's responses better at the first decision point?

The final reward breaks ties by length (shorter wins, ``reward.tie_break``); the partial value breaks them by the
prefix's length. Candidates that tie on their expected fraction of instructions followed are then ordered by
a key that should predict the *final* length. This scores, on the calibration samples (``calibrate --sample``),
the rankings at the decision point given by the same rounded expected value and each candidate key: the prefix's
length (the reward's), none, the generator's mean log-probability of the prefix (the ``logprob`` pruning signal),
its chance of ending the response (stop tokens) at the next token or over the prefix, a final length predicted
from the prefix's characters per token and that chance, and, as the ceiling, the final length itself. Keys
with a free weight have it chosen on one half of the prompts and scored on the other (cross-fitted).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau

from sbon.ifeval.calibrate import SAMPLES_FILE, read_samples
from sbon.ifeval.progress import remaining_tokens
from sbon.ifeval.data import SHIPPED_FILE, is_calibration, load_prompts
from sbon.ifeval.reward import TIE_BREAK, IFEvalReward, tie_break
from sbon.models import load_generator

from . import common

OUT = Path(__file__).resolve().parent / "results" / "cpu-2core-epyc" / "ifeval" / "tie_keys.json"
WEIGHTS = (-0.2, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2)  # of a log-probability feature against log length


def features(gen, reward: IFEvalReward, rows: list[dict], prompts: dict, tokens: int) -> dict[int, list[dict]]:
    """Per prompt, each response still running at ``tokens``: its rounded expected value, final reward and keys."""
    stop = torch.tensor(sorted(gen.stop_ids))
    out = {}
    for r in rows:
        live = [s for s in r["samples"] if len(s["token_ids"]) > tokens]
        if len(live) < 2:
            continue
        prompt = prompts[r["key"]].prompt
        prompt_ids = gen.encode_prompt(prompt)
        ids = torch.tensor([prompt_ids + s["token_ids"][:tokens] for s in live])
        with torch.inference_mode():  # tokens + 1 positions: each prefix token, then the next one
            logp = torch.log_softmax(gen.model(input_ids=ids).logits[:, len(prompt_ids) - 1:].float(), -1)
        token_logp = logp[:, :tokens].gather(-1, ids[:, len(prompt_ids):, None]).squeeze(-1)
        end = torch.logsumexp(logp[:, :, stop], -1)  # log P(a stop token) at each position
        prefixes = [gen.decode(s["token_ids"][:tokens]) for s in live]
        partial = reward.score_partial(prompt, prefixes)
        final = reward.score(prompt, [s["text"] for s in live])
        out[r["key"]] = [{"value": partial[j] - tie_break(prefixes[j]), "final": final[j],
                          "prefix_chars": len(prefixes[j]), "final_chars": len(s["text"]),
                          "mean_logprob": float(token_logp[j].mean()), "end_next": float(end[j, tokens]),
                          "end_prefix": float(end[j, 1:].exp().mean())} for j, s in enumerate(live)]
    return out


def predicted_chars(c: dict, tokens: int, horizon: int) -> float:
    """Prefix characters per token times the expected final tokens, each later token ending the response with the
    mean chance the generator gave a stop token over the prefix (a geometric stop, capped by the horizon)."""
    steps = np.arange(1, horizon - tokens + 1)
    return c["prefix_chars"] / tokens * (tokens + ((1.0 - c["end_prefix"]) ** steps).sum())


def expected_final_tie(c: dict, tokens: int, horizon: int, stop_rate: float) -> float:
    """The final reward's tie term expected from the prefix alone: its characters per token over the tokens still
    to come under the calibrated geometric stop (``progress.remaining_tokens``), on the final reward's scale."""
    rest = remaining_tokens([horizon - tokens], stop_rate)[:, 0]
    return float(np.mean(TIE_BREAK / (1.0 + c["prefix_chars"] / tokens * (tokens + rest) / 500.0)))


def keys(tokens: int, horizon: int, stop_rate: float) -> dict:
    """Tie keys: the larger, the higher the candidate ranks among those of equal value (all map into (0, TIE_BREAK])."""
    squash = lambda x: TIE_BREAK * (0.5 + 0.4 * np.tanh(x))  # noqa: E731  order-preserving, inside (0, TIE_BREAK)
    return {
        "prefix length (the reward's)": lambda c: tie_break("x" * c["prefix_chars"]),
        "none": lambda c: 0.0,
        "expected final tie term (prefix chars/token, calibrated stop rate)":
            lambda c: expected_final_tie(c, tokens, horizon, stop_rate),
        "mean log-probability, higher first": lambda c: squash(c["mean_logprob"] / 5),
        "mean log-probability, lower first": lambda c: squash(-c["mean_logprob"] / 5),
        "P(end) at the next token, higher first": lambda c: squash(c["end_next"] / 20 + 1),
        "P(end) over the prefix, higher first": lambda c: squash(20 * c["end_prefix"]),
        "predicted final length (prefix chars/token, P(end) over the prefix)":
            lambda c: TIE_BREAK / (1.0 + predicted_chars(c, tokens, horizon) / 500.0),
        "ceiling: the final length": lambda c: TIE_BREAK / (1.0 + c["final_chars"] / 500.0),
    }


def per_prompt(groups: dict[int, list[dict]], key) -> dict[int, float]:
    """Kendall of partial (value + key) against final rewards, per prompt where neither side is constant."""
    out = {}
    for k, g in groups.items():
        partial = [c["value"] + key(c) for c in g]
        final = [c["final"] for c in g]
        if np.ptp(partial) > 0 and np.ptp(final) > 0:
            out[k] = float(kendalltau(partial, final).statistic)
    return out


def summary(groups: dict[int, list[dict]], key, reference: dict[int, float] | None) -> dict:
    kendall = per_prompt(groups, key)
    pooled = [(c["value"] + key(c), c["final"]) for g in groups.values() for c in g]
    ties = [abs(a["value"] + key(a) - b["value"] - key(b)) < TIE_BREAK for g in groups.values()
            for i, a in enumerate(g) for b in g[i + 1:]]
    out = {"kendall_per_prompt_mean": round(float(np.mean(list(kendall.values()))), 4), "prompts": len(kendall),
           "kendall_pooled": round(float(kendalltau(*zip(*pooled)).statistic), 4),
           "tied_pairs": round(float(np.mean(ties)), 4)}
    if reference is not None:
        diff = [kendall[k] - reference[k] for k in kendall if k in reference]
        out["gain_vs_reward"] = {"mean": round(float(np.mean(diff)), 4),
                                 "standard_error": round(float(np.std(diff, ddof=1) / np.sqrt(len(diff))), 4)}
    return out


def cross_fitted(groups: dict[int, list[dict]], feature: str, scale: float) -> dict:
    """Prefix length and ``feature`` together (log length against weight * feature / scale), the weight chosen on
    one half of the prompts and the per-prompt Kendall gain over the prefix length scored on the other."""
    def key(w):
        return lambda c: TIE_BREAK * (0.5 + 0.4 * np.tanh(-np.log(c["prefix_chars"] + 1) + w * c[feature] / scale))
    table = {w: per_prompt(groups, key(w)) for w in WEIGHTS}
    gains, chosen = [], []
    for half in (0, 1):
        fit = [k for k in groups if (k // 2) % 2 == half]
        best = max(WEIGHTS, key=lambda w: np.mean([table[w][k] for k in fit if k in table[w]]))
        chosen.append(best)
        gains += [table[best][k] - table[0.0][k] for k in groups if (k // 2) % 2 != half and k in table[best]]
    return {"weights_chosen": chosen, "gain_vs_reward": {"mean": round(float(np.mean(gains)), 4),
            "standard_error": round(float(np.std(gains, ddof=1) / np.sqrt(len(gains))), 4)},
            "in_sample_by_weight": {str(w): round(float(np.mean(list(t.values()))), 4) for w, t in table.items()}}


def add_parser(sub) -> None:
    p = sub.add_parser("ifeval-tie-keys", help="calibration split: tie-breaks of the ifeval partial value against "
                                                "the prefix length, per-prompt Kendall at the decision point")
    p.add_argument("--tokens", type=int, default=32, help="decision point (tokens)")
    p.add_argument("--prompts", type=int, default=None, help="the first PROMPTS sampled prompts (None: all)")
    p.add_argument("--out", type=Path, default=OUT, help="result file")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    start, load = time.time(), os.getloadavg()
    gen = load_generator(device="cpu")
    reward = IFEvalReward()
    rows = read_samples(SAMPLES_FILE)[:args.prompts]
    prompts = {p.key: p for p in load_prompts(SHIPPED_FILE) if is_calibration(p.key)}
    groups = features(gen, reward, rows, prompts, args.tokens)
    horizon = reward.progress.horizon_tokens
    table = keys(args.tokens, horizon, reward.progress.stop_rate)
    reference = per_prompt(groups, table["prefix length (the reward's)"])
    payload = {
        "about": __doc__.split("\n\n")[0].split(": ", 1)[1],
        "command": common.command_line(args),
        "settings": {"decision_tokens": args.tokens, "horizon_tokens": horizon, "samples_file": SAMPLES_FILE.name, "prompts": len(rows),
                     "resolution": reward.progress.resolution,
                     "stop_rate": reward.progress.stop_rate, "live_responses": sum(map(len, groups.values()))},
        "environment": common.environment(gen),
        "load_average": {"start": [round(x, 2) for x in load], "end": [round(x, 2) for x in os.getloadavg()]},
        "seconds": None,
        "keys": {name: summary(groups, key, reference) for name, key in table.items()},
        "cross_fitted": {f"prefix length with {f}": cross_fitted(groups, f, s)
                         for f, s in (("end_next", 1.0), ("end_prefix", 0.01), ("mean_logprob", 1.0))},
    }
    payload["seconds"] = round(time.time() - start, 1)
    common.write_json(payload, args.out)
    for name, s in payload["keys"].items():
        print(f"{name:72s} Kendall per prompt {s['kendall_per_prompt_mean']:.4f}  pooled {s['kendall_pooled']:.4f}  "
              f"tied {s['tied_pairs']:.4f}  {s.get('gain_vs_reward', '')}")
    for name, s in payload["cross_fitted"].items():
        print(name, s["weights_chosen"], s["gain_vs_reward"])
    return 0
