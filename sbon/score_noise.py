"""A reward model's score noise on partial responses: how far apart two partial rewards must be before the
reward can tell them apart at a decision point (``sbon.cut``'s undecided candidates).

Measured on the IFEval calibration split's sampled responses (``python -m sbon.ifeval.calibrate --sample``: the
embedded generator's own responses, prompts that no benchmark evaluates on): each response still running after
``tokens + step`` tokens is scored by the reward on its first ``tokens`` and its first ``tokens + step`` tokens.
The change, less its mean over the prompt's responses (what every candidate gains alike, a length term, say),
is how much a candidate moves against its peers over ``step`` more tokens; its standard deviation over
sqrt(2) is the noise of one score: an order finer than that is as likely undone a few tokens later as kept.

    python -m sbon.score_noise --reward minilm-pref

writes it to ``sbon/assets/score_noise.json``, read by the reward pruning signal (``noise_of``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

NOISE_FILE = Path(__file__).with_name("assets") / "score_noise.json"


def noise_of(reward_name: str | None) -> float | None:
    """The measured score noise of a reward preset (None: not measured)."""
    if reward_name is None or not NOISE_FILE.exists():
        return None
    entry = json.loads(NOISE_FILE.read_text()).get("rewards", {}).get(reward_name)
    return None if entry is None else float(entry["noise"])


def measure(gen, reward, rows: list[dict], prompts: dict, tokens: int, step: int) -> dict:
    moves = []
    for row in rows:
        live = [s["token_ids"] for s in row["samples"] if len(s["token_ids"]) > tokens + step]
        if len(live) < 2:
            continue
        prompt = prompts[row["key"]].prompt
        before = reward.score(prompt, [gen.decode(ids[:tokens]) for ids in live])
        after = reward.score(prompt, [gen.decode(ids[:tokens + step]) for ids in live])
        change = [a - b for a, b in zip(after, before)]
        mean = sum(change) / len(change)
        moves.extend(c - mean for c in change)
    # each move is demeaned over its prompt's m responses: its variance is (m - 1) / m of the raw one; small
    # against the sample here (m is up to 8), and it errs toward a smaller noise, i.e. toward the paper's rule
    return {"noise": statistics.pstdev(moves) / math.sqrt(2), "responses": len(moves)}


def main(argv=None) -> int:
    from .ifeval.calibrate import SAMPLES_FILE, read_samples
    from .ifeval.data import SHIPPED_FILE, is_calibration, load_prompts
    from .models import load_generator, load_reward

    p = argparse.ArgumentParser(prog="python -m sbon.score_noise", description=__doc__.split("\n\n")[0])
    p.add_argument("--reward", required=True, help="a reward preset")
    p.add_argument("--tokens", type=int, default=32, help="the decision point: tokens of the first prefix")
    p.add_argument("--step", type=int, default=8, help="tokens more in the second prefix")
    p.add_argument("--samples-file", type=Path, default=SAMPLES_FILE)
    args = p.parse_args(argv)
    import os

    start, load = time.perf_counter(), os.getloadavg()
    gen = load_generator()
    reward = load_reward(args.reward, generator=gen)
    prompts = {q.key: q for q in load_prompts(SHIPPED_FILE) if is_calibration(q.key)}
    rows = [r for r in read_samples(args.samples_file) if r["key"] in prompts]
    found = measure(gen, reward, rows, prompts, args.tokens, args.step)
    data = json.loads(NOISE_FILE.read_text()) if NOISE_FILE.exists() else {"rewards": {}}
    data["rewards"][args.reward] = {**found, "tokens": args.tokens, "step": args.step, "split": "IFEval calibration (odd key)",
                                    "command": f"python -m sbon.score_noise --reward {args.reward}",
                                    "seconds": round(time.perf_counter() - start, 1), "load_average": load}
    NOISE_FILE.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.reward}: score noise {found['noise']:.4g} over {found['responses']} responses; wrote {NOISE_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
