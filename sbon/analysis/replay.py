"""A single decision point replayed on completed Best-of-N candidates, with no new generation.

With coupled sampling, a Speculative Rejection run with one decision token tau (``sbon-tau``) on the
same seed samples exactly Best-of-N's candidates, so deciding at tau through the same rule
(:func:`sbon.cut.cut`) keeps exactly the candidates the run keeps, returns the same response and
generates exactly the tokens counted here (tests/test_replay.py checks this against real runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..cut import Cut, cut
from ..metrics import normalized_score
from ..results import RunResult


@dataclass(frozen=True)
class Replay:
    """One decision point at ``tau`` with rejection rate ``alpha``, replayed."""
    tau: int
    alpha: float
    cut: Cut
    eligible: list[int]  # candidates whose complete responses can be returned: survivors and finished ones
    best_id: int  # the response returned: the best final reward among the eligible
    tokens: int  # tokens Speculative Rejection generates: survivors in full, pruned ones up to tau
    live: int  # candidates still generating at tau

    def metrics(self, bon: RunResult) -> dict[str, float]:
        return {"tau": self.tau, "alpha": self.alpha, "live": self.live,
                "winner_kept": float(bon.best_id in self.eligible),
                "normalized_score": normalized_score(bon.final_rewards, bon.candidates[self.best_id].final_reward),
                "token_rate": self.tokens / bon.total_tokens}


def replay_tau(bon: RunResult, partial: Sequence[float | None], tau: int, alpha: float,
               rank_finished: bool = True) -> Replay:
    """Decide at ``tau``: ``partial[k]`` is candidate k's pruning-signal score after tau tokens, None if
    it had finished by then (it then competes with its final reward when ``rank_finished``, i.e. when
    the signal is on the reward's scale; see :func:`sbon.cut.cut`)."""
    cands = bon.candidates
    finished = {c.id for c, p in zip(cands, partial) if p is None}
    scores = {c.id: (c.final_reward if p is None else p) for c, p in zip(cands, partial)}
    decision = cut(scores, finished, alpha, rank_finished=rank_finished)
    eligible = sorted(set(decision.kept) | finished)  # retired ones stay eligible
    best = max(eligible, key=lambda k: (cands[k].final_reward, -k))
    tokens = sum(min(c.tokens_generated, tau) if c.id in decision.pruned else c.tokens_generated for c in cands)
    return Replay(tau, alpha, decision, eligible, best, tokens, len(cands) - len(finished))
