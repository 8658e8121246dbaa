"""The app's one plot style: layout, colours and marker symbols every figure uses.

Sized for the worst screens the page is shown on: a phone (390 px wide) and a projector at 150 %
zoom. Titles are wrapped into short lines (plotly never wraps them, and a long one is clipped on a
phone), the top margin grows with the title's lines, and the legend sits below the plot, where it
cannot cover the title.
"""

from __future__ import annotations

import textwrap

import plotly.graph_objects as go

SURVIVED_COLOR, FINISHED_EARLY_COLOR = "#2a9d8f", "#457b9d"
# One warm colour per round, so the rounds stay apart even in a long run.
PRUNED_COLORS = ("#e76f51", "#f4a261", "#e9c46a", "#d62828", "#9d4edd", "#bc6c25", "#6d597a", "#b5838d")
BON_COLOR = "#adb5bd"
EARLIER_COLOR = "#ced4da"  # candidates pruned at an earlier decision point, still drawn
CUT_COLOR = "#264653"
PARTIAL_SYMBOL, FINAL_SYMBOL = "circle", "diamond"

FONT_SIZE = 15  # tick labels and legend; readable from the back of a lecture room
TITLE_SIZE = 16
TITLE_CHARS = 40  # characters per title line that fit a phone-wide plot at TITLE_SIZE
LINE_PX = 22  # height of one title line
AXIS_ROOM_PX = 70  # tick labels and an axis title under the plot, above the legend


def wrap_title(title: str, width: int = TITLE_CHARS) -> str:
    """The title in lines of at most ``width`` characters (existing <br> breaks are kept)."""
    return "<br>".join(line for part in title.split("<br>") for line in (textwrap.wrap(part, width) or [""]))


def styled(fig: go.Figure, title: str = "", height: int = 440, top: int = 70) -> go.Figure:
    """White background, projector-sized fonts, a wrapped title with room for all its lines."""
    fig.update_layout(template="plotly_white", height=height, font=dict(size=FONT_SIZE),
                      margin=dict(l=70, r=20, t=top, b=AXIS_ROOM_PX))
    title = title or (fig.layout.title.text or "")
    if title:
        wrapped = wrap_title(title)
        lines = wrapped.count("<br>") + 1
        fig.update_layout(title=dict(text=wrapped, font=dict(size=TITLE_SIZE), x=0, xref="paper", xanchor="left",
                                     y=1, yref="container", yanchor="top", pad=dict(t=10)),
                          margin=dict(t=max(top, 20 + LINE_PX * lines)))
    legend_below(fig)
    return fig


def legend_below(fig: go.Figure) -> go.Figure:
    """A horizontal legend under the x-axis title: plotly grows the bottom margin to fit its rows,
    however many a narrow screen needs."""
    margin = fig.layout.margin
    plot_px = max(100, (fig.layout.height or 440) - (margin.t or 0) - (margin.b or 0))
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=-AXIS_ROOM_PX / plot_px, yanchor="top",
                                  font=dict(size=FONT_SIZE - 1)))
    return fig
