"""Decision points replayed on completed Best-of-N candidates, with no new generation: a single one
(``replay_tau``) or a memory-budget run's rounds (``replay_rounds``).

With coupled sampling, a Speculative Rejection run with one decision token tau (``sbon-tau``) on the
same seed samples exactly Best-of-N's candidates, so deciding at tau through the same rule
(:func:`sbon.cut.cut`) keeps exactly the candidates the run keeps, returns the same response and
generates exactly the tokens counted here (tests/test_replay.py checks this against real runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..cut import Cut, cut
from ..metrics import normalized_score
from ..results import DecisionPoint, RunResult


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
               rank_finished: bool = True, uncertainty: Sequence[float | None] | None = None,
               undecided: str = "paper", seed: int = 0, round: int = 1) -> Replay:
    """Decide at ``tau``: ``partial[k]`` is candidate k's pruning-signal score after tau tokens, None if
    it had finished by then (it then competes with its final reward when ``rank_finished``, i.e. when
    the signal is on the reward's scale; see :func:`sbon.cut.cut`). ``uncertainty[k]``, the score's
    half-width (None: the signal has none), and ``undecided`` say what the run's rule does with the
    candidates it cannot tell apart from the cut, drawn with the run's ``seed`` as its decision point of that
    ``round`` draws; a deferred candidate is kept to the end here, as one decision point has no next one."""
    cands = bon.candidates
    finished = {c.id for c, p in zip(cands, partial) if p is None}
    scores = {c.id: (c.final_reward if p is None else p) for c, p in zip(cands, partial)}
    margins = None if uncertainty is None else {c.id: u for c, u, p in zip(cands, uncertainty, partial)
                                                  if p is not None and u is not None}
    decision = cut(scores, finished, alpha, rank_finished=rank_finished, uncertainty=margins,
                   undecided=undecided if margins is not None else "paper", seed=(seed, round))
    eligible = sorted(set(decision.kept) | finished)  # retired ones stay eligible
    best = max(eligible, key=lambda k: (cands[k].final_reward, -k))
    tokens = sum(min(c.tokens_generated, tau) if c.id in decision.pruned else c.tokens_generated for c in cands)
    return Replay(tau, alpha, decision, eligible, best, tokens, len(cands) - len(finished))


@dataclass(frozen=True)
class RoundsReplay:
    """A memory-budget Speculative Rejection run (``sbon``) replayed on Best-of-N's candidates."""
    points: list[DecisionPoint]  # its decision points, as the run records them
    eligible: list[int]  # candidates whose complete responses can be returned (never pruned)
    best_id: int  # the response returned
    tokens: int  # tokens generated: pruned candidates up to their decision point, the others in full


def replay_rounds(bon: RunResult, prompt_tokens: int, kv_budget: int, alpha: float,
                  score_at: Callable[[int, list[int]], tuple[list[float], list[float] | None]],
                  undecided: str = "paper", seed: int = 0, tie: float = 0.0, signal: str = "reward") -> RoundsReplay:
    """The memory-budget rounds (``sbon.algorithms._speculative_rejection``, its default or a given budget) on
    Best-of-N's candidates, with no new generation: with coupled sampling the run samples exactly these
    candidates, so its rounds end at the same token counts (a round ends when its starting rows would overflow
    ``kv_budget`` with one more token), each decision point goes through the same cut (:func:`sbon.cut.cut`,
    with the run's ``undecided`` rule, seeded by the run's seed and the round) and the run returns the same
    response. ``score_at(t, ids)`` gives the live candidates' pruning-signal scores after t tokens and their
    half-widths (None: the signal has none); finished ones are ranked by their final reward."""
    cands = bon.candidates
    length = [c.tokens_generated for c in cands]
    fits = lambda live, t: live * (prompt_tokens + t + 1) <= kv_budget  # noqa: E731 (the run's own rule)
    batch, contenders = list(range(len(cands))), list(range(len(cands)))
    rows, t, round, owed, deferred, points, pruned_at = len(batch), 0, 1, 0, set(), [], {}
    while batch:
        if fits(rows, t):  # no decision: one more token, and those that end here leave the batch
            t += 1
            batch = [k for k in batch if length[k] > t]
            continue
        final = [k for k in contenders if k not in batch]
        partial, margins = score_at(t, batch)
        score = {**{k: cands[k].final_reward for k in final}, **dict(zip(batch, partial))}
        decision = cut(score, set(final), alpha, lambda live: fits(live, t), True,
                       uncertainty=None if margins is None else dict(zip(batch, margins)),
                       undecided=undecided if margins is not None else "paper", owed=owed, deferred=deferred,
                       seed=(seed, round), tie=tie)
        owed, deferred = decision.owed, set(decision.deferred)
        pruned_at.update(dict.fromkeys(decision.pruned, t))
        points.append(DecisionPoint(round, t, contenders, decision.kept, decision.pruned, decision.threshold,
                                    retired=decision.retired, scores=[score[k] for k in contenders], final=final,
                                    signal=signal, ranks_finished=True, forced=list(decision.forced),
                                    undecided=list(decision.undecided),
                                    undecided_rule=undecided if margins is not None else "paper", tied=decision.tied))
        contenders = decision.kept
        batch = [k for k in batch if k in decision.kept]
        round, rows = round + 1, len(batch)
    eligible = [k for k in range(len(cands)) if k not in pruned_at]
    best = max(eligible, key=lambda k: (cands[k].final_reward, -k))
    return RoundsReplay(points, eligible, best, sum(pruned_at.get(k, n) for k, n in enumerate(length)))
