"""The cut rule: who survives a decision point. One pure function, called by the real run
(`sbon.algorithms._prune`) and by every replay (:mod:`sbon.analysis`), so a replay keeps exactly
what a run with the same candidates keeps.

**Undecided candidates.** A pruning signal that knows its own uncertainty gives each score a half-width
(`sbon.signals.PruningSignal.uncertainty`): two scores closer than the sum of their half-widths cannot be
told apart. When the lowest survivor and the best candidate below it are that close, the cut itself is
undecided, and so is every contender that cannot be told apart from either of them. What is done with them
is the run setting ``undecided`` (``UNDECIDED``): the paper's rule ranks them anyway (by score, then the
lower id), ``prune`` halts only the decided ones below the cut and keeps every undecided one, ``defer`` keeps
them too, once: the next decision point keeps as many as the paper's rule would have kept there, and a candidate
still undecided after its wait is drawn at random for the places left; and ``random`` fills the survivors' places left after the decided ones with undecided ones drawn
at random (seeded by the run's seed and the round: a run is reproducible). No rule orders undecided ones by a
key without evidence behind it, such as a length tie term.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Collection, Mapping

from .errors import SBoNError

__all__ = ["Cut", "cut", "survivors_count", "UNDECIDED", "check_undecided"]

# What a decision point does with the candidates its signal cannot tell apart from the cut, by name: the
# setting's choices, each with the words the page says of it (the round caption, the cut explanation).
UNDECIDED = {
    "paper": "ranked anyway, by the order of their scores (the paper's rule)",
    "prune": "kept: only the candidates clearly below the cut were pruned",
    "defer": "kept for one more decision point, which catches up on the pruning; still undecided there, drawn at random",
    "random": "kept or pruned at random, to fill the survivors' places",
}


def check_undecided(rule: str) -> None:
    if rule not in UNDECIDED:
        raise SBoNError(f"unknown undecided rule {rule!r}: use one of {', '.join(UNDECIDED)}")


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
    undecided: tuple[int, ...] | list[int] = ()  # contenders the signal could not tell apart from the cut, sorted
    owed: int = 0  # survivors kept beyond the paper's count (``defer``): the next decision point keeps that many fewer
    tied: bool = False  # every live contender's score was equal up to the signal's tie term
    deferred: tuple[int, ...] | list[int] = ()  # undecided survivors kept to wait for the next decision point (``defer``)

    def rank(self, k: int) -> int | None:
        """1-based rank of candidate k among the ranked ones (None: not ranked)."""
        return self.ranked.index(k) + 1 if k in self.ranked else None


def undecided_group(ranked: list[int], scores: Mapping[int, float], keep: int,
                    uncertainty: Mapping[int, float]) -> list[int]:
    """The contenders (in ranked order) that cannot be told apart from a cut keeping the best ``keep`` of
    ``ranked``; none when the cut is decided (its two sides are further apart than their half-widths)."""
    if not 0 < keep < len(ranked):
        return []
    u = lambda k: uncertainty.get(k, 0.0)  # a finished contender's final reward is exact
    low, high = ranked[keep - 1], ranked[keep]
    if scores[low] - scores[high] > u(low) + u(high):
        return []
    return [k for k in ranked if abs(scores[k] - scores[low]) <= u(k) + u(low)
            or abs(scores[k] - scores[high]) <= u(k) + u(high)]


def cut(scores: Mapping[int, float], finished: Collection[int], alpha: float,
        fits: Callable[[int], bool] | None = None, rank_finished: bool = True, *,
        uncertainty: Mapping[int, float] | None = None, undecided: str = "paper", owed: int = 0,
        deferred: Collection[int] = (), seed: object = 0, tie: float = 0.0) -> Cut:
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
    - ``uncertainty``: each live contender's half-width (see the module docstring); None: the signal has
      none, and every cut is decided. ``undecided`` (a key of ``UNDECIDED``) says what is done with the
      undecided ones; ``owed`` is what an earlier ``defer`` left to this decision point (survivors kept beyond
      the paper's count) and ``deferred`` the candidates it deferred (``Cut.deferred``); ``seed`` seeds every draw
      (the run's seed and the round). Under a rule other than the paper's, the budget's halts (``fits``) take
      undecided survivors first, in a random order.
    - ``tie``: the signal's tie term (scores closer than it differ by a tie-break only): ``Cut.tied`` says
      whether every live contender is within it of the others.
    """
    check_undecided(undecided)
    done = [k for k in scores if k in finished]
    ranked = sorted((k for k in scores if rank_finished or k not in finished), key=lambda k: (-scores[k], k))
    keep = survivors_count(max(1, len(ranked) - owed), alpha) if ranked else 0
    group = undecided_group(ranked, scores, keep, uncertainty) if uncertainty is not None else []
    kept, held = ranked[:keep], []
    draw = random.Random(repr(seed))  # str seeds hash the same in every process: a run is reproducible
    deciding = bool(group) and undecided != "paper"
    if deciding:
        clear = [k for k in ranked[:keep] if k not in group]  # decided survivors
        places = keep - len(clear)  # what the undecided fill under the paper's count (at least one)
        if undecided == "random":
            chosen = draw.sample(group, places)
        elif undecided == "prune":
            chosen = group
        else:  # defer: each undecided candidate waits once; one still undecided after its wait is drawn for what is left
            held = [k for k in group if k not in deferred]
            waited = [k for k in group if k in deferred]
            chosen = held + draw.sample(waited, max(0, min(len(waited), places - len(held))))
        kept = [k for k in ranked if k in clear or k in chosen]
    owed_now = len(kept) - keep if undecided == "defer" else 0
    threshold = scores[kept[-1]] if kept else None
    kept_live = [k for k in kept if k not in finished]
    if deciding:  # the budget halts undecided survivors first, in a random order: no key without evidence orders them
        unsure = [k for k in kept_live if k in group]
        draw.shuffle(unsure)
        kept_live = [k for k in kept_live if k not in group] + unsure
    forced = []
    while fits is not None and kept_live and not fits(len(kept_live)):
        forced.append(kept_live.pop())
        kept.remove(forced[-1])
    dropped = [k for k in ranked if k not in kept]
    if not rank_finished:
        kept = kept + done
    live_scores = [scores[k] for k in scores if k not in finished]
    tied = len(live_scores) > 1 and max(live_scores) - min(live_scores) <= tie
    return Cut(ranked, sorted(kept), sorted(k for k in dropped if k not in finished),
               sorted(k for k in dropped if k in finished), threshold, sorted(forced), sorted(group),
               max(0, owed_now - len(forced)), tied, sorted(k for k in held if k in kept))
