"""Does the partial IFEval reward prune well? A counterfactual check on the evaluation split.

    OMP_NUM_THREADS=1 python -m sbon.ifeval.evaluate --minutes 10

For prompts of the evaluation split (even key; ``data.is_calibration``), in file order until ``--minutes``
have passed: N complete responses of the embedded generator (Best-of-N's coupled sampler, seed = key),
then, with no new generation, what each method would return, scored by IFEval's strict
instruction-level accuracy (the reward without its tie-break):

- ``one sample``: candidate 0, the response of plain sampling;
- ``Best-of-N``: the candidate with the best final ifeval reward;
- ``Speculative Rejection (tau)``: the single-decision-token method replayed: at ``--tau`` tokens the
  candidates still generating are ranked by their partial reward (``score_partial``; those finished
  earlier by their final reward) and the best round((1 - alpha) N) are kept; it returns the best kept one.

It also counts, over every instruction of every candidate, the partial verdicts at tau that were
settled (satisfied or violated) and how many of them the final verdict contradicted (a soundness check
on real responses: it should be 0). Responses and numbers go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..algorithms import best_of_n, run, survivors_count
from ..models import load_generator
from ..rewards import CallableReward
from .checkers import OPEN
from .data import SHIPPED_FILE, is_calibration, load_prompts
from .reward import IFEvalReward


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sbon.ifeval.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tau", type=int, default=32)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--data", type=Path, default=SHIPPED_FILE)
    p.add_argument("--out", type=Path, default=Path("ifeval_evaluation.json"))
    return p.parse_args(argv)


def accuracy(reward: IFEvalReward, prompt: str, text: str) -> float:
    verdicts = reward.explain(prompt, text, final=True)
    return sum(v.value for v in verdicts) / len(verdicts)


def replay(reward: IFEvalReward, prompt: str, candidates, partial_texts, args) -> dict:
    """Each method's pick among the same complete candidates, and the settled-verdict counts."""
    finals = reward.score(prompt, [c.text for c in candidates])
    live = [k for k, c in enumerate(candidates) if len(c.token_ids) > args.tau]
    ranked = dict(zip(live, reward.score_partial(prompt, [partial_texts[k] for k in live])))
    at_tau = {k: ranked.get(k, finals[k]) for k in range(len(candidates))}
    kept = sorted(at_tau, key=lambda k: -at_tau[k])[:survivors_count(len(candidates), args.alpha)]
    settled = wrong = 0
    for k in live:
        partial = reward.explain(prompt, partial_texts[k], final=False)
        final = reward.explain(prompt, candidates[k].text, final=True)
        for p, f in zip(partial, final):
            if p.status != OPEN:
                settled += 1
                wrong += p.followed != f.followed
    picks = {"one sample": 0, "Best-of-N": max(range(len(candidates)), key=lambda k: finals[k]),
             f"Speculative Rejection (tau={args.tau})": max(kept, key=lambda k: finals[k])}
    return {"accuracy": {m: accuracy(reward, prompt, candidates[k].text) for m, k in picks.items()},
            "settled": settled, "contradicted": wrong, "live_at_tau": len(live)}


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = [r for r in load_prompts(args.data) if not is_calibration(r.key)]
    gen, reward = load_generator(device="cpu"), IFEvalReward()
    zero = CallableReward(lambda p, rs: [0.0] * len(rs), name="none")
    load_before, start, results = os.getloadavg(), time.time(), []
    for row in rows:
        if time.time() > start + 60 * args.minutes:
            break
        bon = run(best_of_n(gen, zero, row.prompt, n=args.n, max_new_tokens=args.max_new_tokens, seed=row.key))
        partial_texts = [gen.decode(c.token_ids[:args.tau]) for c in bon.candidates]
        results.append({"key": row.key, **replay(reward, row.prompt, bon.candidates, partial_texts, args),
                        "responses": [c.text for c in bon.candidates]})
    methods = list(results[0]["accuracy"]) if results else []
    summary = {m: round(sum(r["accuracy"][m] for r in results) / len(results), 4) for m in methods}
    command = "OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "?") + " python -m sbon.ifeval.evaluate "
    out = {"command": command + " ".join(sys.argv[1:] if argv is None else argv), "settings": vars(args) | {
               "data": str(args.data), "out": str(args.out)},
           "prompts": len(results), "seconds": round(time.time() - start, 1),
           "load_average_before": [round(x, 2) for x in load_before],
           "load_average_after": [round(x, 2) for x in os.getloadavg()],
           "instruction_level_strict_accuracy": summary,
           "settled_partial_verdicts": sum(r["settled"] for r in results),
           "contradicted_by_final": sum(r["contradicted"] for r in results), "per_prompt": results}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "per_prompt"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
