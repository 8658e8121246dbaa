"""The app's one plot style: layout, colours and marker symbols every figure uses.

Sized for the worst screens the page is shown on: a phone (390 px wide) and a projector at 150 %
zoom. Plotly never wraps a title, an axis title or a legend row to the plot's width, and on a
narrow plot it clips them or lays the legend over the title. So titles and axis titles are wrapped
into short lines, the legend sits under the data (below the x-axis title: any room its phone-wide
rows do not need is left at the figure's foot, never between the title and the data), and the
margins are computed from how many lines each needs on a phone-wide plot.

The presenter view (:class:`Look` with ``presenter=True``) redraws any finished figure for a lecture hall:
every text at least PRESENTER_FONT_PX CSS pixels, the legend beside the data, and the figure no taller
than the window it is shown in.
"""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass, field, replace

import plotly.graph_objects as go
import plotly.io as pio

# The page's template, plotly's default in any process that draws the page's figures: plotly gives a figure its default
# template as it makes it, unchecked, where a template named on a made figure is checked and copied whole again, a
# large part of the time the page takes to draw a finished run's figures.
# Its ticks are plain decimals: plotly's own format writes small numbers with SI prefixes ("550µ" for a score of 0.00055),
# which a class reads as units.
TEMPLATE = "sbon"
pio.templates[TEMPLATE] = go.layout.Template(pio.templates["plotly_white"])
pio.templates[TEMPLATE].layout.xaxis.exponentformat = pio.templates[TEMPLATE].layout.yaxis.exponentformat = "none"
pio.templates.default = TEMPLATE

SURVIVED_COLOR, FINISHED_EARLY_COLOR = "#2a9d8f", "#457b9d"
# One warm colour per round, so the rounds stay apart even in a long run.
PRUNED_COLORS = ("#e76f51", "#f4a261", "#e9c46a", "#d62828", "#9d4edd", "#bc6c25", "#6d597a", "#b5838d")
BON_COLOR = "#adb5bd"
EARLIER_COLOR = "#ced4da"  # candidates pruned at an earlier decision point, still drawn
CUT_COLOR = "#264653"
PARTIAL_SYMBOL, FINAL_SYMBOL = "circle", "diamond"

FONT_SIZE = 16  # tick labels; readable from the back of a lecture room on a laptop screen
TITLE_SIZE = 17
LEGEND_SIZE = 15
TITLE_CHARS = 36  # characters per title line that fit a phone-wide plot at TITLE_SIZE
AXIS_TITLE_CHARS = 28
LINE_PX = 22  # one line of title or axis title
NARROW_PLOT_PX = 230  # the plot area's width on a phone: legend rows are packed for it
CHAR_PX = 8.5  # mean character width at LEGEND_SIZE, rounded up
TEXT_SLACK = 1.1  # a line of text may be this much wider than the mean width the browser measured (Look.char_em)
LEGEND_ITEM_PX = 60  # a legend item's symbol and gaps, rounded up
TICKS_PX = 36  # tick labels under the plot
TITLE_TOP_PX = 8  # the title's distance from the figure's top
TITLE_ASCENT_PX = 15  # a title line's height above its baseline at TITLE_SIZE
LEGEND_ROW_PX = 30  # one row of legend entries
MIN_PLOT_PX = 220  # the plot area never shrinks below this: the figure grows instead
TITLE_LEFT_PX = 8  # the title starts this far from the figure's left edge (on a phone)
NARROW_FIGURE_PX = 326  # a phone-wide figure
SLIDER_PX = 80  # room under the legend for a rounds slider and its current value
# The presenter view: text for a hall (a 1280×720 projector at 150 % zoom shows 853×480 CSS pixels).
PRESENTER_FONT_PX = 20  # the smallest text of a presenter-view figure, in CSS pixels
PRESENTER_SCALE = PRESENTER_FONT_PX / min(FONT_SIZE, LEGEND_SIZE)  # every size and gap of the style grows by this
PRESENTER_TITLE_CHARS = 60  # a presenter-view figure spans one column of at least 853 CSS pixels
PRESENTER_AXIS_CHARS = 44  # an x-axis title is centred on the plot area, narrower than the figure by the legend
PRESENTER_LEGEND_CHARS = 18  # characters per legend line beside the data ("pruned in round 4" on one line)
PRESENTER_MIN_PLOT_PX = 150
SHAPE_KEYS = "shape keys"  # the legend group of legend-only entries that explain a marker's shape
# Those entries: a shape and what it marks (the legend draws the shape beside the name, so the name does not repeat it),
# and the shorter name of the presenter view's legend.
PARTIAL_KEY, FINAL_KEY = "partial reward", "finished: final reward"
SHAPE_KEY_NAMES = ((PARTIAL_SYMBOL, PARTIAL_KEY, PARTIAL_KEY), (FINAL_SYMBOL, FINAL_KEY, "final reward"))


def shape_keys(visible: bool = True) -> list[go.Scatter]:
    """The legend-only entries for the two marker shapes (figures that mix them): shown only where ``visible``."""
    return [presenter_name(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                                      legendgroup=SHAPE_KEYS, visible=visible,
                                      marker=dict(color="#6c757d", size=10, symbol=symbol)), short)
            for symbol, name, short in SHAPE_KEY_NAMES]


def ring(symbol: str, color: str, size: float, width: float) -> dict:
    """A marker drawn as an outline around a point (an "-open" symbol): plotly strokes an open symbol in the marker's
    own colour (``marker.line.color`` is not used for it), so a transparent marker colour would draw nothing."""
    return dict(symbol=symbol, color=color, size=size, line=dict(width=width))


def id_dtick(n: int) -> int:
    """Every how many ids an x-axis of ``n`` candidates is labelled: every one where a phone-wide plot
    (NARROW_PLOT_PX) holds all their labels side by side, else every second, fourth, ... (a label: the widest id
    at FONT_SIZE and a gap)."""
    label_px = len(str(max(0, n - 1))) * CHAR_PX * FONT_SIZE / LEGEND_SIZE + 8
    step = 1
    while n / step * label_px > NARROW_PLOT_PX:
        step *= 2
    return step


def wrap_title(title: str, width: int = TITLE_CHARS) -> str:
    """The title in lines of at most ``width`` characters (existing <br> breaks are kept)."""
    return "<br>".join(line for part in title.split("<br>") for line in (textwrap.wrap(part, width) or [""]))


def unwrap(text: str) -> str:
    """A wrapped title (``wrap_title``) on one line again. A title whose first line ends a clause ends it with its
    " ·" before the break, so that the clauses stay apart joined again."""
    return "".join(line + ("" if line.endswith("-") else " ") for line in text.split("<br>")).strip()


def _lines(text: str | None) -> int:
    return text.count("<br>") + 1 if text else 0


def _legend_names(fig: go.Figure) -> list[str]:
    return [t.name for t in fig.data if t.showlegend is not False and t.visible is not False and t.name]


def legend_rows(fig: go.Figure) -> int:
    """Rows the legend needs on a phone-wide plot. Plotly lines a wrapping horizontal legend up in
    columns as wide as its widest entry, so that width decides how many fit a row."""
    names = _legend_names(fig)
    if not names:
        return 0
    column = LEGEND_ITEM_PX + CHAR_PX * max(map(len, names))
    per_row = max(1, int(NARROW_PLOT_PX // column))
    return math.ceil(len(names) / per_row)


def scale_of(fig: go.Figure) -> float:
    """How much larger than the page's style this figure is drawn: 1, or PRESENTER_SCALE in the presenter view."""
    size = fig.layout.font.size if fig.layout.font and fig.layout.font.size else FONT_SIZE
    return size / FONT_SIZE


def _titled_steps(fig: go.Figure) -> list[tuple[go.layout.slider.Step, str]]:
    """The slider steps that set the figure's title (``{"title.text": ...}`` in their layout arguments), each with
    that title."""
    return [(step, step.args[1]["title.text"]) for slider in fig.layout.sliders or () for step in slider.steps or ()
            if step.args and len(step.args) > 1 and isinstance(step.args[1], dict) and step.args[1].get("title.text")]


def fit_margins(fig: go.Figure, bottom_extra: int = 0) -> go.Figure:
    """Margins with room for every title line (and subplot titles over the top panels), the x-axis title's lines, the
    legend (under them, or beside the data in the presenter view) and a rounds slider (under the legend); called again
    whenever one of them or the height changes."""
    s = scale_of(fig)
    presenter = s > 1
    title = fig.layout.title.text if fig.layout.title else None
    # A rounds slider gives each of its steps its own title: the top margin fits the one with the most lines.
    title_lines = max((_lines(t) for t in (title, *(t for _, t in _titled_steps(fig))) if t), default=0)
    x_title = fig.layout.xaxis.title.text if fig.layout.xaxis and fig.layout.xaxis.title else None
    slider = SLIDER_PX * s if fig.layout.sliders else 0
    # Text set on the plot area's top edge and standing above it (make_subplots' titles over the top panels) takes a
    # line of the top margin under the title.
    over = max((_lines(a.text) for a in fig.layout.annotations or ()
                if a.yref == "paper" and a.yanchor == "bottom" and a.y is not None and a.y >= 0.999), default=0)
    top = max(30, (TITLE_TOP_PX + 4 + (title_lines + over) * LINE_PX) * s + (4 if title else 0))
    axis = (TICKS_PX + _lines(x_title) * LINE_PX) * s + 10
    names = _legend_names(fig)
    legend_px = 0 if presenter else legend_rows(fig) * LEGEND_ROW_PX * s
    bottom = axis + legend_px + slider + bottom_extra
    right = 20
    if presenter and names:  # beside the data: as wide as its widest (wrapped) line
        widest = max(len(line) for name in names for line in name.split("<br>"))
        right = int((LEGEND_ITEM_PX * 0.7 + CHAR_PX * widest) * s) + 10
    min_plot = PRESENTER_MIN_PLOT_PX if presenter else MIN_PLOT_PX
    height = max(fig.layout.height or 450, top + bottom + min_plot)
    fig.update_layout(height=height, margin=dict(l=int(70 * s), r=right, t=int(top), b=int(bottom)))
    if presenter:
        fig.update_layout(legend=dict(orientation="v", x=1.01, xanchor="left", y=1, yanchor="top", yref="paper",
                                      font=dict(size=LEGEND_SIZE * s)))
    else:
        # Under the x-axis title, its top a fixed distance from the figure's foot (container units).
        fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=(legend_px + slider + bottom_extra) / height,
                                      yref="container", yanchor="top", font=dict(size=LEGEND_SIZE * s)))
    if slider:  # under the legend
        plot_px = height - top - bottom
        fig.layout.sliders[0].update(y=-(axis + legend_px) / plot_px, yanchor="top")
    if title:
        # At the figure's top, in pixels turned into the figure's fraction (plotly ignores a title's pad
        # with some anchors, and a paper-based y cannot pass 1).
        # Plotly anchors a multi-line title by its first line's baseline and lets further lines run
        # below it, so the baseline goes one line's ascent under the wanted top.
        fig.update_layout(title=dict(x=TITLE_LEFT_PX / NARROW_FIGURE_PX, xref="container", xanchor="left",
                                     y=1 - (TITLE_TOP_PX + TITLE_ASCENT_PX * s) / height, yref="container",
                                     yanchor="bottom", font=dict(size=TITLE_SIZE * s)))
    return fig


def styled(fig: go.Figure, title: str = "", height: int = 440, top: int = 70) -> go.Figure:
    """White background, projector-sized fonts, a wrapped title, and margins that fit them.
    ``top`` is kept for callers; the margins are computed (fit_margins)."""
    fig.update_layout(height=height, font=dict(size=FONT_SIZE))  # the template is the default (TEMPLATE)
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


def _rewrap(text: str | None, width: int) -> str | None:
    """Text wrapped for a phone (``wrap_title``), re-wrapped to ``width``."""
    return wrap_title(unwrap(text), width) if text else text


@dataclass(frozen=True)
class Look:
    """How this page draws its figures: the page's style, or the presenter view's."""
    presenter: bool = field(default=False, metadata={"help": "the presenter view: type for a hall, legends beside the data"})
    screen_px: int | None = field(default=None, metadata={
        "help": "the window's height in CSS pixels: no presenter-view figure is taller"})
    live_px: int | None = field(default=None, metadata={
        "help": "the height left for the live chart under the run bar and the round caption, in CSS pixels"})
    width_px: int | None = field(default=None, metadata={
        "help": "the live chart's width in CSS pixels: its title, and text drawn as a figure (the result step's "
                "answers), wrap to it"})
    char_em: float | None = field(default=None, metadata={
        "help": "the figures' font's mean character width on English prose, in ems, as the browser measured it: the "
                "text that wraps to ``width_px`` wraps by it (else by CHAR_PX, an upper bound for common fonts)"})

    def sized(self, viewport: dict | None) -> Look:
        """This look at the window's size the browser reported (VIEWPORT_JS's numbers; left as they were where it
        reported none, as an API client does)."""
        if not isinstance(viewport, dict):
            return self
        px = {k: int(v) for k, v in viewport.items() if isinstance(v, (int, float)) and math.isfinite(v) and 0 < v < 10_000}
        em = viewport.get("char_em")
        return replace(self, screen_px=px.get("screen"), live_px=px.get("live"), width_px=px.get("width"),
                       char_em=float(em) if isinstance(em, (int, float)) and 0.2 <= em <= 1 else None)

    def char_px(self, font_px: float) -> float:
        """The width to allow per character of text at ``font_px``: the measured font's (``char_em``) with TEXT_SLACK
        for a text wider than the prose it was measured on, else CHAR_PX's."""
        return font_px * (self.char_em * TEXT_SLACK if self.char_em else CHAR_PX / LEGEND_SIZE)

    def apply(self, fig: go.Figure, live: bool = False) -> go.Figure:
        """``fig`` as this look draws it: the presenter view's text, legend and height; in the page's view, its titles
        (its own and those its rounds slider sets) in lines as wide as the live chart (``page_title``), which a tab's
        figures, the page's full width, are at least."""
        if not self.presenter:
            changed = False
            for step, title in _titled_steps(fig):
                if (text := self.page_title(title)) != title:
                    step.args, changed = (step.args[0], {**step.args[1], "title.text": text}), True
            title = fig.layout.title.text if fig.layout.title else None
            if title and (text := self.page_title(title)) != title:
                fig.update_layout(title=dict(text=text))
                changed = True
            if changed:
                fit_margins(fig)
            return fig
        if live:  # the round caption over the live chart is its title in the presenter view
            fig.update_layout(title=None)
            return live_for_presenter(for_presenter(fig, self.live_px or None, fill=True), max_height=self.live_px or None)
        return for_presenter(fig, self.screen_px or None)

    def page_title(self, title: str) -> str:
        """A figure's title as this look wraps it on the page: in lines of ``title_chars`` where that saves a line, else
        a phone's lines (wrap_title), which also break where the title itself does."""
        phone = wrap_title(title)
        wide = _rewrap(phone, self.title_chars())
        return wide if _lines(wide) < _lines(phone) else phone

    def title_chars(self) -> int:
        """Characters per title line of the live chart in the page's view: a phone's (TITLE_CHARS), or more where the
        browser reported a wider chart (a title starts TITLE_LEFT_PX of a phone-wide figure in from its left edge)."""
        if self.presenter or not self.width_px:
            return TITLE_CHARS
        room = self.width_px * (1 - TITLE_LEFT_PX / NARROW_FIGURE_PX) - TITLE_LEFT_PX
        return max(TITLE_CHARS, int(room / self.char_px(TITLE_SIZE)))

    def chars(self) -> int | None:
        """Characters of the page's text (FONT_SIZE; larger in the presenter view) per line of the live chart, or
        None where the browser reported no width."""
        if not self.width_px:
            return None
        return max(16, int((self.width_px - 24) / self.char_px(FONT_SIZE * (PRESENTER_SCALE if self.presenter else 1))))


PRESENTER_WIDTH_PX = 853  # the narrowest presenter-view window (a 1280-pixel projector at 150 %)
PRESENTER_ROW_PX = 18  # the least height of a candidate's row in the presenter view's live chart: its label still fits
PRESENTER_LIVE_TOP_PX = 8  # over the live chart's data: nothing (no title, the legend is beside it)


def presenter_name(trace: go.BaseTraceType, short: str) -> go.BaseTraceType:
    """Give ``trace`` the shorter legend name the presenter view's live chart shows (its page name stays in
    the page's views and the hover), so that the legend beside the data stays one narrow column."""
    trace.meta = {**(trace.meta if isinstance(trace.meta, dict) else {}), "presenter_name": short}
    return trace


def _without_aside(text: str) -> str:
    """``text`` without the remark in brackets it ends with, if any."""
    return re.sub(r"\s*\([^()]*\)\s*$", "", text)


def _axis_title(text: str, width: int) -> str:
    """An axis title in lines of ``width``: on one line where it fits, else without the aside in brackets it ends
    with where that fits one line, else on as many lines as it needs."""
    whole = _rewrap(text, width)
    return next((t for t in (whole, _rewrap(_without_aside(text), width)) if _lines(t) == 1), whole)


def live_for_presenter(fig: go.Figure, width_px: int = PRESENTER_WIDTH_PX, max_height: int | None = None) -> go.Figure:
    """The presenter view's live chart: exactly ``max_height`` tall (the height the window leaves it under the run bar
    and a two-line caption), its legend beside the data in one narrow column of short names (presenter_name), one line
    each, so the legend never takes height from the data; every candidate's row labelled while a row keeps
    PRESENTER_ROW_PX; the x-axis title on one line (without the aside in brackets it ends with, where only that fits),
    or none where keeping it would cost the rows their labels (the caption over the chart says what is drawn).
    Without ``max_height`` it keeps its height."""
    s = scale_of(fig)
    if not fig.data:  # text only (the result step's answers): no legend, no axes, the whole height for the text
        fig.update_layout(margin=dict(l=10, r=10, t=10, b=10))
        return fig
    for t in fig.data:
        short = t.meta.get("presenter_name") if isinstance(t.meta, dict) else None
        if short or t.name:
            t.name = short or t.name.replace("<br>", " ")
        if t.type == "scatter":  # rows as tall as a label: the first and last rows' marks reach past the plot area
            t.cliponaxis = False
    names = _legend_names(fig)
    right = int((LEGEND_ITEM_PX * 0.7 + CHAR_PX * max(map(len, names))) * s) + 10 if names else 20
    height = max_height or fig.layout.height or 450
    rows = abs(fig.layout.yaxis.range[1] - fig.layout.yaxis.range[0]) if fig.layout.yaxis.range else 0
    x = fig.layout.xaxis
    plot_width = width_px - 16 - 70 * s - right
    if x and x.title and x.title.text:
        width = max(20, int(plot_width / (CHAR_PX * s * 1.1)))
        x.title.text = _axis_title(x.title.text.replace("<br>", " "), width)
        if _lines(x.title.text) > 1 or height - PRESENTER_LIVE_TOP_PX - (TICKS_PX + LINE_PX) * s - 10 < rows * PRESENTER_ROW_PX:
            x.title.text = None
    bottom = int((TICKS_PX + _lines(x.title.text if x and x.title else None) * LINE_PX) * s * 0.85) + 6
    fig.update_layout(height=height, margin=dict(t=PRESENTER_LIVE_TOP_PX, r=right, b=bottom),
                      legend=dict(orientation="v", x=1.01, xanchor="left", y=1, yref="paper", yanchor="top",
                                  font=dict(size=LEGEND_SIZE * s), itemsizing="constant", tracegroupgap=0))
    y = fig.layout.yaxis
    if rows and y.dtick is not None:  # a row per candidate: each labelled while a row keeps PRESENTER_ROW_PX
        per_row = (height - PRESENTER_LIVE_TOP_PX - bottom) / rows
        y.dtick = 1 if per_row >= PRESENTER_ROW_PX else math.ceil(PRESENTER_ROW_PX / per_row)
    return fig


def for_presenter(fig: go.Figure, max_height: int | None = None, fill: bool = False) -> go.Figure:
    """Any of the page's finished figures redrawn for a lecture hall: every text PRESENTER_SCALE times its
    size (so none is below PRESENTER_FONT_PX), titles re-wrapped for one wide column, legend names wrapped
    beside the data, and the figure at most ``max_height`` pixels tall (its plot area shrinks, never
    below PRESENTER_MIN_PLOT_PX); ``fill``: exactly ``max_height`` tall (the live chart takes the screen it is
    given). Applied once, to a figure in the page's style."""
    if scale_of(fig) > 1:
        return fig
    s = PRESENTER_SCALE
    old = fig.layout.margin
    plot_px = (fig.layout.height or 450) - (old.t or 0) - (old.b or 0)
    fig.update_layout(font=dict(size=FONT_SIZE * s))
    if fig.layout.title and fig.layout.title.text:
        fig.update_layout(title=dict(text=_rewrap(fig.layout.title.text, PRESENTER_TITLE_CHARS)))
    for axis in (fig.layout.xaxis, fig.layout.yaxis):
        if axis and axis.title and axis.title.text:
            axis.title.text = _rewrap(axis.title.text, PRESENTER_AXIS_CHARS)
    for t in fig.data:
        if t.name:
            t.name = _rewrap(t.name, PRESENTER_LEGEND_CHARS)
        if getattr(t, "textfont", None) is not None and t.textfont.size:
            t.textfont.size = t.textfont.size * s
        if getattr(t, "marker", None) is not None and getattr(t.marker, "size", None) and \
                isinstance(t.marker.size, (int, float)):
            t.marker.size = t.marker.size * 1.3
    for a in fig.layout.annotations or ():
        a.font.size = (a.font.size or FONT_SIZE) * s
    if fig.layout.sliders:
        fig.layout.sliders[0].update(font=dict(size=FONT_SIZE * s), currentvalue=dict(font=dict(size=FONT_SIZE * s)))
    for step, title in _titled_steps(fig):  # the title each step sets, wrapped as the figure's own
        step.args = (step.args[0], {**step.args[1], "title.text": _rewrap(title, PRESENTER_TITLE_CHARS)})
    # Long axis titles and tick labels push the margins out rather than being clipped.
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    fit_margins(fig)
    m = fig.layout.margin
    height = m.t + m.b + plot_px
    if max_height:
        height = max(m.t + m.b + PRESENTER_MIN_PLOT_PX, max_height if fill else min(height, max_height))
    if not fill:  # the legend beside the data never runs below it, into the x-axis title
        lines = sum(name.count("<br>") + 1 for name in _legend_names(fig))
        height = max(height, m.t + m.b + lines * LEGEND_ROW_PX * s)
    fig.update_layout(height=height)
    fit_margins(fig)
    # Tick labels a category or id axis would crowd: at most one per label height.
    y = fig.layout.yaxis
    if y and y.dtick == 1 and y.range:
        rows = abs(y.range[1] - y.range[0])
        per_label = (FONT_SIZE * s * 1.4) / max(1.0, (height - m.t - m.b) / rows)
        y.dtick = max(1, math.ceil(per_label))
    _fit_y_title(fig)
    return fig


def _fit_y_title(fig: go.Figure) -> None:
    """The y-axis title, which stands along the plot area's height, re-wrapped to that height: on one line where it
    fits, else without the aside in brackets it ends with where that fits one line, else on as many lines as it needs
    (the left margin grows for them). Longer, it would run past the plot area, over the title or off the figure."""
    y = fig.layout.yaxis
    if not (y and y.title and y.title.text):
        return
    m = fig.layout.margin
    char_px = CHAR_PX / LEGEND_SIZE * FONT_SIZE * scale_of(fig)
    width = max(8, int((fig.layout.height - m.t - m.b) / char_px))
    y.title.text = _axis_title(y.title.text, width)
