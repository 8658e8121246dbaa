"""UI pieces of the SBoN Explorer: plotly figures, pandas tables, HTML snippets and run settings.

Everything here takes plain data from ``sbon`` (a :class:`sbon.analysis.comparison.Comparison`, a
:class:`sbon.results.RunResult`, algorithm events) and returns plain values a Gradio component
can show; only ``app.py`` knows which component shows what. ``sbon`` itself knows nothing of the UI.

Vocabulary (as in ``sbon.algorithms``): a *candidate* is one sampled response; a *round* ends at a
*decision point*, where contenders are ranked by their *partial reward* (or *final reward* if they
have finished) and the lowest fraction alpha is *pruned*; the rest are *survivors*.
"""
