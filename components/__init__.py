"""UI pieces of the SBoN Explorer: plotly figures, pandas tables, HTML snippets, run settings, and the page's
handlers.

Everything here takes plain data from ``sbon`` (a :class:`sbon.analysis.comparison.Comparison`, a
:class:`sbon.results.RunResult`, algorithm events) and returns plain values a Gradio component can show;
a handler returns them by page element name, with :mod:`components.updates`' records for what is not a
value (a dropdown's choices, a button's visibility, a notice). Nothing here imports Gradio: only
``app.py`` does, laying out the elements of those names and converting the records in one place.
``sbon`` itself knows nothing of the UI.

Vocabulary (as in ``sbon.algorithms``): a *candidate* is one sampled response; a *round* ends at a
*decision point*, where contenders are ranked by their *partial reward* (or *final reward* if they
have finished) and the lowest fraction alpha is *pruned*; the rest are *survivors*.
"""
