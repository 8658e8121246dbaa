"""The "Pruning signals" view: per pruning signal, which candidates it cut or would have cut at each of the
Speculative Rejection run's decision points, and whether Best-of-N's winner survives the cut.

Two kinds of rows, and the view says which is which in its first line (:func:`signals_note`):

- **the run's own signal** (the one it pruned by): the run's own decision points, read from its result: its
  contenders, its pruned candidates and its survivors, the numbers of the round captions;
- **every other signal: a what-if**, the cut of ``python -m benchmarks signals``: at a decision point of t
  tokens, *all* of Best-of-N's candidates still generating are ranked by the signal and round((1 - alpha) *
  live) of them kept, with the run's alpha and no earlier cut; candidates that finished before t stay
  eligible. Its counts are therefore Best-of-N's, not the run's. Coupled sampling makes every Best-of-N
  candidate the same response Speculative Rejection would have continued, so the cost of a cut is counted,
  not estimated. The reward's scores are the comparison's partial rewards; the other signals' are
  ``Comparison.signal_scores``, recorded while Best-of-N generated.

Plain data in, pandas tables and plotly figures out (no Gradio).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sbon.analysis.comparison import Comparison
from sbon.analysis.replay import replay_tau
from sbon.metrics import live_kendall
from sbon.signals import on_reward_scale, signal_title

from .figures import empty_figure
from .style import BON_COLOR, PRUNED_COLORS, SURVIVED_COLOR, fit_margins, id_dtick, styled, wrap_title

ORDER = ("reward", "value-head", "logprob", "deepconf", "self-certainty", "consistency")
KEPT_COLOR, CUT_COLOR, FINISHED_COLOR, WINNER_COLOR = SURVIVED_COLOR, PRUNED_COLORS[0], BON_COLOR, "#f4a261"
NO_SCORES = ("This run was recorded before the comparison watched pruning signals (or with none): "
             "run it again to see which candidates each signal would have cut.")


@dataclass
class Cut:
    """One signal's single cut at one decision point."""
    signal: str
    round: int
    t: int
    live: list[int]  # candidates still generating at t, ranked by the signal
    kept: list[int]
    cut: list[int]
    finished: list[int]  # finished before t: stay eligible
    winner_kept: bool
    kendall: float  # of the signal's scores with the final reward, over the run's live contenders there
    scores: list[float | None]  # by candidate id (None: not scored there)
    own: bool = False  # the run's own cut, read from its decision point; else a what-if on Best-of-N's candidates

    @property
    def contenders(self) -> int:
        """Candidates in contention at this cut: those ranked or kept eligible (finished), as the round captions
        count them."""
        return len(self.live) + len(self.finished)


def has_signal_scores(comp: Comparison | None) -> bool:
    return comp is not None and bool(comp.signal_scores)


def own_signal(comp: Comparison) -> str | None:
    """The pruning signal the Speculative Rejection run ranked its contenders by (None: no decision point)."""
    points = comp.speculative.decision_points
    return points[0].signal if points else None


def signal_names(comp: Comparison) -> list[str]:
    """The run's own signal first, then the reward (if the comparison scored its decision points) and the watched
    signals."""
    taus = decision_taus(comp)
    own = own_signal(comp)
    names = set((["reward"] if any(t in comp.partials for _, t in taus) else []) + list(comp.signal_scores))
    names.discard(own)
    return ([own] if own else []) + sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def decision_taus(comp: Comparison) -> list[tuple[int, int]]:
    """(round, tokens) of each of the Speculative Rejection run's decision points."""
    return [(p.round, p.tokens) for p in comp.speculative.decision_points]


def scores_of(comp: Comparison, signal: str, t: int) -> list[float | None] | None:
    by_t = comp.partials if signal == "reward" else comp.signal_scores.get(signal, {})
    return by_t.get(t)


def run_cuts(comp: Comparison) -> list[Cut]:
    """The run's own cuts, from its decision points: its live contenders ranked by the scores it ranked them by,
    the survivors, the pruned, and the contenders that had finished (ranked by their final reward or not)."""
    winner, out, gone = comp.bon.best_id, [], set()  # gone: pruned at this decision point or an earlier one
    for p in comp.speculative.decision_points:
        score = p.score_of()
        live = sorted((k for k in p.contenders if k not in p.final), key=lambda k: (-score[k], k))
        gone |= set(p.pruned)
        scores = [score.get(k) if k in live else None for k in range(comp.n)]
        out.append(Cut(p.signal, p.round, p.tokens, live, [k for k in live if k in p.survivors], list(p.pruned),
                       list(p.final), winner not in gone, decision_kendall(comp, p, p.signal, scores), scores, own=True))
    return out


def cuts(comp: Comparison) -> list[Cut]:
    """Every signal's cut at every decision point, with the run's alpha: the run's own signal's are the run's
    (:func:`run_cuts`), every other signal's a what-if on all of Best-of-N's candidates."""
    if not has_signal_scores(comp):
        return []
    alpha = float(comp.speculative.settings.get("alpha", 0.5))
    winner = comp.bon.best_id
    points = {p.round: p for p in comp.speculative.decision_points}
    out = run_cuts(comp)
    for name in signal_names(comp)[1:]:
        for round, t in decision_taus(comp):
            score = scores_of(comp, name, t)
            if score is None:
                continue
            live = sorted((k for k, s in enumerate(score) if s is not None), key=lambda k: (-score[k], k))
            replay = replay_tau(comp.bon, score, t, alpha, on_reward_scale(name, comp.bon.reward),  # the run's own cut rule
                                comp.uncertainties.get(t) if name == "reward" else None,
                                comp.speculative.settings.get("undecided", "paper"), comp.speculative.settings.get("seed", 0), round)
            kept = set(replay.cut.kept)
            finished = [k for k, s in enumerate(score) if s is None]
            out.append(Cut(name, round, t, live, [k for k in live if k in kept], [k for k in live if k not in kept],
                           finished, winner in replay.eligible, decision_kendall(comp, points[round], name, score),
                           list(score)))
    return out


def decision_kendall(comp: Comparison, point: Any, signal: str, score: Sequence[float | None]) -> float:
    """The signal's Kendall at a decision point, as the headline and the scatter state it (sbon.metrics.live_kendall:
    the run's live contenders there, their final rewards): the run's own signal by the scores the run ranked by,
    another signal by its scores of the same candidates in Best-of-N's run."""
    own = point.signal == signal
    scores = point.score_of() if own else dict(enumerate(score))
    return live_kendall(point, scores, comp.final_reward)[0]


def _mark(c: Cut, winner: int | None) -> str:
    if winner in c.finished:
        return "✓ (finished)"
    return "✓" if c.winner_kept else "✗"


KIND = {True: "this run", False: "what-if"}


def _counts(cs: Sequence[Cut], count) -> str:
    return " / ".join(str(count(c)) for c in cs)


def signals_note(comp: Comparison | None) -> str:
    """The view's first lines: which rows are the run's own cuts and which are a what-if, what the what-if
    assumes, and how its counts differ from the run's (the numbers of both, from the same cuts the table shows)."""
    if not has_signal_scores(comp):
        return NO_SCORES
    all_cuts = cuts(comp)
    own = [c for c in all_cuts if c.own]
    other = [c for c in all_cuts if not c.own and c.signal == (signal_names(comp)[1:] or [""])[0]]
    alpha = float(comp.speculative.settings.get("alpha", 0.5))
    lines = []
    if other:
        lines.append(f"**What-if rows: what each signal would have cut if it had judged all {comp.n} of Best-of-N's "
                     f"candidates at each decision point**, one cut at the run's α = {alpha:g} with no cut before it; "
                     f"so they count {_counts(other, lambda c: c.contenders)} contenders and "
                     f"{_counts(other, lambda c: len(c.cut))} pruned, where this run had "
                     f"{_counts(own, lambda c: c.contenders)} and {_counts(own, lambda c: len(c.cut))}.")
    if own:
        title = signal_title(own[0].signal)
        lines.append(f"**{title[0].upper() + title[1:]}** is the signal this run pruned by: its rows are the run's own "
                     f"cuts ({_counts(own, lambda c: c.contenders)} contenders, {_counts(own, lambda c: len(c.cut))} "
                     "pruned, as in the round captions).")
    lines.append("Signals other than the reward were watched while Best-of-N generated (no extra forward pass); the "
                 "reward's scores are its partial rewards. Kendall is over the run's live contenders at each "
                 "decision point.")
    return "\n\n".join(lines)


def summary_table(comp: Comparison | None) -> pd.DataFrame:
    """One row per signal x decision point: whose cut it is (this run's or a what-if), contenders, pruned, Best-of-N
    winner kept, Kendall with final reward."""
    if not has_signal_scores(comp):
        return pd.DataFrame({"note": [NO_SCORES]})
    winner = comp.bon.best_id
    return pd.DataFrame([{"signal": signal_title(c.signal), "cuts": KIND[c.own],
                          "decision point": f"round {c.round} · {c.t} tokens",
                          "contenders": c.contenders, "pruned": len(c.cut), "winner kept": _mark(c, winner),
                          "Kendall with final reward": None if math.isnan(c.kendall) else round(c.kendall, 2)}
                         for c in cuts(comp)])


def column_title(comp: Comparison, signal: str) -> str:
    """A signal's column in the candidate table: its name and whose cuts they are."""
    return f"{signal_title(signal)} ({KIND[signal == own_signal(comp)]})"


def candidate_table(comp: Comparison | None) -> pd.DataFrame:
    """One row per candidate (the first column is its id, for a click to open it): its final reward
    and, per signal, its fate at each decision point in order (✓ kept, ✗ pruned, · finished before
    it, – not judged there: pruned earlier by the run, or no scores)."""
    if not has_signal_scores(comp):
        return pd.DataFrame({"note": [NO_SCORES]})
    by_key = {(c.signal, c.t): c for c in cuts(comp)}
    taus = [t for _, t in decision_taus(comp)]
    rows = []
    for k in range(comp.n):
        row: dict[str, Any] = {"candidate": k, "final reward": round(comp.bon.candidates[k].final_reward, 3),
                               "Best-of-N winner": "★" if k == comp.bon.best_id else ""}
        for name in signal_names(comp):
            row[column_title(comp, name)] = " ".join(_fate_mark(by_key.get((name, t)), k) for t in taus)
        rows.append(row)
    return pd.DataFrame(rows)


def _fate_mark(c: Cut | None, k: int) -> str:
    if c is None:
        return "–"  # the signal has no scores at this decision point
    return "·" if k in c.finished else "✓" if k in c.kept else "✗" if k in c.cut else "–"  # –: pruned earlier


def candidate_for_select(row_value: Sequence[Any] | None) -> int | None:
    """The candidate id of a selected row of :func:`candidate_table` (its first column), or None."""
    if not row_value:
        return None
    try:
        return int(row_value[0])
    except (TypeError, ValueError):
        return None


SIGNAL_LABEL_CHARS = 20  # a signal's row label, per line: a phone-wide plot keeps most of its width for the candidates
LABEL_LINE_PX = 22  # one line of a row label, with room for the presenter view's larger type
PANEL_GAP_PX = 40  # between two decision points' panels: the lower one's title


def cuts_figure(comp: Comparison | None, side_by_side: bool = False) -> go.Figure:
    """One panel per decision point, one under another (side by side, a phone's width left each of them a few
    pixels), or ``side_by_side`` (the presenter view: a wide window no taller than a projector's); rows: signals
    (the run's own first, then the what-ifs), x: candidate id; a filled marker for kept, a cross for pruned, a grey
    ring for finished before t; Best-of-N's winner in a highlighted column."""
    if not has_signal_scores(comp):
        return empty_figure(NO_SCORES, height=220)
    taus = decision_taus(comp)
    names = signal_names(comp)
    alpha = float(comp.speculative.settings.get("alpha", 0.5))
    title = {name: column_title(comp, name) for name in names}
    label = {name: wrap_title(title[name], SIGNAL_LABEL_CHARS) for name in names}
    panel_px = len(names) * (LABEL_LINE_PX * max(v.count("<br>") + 1 for v in label.values()) + 8)
    if side_by_side:  # a panel a few candidates wide: its title the round alone, fewer ticks
        plot_px = panel_px
        fig = make_subplots(rows=1, cols=len(taus), shared_yaxes=True, horizontal_spacing=0.03,
                            subplot_titles=[f"round {r}" for r, _ in taus])
        cells = [(1, col) for col in range(1, len(taus) + 1)]
    else:
        plot_px = len(taus) * panel_px + (len(taus) - 1) * PANEL_GAP_PX
        # Row 1 is the lowest panel (the last decision point): its x-axis is the figure's first, whose title the
        # margins are fitted to (components.style.fit_margins).
        fig = make_subplots(rows=len(taus), cols=1, shared_xaxes=True, start_cell="bottom-left",
                            vertical_spacing=PANEL_GAP_PX / plot_px,
                            subplot_titles=[f"round {r} · {t} tokens" for r, t in reversed(taus)])
        cells = [(row, 1) for row in range(len(taus), 0, -1)]
    winner = comp.bon.best_id
    styles = {"kept": dict(symbol="circle", color=KEPT_COLOR, size=10),
              "pruned": dict(symbol="x", color=CUT_COLOR, size=9),
              "finished": dict(symbol="circle-open", color=FINISHED_COLOR, size=9)}
    by_key = {(c.signal, c.t): c for c in cuts(comp)}
    for (round, t), (row, col) in zip(taus, cells):
        for fate, marker in styles.items():
            xs, ys, data = [], [], []
            for name in names:
                c = by_key.get((name, t))
                if c is None:
                    continue
                ids = {"kept": c.kept, "pruned": c.cut, "finished": c.finished}[fate]
                for k in ids:
                    s = c.scores[k]
                    xs.append(k)
                    ys.append(label[name])
                    data.append([k, "—" if s is None else f"{s:.3f}", fate, title[name]])
            fig.add_scatter(x=xs, y=ys, mode="markers", marker=marker, name=fate, legendgroup=fate,
                            showlegend=round == taus[0][0], customdata=data, row=row, col=col,
                            hovertemplate="candidate %{customdata[0]}<br>%{customdata[3]} score %{customdata[1]}"
                                          "<br>%{customdata[2]}<extra></extra>")
        if winner is not None:
            fig.add_vrect(x0=winner - 0.45, x1=winner + 0.45, fillcolor=WINNER_COLOR, opacity=0.3, line_width=0, layer="below",
                          row=row, col=col)
    fig.update_xaxes(range=[-0.7, comp.n - 0.3], dtick=max(1, comp.n // 4) if side_by_side else id_dtick(comp.n))
    if side_by_side:
        fig.update_xaxes(title_text="candidate")
    else:
        fig.layout.xaxis.title = "candidate"
    fig.update_yaxes(categoryorder="array", categoryarray=[label[n] for n in reversed(names)])
    styled(fig, f"What-if rows judge all {comp.n} of Best-of-N's candidates, one cut each at α = {alpha:g}; “this run”: "
                f"the run's own cuts; shaded: Best-of-N's winner ({winner})")
    fig.update_layout(height=plot_px + fig.layout.margin.t + fig.layout.margin.b)
    return fit_margins(fig)  # the legend's place follows the height
