"""`python -m benchmarks undecided-evidence`: on the IFEval calibration split only, can a second signal order the
candidates the ``ifeval`` reward cannot tell apart at a decision point?

At ``--tokens`` (the first decision point of memory-budget rounds by default), for each prompt's responses still
running there: the reward's partial value and half-width (``score_uncertainty``, the ones ``sbon.cut`` uses), the
final reward, whether the response follows every instruction, and the generator's own signals of the prefix (the
reward-free pruning signals of ``sbon.signals``, computed from one forward pass over the prefix: mean
log-probability, self-certainty, DeepConf's lowest group confidence, hidden-state consistency, and the chance of a
stop token at the next token). *Undecided pairs* are those whose partial values are closer than the sum of their
half-widths (what ``sbon.cut`` cannot tell apart). Per signal: on the undecided pairs whose outcomes differ, how
often the signal ranks the better one higher (pairwise accuracy; 0.5 = a coin), with a standard error from
resampling prompts (pairs of one prompt are not independent). Each signal is read in its own direction (higher =
better, as it ranks as a pruning signal); the reverse direction is not chosen after seeing these numbers.

Three outcomes (``OUTCOMES``): the final reward (the fraction of instructions followed, ties broken by length),
that fraction alone (what a signal knows beyond the length), and following every instruction (what
``python -m benchmarks undecided`` counts). Result file:
benchmarks/results/cpu-2core-epyc/ifeval/undecided_evidence.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

from sbon.config import resolve_first_decision
from sbon.ifeval.calibrate import SAMPLES_FILE, read_samples
from sbon.ifeval.data import SHIPPED_FILE, is_calibration, load_prompts
from sbon.ifeval.reward import IFEvalReward
from sbon.models import load_generator
from sbon.signals import REWARD_FREE, SIGNALS, Step

from . import common

OUT = Path(__file__).resolve().parent / "results" / "cpu-2core-epyc" / "ifeval" / "undecided_evidence.json"
MEASURED = {  # name -> what the value measures (higher = ranked higher, as the pruning signal ranks)
    "logprob": "mean log-probability of the prefix's tokens",
    "self-certainty": "mean KL(uniform || next-token distribution) over the prefix",
    "deepconf": "lowest mean top-20 confidence over a 16-token window of the prefix",
    "consistency": "mean cosine of the prefix's mean final-layer state to the other live candidates'",
    "end-next": "log P(a stop token) at the next token",
}
OUTCOMES = {"final": "the final reward (the fraction of instructions followed, shorter wins ties)",
            "followed": "the fraction of instructions followed (the final reward without its length tie term)",
            "every": "follows every instruction"}
BOOTSTRAP = 2000


def candidates(gen, reward: IFEvalReward, row: dict, prompt, tokens: int) -> list[dict]:
    """One prompt's responses still running at ``tokens``: partial value, half-width, outcomes and signals."""
    live = [s for s in row["samples"] if len(s["token_ids"]) > tokens]
    if len(live) < 2:
        return []
    prompt_ids = gen.encode_prompt(prompt.prompt)
    ids = torch.tensor([prompt_ids + s["token_ids"][:tokens] for s in live], device=gen.device)
    with torch.inference_mode():
        out = gen.model(input_ids=ids, output_hidden_states=True)
    # The pruning signals themselves (sbon.signals), fed the steps this one pass computed: position P - 1 + t's
    # logits sampled token t, and the final-layer state at P + t is the one after feeding it.
    start, rows = len(prompt_ids), list(range(len(live)))
    watched = {name: SIGNALS[name].build(gen, None) for name in REWARD_FREE}
    for t in range(tokens):
        step = Step(rows, ids[:, start + t], out.logits[:, start - 1 + t], out.hidden_states[-1][:, start + t], rows)
        for signal in watched.values():
            signal.observe(step)
    values = {name: signal.score(prompt.prompt, rows, None) for name, signal in watched.items()}
    logp = torch.log_softmax(out.logits[:, start - 1 + tokens].float(), -1)  # the next token's distribution
    stop = torch.tensor(sorted(gen.stop_ids), device=logp.device)
    values["end-next"] = torch.logsumexp(logp[:, stop], -1).tolist()
    prefixes = [gen.decode(s["token_ids"][:tokens]) for s in live]
    texts = [s["text"] for s in live]
    partial = reward.score_partial(prompt.prompt, prefixes)
    half = reward.score_uncertainty(prompt.prompt, prefixes)
    final = reward.score(prompt.prompt, texts)
    verdicts = [reward.explain(prompt.prompt, t, final=True) for t in texts]
    every = [float(all(v.followed for v in vs)) for vs in verdicts]
    share = [sum(v.followed for v in vs) / len(vs) for vs in verdicts]
    return [{"partial": partial[j], "half": half[j], "final": final[j], "every": every[j], "followed": share[j],
             **{name: float(v[j]) for name, v in values.items()}} for j in rows]


def pairs_of(group: list[dict]) -> list[tuple[dict, dict]]:
    """Every pair of one prompt's live responses."""
    return [(a, b) for i, a in enumerate(group) for b in group[i + 1:]]


def undecided_pairs(group: list[dict]) -> list[tuple[dict, dict]]:
    return [(a, b) for a, b in pairs_of(group) if abs(a["partial"] - b["partial"]) <= a["half"] + b["half"]]


def accuracy(pairs_by_prompt: list[list[tuple[dict, dict]]], signal: str, outcome: str, rng) -> dict:
    """Pairwise accuracy of ``signal`` on the pairs whose ``outcome`` differs (a tie of the signal counts a half),
    with a standard error from resampling prompts."""
    per_prompt = []  # (correct, pairs) per prompt with at least one such pair
    for pairs in pairs_by_prompt:
        right = total = 0.0
        for a, b in pairs:
            if a[outcome] == b[outcome]:
                continue
            better, worse = (a, b) if a[outcome] > b[outcome] else (b, a)
            right += 1.0 if better[signal] > worse[signal] else 0.5 if better[signal] == worse[signal] else 0.0
            total += 1
        if total:
            per_prompt.append((right, total))
    if not per_prompt:
        return {"pairs": 0, "prompts": 0, "accuracy": None, "standard_error": None}
    counts = np.array(per_prompt)
    draws = rng.integers(0, len(counts), (BOOTSTRAP, len(counts)))
    boot = counts[draws, 0].sum(1) / counts[draws, 1].sum(1)
    return {"pairs": int(counts[:, 1].sum()), "prompts": len(counts),
            "accuracy": round(float(counts[:, 0].sum() / counts[:, 1].sum()), 4),
            "standard_error": round(float(boot.std(ddof=1)), 4)}


def add_parser(sub) -> None:
    p = sub.add_parser("undecided-evidence", help="calibration split: can a second signal (the generator's own) order "
                                                  "the candidates the ifeval reward cannot tell apart at a decision "
                                                  "point? pairwise accuracy on the undecided pairs")
    p.add_argument("--tokens", type=int, nargs="+", default=[resolve_first_decision(None, 128)],
                   help="decision points (tokens); the default is memory-budget rounds' first one at 128 tokens")
    p.add_argument("--prompts", type=int, default=None, help="the first PROMPTS sampled prompts (None: all)")
    p.add_argument("--weights", default="fp32", help="the generator's weight format (sbon.engine.WEIGHT_FORMATS)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=OUT, help="result file")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    start, load = time.time(), os.getloadavg()
    gen = load_generator(device="cpu", weights=args.weights)
    reward = IFEvalReward()
    rows = read_samples(SAMPLES_FILE)[:args.prompts]
    prompts = {p.key: p for p in load_prompts(SHIPPED_FILE) if is_calibration(p.key)}
    rng = np.random.default_rng(0)
    by_tokens = {}
    bar = common.progress(len(rows) * len(args.tokens), "undecided evidence")
    for tokens in args.tokens:
        groups = []
        for r in rows:
            groups.append(candidates(gen, reward, r, prompts[r["key"]], tokens))
            bar.update(1)
        pairs = [undecided_pairs(g) for g in groups]
        every_pair = sum(len(g) * (len(g) - 1) // 2 for g in groups)
        by_tokens[str(tokens)] = {
            "prompts_with_live_pairs": sum(len(g) > 1 for g in groups), "live_pairs": every_pair,
            "undecided_pairs": sum(map(len, pairs)),
            "undecided_pairs_differing": {o: sum(a[o] != b[o] for p in pairs for a, b in p) for o in OUTCOMES},
            "signals": {s: {o: accuracy(pairs, s, o, rng) for o in OUTCOMES} for s in MEASURED},
            # the same signals on every live pair, for comparison: what they know where the reward can tell too
            "signals_on_every_pair": {s: {o: accuracy([pairs_of(g) for g in groups], s, o, rng) for o in OUTCOMES}
                                      for s in MEASURED},
        }
    bar.close()
    payload = {"about": __doc__.split("\n\n")[0].split(": ", 1)[1], "command": common.command_line(args),
               "signals": MEASURED, "outcomes": OUTCOMES,
               "settings": {"tokens": args.tokens, "samples_file": SAMPLES_FILE.name, "prompts": len(rows),
                            "weights": args.weights, "bootstrap": BOOTSTRAP},
               "environment": common.environment(gen),
               "load_average": {"start": [round(x, 2) for x in load], "end": [round(x, 2) for x in os.getloadavg()]},
               "seconds": round(time.time() - start, 1), "by_tokens": by_tokens}
    common.write_json(payload, args.out)
    for tokens, d in by_tokens.items():
        print(f"at {tokens} tokens: {d['undecided_pairs']} undecided of {d['live_pairs']} live pairs; differing "
              f"{d['undecided_pairs_differing']}")
        for s, o in d["signals"].items():
            print(f"  {s:15s}", "  ".join(f"{k} {v['accuracy']} ({v['pairs']} pairs, SE {v['standard_error']})"
                                              for k, v in o.items()))
    return 0
