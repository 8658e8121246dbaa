"""Decision points as pictures: one frame per round, live or replayed.

Each frame draws one :class:`~sbon.results.DecisionPoint` as the algorithm recorded it: the
contenders, the score each was ranked by, who survived and the cut, with each contender's reason
("rank 14 of 16, 0.50 < cut 0.67") in its hover. Candidates pruned at earlier decision points stay
in later frames, greyed, at the score that cut them, so a frame always shows all N. The live view
and the replay animation are drawn by the same code from the same objects.

Scores that tie (closer than TIE_FRACTION of the axis; e.g. a signal that gives many candidates the
same score, separated only by the cut's tie-break) are drawn spread by their rank, the better-ranked to
the right (the pruned left of the kept, as the cut's tie-break put them), at most TIE_SPREAD of the axis in all:
a tie on one side of the cut stays on that side, and the cut line inside a tie goes between its kept and its
pruned; the hover gives each candidate's true score. Each frame also has a one-line caption
(:func:`round_caption`), the sentence a presenter says over it.
"""

from __future__ import annotations

import html
import re
import textwrap
from typing import Any, Sequence

import plotly.graph_objects as go

from sbon.results import DecisionPoint, RunResult, pruned_in

from .fates import fate_color
from .reasons import (UNDECIDED_DONE, coin_toss, coin_toss_text, marked_undecided, point_reasons, pruning_cost,
                      reward_scale, tie_text)
from .style import (CUT_COLOR, axis_titles, fit_margins, EARLIER_COLOR, FINAL_SYMBOL, FINISHED_EARLY_COLOR, PARTIAL_SYMBOL, SURVIVED_COLOR,
                    presenter_name, ring, shape_keys, styled, wrap_title)

ROW_PX = 15  # plot height per candidate
COST_NAME = "○ pruning it cost reward (hover)"
RETIRED_NAME = "finished, still eligible"  # short: one phone-wide legend column
# Short, so that the presenter view's legends fit its window (beside the data: one line; over the live chart: the
# rows a run with every mark needs); the legend draws the amber square, and the hover, the round caption and the cut
# explanation say it in full ("could not be told apart from the cut").
UNDECIDED_NAME = "undecided"
# Shorter legend names for the presenter view's live chart, whose legend is one narrow column beside the data
# (style.presenter_name); the hover says each in full.
PRESENTER_NAMES = {RETIRED_NAME: "finished, eligible", COST_NAME: "○ cost reward"}
UNDECIDED_COLOR = "#e8a317"  # amber: neither the survivors' nor the pruned's colour
TIE_FRACTION = 0.004  # scores closer than this fraction of the axis look like one spot: they are spread
TIE_STEP = 0.012  # the gap between two tied contenders, as a fraction of the axis
TIE_SPREAD = 0.06  # a whole tie spans at most this fraction of the axis
OUTCOME_ORDER = {"pruned": 0, "retired": 1, "kept": 2}  # left to right inside a tie


def round_views(run: RunResult) -> list[DecisionPoint]:
    """The decision points of a finished Speculative Rejection run."""
    return run.decision_points


def _x_range(views: Sequence[DecisionPoint]) -> list[float] | None:
    values = [s for v in views for s in v.scores if s is not None]
    if not values:
        return None
    lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo or 1.0)
    return [lo - pad, hi + pad]


def _earlier(views: Sequence[DecisionPoint], reward: str = "") -> dict[int, tuple[float, str]]:
    """Candidates pruned before the last of ``views``: id -> (the score that cut it, its reason)."""
    out: dict[int, tuple[float, str]] = {}
    for v in views[:-1]:
        reasons = point_reasons(v, reward)
        for k in v.pruned:
            out[k] = (v.score_of()[k], f"pruned in round {v.round}: {reasons[k].text()}")
    return out


def _spread(view: DecisionPoint, span: float) -> tuple[dict[int, float], float]:
    """Where each contender of ``view`` is drawn on the score axis, and where the cut line is: its score,
    except that contenders whose scores tie (closer than TIE_FRACTION of ``span``) are spread by rank
    (rank 1 rightmost) over at most TIE_SPREAD of ``span``, and a cut inside such a tie is drawn between
    its lowest kept and its highest pruned contender. Deterministic: the same point draws the same."""
    reasons = point_reasons(view)
    # rank 1 first from the right; a finished contender the signal could not rank after every ranked one
    order = {k: r.rank if r.rank is not None else len(reasons) + 1 + k for k, r in reasons.items()}
    by_score = sorted(view.score_of().items(), key=lambda kv: (kv[1], -order[kv[0]]))
    shown: dict[int, float] = {}
    groups: list[list[tuple[int, float]]] = []
    for k, x in by_score:
        if groups and x - groups[-1][-1][1] <= TIE_FRACTION * span:
            groups[-1].append((k, x))
        else:
            groups.append([(k, x)])
    group_of = {}
    for i, group in enumerate(groups):
        centre = sum(x for _, x in group) / len(group)
        step = min(TIE_STEP, TIE_SPREAD / max(1, len(group) - 1)) * span
        # pruned leftmost, kept rightmost (the cut's tie-break decided between them), then by rank
        ordered = sorted(group, key=lambda kx: (OUTCOME_ORDER[reasons[kx[0]].outcome], -order[kx[0]]))
        drawn = {k: centre + (j - (len(ordered) - 1) / 2) * step for j, (k, _) in enumerate(ordered)}
        # a tie on one side of the cut stays there: spread, its dots move by the least that keeps them on it
        scores = [x for _, x in group]
        if min(scores) >= view.cut:
            drawn = {k: x + max(0.0, min(scores) - min(drawn.values())) for k, x in drawn.items()}
        elif max(scores) < view.cut:
            drawn = {k: x + min(0.0, max(scores) - max(drawn.values())) for k, x in drawn.items()}
        for k, x in drawn.items():
            shown[k], group_of[k] = x, i
    cut = view.cut
    kept = [k for k in view.survivors if k in shown]
    pruned = [k for k in view.pruned if k in shown]
    if kept and pruned:
        lowest, highest = min(kept, key=shown.get), max(pruned, key=shown.get)
        if group_of[lowest] == group_of[highest] and shown[highest] < shown[lowest]:  # the cut falls inside a tie
            cut = (shown[highest] + shown[lowest]) / 2
    return shown, cut


def count_clauses(view: DecisionPoint) -> list[str]:
    """The caption's counts, each with its own reason: kept, pruned below the cut, halted by the KV budget, drawn
    at random, finished below the cut; then what the scores said (a tie, a coin toss, or how many could not be
    told apart from the cut). Clauses with a zero count are left out."""
    forced, undecided = set(view.forced), set(view.undecided)
    drawn = [k for k in view.pruned if k in undecided and k not in forced and view.undecided_rule in ("random", "defer")]
    below = [k for k in view.pruned if k not in forced and k not in drawn]
    parts = [f"{len(view.survivors)} of {len(view.contenders)} kept"]
    for count, why in ((len(below), "pruned below the cut"), (len(view.forced), "halted by the KV budget"),
                       (len(drawn), "pruned by a random draw"), (len(view.retired), "finished below the cut, still eligible")):
        if count:
            parts.append(f"{count} {why}")
    return parts


def round_caption(view: DecisionPoint, rounds: int | None = None, bon_best: int | None = None,
                  pruned_before: dict[int, int] | None = None, *, reward: str) -> str:
    """One line for a decision point, from the run's data: e.g. 'Round 2 of 3 · after 51 tokens · 10 of 13 kept ·
    3 pruned below the cut · Best-of-N's pick still in'. ``rounds``: how many the run has (unknown while it runs);
    ``bon_best``: Best-of-N's returned candidate (known once it ran); ``pruned_before``: candidate -> the round that
    pruned it, for the rounds before this one; ``reward``: the run's reward, whose words a cut among scores all
    alike takes (``tie_text``): required, so that the live caption and the final one give one reason."""
    parts = [f"Round {view.round}" + (f" of {rounds}" if rounds else ""), f"after {view.tokens} tokens",
             *count_clauses(view)]
    marked = marked_undecided(view)
    if view.tied:
        parts.append(tie_text(view, reward, short=True))
    elif coin_toss(view):
        parts.append(coin_toss_text(view, short=True))
    elif marked:
        parts.append(f"{len(marked)} within the noise: {UNDECIDED_DONE[view.undecided_rule]}")
    if bon_best is not None:
        pick = "Best-of-N's pick"
        if bon_best in view.survivors:
            parts.append(f"{pick} still in")
        elif bon_best in view.pruned:
            parts.append(f"{pick} pruned here")
        elif bon_best in view.retired:
            parts.append(f"{pick} finished below the cut, still eligible")
        elif (pruned_before or {}).get(bon_best):
            parts.append(f"{pick} pruned in round {pruned_before[bon_best]}")
        else:
            parts.append(f"{pick} had finished before")
    return " · ".join(parts)


def run_captions(comp: Any) -> list[str]:
    """The caption of every decision point of a finished comparison's Speculative Rejection run, in order."""
    views, before = round_views(comp.speculative), {}
    # Best-of-N's winner is in this run only if its candidate came out the same here (coupling held for it)
    winner = comp.bon.best_id if comp.twin(comp.bon.best_id) else None
    captions = []
    for v in views:
        captions.append(round_caption(v, len(views), winner, before, reward=comp.speculative.reward))
        before.update({k: v.round for k in v.pruned})
    return captions


def _traces(views: Sequence[DecisionPoint], n: int, comp: Any = None, reward: str = "") -> list[go.Scatter]:
    """The frame of the last of ``views``: survived, pruned, cut, retired, pruned earlier, the cost
    ring, the undecided mark and the two shape keys, always these nine traces, so animation frames line up.
    ``comp`` (a finished Comparison) adds the cost ring; live frames have no Best-of-N yet."""
    view = views[-1]
    traces = []
    x_range = _x_range(views)
    final, reasons = set(view.final), point_reasons(view, reward)
    scores, cut = _spread(view, (x_range[1] - x_range[0]) / (1 + 2 * 0.08) if x_range else 1.0)
    # The pruned take the colour of their fate, "pruned in round r", as in every other view.
    groups = (("survived", view.survivors, SURVIVED_COLOR), ("pruned", view.pruned, fate_color(pruned_in(view.round))),
              (RETIRED_NAME, view.retired, FINISHED_EARLY_COLOR))
    for name, ids, color in groups:
        # still-generating ones first: plotly's legend draws a trace's first marker, and the shape keys say a
        # circle is a partial reward, so "survived" is not keyed with a finished candidate's diamond
        ids = sorted((k for k in ids if k in scores), key=lambda k: k in final)
        traces.append(go.Scatter(
            x=[scores[k] for k in ids], y=ids, mode="markers", name=name,
            marker=dict(color=color, size=11, line=dict(width=1, color="white"),
                        symbol=[FINAL_SYMBOL if k in final else PARTIAL_SYMBOL for k in ids]),
            customdata=[[reasons[k].text()] for k in ids],
            hovertemplate="candidate %{y}: " + name + "<br>%{customdata[0]}<extra></extra>"))
        if name in PRESENTER_NAMES:
            presenter_name(traces[-1], PRESENTER_NAMES[name])
    traces.insert(2, go.Scatter(x=[cut, cut], y=[-0.5, n - 0.5], mode="lines", name="cut",
                                line=dict(color=CUT_COLOR, dash="dash", width=2), hoverinfo="skip"))
    earlier = _earlier(views, reward)
    traces.append(go.Scatter(
        x=[s for s, _ in earlier.values()], y=list(earlier), mode="markers", name="pruned earlier",
        marker=dict(color=EARLIER_COLOR, size=9, symbol=PARTIAL_SYMBOL, opacity=0.6),
        customdata=[[why] for _, why in earlier.values()], hovertemplate="candidate %{y}<br>%{customdata[0]}<extra></extra>"))
    costly = [k for k in view.pruned if comp is not None and pruning_cost(comp, k)]
    traces.append(presenter_name(go.Scatter(
        x=[scores[k] for k in costly], y=costly, mode="markers", name=COST_NAME,
        marker=ring("circle-open", "#000000", 20, 2.5),
        customdata=[[pruning_cost(comp, k)] for k in costly],
        hovertemplate="candidate %{y}: %{customdata[0]}<extra></extra>"), PRESENTER_NAMES[COST_NAME]))
    undecided = [k for k in marked_undecided(view) if k in scores]  # none in a coin toss: the title says it
    traces.append(go.Scatter(
        x=[scores[k] for k in undecided], y=undecided, mode="markers", name=UNDECIDED_NAME,
        marker=ring("square-open", UNDECIDED_COLOR, 17, 2),
        customdata=[[reasons[k].text()] for k in undecided],
        hovertemplate="candidate %{y}: %{customdata[0]}<extra></extra>"))
    # The shape keys only when both shapes are drawn: a lone shape needs no key.
    both = any(k in final for k in view.contenders) and any(k not in final for k in view.contenders)
    traces += shape_keys(visible=both)
    return traces


def _shown_in_legend(trace: go.Scatter) -> bool:
    """A legend entry only for a trace with marks (or a shape key whose shape is drawn)."""
    return trace.visible is not False and (trace.x is None or len(trace.x) > 0)


def _title(view: DecisionPoint, reward: str = "") -> str:
    """The frame's title: the round and its decision point in the round caption's words, then its counts, each with
    its own reason (``count_clauses``), or what a cut among scores that were all alike says. The first line ends
    with its "·", so that the clauses stay apart where a view wraps the title again (style.unwrap)."""
    said = tie_text(view, reward) or (coin_toss_text(view) if coin_toss(view) else "")
    return (f"Round {view.round} · after {view.tokens} tokens ·<br>"
            + (said[0].upper() + said[1:] if said else " · ".join(count_clauses(view))))


def _layout(fig: go.Figure, n: int, x_range: list[float] | None, reward: str = "") -> None:
    # One row per candidate: the plot area grows with N so that the ids stay readable; the
    # figure adds the margins its title, legend, axis title and slider need (style.fit_margins).
    styled(fig)
    unit = f" ({reward_scale(reward).unit})" if reward else ""
    axis_titles(fig, "score at the decision point" + unit, "candidate")
    margin = fig.layout.margin
    plot_px = min(800, max(260, ROW_PX * n + 40))
    fig.update_layout(height=plot_px + margin.t + margin.b)
    fit_margins(fig)  # again: the title's and the legend's places depend on the height
    fig.update_yaxes(range=[n - 0.5, -0.5], dtick=1 if n <= 32 else None, zeroline=False)
    if x_range:
        fig.update_xaxes(range=x_range)


def round_figure(view: DecisionPoint | None, n: int, x_range: list[float] | None = None,
                 title_prefix: str = "", earlier: Sequence[DecisionPoint] = (), comp: Any = None,
                 reward: str = "") -> go.Figure:
    """One decision point: every contender at the score it was ranked by, coloured by whether it
    survived, with the cut as a dashed line and the candidates pruned at ``earlier`` decision points
    greyed. ``view=None`` draws the empty frame of a run that has not reached its first decision point."""
    fig = go.Figure()
    if view is None:
        fig.update_layout(title="Waiting for the first decision point…")
        _layout(fig, n, x_range, reward)
        return fig
    views = [*earlier, view]
    for t in _traces(views, n, comp, reward):
        fig.add_trace(t.update(showlegend=_shown_in_legend(t)))
    fig.update_layout(title=title_prefix + _title(view, reward))
    _layout(fig, n, x_range or _x_range(views), reward)
    return fig


def rounds_animation(run: RunResult, active: int = 0, comp: Any = None) -> go.Figure:
    """A finished run's decision points in one figure, with a slider over rounds; ``active`` is the
    index of the round shown.

    Every round has its own traces and the slider only toggles which are visible, so the figure
    needs no plotly animation frames: Gradio's plot component drops frames, and a Play control can
    step through rounds by re-sending the figure with another ``active`` round. One x range for all
    rounds, so a candidate's move from round to round is a move on the page."""
    views, n = round_views(run), len(run.candidates)
    if not views:
        fig = go.Figure()
        fig.update_layout(title="No decision point in this run: every candidate finished before the first one")
        _layout(fig, n, None, run.reward)
        return fig
    active = max(0, min(active, len(views) - 1))
    fig = go.Figure()
    legend: list[bool] = []
    for i in range(len(views)):
        for t in _traces(views[:i + 1], n, comp, run.reward):
            legend.append(_shown_in_legend(t))
            fig.add_trace(t.update(visible=(i == active) and t.visible is not False,
                                   legendgroup=t.name, showlegend=(i == active) and legend[-1]))
    per_round = len(fig.data) // len(views)

    def showing(i: int) -> list[bool]:
        return [j // per_round == i for j in range(len(fig.data))]

    x_range = _x_range(views)
    fig.update_layout(title=_title(views[active], run.reward))
    fig.update_layout(
        sliders=[dict(active=active, x=0, len=1, pad=dict(t=0, b=0),
                      currentvalue=dict(prefix="round "),
                      steps=[dict(label=str(v.round), method="update",
                                  args=[{"visible": [s and legend[j]
                                                     for j, s in enumerate(showing(i))],
                                         "showlegend": [s and legend[j] for j, s in enumerate(showing(i))]},
                                        {"title.text": wrap_title(_title(v, run.reward))}])
                             for i, v in enumerate(views)])])
    _layout(fig, n, x_range, run.reward)
    return fig


def result_caption(comp: Any, hint: bool = True) -> str:
    """One line for a finished comparison: how many decision points, what Speculative Rejection returned
    against Best-of-N's pick, and (``hint``) how to step through its rounds."""
    rounds, sbon, bon = len(comp.speculative.decision_points), comp.speculative.best_id, comp.bon.best_id
    if not rounds:
        return ("No decision point in this run: Speculative Rejection was Best-of-N here, so there are no rounds "
                "to present")
    same = ("the answer Best-of-N picks" if comp.speculative.best.text == comp.bon.best.text else
            f"Best-of-N picks candidate {bon}" if sbon != bon else "Best-of-N picks its own, different version of it")
    return (f"After {rounds} decision point{'s' if rounds > 1 else ''}: Speculative Rejection returned candidate "
            f"{sbon}, {same}" + (" · press ▶ Present rounds to step through them" if hint else ""))


def present_steps(comp: Any) -> int:
    """Steps of "Present rounds" on a finished comparison: one per decision point, then its result."""
    return len(comp.speculative.decision_points) + 1 if comp.speculative.decision_points else 0


# An answer's excerpt on the result step: lines that fit a projector's width where the chart's width is unknown, at most
# ANSWER_MAX_CHARS where it is known (a longer line is hard to follow across a screen), ANSWER_LINES of them.
ANSWER_CHARS, ANSWER_MAX_CHARS, ANSWER_LINES = 72, 96, 3


def answers_figure(comp: Any, chars: int | None = None) -> go.Figure:
    """The end of a run on the projector: the answer each method returned (label, then its first lines), Best-of-N's
    first, as text on a figure in the live chart's place; lines of at most ``chars`` characters (the chart's width,
    where known: a phone's is narrower than a projector's), ANSWER_MAX_CHARS at most; else ANSWER_CHARS."""
    from .tables import returned_texts  # the same labels and texts as the Savings tab's boxes

    chars = min(ANSWER_MAX_CHARS, chars) if chars else ANSWER_CHARS
    bon_label, bon_text, sbon_label, sbon_text = returned_texts(comp)
    fig = go.Figure()
    for i, (label, text) in enumerate(((bon_label, bon_text), (sbon_label, sbon_text))):
        lines = textwrap.wrap(" ".join(text.split()), chars) or ["(empty)"]
        excerpt = "<br>".join(html.escape(line, quote=False) for line in lines[:ANSWER_LINES]) + (" …" if len(lines) > ANSWER_LINES else "")
        title = "<br>".join(html.escape(line, quote=False) for line in textwrap.wrap(label, chars))
        fig.add_annotation(text=f"<b>{title}</b><br>{excerpt}", x=0, xref="paper", xanchor="left",
                           y=1 - 0.52 * i, yref="paper", yanchor="top", showarrow=False, align="left",
                           font=dict(size=16))
    styled(fig, "", height=320, top=10)
    fig.update_layout(margin=dict(l=10, r=10, t=10, b=10))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def result_lines(comp: Any) -> str:
    """The result step's caption: the headline's first two statements (a broken coupling first), from the headline
    itself (sbon.analysis.comparison.headline_text's key phrases), so the projector says what the page says."""
    from sbon.analysis.comparison import coupling_note, headline_text

    marked = re.findall(r"\x00(.*?)\x01", headline_text(comp, strong=lambda text: f"\x00{text}\x01"))
    lines = [coupling_note(comp)] if coupling_note(comp) else []
    return " · ".join((lines + marked)[:2])


def present_step(comp: Any, step: int, chars: int | None = None) -> tuple[go.Figure, str]:
    """(frame, caption) of step ``step`` of "Present rounds": decision point ``step`` (0-based) drawn as the
    live view drew it, on one x range for all rounds so a move is a move on the page; the last step is the
    run's result: the answer each method returned (in lines of ``chars``), under the headline's first two
    statements."""
    views = round_views(comp.speculative)
    step = max(0, min(step, len(views)))
    if step == len(views):
        return answers_figure(comp, chars), f"Result · {result_lines(comp)}"
    fig = round_figure(views[step], comp.n, _x_range(views), earlier=views[:step], comp=comp, reward=comp.speculative.reward)
    return fig, run_captions(comp)[step]
