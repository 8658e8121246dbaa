"""Calibrate the IFEval reward's partial values on the embedded generator's own responses.

    OMP_NUM_THREADS=1 python -m sbon.ifeval.calibrate --sample --samples 8 --prompts 160   # resumable
    python -m sbon.ifeval.calibrate                                                         # fit, write

``--sample`` draws ``--samples`` complete responses of ``--max-new-tokens`` tokens (Best-of-N's sampler,
default sampling settings, seed = the prompt's key) for prompts of the calibration split (odd key, see
``data.is_calibration``; even keys are left for evaluation), the prompt carrying the least-sampled
instruction type first, and appends them to ``--samples-file`` one prompt a line; a run cut short
resumes where it stopped.

The fit (without ``--sample``) reads that file, cuts every response at ``CUTS`` tokens, and for each
instruction still open there records how far the prefix has come (``Instruction.progress``, or
``Instruction.evidence``), what the complete response added to its counts and whether it followed the
instruction (strict). It measures the generator's stop rate and, per count type, the event rate; picks the
strength of least log-loss on a grid and the shrinkage weight of least log-loss out of sample (see
``progress``); per type without a count, the smoothed fraction followed, by evidence where there is some. It
writes ``pass_rates.json`` with the calibration error at the first decision point (``--decision-tokens``):
expected calibration error, Brier score and log-loss of the progress model, cross-fitted (parameters fitted
on one half of the prompts, scored on the other), against the former value (each type's pass rate on
complete responses, whatever the prefix).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..algorithms import best_of_n, run
from ..models import load_generator
from ..rewards import CallableReward
from .checkers import OPEN
from .data import SHIPPED_FILE, is_calibration, load_prompts
from .progress import ProgressModel, TypeModel, counts_met
from .reward import PASS_RATES_FILE, TIE_BREAK, IFEvalReward

SAMPLES_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu-2core-epyc" / "ifeval" / \
    "calibration_samples.jsonl"
CUTS = (16, 32, 48, 64, 96)  # where responses are cut to make open prefixes (tokens)
RATE_FLOOR = 1e-4  # events per token: a type never seen to happen after the cut still may
STRENGTH_GRID = np.geomspace(2.0, 2e4, 13)  # tokens
WEIGHT_GRID = np.linspace(0.0, 1.0, 21)  # trust in the count model against the type's base rate
CLIP = 1e-4  # probabilities are clipped to [CLIP, 1 - CLIP] in the log-loss


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sbon.ifeval.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", action="store_true", help="only sample: append complete responses to --samples-file")
    p.add_argument("--samples", type=int, default=8, help="--sample: complete responses per prompt")
    p.add_argument("--prompts", type=int, default=1000, help="--sample: prompts of the calibration split in the file")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--minutes", type=float, default=600.0, help="--sample: stop starting new prompts after this long")
    p.add_argument("--pseudo-count", type=float, default=8.0,
                   help="weight of the pooled rate in the open rate of a type without a count")
    p.add_argument("--decision-tokens", type=int, default=32, help="where the calibration error is measured")
    p.add_argument("--data", type=Path, default=SHIPPED_FILE)
    p.add_argument("--samples-file", type=Path, default=SAMPLES_FILE,
                   help="the sampled responses (JSON lines); with --shard K/M, shard K writes NAME.K.jsonl beside it")
    p.add_argument("--shard", default=None, help="--sample: K/M samples only the prompts with (key // 2) %% M == K, "
                                                 "so that M processes can share the work")
    p.add_argument("--out", type=Path, default=PASS_RATES_FILE)
    return p.parse_args(argv)


def next_prompt(remaining: list, counts: collections.Counter):
    """The prompt carrying the least-sampled instruction type (file order among equals): a short run
    then covers every type instead of the first prompts' types only."""
    return min(remaining, key=lambda row: min(counts[i] for i in row.instruction_ids))


def sample_files(path: Path) -> list[Path]:
    """The samples file and its shards' files (NAME.K.jsonl)."""
    return [path, *sorted(path.parent.glob(path.stem + ".*" + path.suffix))]


def read_samples(path: Path) -> list[dict]:
    """Every sampled prompt of the samples file and its shards, once each, in key order."""
    rows = {}
    for f in sample_files(path):
        if f.exists():
            for line in f.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    rows.setdefault(row["key"], row)
    return [rows[k] for k in sorted(rows)]


def sample_to_file(gen, prompts, args, path: Path, deadline: float) -> int:
    """Append one JSON line per prompt (key, each sample's token ids, text and stop reason) to ``path``,
    skipping prompts already there. Returns the number of prompts written."""
    rows = read_samples(path)
    done = {r["key"] for r in rows}
    if args.shard:
        k, m = (int(x) for x in args.shard.split("/"))
        prompts = [p for p in prompts if (p.key // 2) % m == k]
        path = path.with_suffix(f".{k}{path.suffix}")
    counts: collections.Counter = collections.Counter()
    for r in rows:
        counts.update({i: len(r["samples"]) for i in r["instruction_ids"]})
    remaining = [p for p in prompts if p.key not in done]
    written = 0
    zero = CallableReward(lambda p, rs: [0.0] * len(rs), name="none")  # Best-of-N's sampling ignores it
    while remaining and len(rows) + written < args.prompts and time.time() < deadline:
        row = next_prompt(remaining, counts)
        remaining.remove(row)
        result = run(best_of_n(gen, zero, row.prompt, n=args.samples, max_new_tokens=args.max_new_tokens,
                               seed=row.key))
        samples = [{"token_ids": c.token_ids, "text": c.text, "stop": c.stop_reason} for c in result.candidates]
        with path.open("a") as f:
            f.write(json.dumps({"key": row.key, "instruction_ids": list(row.instruction_ids), "samples": samples})
                    + "\n")
        counts.update({i: len(samples) for i in row.instruction_ids})
        written += 1
    return written


def observations(decode, rows: list[dict], prompts: dict) -> tuple[list[dict], dict, dict, float]:
    """Open prefixes at every cut (type, counts, characters, followed at the end, cut, key), the checks and
    passes of complete responses per type, and the generator's characters per token."""
    obs, checks, passes = [], collections.Counter(), collections.Counter()
    chars = tokens = 0
    for row in rows:
        instructions = prompts[row["key"]].instructions()
        for s in row["samples"]:
            text, ids = s["text"], s["token_ids"]
            chars, tokens = chars + len(text), tokens + len(ids)
            followed = [bool(text.strip()) and ins.check(text) for ins in instructions]
            for ins, y in zip(instructions, followed):
                checks[ins.id] += 1
                passes[ins.id] += y
            for cut in CUTS:
                if len(ids) <= cut:
                    continue  # finished before the cut: judged by its final reward there, not a partial one
                prefix = decode(ids[:cut])
                for ins, y in zip(instructions, followed):
                    if ins.partial(prefix).status == OPEN:
                        counts = ins.progress(prefix)
                        later = None if counts is None else sum(c.count for c in ins.progress(text)) - \
                            sum(c.count for c in counts)
                        obs.append({"type": ins.id, "counts": counts, "tokens": cut, "y": float(y), "cut": cut,
                                    "key": row["key"], "evidence": ins.evidence(prefix) if counts is None else None,
                                    "later": (later, len(ids) - cut)})
    return obs, checks, passes, chars / max(1, tokens)


def count_probabilities(obs: list[dict], model: TypeModel, horizon: float, stop_rate: float) -> np.ndarray:
    """The count model's probability that each open prefix meets all its counts, before ``TypeModel.shrink``."""
    flat = [(i, c) for i, o in enumerate(obs) for c in o["counts"]]
    return counts_met([c for _, c in flat], [i for i, _ in flat], len(obs), [obs[i]["tokens"] for i, _ in flat],
                      horizon, model, stop_rate)


def stop_rate_of(rows: list[dict], horizon: int) -> float:
    """The generator's chance of ending its response at any one token: responses that ended before the limit
    over the tokens written (a geometric stop)."""
    ended = sum(len(s["token_ids"]) < horizon for r in rows for s in r["samples"])
    return ended / max(1, sum(len(s["token_ids"]) for r in rows for s in r["samples"]))


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, CLIP, 1 - CLIP)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def event_rate(obs: list[dict]) -> float:
    """The type's events per token after the cut, measured: what the complete responses added to the open
    prefixes' counts over the tokens they wrote after it (a rate is observed, not fitted)."""
    events = sum(max(0, o["later"][0]) for o in obs)
    return max(RATE_FLOOR, events / max(1, sum(o["later"][1] for o in obs)))


def _grid_fit(obs: list[dict], horizon: float, stop_rate: float, base: float) -> tuple[float, float, float]:
    """(rate, strength, weight): the measured rate, and the strength and weight of the grid with least log-loss
    on these open prefixes."""
    y = np.array([o["y"] for o in obs])
    r, best = event_rate(obs), (math.inf, 0.0, 1.0)
    for s in STRENGTH_GRID:
        p = count_probabilities(obs, TypeModel(r, s), horizon, stop_rate)
        for w in WEIGHT_GRID:
            best = min(best, (log_loss(w * p + (1 - w) * base, y), s, w))
    return r, best[1], best[2]


def fit_type(obs: list[dict], horizon: float, stop_rate: float, base: float) -> TypeModel:
    """One count type's model: the measured rate, the strength of least log-loss on the grid, and the trust
    (weight toward ``base``, the type's smoothed open pass rate) that does best *out of sample*: two folds of the prompts, each
    valued with the grid's fit on the other. In-sample, a sharp prior (thousands of tokens of strength) always
    looks best and then fails on other prompts; the held-out weight prices that in."""
    folds = [[o for o in obs if (o["key"] // 4) % 2 == f] for f in (0, 1)]
    held_out = []  # (count model's probability, followed) of each prefix, fitted without its fold
    for f in (0, 1):
        if folds[f] and folds[1 - f]:
            r, s, _ = _grid_fit(folds[1 - f], horizon, stop_rate, base)
            held_out += zip(count_probabilities(folds[f], TypeModel(r, s), horizon, stop_rate),
                            (o["y"] for o in folds[f]))
    r, s, w = _grid_fit(obs, horizon, stop_rate, base)
    if held_out:
        p, yy = (np.array(v) for v in zip(*held_out))
        w = min(WEIGHT_GRID, key=lambda w: log_loss(w * p + (1 - w) * base, yy))
    return TypeModel(rate=float(f"{r:.4g}"), strength=float(f"{s:.4g}"), weight=round(float(w), 3), base=base)


def smoothed(passes: float, checks: float, prior: float, pseudo: float) -> float:
    return round((passes + pseudo * prior) / (checks + pseudo), 4)


def smoothed_rates(counts: dict, passes: dict, pseudo: float) -> tuple[dict[str, float], float]:
    """(rate per type, prior): each type's pass rate pulled toward the pooled rate by ``pseudo`` checks."""
    prior = sum(passes.values()) / max(1, sum(counts.values()))
    return {k: smoothed(passes[k], counts[k], prior, pseudo) for k in sorted(counts)}, round(prior, 4)


def fit(obs: list[dict], prior: float, horizon: float, stop_rate: float, pseudo: float) -> tuple[dict, dict, dict]:
    """(count types' models, open rates of the types without a count, their rates by evidence label) from
    open prefixes; every rate is smoothed toward the next coarser one by ``pseudo`` prefixes."""
    by_type: dict[str, list] = collections.defaultdict(list)
    for o in obs:
        by_type[o["type"]].append(o)
    types, open_rates, evidence_rates = {}, {}, {}
    for kind, items in sorted(by_type.items()):
        rate = smoothed(sum(o["y"] for o in items), len(items), prior, pseudo)
        if items[0]["counts"] is not None:
            types[kind] = fit_type(items, horizon, stop_rate, rate)
            continue
        open_rates[kind] = rate
        labels = sorted({o["evidence"] for o in items if o["evidence"] is not None})
        if labels:
            evidence_rates[kind] = {label: smoothed(sum(o["y"] for o in items if o["evidence"] == label),
                                                    sum(o["evidence"] == label for o in items), rate, pseudo)
                                    for label in labels}
    return types, open_rates, evidence_rates


def predict(obs: list[dict], types: dict, open_rates: dict, evidence_rates: dict, prior: float,
            horizon: float, stop_rate: float) -> np.ndarray:
    out = np.empty(len(obs))
    by_type: dict[str, list[int]] = collections.defaultdict(list)
    for i, o in enumerate(obs):
        by_type[o["type"]].append(i)
    for kind, idx in by_type.items():
        if kind in types and obs[idx[0]]["counts"] is not None:
            out[idx] = types[kind].shrink(count_probabilities([obs[i] for i in idx], types[kind], horizon,
                                                                      stop_rate))
        else:
            rates = evidence_rates.get(kind, {})
            out[idx] = [rates.get(obs[i]["evidence"], open_rates.get(kind, prior)) for i in idx]
    return out


def calibration_error(p: np.ndarray, y: np.ndarray, bins: int = 10) -> dict[str, float | int]:
    """Expected calibration error (equal-width bins, weighted by their size), Brier score, log-loss."""
    which = np.minimum((p * bins).astype(int), bins - 1)
    ece = sum(abs(p[which == b].mean() - y[which == b].mean()) * (which == b).sum()
              for b in range(bins) if (which == b).any()) / max(1, len(p))
    return {"open_prefixes": int(len(p)), "ece": round(float(ece), 4),
            "brier": round(float(np.mean((p - y) ** 2)), 4), "log_loss": round(log_loss(p, y), 4)}


def cross_fitted(obs, checks, passes, prior, horizon, stop_rate, pseudo, decision_tokens) -> dict:
    """Calibration error at the decision point, each half of the prompts scored with parameters fitted on
    the other half; the former constant value (pass rate on complete responses) alongside."""
    halves = [[o for o in obs if (o["key"] // 2) % 2 == h] for h in (0, 1)]
    p_new, p_old, y, kinds = [], [], [], []
    rates, _ = smoothed_rates(checks, passes, pseudo)
    for h in (0, 1):
        train, test = halves[1 - h], [o for o in halves[h] if o["cut"] == decision_tokens]
        if not test:
            continue
        types, open_rates, evidence_rates = fit(train, prior, horizon, stop_rate, pseudo)
        p_new.append(predict(test, types, open_rates, evidence_rates, prior, horizon, stop_rate))
        p_old.append(np.array([rates.get(o["type"], prior) for o in test]))
        y.append(np.array([o["y"] for o in test]))
        kinds += [o["type"] for o in test]
    if not y:
        return {}
    p_new, p_old, y, kinds = np.concatenate(p_new), np.concatenate(p_old), np.concatenate(y), np.array(kinds)
    # Per type, where the prefix tells the model more than the type's pass rate (lower log-loss) and where not.
    by_type = {kind: {"open_prefixes": int((kinds == kind).sum()), "followed": round(float(y[kinds == kind].mean()), 4),
                      "log_loss": round(log_loss(p_new[kinds == kind], y[kinds == kind]), 4),
                      "log_loss_constant": round(log_loss(p_old[kinds == kind], y[kinds == kind]), 4)}
               for kind in sorted(set(kinds))}
    return {"progress_model": calibration_error(p_new, y), "constant_pass_rate": calibration_error(p_old, y),
            "by_type": by_type}


def ranking_at_decision(fitted: dict, rows: list[dict], prompts: dict, decode, decision_tokens: int,
                        resolutions: tuple[float, ...]) -> dict[str, dict]:
    """How the partial rewards of each prompt's responses still running at the decision point rank them against
    their final rewards (the benchmark's measures, on the calibration split and in-sample), per resolution: the
    evidence the resolution is chosen on."""
    from scipy.stats import kendalltau

    out = {}
    prefixes = {(r["key"], i): decode(s["token_ids"][:decision_tokens]) for r in rows
                for i, s in enumerate(r["samples"]) if len(s["token_ids"]) > decision_tokens}
    for resolution in resolutions:
        reward = IFEvalReward(progress=ProgressModel.from_dict({**fitted, "resolution": resolution}))
        pooled, per_prompt, ties = [], [], []
        for r in rows:
            live = [(prefixes[r["key"], i], s["text"]) for i, s in enumerate(r["samples"]) if (r["key"], i) in prefixes]
            if len(live) < 2:
                continue
            prompt = prompts[r["key"]].prompt
            partial = reward.score_partial(prompt, [p for p, _ in live])
            final = reward.score(prompt, [t for _, t in live])
            pooled += zip(partial, final)
            ties += [abs(a - b) < TIE_BREAK for i, a in enumerate(partial) for b in partial[i + 1:]]
            if np.ptp(partial) > 0 and np.ptp(final) > 0:
                per_prompt.append(kendalltau(partial, final).statistic)
        out[str(resolution)] = {"kendall_pooled": round(float(kendalltau(*zip(*pooled)).statistic), 4),
                                "kendall_per_prompt_mean": round(float(np.mean(per_prompt)), 4),
                                "tied_pairs": round(float(np.mean(ties)), 4), "prompts": len(per_prompt)}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    prompts = [p for p in load_prompts(args.data) if is_calibration(p.key)]
    gen = load_generator(device="cpu")
    command = ("OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "?") + " python -m sbon.ifeval.calibrate "
               + " ".join(sys.argv[1:] if argv is None else argv))
    if args.sample:
        n = sample_to_file(gen, prompts, args, args.samples_file, time.time() + 60 * args.minutes)
        print(f"{n} prompts sampled into {args.samples_file}")
        return 0
    rows = read_samples(args.samples_file)
    if not rows:
        raise SystemExit(f"no samples in {args.samples_file}: run with --sample first")
    start = time.time()
    obs, checks, passes, chars_per_token = observations(gen.decode, rows, {p.key: p for p in prompts})
    prior = sum(passes.values()) / max(1, sum(checks.values()))
    horizon = args.max_new_tokens
    stop_rate = stop_rate_of(rows, horizon)
    types, open_rates, evidence_rates = fit(obs, prior, horizon, stop_rate, args.pseudo_count)
    error = cross_fitted(obs, checks, passes, prior, horizon, stop_rate, args.pseudo_count, args.decision_tokens)
    out = {
        "about": "partial values of the ifeval reward's open instructions (sbon/ifeval/progress.py), fitted on the "
                 "embedded generator's responses to the calibration split (odd keys)",
        "command": command,
        "settings": {"generator": gen.name, "samples_per_prompt": len(rows[0]["samples"]),
                     "max_new_tokens": args.max_new_tokens, "sampling": "Best-of-N defaults", "seed": "prompt key",
                     "cuts": list(CUTS), "pseudo_count": args.pseudo_count, "decision_tokens": args.decision_tokens,
                     "samples_file": args.samples_file.name},
        "prompts_used": len(rows), "prompts_available": len(prompts),
        "responses": sum(len(r["samples"]) for r in rows), "open_prefixes": len(obs),
        "seconds": round(time.time() - start, 1), "load_average": [round(x, 2) for x in os.getloadavg()],
        "prior": round(prior, 4), "chars_per_token": round(chars_per_token, 3),
        "stop_rate": round(stop_rate, 5),
        # The model cannot tell apart probabilities closer than its calibration error: values are rounded so.
        "resolution": max(0.05, math.ceil(error.get("progress_model", {}).get("ece", 0.0) * 20) / 20),
        "types": {k: vars(v) for k, v in types.items()}, "open_rates": open_rates,
        "evidence_rates": evidence_rates,
        "calibration_error_at_decision": error,
        "counts": dict(sorted(checks.items())), "passes": dict(sorted(passes.items())),
    }
    out["ranking_at_decision_in_sample"] = ranking_at_decision(out, rows, {p.key: p for p in prompts}, gen.decode,
                                                                args.decision_tokens, (0.0, 0.02, out["resolution"]))
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    summary = error.get("progress_model", {})
    print(f"{len(rows)} prompts, {len(obs)} open prefixes; ECE at {args.decision_tokens} tokens "
          f"{summary.get('ece', math.nan)} (former {error.get('constant_pass_rate', {}).get('ece', math.nan)}); "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
