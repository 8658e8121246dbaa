"""The app's one plot style: layout, colours and marker symbols every figure uses."""

from __future__ import annotations

import plotly.graph_objects as go

SURVIVED_COLOR, FINISHED_EARLY_COLOR = "#2a9d8f", "#457b9d"
# One warm colour per round, so the rounds stay apart even in a long run.
PRUNED_COLORS = ("#e76f51", "#f4a261", "#e9c46a", "#d62828", "#9d4edd", "#bc6c25", "#6d597a", "#b5838d")
BON_COLOR = "#adb5bd"
CUT_COLOR = "#264653"
PARTIAL_SYMBOL, FINAL_SYMBOL = "circle", "diamond"


def styled(fig: go.Figure, title: str = "", height: int = 440, top: int = 70) -> go.Figure:
    """White background, legend in a row above the plot, room on the left for axis labels."""
    fig.update_layout(template="plotly_white", height=height, margin=dict(l=60, r=20, t=top, b=50),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    if title:
        fig.update_layout(title=title)
    return fig
