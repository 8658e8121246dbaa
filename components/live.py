"""Follow a running comparison from its events: a status line, a race board and one frame per round.

The tracker only counts and remembers; it never draws per token. A UI redraws the round figure
when :meth:`LiveTracker.update` says a decision point was taken, and refreshes the status line
and the race board at whatever rate it likes.

The race board is what a lecture audience watches while a run goes: one row per method with its
own clock, so Speculative Rejection's finish time stands next to Best-of-N's running one. While
Best-of-N runs (no decision point to draw), :func:`progress_figure` draws every candidate's tokens so
far, Best-of-N's growing beside Speculative Rejection's final ones, and :meth:`LiveTracker.caption`
is the one line over the live chart: where the run is, and Speculative Rejection's answer as soon as
it has one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go

from sbon.algorithms import CandidateFinished, CandidatesScored, DecisionTaken, Done, RoundStarted, TokensGenerated
from sbon.analysis.comparison import (ComparisonDone, ComparisonEvent, ComparisonReady, CounterfactualScored,
                                     MethodEvent)
from sbon.config import METHOD_SPECS
from sbon.results import DecisionPoint, RunResult

from .fates import fate_color, fate_order
from .reasons import marked_undecided
from .rounds import UNDECIDED_COLOR, UNDECIDED_NAME, round_caption
from .style import BON_COLOR, axis_titles, presenter_name, ring, styled, wrap_title

PHASE_NAMES = {**{name: spec.label for name, spec in METHOD_SPECS.items()}, "counterfactual": "Preparing the what-if views"}


def plural(count: int, word: str) -> str:
    """``word`` for one, ``word + 's'`` for any other count."""
    return word if count == 1 else word + "s"


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
    def __init__(self, max_new_tokens: int, started: float | None = None, clock=time.perf_counter, *, reward: str):
        self.max_new_tokens = max_new_tokens
        self.reward = reward  # the run's reward: its round captions take its words (components.reasons.tie_text)
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
        self.tokens_of: dict[str, dict[int, int]] = {}  # method -> candidate -> tokens it has generated so far
        self.results: dict[str, RunResult] = {}  # the methods that are done, by name
        self.finished_of: dict[str, set[int]] = {}  # method -> the candidates that have finished
        self.steps_of: dict[str, int] = {}  # method -> decode steps so far (one token for every live candidate of a batch)
        self.rewards_of: dict[str, dict[int, float]] = {}  # method -> candidate -> final reward, once scored
        self.batch: list[int] = []  # the candidates of the batch generating now (all N, unless in batches)
        self.batch_size = 0  # the method's batch size: its first batch's (the last may be smaller)

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
            self.batch, self.batch_size = [], 0
        clock = self.clocks.setdefault(event.method, MethodClock(event.method, self.clock()))
        if isinstance(e, RoundStarted):
            self.round, self.live, self.tokens = e.round, list(e.live), e.tokens
            self.n = max(self.n, len(e.live))
        elif isinstance(e, TokensGenerated):
            self.tokens, self.live = e.tokens, list(e.candidate_ids)
            if not set(e.candidate_ids) <= set(self.batch):  # a batch's first step has every candidate of it
                self.batch = list(e.candidate_ids)
                self.batch_size = max(self.batch_size, len(self.batch))
            clock.generated += len(e.candidate_ids)
            self.steps_of[event.method] = self.steps_of.get(event.method, 0) + 1
            self.tokens_of.setdefault(event.method, {}).update(dict.fromkeys(e.candidate_ids, e.tokens))
        elif isinstance(e, CandidateFinished):
            self.finished += 1
            self.finished_of.setdefault(event.method, set()).add(e.candidate_id)
            self.tokens_of.setdefault(event.method, {})[e.candidate_id] = e.tokens
        elif isinstance(e, CandidatesScored) and all(e.final):
            self.rewards_of.setdefault(event.method, {}).update(zip(e.candidate_ids, e.rewards))
        elif isinstance(e, Done):
            clock.ended, clock.live = self.clock(), 0
            self.results[event.method] = e.result
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
            progress = f": {done} of {total}" if total else ""
            return f"**{name}**{progress} (both answers are in; {clock})"
        if self.phase == "done":
            return f"Done in {clock}"
        rounds = f"round {self.round} · " if self.phase != "bon" else "same seed, no pruning · "
        pruned = f" · {self.pruned} pruned" if self.phase != "bon" else ""
        return (f"**{name}** · {rounds}{len(self.live)} of {self.n} {plural(self.n, 'candidate')} generating · "
                f"{self.tokens}/{self.max_new_tokens} tokens{pruned} ({clock})")

    def race(self, methods: tuple[str, ...]) -> str:
        """A Markdown table with one row per method, each with its own clock: what replaces the
        previous run's headline while this run goes. ``methods`` are the rows, in running order;
        a method that has not started yet shows as waiting. Four columns of short words (the Method
        setting names the variant), so that a phone's width and the presenter view's type hold it
        with every word whole."""
        now = self.clock()
        rows = ["| method | candidates | tokens (each / all) | time |", "|---|---|---|---|"]
        for method in methods:
            c, spec = self.clocks.get(method), METHOD_SPECS[method]
            if c is None:
                rows.append(f"| {spec.short} | waiting | – | – |")
                continue
            where = f"round {c.round}: " if spec.prunes and c.round else ""
            state = "done ✓" if c.ended is not None else f"{where}{c.live} of {self.n} generating"
            pruned = f" · {c.pruned} pruned" if spec.prunes else ""
            rows.append(f"| {spec.short} | {state}{pruned} | {c.tokens}/{self.max_new_tokens} / {c.generated} | "
                        f"**{c.seconds(now):.1f} s** |")
        if self.phase == "counterfactual":
            done, total = self.counterfactual
            rows.append(f"\nPreparing the what-if views: {done} of {total}.")
        return "\n".join(rows)

    def caption(self) -> str:
        """The one line over the live chart while a run goes: the last decision point's caption (or
        where the run is), Speculative Rejection's answer (candidate, seconds) once it has one, and a
        clock, so the line moves with every update."""
        method, done = next(((m, r) for m, r in self.results.items() if METHOD_SPECS[m].prunes), (None, None))
        answered = (f"Speculative Rejection answered: candidate {done.best.id} after {done.wall_time:.1f} s · "
                    if done is not None and done.best is not None else "")
        clock = f"{self.elapsed:.1f} s"
        if self.phase == "starting":
            return f"Starting… · {clock}"
        if self.phase == "bon" and not self.tokens_of.get("bon"):  # its first batch's size is known at its first token
            return f"{answered}Best-of-N starting · {clock}"
        if self.phase == "bon":
            return self.bon_caption(done)
        if self.phase == method:  # answered; Best-of-N starts next
            return f"{answered}Best-of-N next · {clock}"
        if self.phase in METHOD_SPECS:
            where = (round_caption(self.views[-1], reward=self.reward) if self.views
                     else "Speculative Rejection: before the first decision point")
            return f"{where} · now {self.tokens} tokens · {clock}"  # short: the caption holds to two lines
        if self.phase == "counterfactual":
            return f"{answered}both runs done · preparing the what-if views · {clock}"
        return f"{answered}done in {clock}"

    def bon_caption(self, sbon: RunResult | None) -> str:
        """Best-of-N's progress against Speculative Rejection's finished run, in two lines (one Markdown line break):
        steps and tokens so far against Speculative Rejection's in all; then its batch (when it runs in batches),
        how many candidates have finished, and its best final reward so far against Speculative Rejection's answer.
        Each line leaves out its least needed parts to stay within CAPTION_LINE_CHARS (the presenter view shows two
        lines), and the steps move at every token, so the caption never stands still while Best-of-N works."""
        steps, tokens = self.steps_of.get("bon", 0), sum(self.tokens_of.get("bon", {}).values())
        race = [f"Best-of-N so far: {steps} {plural(steps, 'step')}, {tokens:,} tokens"]
        if sbon is not None:
            race.append(f"Speculative Rejection used {sbon.decode_steps} and {sbon.total_tokens:,}")
        n, size = self.n or len(self.tokens_of.get("bon", {})), max(1, self.batch_size)
        batches = -(-n // size)
        batch = f"batch {min(self.batch, default=0) // size + 1} of {batches}" if batches > 1 else ""
        rewards, answer = self.rewards_of.get("bon", {}), sbon.best if sbon is not None else None
        if rewards:
            k = max(rewards, key=lambda c: (rewards[c], -c))
            best = f"its best {rewards[k]:.2f} (candidate {k})" + (
                f", Speculative Rejection's {answer.final_reward:.2f}"
                if answer is not None and answer.final_reward is not None else "")
        else:
            best = "rewards come as each batch ends" if batches > 1 else "rewards come at the end"
        state = [batch, f"{len(self.finished_of.get('bon', ()))} of {n} done", best, f"{self.elapsed:.0f} s"]
        return fit_line(race, drop=(1,)) + "  \n" + fit_line(state, drop=(3, 0))


CAPTION_LINE_CHARS = 86  # a line of the round caption at the presenter view's 20 px on an 853 px window


def fit_line(parts: list[str], drop: tuple[int, ...] = (), width: int = CAPTION_LINE_CHARS) -> str:
    """``parts`` joined with " · ", leaving out the parts ``drop`` names (by index, in that order) until the line fits
    ``width`` characters; empty parts are left out."""
    shown = [part for part in parts if part]
    for i in drop:
        if len(" · ".join(shown)) <= width:
            break
        if parts[i] in shown:
            shown.remove(parts[i])
    return " · ".join(shown)


def progress_title(tracker: LiveTracker) -> str:
    bon = sum(tracker.tokens_of.get("bon", {}).values())
    sbon = next((r for m, r in tracker.results.items() if METHOD_SPECS[m].prunes), None)
    done = sum(c.tokens_generated for c in sbon.candidates) if sbon is not None else 0
    return f"Live · Best-of-N: {bon} tokens so far · Speculative Rejection needed {done} in all"


BON_NAMES = ("Best-of-N generating", "Best-of-N finished")
BON_FINISHED_COLOR = "#495057"


def bon_bars(tracker: LiveTracker) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
    """(candidates, tokens so far) of Best-of-N's candidates still generating, then of those that have finished."""
    tokens, done = tracker.tokens_of.get("bon", {}), tracker.finished_of.get("bon", set())
    going = [k for k in tokens if k not in done]
    finished = [k for k in tokens if k in done]
    return (going, [tokens[k] for k in going]), (finished, [tokens[k] for k in finished])


def progress_figure(tracker: LiveTracker, n: int) -> go.Figure:
    """Every candidate's tokens so far while Best-of-N runs: its bars grow beside the tokens each
    candidate got under Speculative Rejection (coloured by fate), one row per candidate as in the round
    frames, so the audience watches the cost Speculative Rejection saved being spent."""
    fig = go.Figure()
    sbon = next((r for m, r in tracker.results.items() if METHOD_SPECS[m].prunes), None)
    if sbon is not None:
        fates = {c.id: sbon.fate(c.id) for c in sbon.candidates}
        for fate in fate_order(set(fates.values())):
            ids = [k for k in range(n) if fates.get(k) == fate]
            fig.add_trace(presenter_name(go.Bar(y=ids, x=[sbon.candidates[k].tokens_generated for k in ids], orientation="h",
                                           name=f"Speculative Rejection: {fate}", marker_color=fate_color(fate),
                                           offsetgroup="sbon", hovertemplate="candidate %{y}: %{x} tokens<extra></extra>"),
                                   fate))
        # Candidates some decision point could not tell apart from its cut, where that set them apart from others,
        # marked at their bar's end (a coin toss marks none: components.reasons.marked_undecided).
        unsure = sorted({k for p in sbon.decision_points for k in marked_undecided(p)})
        fig.add_trace(go.Scatter(x=[sbon.candidates[k].tokens_generated for k in unsure], y=unsure, mode="markers",
                                 name=UNDECIDED_NAME, showlegend=bool(unsure),
                                 marker=ring("square-open", UNDECIDED_COLOR, 13, 2),
                                 hovertemplate="candidate %{y}: could not be told apart from the cut at a decision "
                                               "point<extra></extra>"))
    for name, color, (ids, tokens) in zip(BON_NAMES, (BON_COLOR, BON_FINISHED_COLOR), bon_bars(tracker)):
        fig.add_trace(go.Bar(y=ids, x=tokens, orientation="h", name=name, marker_color=color, offsetgroup="bon",
                             showlegend=bool(ids), hovertemplate=f"candidate %{{y}}: %{{x}} tokens<extra>{name}</extra>"))
    styled(fig, progress_title(tracker))
    fig.update_layout(barmode="group", bargap=0.2, height=max(360, 15 * n + 200))
    axis_titles(fig, "tokens generated", "candidate")
    fig.update_yaxes(range=[n - 0.5, -0.5], dtick=1 if n <= 32 else None)
    fig.update_xaxes(range=[0, tracker.max_new_tokens * 1.02])
    return fig


class ProgressChart:
    """Best-of-N's progress frames of one run (:func:`progress_figure`), cheap enough to send every second: the
    figure is drawn once, in the page's look, and each later frame changes only Best-of-N's bars and the title,
    in place. Building a Plotly figure from scratch takes a core for tens of milliseconds, which the run
    decoding beside it on the same cores would lose at every frame. Each frame is the same figure object:
    send it before asking for the next."""

    def __init__(self, n: int, look: Any = None):
        self.n, self.look, self.fig = n, look, None

    def frame(self, tracker: LiveTracker) -> go.Figure:
        title = self.look.page_title(progress_title(tracker)) if self.look is not None else wrap_title(progress_title(tracker))
        shown = self.fig.layout.title.text if self.fig is not None else None
        if self.fig is None or (shown and shown.count("<br>") != title.count("<br>")):  # margins fit the lines
            fig = progress_figure(tracker, self.n)
            self.fig = self.look.apply(fig, live=True) if self.look is not None else fig
            return self.fig
        with self.fig.batch_update():
            for trace, (ids, tokens) in zip(self.fig.data[-2:], bon_bars(tracker)):
                trace.update(y=ids, x=tokens, showlegend=bool(ids))
            if shown:  # the presenter view's live chart has no title: the round caption over it is one
                self.fig.layout.title.text = title
        return self.fig
