"""One run as one self-contained HTML page ("Download as a page"): every view as a Plotly figure, the
tables, each candidate's text with why it was kept or cut, the explanations and the caption, with
Plotly's JavaScript inlined, so the file opens in a browser with no server and no network.

Model text reaches the page only escaped: tables through pandas' escaping, candidates through
``tables.candidate_detail_html`` (as on the page), Markdown through markdown-it with raw HTML off,
figure data as JSON with ``<``, ``>`` and ``&`` written as unicode escapes (no ``</script>`` can end it).
"""

from __future__ import annotations

import html
import json
from functools import lru_cache
from typing import Any

import plotly.graph_objects as go  # noqa: F401  (the figures' type)
from markdown_it import MarkdownIt
from plotly.offline import get_plotlyjs

from sbon.analysis.comparison import Comparison

from . import figures, signals_view, tables
from .rounds import round_figure, round_views, rounds_animation

MAX_PAGE_BYTES = 5_500_000  # "about 5 MB": Plotly's own script is most of it; a run's data adds a few hundred kB
_MD = MarkdownIt("commonmark", {"html": False}).enable("table")


def figures_of(comp: Comparison) -> dict[str, tuple[str, go.Figure]]:
    """The run's views, by element id: (heading, figure). The same functions as the page's views."""
    views = round_views(comp.sbon)
    first = views[0].round if views else 1
    return {
        "live-plot": ("The last decision point", round_figure(views[-1] if views else None, comp.n,
                                                               earlier=views[:-1], comp=comp, reward=comp.sbon.reward)),
        "rounds-plot": ("Rounds", rounds_animation(comp.sbon, comp=comp)),
        "scatter": ("Partial vs final reward at the first decision point", figures.partial_final_scatter(comp, first)),
        "tokens-plot": ("Tokens per candidate", figures.tokens_per_candidate(comp)),
        "times-plot": ("Wall time by phase", figures.phase_times(comp)),
        "tradeoff-plot": ("Trade-off (replayed on Best-of-N's candidates)", figures.tradeoff_figure(comp, "curves")),
        "signals-plot": ("Pruning signals on the same candidates", signals_view.cuts_figure(comp)),
    }


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element: nothing in it can close the element or open a comment."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _table(df) -> str:
    return df.to_html(index=False, border=0, classes="sbon-table", na_rep="–", escape=True)


@lru_cache(maxsize=1)
def _plotly_js() -> str:
    return get_plotlyjs()


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:auto;padding:1em;line-height:1.45}
.sbon-table{border-collapse:collapse;font-size:.85em}.sbon-table td,.sbon-table th{border:1px solid #ccc;padding:2px 6px}
section{margin:1.5em 0}details{margin:.4em 0}.caption{font-size:1.15em;font-weight:600}
pre.answer{white-space:pre-wrap;border:1px solid #ccc;border-radius:6px;padding:8px}"""


def page_html(comp: Comparison, caption: str = "", origin: str = "", reward: object = None,
              plotly_src: str | None = None, links: tuple[tuple[str, str], ...] = ()) -> str:
    """The whole page as one string. ``reward`` (optional) adds its per-instruction explanations, as on the
    page's candidate detail. ``plotly_src``: load Plotly from this address of the same server instead of inlining
    it (the app's static pages share one cached copy); ``links``: (label, address) pairs shown under the title."""
    figs = figures_of(comp)
    fig_divs, fig_scripts = [], []
    for div_id, (heading, fig) in figs.items():
        fig_divs.append(f'<section><h2>{html.escape(heading)}</h2><div id="{div_id}" class="sbon-figure"></div></section>')
        fig_scripts.append(f'{{"id": "{div_id}", "figure": {_script_json(fig.to_json())}}}')
    bon_label, bon_text, sbon_label, sbon_text = tables.returned_texts(comp)
    text_blocks = "".join(f"<h3>{html.escape(label)}</h3><pre class='answer'>{html.escape(text)}</pre>"
                          for label, text in ((bon_label, bon_text), (sbon_label, sbon_text)))
    md = "\n\n".join(p for p in (tables.run_description(comp, origin or "a saved run"), tables.headline(comp),
                                 tables.answers_checked(comp, reward), tables.prediction_report(comp)) if p)
    candidates = "".join(
        f"<details{' open' if k == tables.first_pruned(comp) else ''}><summary>{html.escape(label)}</summary>"
        f"{tables.candidate_detail_html(comp, k, reward)}</details>" for label, k in tables.candidate_choices(comp))
    notes = {"Pruning signals per decision point": _MD.render(signals_view.signals_note(comp))}  # what the rows are
    data_tables = "".join(f"<section><h2>{html.escape(h)}</h2>{notes.get(h, '')}{_table(df)}</section>" for h, df in (
        ("Every candidate", tables.candidates_table(comp)), ("Savings", tables.savings_table(comp)),
        ("Partial vs final reward of Best-of-N's candidates at each τ", tables.correlation_table(comp)),
        ("Pruning signals per decision point", signals_view.summary_table(comp))))
    # The gallery's caption (plain text) when the run is a gallery story; the headline, Markdown, is rendered once
    # in the explanations below it.
    title = f'<p class="caption" id="caption">{html.escape(caption)}</p>' if caption else ""
    # Inlined, the page forbids every request; served, it may fetch only its own server's Plotly.
    script_src = "'self' 'unsafe-inline' 'unsafe-eval'" if plotly_src else "'unsafe-inline' 'unsafe-eval'"
    plotly = f'<script src="{html.escape(plotly_src)}"></script>' if plotly_src else f"<script>{_plotly_js()}</script>"
    nav = " · ".join(f'<a href="{html.escape(href)}">{html.escape(label)}</a>' for label, href in links)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src {script_src}; style-src 'unsafe-inline'; img-src data:; font-src data:">
<title>SBoN Explorer: a saved run</title><style>{CSS}</style>
{plotly}</head><body>
<h1>SBoN Explorer: Speculative Rejection vs Best-of-N</h1>
{title}
{f'<p id="links">{nav}</p>' if nav else ""}
<section id="explanations">{_MD.render(md)}</section>
<section id="answers">{text_blocks}</section>
{"".join(fig_divs)}
{data_tables}
<section id="candidates"><h2>Candidates: why each was kept or cut</h2>{candidates}</section>
<p>Made by SBoN Explorer (Sun et al., <i>Fast Best-of-N Decoding via Speculative Rejection</i>, NeurIPS 2024).</p>
<script>
for (const spec of [{",".join(fig_scripts)}]) {{
  Plotly.newPlot(spec.id, {{...spec.figure, config: {{responsive: true, displaylogo: false}}}});
}}
</script></body></html>
"""

