"""A reward model's score noise on partial responses: how far apart two partial rewards must be before the
reward can tell them apart at a decision point (``sbon.cut``'s undecided candidates).

What a partial reward is for is ranking candidates by their final reward. So the noise is measured against the
final reward, on the IFEval calibration split's sampled responses (``python -m sbon.ifeval.calibrate --sample``:
the embedded generator's own responses, prompts that no benchmark evaluates on): every pair of one prompt's
responses still running at the decision point (``tokens``) whose final rewards differ gives a gap ``d`` between
their partial rewards and whether the partial order was the final one. The chance that it was is modelled as
``Phi(d / s)`` (a partial reward is the final one plus noise: ``s`` is the standard deviation of the noise of a
gap), ``s`` fitted by maximum likelihood. Two partial rewards closer than ``s`` -- within one standard deviation
of the noise, ordered right at most ``Phi(1)``, 84 % of the time -- cannot be told apart: each score's half-width
is ``s / 2``, the ``noise`` this module records.

    python -m sbon.ifeval.score_noise --reward minilm-pref

writes it to ``sbon/assets/score_noise.json``, read by the reward pruning signal (``noise_of``). This module imports
nothing of the package: the pruning signals read it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

NOISE_FILE = Path(__file__).with_name("assets") / "score_noise.json"


def noise_of(reward_name: str | None) -> float | None:
    """The measured half-width of a reward preset's partial scores (None: not measured)."""
    if reward_name is None or not NOISE_FILE.exists():
        return None
    entry = json.loads(NOISE_FILE.read_text()).get("rewards", {}).get(reward_name)
    return None if entry is None else float(entry["noise"])


def gaps(partial: Sequence[float], final: Sequence[float], tie: float = 0.0) -> list[tuple[float, bool]]:
    """Every pair of one prompt's responses whose final rewards differ by more than ``tie``: (the gap between their
    partial rewards, whether the partial order is the final one)."""
    out = []
    for a in range(len(partial)):
        for b in range(a + 1, len(partial)):
            df = final[a] - final[b]
            if abs(df) > tie:
                dp = partial[a] - partial[b]
                out.append((abs(dp), dp * df > 0))
    return out


def fit_gap_noise(pairs: Sequence[tuple[float, bool]]) -> float:
    """The standard deviation ``s`` of a gap's noise that makes P(the partial order is right | gap d) = Phi(d / s)
    likeliest on these pairs (a 1-D maximum likelihood, on a log grid refined once)."""
    if not pairs:
        raise ValueError("no pairs with different final rewards to fit the noise on")
    phi = lambda z: 0.5 * math.erfc(-z / math.sqrt(2))

    def loglik(s: float) -> float:
        return sum(math.log(max(1e-12, phi(d / s) if right else 1 - phi(d / s))) for d, right in pairs)

    top = max(d for d, _ in pairs) or 1.0
    grid = [top * 10 ** (k / 20) for k in range(-80, 21)]
    best = max(grid, key=loglik)
    fine = [best * 10 ** (k / 400) for k in range(-20, 21)]
    return max(fine, key=loglik)


def measure(gen, reward, rows: list[dict], prompts: dict, tokens: int) -> dict:
    """The half-width of ``reward``'s partial scores at ``tokens`` tokens (the module docstring), on sampled rows."""
    pairs = []
    for row in rows:
        live = [s["token_ids"] for s in row["samples"] if len(s["token_ids"]) > tokens]
        if len(live) < 2:
            continue
        prompt = prompts[row["key"]].prompt
        partial = getattr(reward, "score_partial", reward.score)(prompt, [gen.decode(ids[:tokens]) for ids in live])
        final = reward.score(prompt, [gen.decode(ids) for ids in live])
        pairs.extend(gaps(partial, final, float(getattr(reward, "tie_term", 0.0))))
    s = fit_gap_noise(pairs)
    right_within = [right for d, right in pairs if d <= s]
    return {"noise": s / 2, "gap_noise": s, "pairs": len(pairs), "pairs_within": len(right_within),
            "right_within": sum(right_within) / len(right_within) if right_within else None,
            "right_beyond": (lambda r: sum(r) / len(r) if r else None)([right for d, right in pairs if d > s])}
