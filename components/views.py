"""The views of a finished comparison: one table (`VIEWS`), page element name -> its value, and the handlers
that redraw one view (a decision point, a candidate, the rounds replay, the trade-off's kind). Plain data in,
{page element name: value} out (components/updates.py); app.py shows them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import plotly.graph_objects as go

from sbon.analysis.comparison import Comparison
from sbon.machine import machine_class
from sbon.rewards import bind_instructions

from . import figures, signals_view, tables
from .model_cache import MODELS
from .rounds import result_caption, round_figure, round_views, rounds_animation
from .saved_runs import save_for_download
from .style import Look
from .updates import Update

PLAY_STEP_S = 1.2  # pause between rounds when the rounds replay plays
NO_RUN = "No run to present yet: press ▶ Run, or replay a saved run under Save and replay, then ▶ Present rounds."


@dataclass
class Shown:
    """A finished comparison and where it came from: what every view is drawn from."""
    comp: Comparison
    origin: str  # "your run", "the recorded run …", "uploaded file …"
    kind: str = "curves"  # how the trade-off view draws
    file: str | Path | None = None  # its JSON, if it already has one
    look: Look = Look()  # the page's view or the presenter view

    @property
    def first_round(self) -> int | None:
        return self.comp.speculative.decision_points[0].round if self.comp.speculative.decision_points else None


def as_look(look: Any) -> Look:
    """The page's look as the browser sent it back (an API client sends none)."""
    return look if isinstance(look, Look) else Look()


def as_kind(kind: Any) -> str:
    """The trade-off view's kind as the browser sent it (anything else draws the curves)."""
    return kind if kind in ("curves", "heatmap") else "curves"


def explaining_reward(comp: Comparison) -> Any:
    """The run's reward if it is in memory now (never loads), judging the prompt by the instructions the run
    recorded: a run opened from a file, a link or the gallery is explained as it was judged."""
    return bind_instructions(MODELS.loaded_reward(comp.speculative.reward, comp.speculative.generator), comp.speculative.prompt,
                             comp.speculative.instructions)


def source(shown: Shown) -> str:
    """Which run the views show, with which settings, and -- for a run recorded elsewhere or earlier -- whether a
    Run here reproduces it (tables.reproduction_note)."""
    described = tables.run_description(shown.comp, shown.origin)
    if shown.origin == "your run":
        return described
    generator = shown.comp.speculative.generator
    weights, decode, settled = MODELS.planned(generator)
    note = tables.reproduction_note(shown.comp, machine_class(MODELS.device()), weights, decode, settled)
    return f"{described}\n\n{note}"


def detail(comp: Comparison, k: int) -> str:
    """Candidate k in full; a reward still in memory that can explain itself adds its reasons."""
    return tables.candidate_detail_html(comp, k, explaining_reward(comp))


def _returned(shown: Shown, which: int) -> Update:
    label, text = tables.returned_texts(shown.comp)[2 * which: 2 * which + 2]
    return Update(label=label, value=text)


# The trade-off view's per-τ statistics, by the names the page gives them, each explained under the table.
CORRELATION_NAMES = {"tau": "decision token τ", "pearson": "Pearson r", "kendall": "Kendall",
                     "oracle_cut": "prunable, keeping the best (c*)"}
CORRELATION_NOTE = ("*decision token τ*: where Best-of-N's prefixes were scored · *candidates*: the unfinished ones "
                    "scored there · *Pearson r*: linear correlation of their partial with their final rewards "
                    "(1 = a line) · *Kendall*: how much the two orders agree (1 = the same order, 0 = unrelated) · "
                    "*prunable, keeping the best (c\\*)*: the largest fraction an oracle cut could have pruned there "
                    "and still kept Best-of-N's winner.")

# Page element name -> its value for a finished comparison. A new view is a line here and an
# element of the same name on the page.
VIEWS: dict[str, Callable[[Shown], Any]] = {
    "comparison": lambda s: s.comp,
    "origin": lambda s: s.origin,
    "source": source,
    "summary": lambda s: "\n\n".join(part for part in (
        tables.headline(s.comp),
        tables.answers_checked(s.comp, explaining_reward(s.comp)),
        tables.prediction_report(s.comp)) if part),
    "decision_point": lambda s: Update(choices=figures.decision_point_choices(s.comp), value=s.first_round),
    "scatter": lambda s: figures.partial_final_scatter(s.comp, s.first_round or 1),
    "table": lambda s: tables.candidates_table(s.comp),
    "picker": lambda s: Update(choices=tables.candidate_choices(s.comp), value=tables.first_pruned(s.comp)),
    "detail": lambda s: detail(s.comp, tables.first_pruned(s.comp)),
    "savings": lambda s: tables.savings_table(s.comp),
    "tokens_plot": lambda s: figures.tokens_per_candidate(s.comp),
    "times_plot": lambda s: figures.phase_times(s.comp),
    "bon_text": lambda s: _returned(s, 0),
    "sbon_text": lambda s: _returned(s, 1),
    "rounds_plot": lambda s: rounds_animation(s.comp.speculative, comp=s.comp),
    "tradeoff_plot": lambda s: figures.tradeoff_figure(s.comp, s.kind),
    "correlations": lambda s: tables.correlation_table(s.comp).rename(columns=CORRELATION_NAMES),
    "signals_note": lambda s: signals_view.signals_note(s.comp),
    "signals_summary": lambda s: signals_view.summary_table(s.comp),
    "signals_plot": lambda s: signals_view.cuts_figure(s.comp, side_by_side=s.look.presenter),
    "signals_candidates": lambda s: signals_view.candidate_table(s.comp),
    "download": lambda s: Update(value=str(s.file) if s.file else save_for_download(s.comp)),
    "caption": lambda s: result_caption(s.comp),
    # Share's link and the page export belong to the run they were made for: another run shown empties them
    "share_link": lambda s: "",
    "page_file": lambda s: None,
}
SHOWN = (*VIEWS, "status", "live_plot", "present", "present_prev", "present_next")  # what showing a comparison updates
NOT_PRESENTING = {"present": None, "present_prev": Update(visible=False), "present_next": Update(visible=False)}
# The `present` state while a run draws its own frames on the live chart: there is nothing to present until the run
# has shown its result (show) or ended without one (redrawn).
LIVE = "live"
LIVE_CHART = ("live_plot", "caption", *NOT_PRESENTING)  # the live chart, its caption and the presentation on it


# What the trade-off shows from a run's answers until its every view is ready: its replay scores the prefixes meanwhile.
WHAT_IF_PENDING = "Being prepared: every prefix of Best-of-N's candidates is scored, seconds after both runs."


def what_if_pending(look: Look = Look()) -> dict[str, Any]:
    """The views the prefix rewards draw, while they are scored (ComparisonReady to ComparisonDone)."""
    return {"tradeoff_plot": look.apply(figures.empty_figure(WHAT_IF_PENDING))}


def last_round(comp: Comparison, look: Look = Look()) -> go.Figure:
    """The live figure as it looked at the end of a run: its last decision point."""
    views = round_views(comp.speculative)
    return look.apply(round_figure(views[-1] if views else None, comp.n, earlier=views[:-1], comp=comp,
                                   reward=comp.speculative.reward), live=True)


def show(shown: Shown, status: str = "", chart: bool = True) -> dict[str, Any]:
    """Every view of a finished comparison (figures in the page's look), the status line, the live
    figure at its last round and its caption; a presentation of the rounds ends. ``chart=False``: all but the
    live chart and its caption (LIVE_CHART), so that a presentation begun since they were shown goes on."""
    views = {name: view(shown) for name, view in VIEWS.items() if chart or name not in LIVE_CHART}
    drawn = {name: shown.look.apply(v) if isinstance(v, go.Figure) else v for name, v in views.items()}
    return {**drawn, "status": status, **({"live_plot": last_round(shown.comp, shown.look), **NOT_PRESENTING}
                                          if chart else {})}


def restored(comp: Comparison | None, origin: str | None) -> dict[str, Any]:
    """The description and headline of the run the views still show (a run replaced them with its
    progress while it went)."""
    if comp is None:
        return {"source": "", "summary": ""}
    shown = Shown(comp, origin or "the run shown before")
    return {"source": VIEWS["source"](shown), "summary": VIEWS["summary"](shown)}


def redrawn(comp: Comparison | None, look: Look) -> dict[str, Any]:
    """The live chart at its last round and both answers of the run the views still show, which a run that
    ended without a result (refused, failed, stopped) had replaced with its own; the live chart is no run's
    frames any more, so "Present rounds" presents the run shown."""
    if comp is None:
        return dict(NOT_PRESENTING)
    shown = Shown(comp, "the run shown before", look=look)
    return {"live_plot": last_round(comp, look), "sbon_text": VIEWS["sbon_text"](shown),
            "bon_text": VIEWS["bon_text"](shown), **NOT_PRESENTING}


# -- one view redrawn ------------------------------------------------------------------------------

def on_decision_point(comp: Comparison | None, round: int | None, look: Look) -> dict[str, Any]:
    return {"scatter": look.apply(figures.partial_final_scatter(comp, round or 1))} if comp else {}


def on_pick(comp: Comparison | None, k: int | None) -> dict[str, Any]:
    return {"detail": detail(comp, int(k))} if comp is not None and k is not None else {}


def on_row_select(comp: Comparison | None, row: list | None) -> dict[str, Any]:
    """A row of a candidate table opens that candidate in the inspector: the first column is its id,
    whatever order the user sorted the rows in (a note row, in a file without the data, opens nothing)."""
    k = signals_view.candidate_for_select(row) if comp is not None else None
    return {} if k is None else {"picker": k, "detail": detail(comp, k)}


def on_play(comp: Comparison | None, look: Look) -> Iterator[dict[str, Any]]:
    # One figure per round, sent a beat apart: Gradio's plot drops plotly's own animation frames.
    for i in range(len(comp.speculative.decision_points) if comp else 0):
        yield {"rounds_plot": look.apply(rounds_animation(comp.speculative, i, comp=comp))}
        time.sleep(PLAY_STEP_S)


def on_tradeoff_kind(comp: Comparison | None, kind: str, look: Look, running: float | None = None) -> dict[str, Any]:
    """Curves or heatmap. A run still going whose answers are shown has its prefixes being scored."""
    if comp is None:
        return {}
    if running and not comp.partials:
        return what_if_pending(look)
    return {"tradeoff_plot": look.apply(figures.tradeoff_figure(comp, kind))}
