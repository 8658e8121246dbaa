"""The app's one plot style: layout, colours and marker symbols every figure uses.

Sized for the worst screens the page is shown on: a phone (390 px wide) and a projector at 150 %
zoom. Plotly never wraps a title, an axis title or a legend row to the plot's width, and on a
narrow plot it clips them or lays the legend over the title. So titles and axis titles are wrapped
into short lines, the legend sits in its own band between the title and the plot, and the margins
are computed from how many lines each needs on a phone-wide plot.
"""

from __future__ import annotations

import math
import textwrap

import plotly.graph_objects as go

SURVIVED_COLOR, FINISHED_EARLY_COLOR = "#2a9d8f", "#457b9d"
# One warm colour per round, so the rounds stay apart even in a long run.
PRUNED_COLORS = ("#e76f51", "#f4a261", "#e9c46a", "#d62828", "#9d4edd", "#bc6c25", "#6d597a", "#b5838d")
BON_COLOR = "#adb5bd"
EARLIER_COLOR = "#ced4da"  # candidates pruned at an earlier decision point, still drawn
CUT_COLOR = "#264653"
PARTIAL_SYMBOL, FINAL_SYMBOL = "circle", "diamond"

FONT_SIZE = 14  # tick labels; readable from the back of a lecture room
TITLE_SIZE = 15
LEGEND_SIZE = 13
TITLE_CHARS = 40  # characters per title line that fit a phone-wide plot at TITLE_SIZE
AXIS_TITLE_CHARS = 30
LINE_PX = 20  # one line of title or axis title
NARROW_PLOT_PX = 230  # the plot area's width on a phone: legend rows are packed for it
CHAR_PX = 7.5  # mean character width at LEGEND_SIZE, rounded up
LEGEND_ITEM_PX = 60  # a legend item's symbol and gaps, rounded up
TICKS_PX = 34  # tick labels under the plot
TITLE_TOP_PX = 8  # the title's distance from the figure's top
TITLE_ASCENT_PX = 14  # a title line's height above its baseline at TITLE_SIZE
LEGEND_ROW_PX = 30  # one row of legend entries
MIN_PLOT_PX = 220  # the plot area never shrinks below this: the figure grows instead
TITLE_LEFT_PX = 8  # the title starts this far from the figure's left edge (on a phone)
NARROW_FIGURE_PX = 326  # a phone-wide figure


def wrap_title(title: str, width: int = TITLE_CHARS) -> str:
    """The title in lines of at most ``width`` characters (existing <br> breaks are kept)."""
    return "<br>".join(line for part in title.split("<br>") for line in (textwrap.wrap(part, width) or [""]))


def _lines(text: str | None) -> int:
    return text.count("<br>") + 1 if text else 0


def legend_rows(fig: go.Figure) -> int:
    """Rows the legend needs on a phone-wide plot. Plotly lines a wrapping horizontal legend up in
    columns as wide as its widest entry, so that width decides how many fit a row."""
    names = [t.name for t in fig.data if t.showlegend is not False and t.visible is not False and t.name]
    if not names:
        return 0
    column = LEGEND_ITEM_PX + CHAR_PX * max(map(len, names))
    per_row = max(1, int(NARROW_PLOT_PX // column))
    return math.ceil(len(names) / per_row)


def fit_margins(fig: go.Figure, bottom_extra: int = 0) -> go.Figure:
    """Margins with room for every title line, the legend's rows (between the title and the plot)
    and the x-axis title's lines; called again whenever one of them changes."""
    title = fig.layout.title.text if fig.layout.title else None
    x_title = fig.layout.xaxis.title.text if fig.layout.xaxis and fig.layout.xaxis.title else None
    legend_px = legend_rows(fig) * LEGEND_ROW_PX
    top = TITLE_TOP_PX + 4 + _lines(title) * LINE_PX + legend_px + (8 if legend_px else 0)
    bottom = TICKS_PX + _lines(x_title) * LINE_PX + 10 + bottom_extra
    top = max(top, 30)
    fig.update_layout(height=max(fig.layout.height or 450, top + bottom + MIN_PLOT_PX),
                      margin=dict(l=70, r=20, t=top, b=bottom),
                      legend=dict(orientation="h", x=0, xanchor="left", y=1, yanchor="bottom",
                                  font=dict(size=LEGEND_SIZE)))
    if title:
        # At the figure's top, in pixels turned into the figure's fraction (plotly ignores a title's pad
        # with some anchors, and a paper-based y cannot pass 1); the legend band lies under it.
        height = fig.layout.height or 450
        # Plotly anchors a multi-line title by its first line's baseline and lets further lines run
        # below it, so the baseline goes one line's ascent under the wanted top.
        fig.update_layout(title=dict(x=TITLE_LEFT_PX / NARROW_FIGURE_PX, xref="container", xanchor="left",
                                     y=1 - (TITLE_TOP_PX + TITLE_ASCENT_PX) / height, yref="container",
                                     yanchor="bottom", font=dict(size=TITLE_SIZE)))
    return fig


def styled(fig: go.Figure, title: str = "", height: int = 440, top: int = 70) -> go.Figure:
    """White background, projector-sized fonts, a wrapped title, and margins that fit them.
    ``top`` is kept for callers; the margins are computed (fit_margins)."""
    fig.update_layout(template="plotly_white", height=height, font=dict(size=FONT_SIZE))
    title = title or (fig.layout.title.text or "")
    if title:
        fig.update_layout(title=dict(text=wrap_title(title)))
    return fit_margins(fig)


def axis_titles(fig: go.Figure, x: str | None = None, y: str | None = None) -> go.Figure:
    """Axis titles wrapped to fit a phone-wide plot, and the margins refitted."""
    if x is not None:
        fig.update_xaxes(title=wrap_title(x, AXIS_TITLE_CHARS))
    if y is not None:
        fig.update_yaxes(title=wrap_title(y, AXIS_TITLE_CHARS))
    return fit_margins(fig)


def legend_below(fig: go.Figure) -> go.Figure:
    """Kept for callers: the legend's place is fixed by fit_margins."""
    return fit_margins(fig)
