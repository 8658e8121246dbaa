"""The cut rule: who survives a decision point. One pure function, called by the real run
(`sbon.algorithms._prune`) and by every replay (:mod:`sbon.analysis`), so a replay keeps exactly
what a run with the same candidates keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Collection, Mapping

__all__ = ["Cut", "cut", "survivors_count"]


def survivors_count(n: int, alpha: float) -> int:
    """round((1 - alpha) * n), rounding halves up, and never below one."""
    return max(1, math.floor((1 - alpha) * n + 0.5))


@dataclass(frozen=True)
class Cut:
    """What one decision point does to its contenders."""
    ranked: list[int]  # the contenders that were ranked, best first (ties: the lower id)
    kept: list[int]  # survivors: they stay in contention (live ones go on generating), sorted
    pruned: list[int]  # live candidates halted here, sorted
    retired: list[int]  # finished candidates that left contention; their responses stay eligible, sorted
    threshold: float | None  # the lowest ranked survivor's score: the cut a candidate had to reach
    forced: tuple[int, ...] | list[int] = ()  # pruned although ranked above the cut: halted so the survivors fit the budget

    def rank(self, k: int) -> int | None:
        """1-based rank of candidate k among the ranked ones (None: not ranked)."""
        return self.ranked.index(k) + 1 if k in self.ranked else None


def cut(scores: Mapping[int, float], finished: Collection[int], alpha: float,
        fits: Callable[[int], bool] | None = None, rank_finished: bool = True) -> Cut:
    """The cut rule: the one place that decides who survives a decision point. The real run
    (`sbon.algorithms._prune`) and every replay (trade-off, counterfactual, signal matrix) call it.

    ``scores`` holds every contender's score: a live candidate's pruning-signal score (its partial
    reward), a finished one's final reward. The best ``survivors_count(ranked, alpha)`` are kept.

    - ``rank_finished``: when the signal is on the final reward's scale, finished candidates are
      ranked with the live ones, and one below the cut is *retired* -- it leaves contention but its
      response stays eligible, since the paper returns the best of all completed responses. When the
      signal is on another scale (a reward-free signal), the two cannot be ranked together: finished
      candidates all stay in contention and the survivors are counted over the live ones.
    - ``fits(live)``: whether that many live survivors fit the memory budget for one more token. If
      not, the lowest-ranked live survivors are halted too, until they fit -- at least one per decision
      point, so alpha = 0 and small N make progress.
    """
    done = [k for k in scores if k in finished]
    ranked = sorted((k for k in scores if rank_finished or k not in finished), key=lambda k: (-scores[k], k))
    kept = ranked[:survivors_count(len(ranked), alpha)] if ranked else []
    threshold = scores[kept[-1]] if kept else None
    kept_live = [k for k in kept if k not in finished]
    forced = []
    while fits is not None and kept_live and not fits(len(kept_live)):
        forced.append(kept_live.pop())
        kept.remove(forced[-1])
    dropped = [k for k in ranked if k not in kept]
    if not rank_finished:
        kept = kept + done
    return Cut(ranked, sorted(kept), sorted(k for k in dropped if k not in finished),
               sorted(k for k in dropped if k in finished), threshold, sorted(forced))
