"""Plotly figures of a finished comparison: partial vs final reward, savings, and the trade-off."""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sbon.analysis.comparison import Comparison
from sbon.analysis.counterfactual import tradeoff_grid
from sbon.metrics import decision_quality
from sbon.models import reward_title
from sbon.results import PHASES

from .fates import fate_color, fate_order
from .page_text import machine_words
from .reasons import decimals, point_reasons, pruning_cost, reward_scale
from .rounds import COST_NAME
from .style import (BON_COLOR, CHAR_PX, FINAL_SYMBOL, LEGEND_SIZE, LINE_PX, MIN_PLOT_PX, NARROW_PLOT_PX, PARTIAL_SYMBOL,
                    axis_titles, id_dtick, ring, shape_keys, styled)

ALPHAS = tuple(round(a, 2) for a in np.arange(0.1, 0.95, 0.1))  # rejection rates of the trade-off grid


def empty_figure(message: str, height: int = 300) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = styled(go.Figure(), "", height)
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=16))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def snippet(text: str, limit: int = 90) -> str:
    """Model text for a hover label: shortened and HTML-escaped (plotly renders some tags)."""
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return html.escape(text).replace("\n", " ⏎ ")


def _fmt(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


# -- Figure 2: partial vs final reward ----------------------------------------------------------

def decision_point_choices(comp: Comparison) -> list[tuple[str, int]]:
    """(label, round) of every decision point of the SBoN run."""
    return [(f"round {p.round} · after {p.tokens} tokens", p.round) for p in comp.speculative.decision_points]


def partial_final_scatter(comp: Comparison, round: int = 1) -> go.Figure:
    """One point per contender of decision point ``round``: the reward it was ranked by on x, its
    final reward on y (from Best-of-N for pruned candidates, which never finished), coloured by
    fate. Candidates already finished at the decision point were ranked by their final reward and
    sit on the diagonal as diamonds; the correlations count only partial rewards."""
    points = {p.round: p for p in comp.speculative.decision_points}
    if round not in points:
        return empty_figure("No decision point in this run: every candidate finished before the first one.")
    point = points[round]
    cands = comp.speculative.candidates
    reasons = point_reasons(point, comp.speculative.reward)
    rows = []
    for k, score in zip(point.contenders, point.scores):
        rows.append(dict(id=k, fate=comp.speculative.fate(k), finished=k in point.final, x=score, y=comp.final_reward(k),
                         source="own" if cands[k].final_reward is not None else "from Best-of-N",
                         reason=reasons[k].text(), cost=pruning_cost(comp, k) if k in point.pruned else "",
                         text=snippet(cands[k].text)))
    df = pd.DataFrame(rows)
    live = df[~df.finished & df.y.notna()]
    # the page's one Pearson and Kendall of this decision point (sbon.metrics.decision_quality), as the headline states them
    corr = next(q for q in decision_quality(comp.bon, comp.speculative) if q["round"] == round)
    dx, dy = decimals(df.x), decimals(df.y)
    fig = go.Figure()
    for name in fate_order(set(df.fate)):
        part = df[df.fate == name]
        fig.add_trace(go.Scatter(
            x=part.x, y=part.y, mode="markers", name=name,
            marker=dict(color=fate_color(name), size=12, line=dict(width=1, color="white"),
                        symbol=[FINAL_SYMBOL if f else PARTIAL_SYMBOL for f in part.finished]),
            customdata=np.stack([part.id, part.source, part.text, part.reason, part.cost], axis=-1),
            hovertemplate=("candidate %{customdata[0]}: " + name + "<br>%{customdata[3]}<br>"
                           f"final reward %{{y:.{dy}f}} (%{{customdata[1]}})<br>%{{customdata[4]}}"
                           "<br>%{customdata[2]}<extra></extra>")))
    costly = df[df.cost != ""]
    fig.add_trace(go.Scatter(x=costly.x, y=costly.y, mode="markers", name=COST_NAME, hoverinfo="skip",
                             showlegend=not costly.empty,
                             marker=ring("circle-open", "#000000", 22, 2.5)))
    both = not live.empty and bool(df.finished.any())  # a lone shape needs no key
    if both:
        fig.add_traces(shape_keys())
    fig.add_vline(x=point.cut, line=dict(color="#264653", dash="dash", width=2),
                  annotation_text=f"cut {point.cut:.{dx}f}", annotation_position="top left")
    styled(fig, f"Partial vs final reward at round {round} (after {point.tokens} tokens) · "
               f"Pearson {_fmt(corr['pearson'])} · Kendall {_fmt(corr['kendall'])} · {len(live)} partial rewards",
           height=480)
    scale = reward_scale(comp.speculative.reward)
    fig.update_xaxes(tickformat=f".{dx}f")
    fig.update_yaxes(tickformat=f".{dy}f")
    axis_titles(fig, f"score at the decision point ({scale.unit})", f"final reward ({reward_title(comp.speculative.reward)})")
    return fig


# -- savings ----------------------------------------------------------------------------------------

def tokens_per_candidate(comp: Comparison) -> go.Figure:
    """Tokens each candidate generated under Best-of-N and under Speculative Rejection."""
    ids = list(range(comp.n))
    sb = comp.speculative.candidates
    fig = go.Figure()
    twins = [k for k in ids if comp.twin(k)]
    fig.add_trace(go.Bar(x=twins, y=[comp.bon.candidates[k].tokens_generated for k in twins], name="Best-of-N",
                         marker_color=BON_COLOR))
    # One bar trace per fate, so each colour has its legend entry; offsetgroup keeps them beside Best-of-N's bars.
    fates = {c.id: comp.speculative.fate(c.id) for c in sb}
    for fate in fate_order(set(fates.values())):
        ids_ = [k for k in ids if fates[k] == fate]
        fig.add_trace(go.Bar(x=ids_, y=[sb[k].tokens_generated for k in ids_], name=fate,
                             marker_color=fate_color(fate), offsetgroup="sbon",
                             hovertemplate="candidate %{x}: %{y} tokens<extra>" + fate + "</extra>"))
    fig.data[0].update(offsetgroup="bon")
    parted = comp.diverged_ids  # Best-of-N's candidate k is another text there: its bar says so, hatched
    if parted:
        fig.add_trace(go.Bar(x=parted, y=[comp.bon.candidates[k].tokens_generated for k in parted],
                             name="Best-of-N: a different text", marker=dict(color=BON_COLOR, pattern_shape="/"),
                             offsetgroup="bon",
                             hovertemplate="candidate %{x}: %{y} tokens in Best-of-N's run, another text than "
                                           "Speculative Rejection's candidate %{x}<extra></extra>"))
    m = comp.metrics
    styled(fig, f"Tokens generated: Best-of-N {m['bon_tokens']} (grey bars) · Speculative Rejection {m['sbon_tokens']} "
               f"(bars coloured by fate; {m['token_rate']:.0%} of Best-of-N's)", height=380)
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_xaxes(dtick=id_dtick(comp.n))
    axis_titles(fig, "candidate", "tokens generated")
    return fig


def phase_times(comp: Comparison) -> go.Figure:
    """Wall time of each run, split into prefill, decode, reward and rejection."""
    fig = go.Figure()
    colors = dict(prefill="#8ecae6", decode="#219ebc", reward="#ffb703", rejection="#fb8500")
    runs = (("Best-of-N", comp.bon), ("Speculative Rejection", comp.speculative))
    for phase in PHASES:
        fig.add_trace(go.Bar(y=[label for label, _ in runs], x=[r.timings.get(phase, 0.0) for _, r in runs],
                             name=phase, orientation="h", marker_color=colors[phase],
                             hovertemplate="%{y}: %{x:.2f} s<extra>" + phase + "</extra>"))
    where = f" on {machine_words(comp.speculative.machine)}" if comp.speculative.machine else " (machine not recorded)"
    styled(fig, f"Wall time{where}: Best-of-N {comp.bon.wall_time:.1f} s · Speculative Rejection "
               f"{comp.speculative.wall_time:.1f} s (speedup {comp.metrics['speedup']:.2f}×)", height=260)
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    axis_titles(fig, "seconds")
    return fig


# -- Figure 3: the trade-off --------------------------------------------------------------------------

def tradeoff_table(comp: Comparison, alphas: tuple[float, ...] = ALPHAS) -> pd.DataFrame:
    """Normalized score and token rate of the single-decision-token method replayed on the Best-of-N
    candidates, for every (tau, alpha): no new generation."""
    if not comp.partials:
        return pd.DataFrame(columns=["tau", "alpha", "normalized_score", "token_rate"])
    return tradeoff_grid(comp.bon, comp.partials, alphas, comp.uncertainties, comp.speculative.settings.get("undecided", "paper"))


def tradeoff_figure(comp: Comparison, kind: str = "curves", alphas: tuple[float, ...] = ALPHAS) -> go.Figure:
    """``kind="curves"``: normalized score against token rate, one curve per decision token tau
    (alpha varies along it), with this run as a star. ``kind="heatmap"``: normalized score over
    (alpha, tau), each cell labelled with its token rate."""
    grid = tradeoff_table(comp, alphas)
    if grid.empty:
        return empty_figure("No prefix of Best-of-N's candidates was scored: the run was too short, or stopped before.")
    if kind == "heatmap":
        table = grid.pivot(index="tau", columns="alpha", values="normalized_score")
        rates = grid.pivot(index="tau", columns="alpha", values="token_rate")
        fig = go.Figure(go.Heatmap(
            z=table.values, x=[f"{a:.1f}" for a in table.columns], y=[str(t) for t in table.index],
            colorscale="Viridis", colorbar=dict(title="normalized<br>score"),
            text=[[f"{r:.2f}" for r in row] for row in rates.values], texttemplate="%{text}",
            customdata=rates.values,
            hovertemplate="α %{x}, τ %{y}<br>normalized score %{z:.1f}<br>token rate %{customdata:.2f}<extra></extra>"))
        styled(fig, "Trade-off (replayed on the Best-of-N candidates): normalized score; cells show the token rate")
        fig.update_xaxes(type="category")
        fig.update_yaxes(type="category")
        axis_titles(fig, "rejection rate α", "decision token τ")
        return fig
    fig = go.Figure()
    m = comp.metrics
    x_range = _around([*grid.token_rate, m["token_rate"]], LABEL_CELL[0] / 2)  # room for a label's half either side
    y_range = _fit([*grid.normalized_score, m["normalized_score"]])
    labels = _free_labels(grid, x_range, y_range)
    for tau, part in grid.groupby("tau"):
        fig.add_trace(go.Scatter(x=part.token_rate, y=part.normalized_score, mode="lines+markers+text", name=f"τ={tau}",
                                 customdata=part.alpha,
                                 text=[f"α {a:.1f}" if (tau, a) in labels else "" for a in part.alpha],
                                 textposition="top center", textfont=dict(size=LEGEND_SIZE),
                                 hovertemplate=f"τ={tau}, " + "α=%{customdata:.1f}<br>token rate %{x:.2f}<br>"
                                               "normalized score %{y:.1f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[m["token_rate"]], y=[m["normalized_score"]], mode="markers", name="this run",
                             marker=dict(symbol="star", size=18, color="#e63946", line=dict(width=1, color="black")),
                             hovertemplate="this run<br>token rate %{x:.2f}<br>normalized score %{y:.1f}<extra></extra>"))
    styled(fig, "Trade-off (replayed on the Best-of-N candidates): normalized score vs token rate; "
                "points are labelled with their rejection rate α where labels do not overlap (hover: every point)",
           height=480)
    fig.update_xaxes(range=x_range)
    fig.update_yaxes(range=y_range)
    axis_titles(fig, "token rate (tokens generated / Best-of-N's tokens)", "normalized score (100 = Best-of-N's best)")
    return fig


# An α label's room on the narrowest plot the page draws (a phone's: NARROW_PLOT_PX wide, MIN_PLOT_PX tall), as
# fractions of the axes' ranges: "α 0.8" at LEGEND_SIZE and a gap, one line high. One label per cell.
LABEL_CELL = ((len("α 0.8") * CHAR_PX + 8) / NARROW_PLOT_PX, LINE_PX / MIN_PLOT_PX)


def _free_labels(grid: pd.DataFrame, x_range: list[float], y_range: list[float]) -> set[tuple[int, float]]:
    """The (τ, α) points whose α label is drawn: in τ then α order, each point whose label would not
    share a cell (LABEL_CELL) with one already drawn; points that coincide (many reach 100 at once) get one."""
    x_span, y_span = x_range[1] - x_range[0], y_range[1] - y_range[0]
    taken: list[tuple[float, float]] = []
    free = set()
    for row in grid.sort_values(["tau", "alpha"]).itertuples():
        x, y = row.token_rate / x_span, row.normalized_score / y_span
        if all(abs(x - tx) >= LABEL_CELL[0] or abs(y - ty) >= LABEL_CELL[1] for tx, ty in taken):
            taken.append((x, y))
            free.add((row.tau, row.alpha))
    return free


def _around(values, room: float) -> list[float]:
    """An axis range around the values that leaves ``room`` (a fraction of the range) beyond each end."""
    lo, hi = min(values), max(values)
    span = hi - lo or max(0.1, abs(hi) * 0.05)
    pad = room * span / (1 - 2 * room)
    return [lo - pad, hi + pad]


def _fit(values, pad: float = 0.1) -> list[float]:
    """An axis range around the values, with room for the point labels above them."""
    lo, hi = min(values), max(values)
    span = hi - lo or max(1.0, abs(hi) * 0.05)
    return [lo - pad * span, hi + 2 * pad * span]
