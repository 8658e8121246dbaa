"""A reward model's score noise on partial responses: how far apart two partial rewards must be before the
reward can tell them apart at a decision point (``sbon.cut``'s undecided candidates).

Measured on the IFEval calibration split's sampled responses (``python -m sbon.ifeval.calibrate --sample``: the
embedded generator's own responses, prompts that no benchmark evaluates on): each response still running after
``tokens + step`` tokens is scored by the reward on its first ``tokens`` and its first ``tokens + step`` tokens.
The change, less its mean over the prompt's responses (what every candidate gains alike, a length term, say),
is how much a candidate moves against its peers over ``step`` more tokens; its standard deviation over
sqrt(2) is the noise of one score: an order finer than that is as likely undone a few tokens later as kept.

    python -m sbon.ifeval.score_noise --reward minilm-pref

writes it to ``sbon/assets/score_noise.json``, read by the reward pruning signal (``noise_of``). This module imports
nothing of the package: the pruning signals read it.
"""

from __future__ import annotations

import json
import math
import statistics
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
