"""Follow a running comparison from its events: a status line and one frame per round.

The tracker only counts and remembers; it never draws per token. A UI redraws the round figure
when :meth:`LiveTracker.update` says a decision point was taken, and refreshes the status line
at whatever rate it likes.
"""

from __future__ import annotations

import time

from sbon.algorithms import CandidateFinished, DecisionTaken, Done, RoundStarted, TokensGenerated
from sbon.analysis.comparison import ComparisonDone, ComparisonEvent, CounterfactualScored, MethodEvent
from sbon.config import METHOD_SPECS
from sbon.results import DecisionPoint

PHASE_NAMES = {**{name: spec.label for name, spec in METHOD_SPECS.items()}, "counterfactual": "Counterfactual replay"}


class LiveTracker:
    def __init__(self, max_new_tokens: int, started: float | None = None, clock=time.perf_counter):
        self.max_new_tokens = max_new_tokens
        self.clock = clock
        self.started = clock() if started is None else started  # e.g. the click, to count model loading
        self.first_round_at: float | None = None  # seconds from start to the first decision point
        self.phase = "starting"
        self.round = 0
        self.tokens = 0
        self.live: list[int] = []
        self.n = 0
        self.finished = 0
        self.pruned = 0
        self.views: list[DecisionPoint] = []
        self.counterfactual = (0, 0)

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def update(self, event: ComparisonEvent) -> bool:
        """Take one event; True when a decision point was just taken (a new round frame to draw)."""
        if isinstance(event, CounterfactualScored):
            self.phase, self.counterfactual = "counterfactual", (event.done, event.total)
            return False
        if isinstance(event, ComparisonDone):
            self.phase = "done"
            return False
        if not isinstance(event, MethodEvent):
            return False
        e = event.event
        if event.method != self.phase and not isinstance(e, Done):
            # A new algorithm has started: its counters begin from zero.
            self.phase, self.round, self.tokens, self.finished, self.pruned = event.method, 0, 0, 0, 0
        if isinstance(e, RoundStarted):
            self.round, self.live, self.tokens = e.round, list(e.live), e.tokens
            self.n = max(self.n, len(e.live))
        elif isinstance(e, TokensGenerated):
            self.tokens, self.live = e.tokens, list(e.candidate_ids)
        elif isinstance(e, CandidateFinished):
            self.finished += 1
        elif isinstance(e, DecisionTaken):
            point = e.decision
            self.views.append(point)
            self.pruned += len(point.pruned)
            if self.first_round_at is None:
                self.first_round_at = self.elapsed
            return True
        return False

    def status(self) -> str:
        """One line of Markdown: which algorithm runs, its round, live candidates and tokens."""
        clock = f"{self.elapsed:.1f} s"
        name = PHASE_NAMES.get(self.phase, self.phase)
        if self.phase == "starting":
            return f"starting… ({clock})"
        if self.phase == "counterfactual":
            done, total = self.counterfactual
            return f"**{name}**: scoring Best-of-N prefixes at decision token {done} of {total} ({clock})"
        if self.phase == "done":
            return f"Done in {clock}"
        rounds = f"round {self.round} · " if self.phase != "bon" else "same seed, no pruning · "
        pruned = f" · {self.pruned} pruned" if self.phase != "bon" else ""
        return (f"**{name}** · {rounds}{len(self.live)} of {self.n} candidates generating · "
                f"{self.tokens}/{self.max_new_tokens} tokens{pruned} ({clock})")
