"""Distil a prefix value head for a reward model from the generator's own samples ("mode two").

    python -m training.value_data --data DIR --split train --prompts 240 --n 8 --batch-prompts 8
    python -m training.value_data --data DIR --split eval --prompts 24 --n 16 --batch-prompts 4
    python -m training.train_value_head --data DIR --reward likelihood --out sbon/assets/smollm2_value_likelihood
    python -m training.train_value_head --data DIR --reward minilm-pref --out sbon/assets/smollm2_value_minilm_pref

The head regresses the reward's FINAL score of the complete response from the features of a
prefix (``sbon.value_head``: mean and last final-layer hidden state, log t). One head serves
every prefix length: its training rows are the candidates still generating at t = 8, 16, 32,
64 and 128 tokens, and the complete responses. Ridge regression (closed form, deterministic),
its penalty chosen by 5-fold cross-validation over training *prompts* on the mean per-prompt
Kendall tau. The evaluation runs on the held-out instructions (``training.value_data``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from scipy.stats import kendalltau

from sbon.engine import SamplingConfig
from sbon.value_head import ValueHead
from .pairs import SEED, check_data
from .value_data import CACHE, PREFIX_TOKENS, PROMPTS_FILE, SHIPPED_DATA, load_records

REWARDS = ("likelihood", "minilm-pref", "minilm-pref-nolength")
TRAIN_AT = (*PREFIX_TOKENS, "full")
EVAL_AT = (8, 16, 32, 64)
L2_VALUES = (1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0)
FOLDS = 5


# -- data ---------------------------------------------------------------------------------------

def live_at(record: dict, t) -> torch.Tensor:
    """Which candidates are still generating after t tokens (all of them for "full")."""
    lengths = torch.tensor(record["lengths"])
    return torch.ones_like(lengths, dtype=torch.bool) if t == "full" else lengths >= t


def features_at(record: dict, t, uses_logprob: bool = False) -> torch.Tensor:
    """(candidates, f) features of each candidate's first t tokens (its whole response if shorter)."""
    x = record["features"][t]
    # The mean log-probability of the prefix is the likelihood reward of the prefix, already cached.
    return torch.cat([x, record["scores"]["likelihood"][t][:, None]], -1) if uses_logprob else x


def training_rows(records: list[dict], reward: str, at=TRAIN_AT,
                  uses_logprob: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features, final reward, group) of every candidate live at each prefix length; a group is
    one prompt at one prefix length: the candidates a decision point ranks against each other."""
    xs, ys, groups = [], [], []
    for i, r in enumerate(records):
        final = r["scores"][reward]["full"].float()
        for j, t in enumerate(at):
            live = live_at(r, t)
            xs.append(features_at(r, t, uses_logprob)[live])
            ys.append(final[live])
            groups.append(torch.full((int(live.sum()),), i * len(at) + j))
    return torch.cat(xs).double(), torch.cat(ys).double(), torch.cat(groups)


# -- fitting ------------------------------------------------------------------------------------

def group_centred(v: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """v minus the mean of its group."""
    _, index = groups.unique(return_inverse=True)
    sums = torch.zeros(int(index.max()) + 1, *v.shape[1:], dtype=v.dtype).index_add_(0, index, v)
    counts = torch.bincount(index).to(v.dtype).reshape(-1, *([1] * (v.dim() - 1)))
    return v - (sums / counts)[index]


def fit(x: torch.Tensor, y: torch.Tensor, l2: float, groups: torch.Tensor | None = None,
        residual: bool = False) -> ValueHead:
    """Ridge regression on standardised features: argmin |Xw + b - y|^2 + l2 |w|^2.

    With ``groups``, w is fitted to the differences within each group (features and rewards minus
    their group means): a decision point only ranks candidates of one prompt at one length, and
    the prompt-to-prompt differences in reward, which a plain regression spends most of its fit
    on, do not change that ranking. The bias then matches the mean reward overall.

    ``residual``: the last feature (the prefix's mean log-probability, the likelihood reward of
    the prefix) enters with weight 1 and the rest is fitted to what it gets wrong, so the penalty
    shrinks the head towards that partial reward rather than towards a constant.
    """
    head = ValueHead(x.shape[1]).double()
    head.set_standardisation(x)
    z = (x - head.mean) / head.scale
    if groups is None:
        zc, yc = z - z.mean(0), y - y.mean()
    else:
        zc, yc = group_centred(z, groups), group_centred(y, groups)
    if residual:
        yc = yc - (group_centred(x[:, -1], groups) if groups is not None else x[:, -1] - x[:, -1].mean())
    w = torch.linalg.solve(zc.T @ zc + l2 * torch.eye(z.shape[1], dtype=z.dtype), zc.T @ yc)
    if residual:
        w[-1] += head.scale[-1]  # weight 1 on the raw feature, in standardised units
    with torch.no_grad():
        head.linear.weight.copy_(w[None])
        head.linear.bias.fill_(float(y.mean() - z.mean(0) @ w))
    return head.float().requires_grad_(False).eval()


def mse(head: ValueHead, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((head.score(x.float()).double() - y).square().mean())


# -- evaluation ---------------------------------------------------------------------------------

def tau(a, b) -> float:
    value = kendalltau(a, b).statistic
    return 0.0 if value != value else float(value)  # NaN when one side is constant


def decision_scores(record: dict, reward: str, t: int, head: ValueHead | None, uses_logprob: bool = False) -> torch.Tensor:
    """What a decision point after t tokens ranks by: the final reward of finished candidates, and
    for live ones the head's prediction (or, with no head, the reward of the partial text)."""
    final = record["scores"][reward]["full"].float()
    live = live_at(record, t)
    partial = head.score(features_at(record, t, uses_logprob)) if head is not None else record["scores"][reward][t].float()
    return torch.where(live, partial, final)


def evaluate(records: list[dict], reward: str, head: ValueHead | None, at=EVAL_AT, uses_logprob: bool = False) -> dict:
    """Mean per-prompt Kendall tau with the final reward, and how often the final winner is in the top half."""
    out = {}
    for t in at:
        taus, kept = [], []
        for r in records:
            final = r["scores"][reward]["full"].float()
            s = decision_scores(r, reward, t, head, uses_logprob)
            taus.append(tau(s.tolist(), final.tolist()))
            top_half = set(torch.argsort(-s, stable=True)[:len(s) // 2].tolist())
            kept.append(float(int(final.argmax()) in top_half))
        out[f"{t}_tokens"] = {"kendall": round(statistics.mean(taus), 3),
                              "kendall_sem": round(statistics.stdev(taus) / len(taus) ** 0.5, 3) if len(taus) > 1 else None,
                              "winner_kept_top_half": round(statistics.mean(kept), 3)}
    return out


def paired_difference(records: list[dict], reward: str, head: ValueHead, uses_logprob: bool, at=EVAL_AT) -> dict:
    """Per prompt, the head's Kendall minus the partial-text reward's: mean and standard error."""
    out = {}
    for t in at:
        diffs = [tau(decision_scores(r, reward, t, head, uses_logprob).tolist(), r["scores"][reward]["full"].tolist())
                 - tau(decision_scores(r, reward, t, None).tolist(), r["scores"][reward]["full"].tolist()) for r in records]
        out[f"{t}_tokens"] = {"mean": round(statistics.mean(diffs), 3),
                              "sem": round(statistics.stdev(diffs) / len(diffs) ** 0.5, 3) if len(diffs) > 1 else None}
    return out


def fold_of(prompt: str) -> int:
    return int(hashlib.sha1(("value-cv" + prompt).encode()).hexdigest(), 16) % FOLDS


def cross_validate(records: list[dict], reward: str, l2_values=L2_VALUES, uses_logprob: bool = False,
                   within: bool = True, residual: bool = False) -> dict[float, float]:
    """Mean per-prompt Kendall (over t in EVAL_AT) of heads fitted without each fold's prompts."""
    result = {}
    for l2 in l2_values:
        taus = []
        for k in range(FOLDS):
            train = [r for r in records if fold_of(r["prompt"]) != k]
            held = [r for r in records if fold_of(r["prompt"]) == k]
            x, y, groups = training_rows(train, reward, uses_logprob=uses_logprob)
            head = fit(x, y, l2, groups if within else None, residual)
            taus += [v["kendall"] for v in evaluate(held, reward, head, uses_logprob=uses_logprob).values()]
        result[l2] = round(statistics.mean(taus), 4)
    return result


# -- command ------------------------------------------------------------------------------------

def train(reward: str, out: Path, cache: Path, uses_logprob: bool = False, residual: bool = False) -> dict:
    start = time.time()
    train_records = load_records(cache, "train")
    eval_records = load_records(cache, "eval")
    if not train_records or not eval_records:
        sys.exit(f"no cached samples in {cache}: run python -m training.value_data --data DIR --split train / --split eval first")
    cv = cross_validate(train_records, reward, uses_logprob=uses_logprob, residual=residual)
    l2 = max(cv, key=cv.get)
    x, y, groups = training_rows(train_records, reward, uses_logprob=uses_logprob)
    head = fit(x, y, l2, groups, residual)
    report = {
        "reward": reward,
        "what": "mean over held-out prompts of Kendall tau-b between the score a decision point after t tokens "
                "ranks by (live candidates: partial score; finished ones: their final reward) and the final reward; "
                "winner_kept_top_half: how often the candidate with the best final reward is in the top half",
        "eval_prompts": len(eval_records), "candidates_per_eval_prompt": eval_records[0]["settings"]["n"],
        "train_prompts": len(train_records), "train_rows": len(y),
        "candidates_per_train_prompt": train_records[0]["settings"]["n"],
        "l2": l2, "cv_kendall_by_l2": {str(k): v for k, v in cv.items()},
        "train_mse": round(mse(head, x, y), 5), "train_target_variance": round(float(y.var()), 5),
        "head": evaluate(eval_records, reward, head, uses_logprob=uses_logprob),
        "partial_text_baseline": evaluate(eval_records, reward, None),
        "head_minus_baseline_per_prompt": paired_difference(eval_records, reward, head, uses_logprob),
        "finished_by_t": {f"{t}_tokens": sum(int((~live_at(r, t)).sum()) for r in eval_records) for t in EVAL_AT},
    }
    config = {"reward": reward, "generator": eval_records[0]["settings"]["generator"], "feature_dim": x.shape[1],
              "features": "[mean(h_1..h_t), h_t, log t] of the final-layer post-norm hidden states of response tokens"
                          + (", mean log-probability of the t tokens" if uses_logprob else ""),
              "uses_logprob": uses_logprob, "residual_on_logprob": residual,
              "fit": "ridge on standardised features, fitted within decision points (prompt x prefix length)",
              "trained_at_tokens": [str(t) for t in TRAIN_AT], "l2": l2,
              "split": "held out: first 20 of alpaca_eval_prompts.jsonl and sha1(instruction) % 100 < 20",
              # decode_prompts samples with the engine's default SamplingConfig
              "sampling": {**{k: v for k, v in train_records[0]["settings"].items() if k != "n"},
                           "temperature": SamplingConfig().temperature, "top_p": SamplingConfig().top_p},
              "train_prompts": len(train_records), "train_rows": len(y)}
    head.save(out, config)
    report["command"] = " ".join(["python -m training.train_value_head", *sys.argv[1:]])
    report["seconds"] = round(time.time() - start, 1)
    report["load_average_1min"] = round(os.getloadavg()[0], 2)
    report["environment"] = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(markdown_table(report))
    return report


def markdown_table(report: dict) -> str:
    """The model card's results table from a report."""
    lines = ["| t | head Kendall | partial-text Kendall | head - partial, per prompt | winner kept, head | winner kept, partial |",
             "| --- | --- | --- | --- | --- | --- |"]
    for t in EVAL_AT:
        k = f"{t}_tokens"
        h, b, d = report["head"][k], report["partial_text_baseline"][k], report["head_minus_baseline_per_prompt"][k]
        lines.append(f"| {t} | {h['kendall']:.3f} ± {h['kendall_sem']:.3f} | {b['kendall']:.3f} ± {b['kendall_sem']:.3f} | "
                     f"{d['mean']:+.3f} ± {d['sem']:.3f} | {h['winner_kept_top_half']:.0%} | {b['winner_kept_top_half']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.train_value_head", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=SHIPPED_DATA, help="folder with alpaca_eval_prompts.jsonl")
    parser.add_argument("--reward", choices=REWARDS, default="likelihood")
    parser.add_argument("--out", type=Path, required=True, help="folder the head, its config and eval.json go to")
    parser.add_argument("--logprob", action="store_true", help="add the prefix's mean token log-probability as a feature")
    parser.add_argument("--residual", action="store_true",
                        help="with --logprob: fit what the prefix's mean log-probability gets wrong (weight 1 on it)")
    parser.add_argument("--cache", type=Path, default=CACHE, help="the samples of training.value_data")
    args = parser.parse_args(argv)
    torch.manual_seed(SEED)
    check_data(args.data, (PROMPTS_FILE,))
    if args.residual and not args.logprob:
        parser.error("--residual needs --logprob")
    train(args.reward, args.out, args.cache, args.logprob, args.residual)


if __name__ == "__main__":
    main()
