"""Follow a running comparison from its events: a status line, a race board and one frame per round.

The tracker only counts and remembers; it never draws per token. A UI redraws the round figure
when :meth:`LiveTracker.update` says a decision point was taken, and refreshes the status line
and the race board at whatever rate it likes.

The race board is what a lecture audience watches while a run goes: one row per method with its
own clock, so Speculative Rejection's finish time stands next to Best-of-N's running one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sbon.algorithms import CandidateFinished, DecisionTaken, Done, RoundStarted, TokensGenerated
from sbon.analysis.comparison import (ComparisonDone, ComparisonEvent, ComparisonReady, CounterfactualScored,
                                     MethodEvent)
from sbon.config import METHOD_SPECS
from sbon.results import DecisionPoint

PHASE_NAMES = {**{name: spec.label for name, spec in METHOD_SPECS.items()}, "counterfactual": "Counterfactual replay"}


@dataclass
class MethodClock:
    """One method's progress in the race: its own clock starts at its first event and stops at Done."""
    method: str = field(metadata={"help": "the method's name in METHOD_SPECS"})
    started: float = field(metadata={"help": "clock reading at the method's first event"})
    ended: float | None = field(default=None, metadata={"help": "clock reading at its Done event; None while it runs"})
    round: int = field(default=0, metadata={"help": "the round it is in (0 before the first)"})
    live: int = field(default=0, metadata={"help": "candidates generating now"})
    tokens: int = field(default=0, metadata={"help": "tokens each live candidate has so far"})
    generated: int = field(default=0, metadata={"help": "tokens generated over all candidates"})
    pruned: int = field(default=0, metadata={"help": "candidates pruned so far"})
    finished: int = field(default=0, metadata={"help": "candidates that finished"})

    def seconds(self, now: float) -> float:
        return (self.ended if self.ended is not None else now) - self.started


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
        self.clocks: dict[str, MethodClock] = {}  # one per method, in the order they ran

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def update(self, event: ComparisonEvent) -> bool:
        """Take one event; True when a decision point was just taken (a new round frame to draw)."""
        if isinstance(event, ComparisonReady):  # both runs done; the prefix scoring starts
            self.phase = "counterfactual"
            return False
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
        clock = self.clocks.setdefault(event.method, MethodClock(event.method, self.clock()))
        if isinstance(e, RoundStarted):
            self.round, self.live, self.tokens = e.round, list(e.live), e.tokens
            self.n = max(self.n, len(e.live))
        elif isinstance(e, TokensGenerated):
            self.tokens, self.live = e.tokens, list(e.candidate_ids)
            clock.generated += len(e.candidate_ids)
        elif isinstance(e, CandidateFinished):
            self.finished += 1
        elif isinstance(e, Done):
            clock.ended, clock.live = self.clock(), 0
            return False
        elif isinstance(e, DecisionTaken):
            point = e.decision
            self.views.append(point)
            self.pruned += len(point.pruned)
            if self.first_round_at is None:
                self.first_round_at = self.elapsed
            clock.round, clock.pruned = point.round, self.pruned
            return True
        clock.round, clock.live, clock.tokens, clock.finished = self.round, len(self.live), self.tokens, self.finished
        return False

    def status(self) -> str:
        """One line of Markdown: which algorithm runs, its round, live candidates and tokens."""
        clock = f"{self.elapsed:.1f} s"
        name = PHASE_NAMES.get(self.phase, self.phase)
        if self.phase == "starting":
            return f"starting… ({clock})"
        if self.phase == "counterfactual":
            done, total = self.counterfactual
            progress = f"{done} of {total} decision tokens done" if total else "starting"
            return (f"**{name}** for the Trade-off and Pruning signals views: scoring Best-of-N's prefixes, "
                    f"{progress} ({clock})")
        if self.phase == "done":
            return f"Done in {clock}"
        rounds = f"round {self.round} · " if self.phase != "bon" else "same seed, no pruning · "
        pruned = f" · {self.pruned} pruned" if self.phase != "bon" else ""
        return (f"**{name}** · {rounds}{len(self.live)} of {self.n} candidates generating · "
                f"{self.tokens}/{self.max_new_tokens} tokens{pruned} ({clock})")

    def race(self, methods: tuple[str, ...]) -> str:
        """A Markdown table with one row per method, each with its own clock: what replaces the
        previous run's headline while this run goes. ``methods`` are the rows, in running order;
        a method that has not started yet shows as waiting."""
        now = self.clock()
        rows = ["| method | phase | round | live candidates | tokens (each / all) | elapsed |",
                "|---|---|---|---|---|---|"]
        for method in methods:
            c = self.clocks.get(method)
            name = PHASE_NAMES.get(method, method)
            if c is None:
                rows.append(f"| {name} | waiting | – | – | – | 0.0 s |")
                continue
            phase = "done ✓" if c.ended is not None else "generating"
            round_ = "–" if not METHOD_SPECS[method].prunes else str(c.round or "before the first")
            live = f"{c.live} of {self.n}" + (f" · {c.pruned} pruned" if METHOD_SPECS[method].prunes else "")
            rows.append(f"| {name} | {phase} | {round_} | {live} | {c.tokens}/{self.max_new_tokens} / "
                        f"{c.generated} | **{c.seconds(now):.1f} s** |")
        if self.phase == "counterfactual":
            done, total = self.counterfactual
            rows.append(f"\nThen the counterfactual replay: Best-of-N prefixes scored at decision token {done} of {total}.")
        return "\n".join(rows)
