"""Decision points as pictures: one frame per round, live or replayed.

Each frame draws one :class:`~sbon.results.DecisionPoint` as the algorithm recorded it: the
contenders, the score each was ranked by, who survived and the cut. The live view and the replay
animation are drawn by the same code from the same objects.
"""

from __future__ import annotations

import plotly.graph_objects as go

from sbon.results import DecisionPoint, RunResult, pruned_in

from .fates import fate_color
from .style import CUT_COLOR, FINAL_SYMBOL, FINISHED_EARLY_COLOR, PARTIAL_SYMBOL, SURVIVED_COLOR, styled



def round_views(run: RunResult) -> list[DecisionPoint]:
    """The decision points of a finished Speculative Rejection run."""
    return run.decision_points


def _x_range(views: list[DecisionPoint]) -> list[float] | None:
    values = [s for v in views for s in v.scores if s is not None]
    if not values:
        return None
    lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo or 1.0)
    return [lo - pad, hi + pad]


def _traces(view: DecisionPoint, n: int) -> list[go.Scatter]:
    """Survivors, pruned, the cut, and retired: always these four traces, so animation frames line up."""
    traces = []
    scores, final = view.score_of(), set(view.final)
    # The pruned take the colour of their fate, "pruned in round r", as in every other view.
    groups = (("survived", view.survivors, SURVIVED_COLOR), ("pruned", view.pruned, fate_color(pruned_in(view.round))),
              ("retired (finished, below the cut; still eligible)", view.retired, FINISHED_EARLY_COLOR))
    for name, ids, color in groups:
        ids = [k for k in ids if k in scores]
        traces.append(go.Scatter(
            x=[scores[k] for k in ids], y=ids, mode="markers", name=name,
            marker=dict(color=color, size=11, line=dict(width=1, color="white"),
                        symbol=[FINAL_SYMBOL if k in final else PARTIAL_SYMBOL for k in ids]),
            customdata=[["final reward (finished)" if k in final else f"partial reward ({view.signal})"] for k in ids],
            hovertemplate="candidate %{y}<br>%{customdata[0]}: %{x:.3f}<extra>" + name.split(" (")[0] + "</extra>"))
    traces.insert(2, go.Scatter(x=[view.cut, view.cut], y=[-0.5, n - 0.5], mode="lines", name="cut",
                                line=dict(color=CUT_COLOR, dash="dash", width=2), hoverinfo="skip"))
    return traces


def _title(view: DecisionPoint) -> str:
    return (f"Round {view.round}: decision point after {view.tokens} tokens · "
            f"kept {len(view.survivors)} of {len(view.contenders)} contenders")


def _layout(fig: go.Figure, n: int, x_range: list[float] | None, extra: int = 0) -> None:
    # One row per candidate: the figure grows with N so that the ids stay readable.
    height = min(1000, max(420, 150 + 16 * n)) + extra
    styled(fig, height=height, top=60)
    fig.update_layout(xaxis_title="reward at the decision point (● partial, ◆ final)", yaxis_title="candidate")
    fig.update_yaxes(range=[n - 0.5, -0.5], dtick=1 if n <= 32 else None, zeroline=False)
    if x_range:
        fig.update_xaxes(range=x_range)


def round_figure(view: DecisionPoint | None, n: int, x_range: list[float] | None = None,
                 title_prefix: str = "") -> go.Figure:
    """One decision point: every contender at the reward it was ranked by, coloured by whether it
    survived, with the cut as a dashed line. ``view=None`` draws the empty frame of a run that has
    not reached its first decision point yet."""
    fig = go.Figure()
    if view is None:
        fig.update_layout(title="Waiting for the first decision point…")
        _layout(fig, n, x_range)
        return fig
    fig.add_traces(_traces(view, n))
    fig.update_layout(title=title_prefix + _title(view))
    _layout(fig, n, x_range or _x_range([view]))
    return fig


def rounds_animation(run: RunResult, active: int = 0) -> go.Figure:
    """A finished run's decision points in one figure, with a slider over rounds; ``active`` is the
    index of the round shown.

    Every round has its own three traces and the slider only toggles which are visible, so the
    figure needs no plotly animation frames: Gradio's plot component drops frames, and a Play
    control can step through rounds by re-sending the figure with another ``active`` round."""
    views, n = round_views(run), len(run.candidates)
    if not views:
        fig = go.Figure()
        fig.update_layout(title="No decision point in this run: every candidate finished before the first one")
        _layout(fig, n, None)
        return fig
    active = max(0, min(active, len(views) - 1))
    fig = go.Figure()
    for i, v in enumerate(views):
        fig.add_traces([t.update(visible=i == active, legendgroup=t.name, showlegend=i == active)
                        for t in _traces(v, n)])
    per_round = len(fig.data) // len(views)

    def showing(i: int) -> list[bool]:
        return [j // per_round == i for j in range(len(fig.data))]

    # Each round gets its own x range: scores drift upwards as candidates grow, and one range for
    # all rounds would squeeze the later cuts into a sliver.
    ranges = [_x_range([v]) for v in views]
    fig.update_layout(title=_title(views[active]))
    _layout(fig, n, ranges[active], extra=60)
    fig.update_layout(
        sliders=[dict(active=active, x=0, len=1, y=-0.08, yanchor="top", currentvalue=dict(prefix="round "),
                      steps=[dict(label=str(v.round), method="update",
                                  args=[{"visible": showing(i), "showlegend": showing(i)},
                                        {"title.text": _title(v), "xaxis.range": ranges[i]}])
                             for i, v in enumerate(views)])],
        margin=dict(l=60, r=20, t=60, b=110))
    return fig
