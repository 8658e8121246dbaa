"""The presenter view and "Present rounds": what the page runs in the browser (its CSS: the sticky run bar, the
presenter view's one column and hall type; its scripts: the view follows the URL and the toggle, the window's
size for the live chart, Run bringing the chart into sight, a clicker's keys stepping through Present rounds)
and their handlers, plain data in, {page element name: value} out. app.py wires them to the page's events; the
figures for each view are drawn by components.style.Look."""

from __future__ import annotations

from typing import Any

from sbon.analysis.comparison import Comparison

from .rounds import present_step, present_steps, result_caption
from .style import Look
from .updates import Update
from .views import LIVE, NO_RUN, Shown, show

PRESENT_STEP_S = 8.0  # "Present rounds", timed (a kiosk): one round per this many seconds, time to read it aloud

# The run bar sticks to the top of the window, so Run/Stop and the race stay in view beside the
# live plot at any scroll position and zoom; plot text is sized for a projector.
CSS = """
.gradio-container { overflow: clip !important; }  /* hidden would make it a scroll box and unstick the bar */
#run-bar { position: sticky; top: 0; z-index: 50; background: var(--background-fill-primary);
           border-bottom: 1px solid var(--border-color-primary); padding: 6px 4px; align-items: center; }
#run-bar button { min-width: 6em; white-space: nowrap; }
#run-bar { flex-wrap: nowrap; gap: 8px; }
/* A window too narrow for the whole run bar and a status line beside it wraps the bar rather than cutting off its
   right end (the presenter view keeps one row: it leaves the seed and the status line out). */
@media (max-width: 1100px) { #run-bar { flex-wrap: wrap; } }
.js-plotly-plot, #live-plot, #scatter, #rounds-plot { scroll-margin-top: 90px; }  /* not under the run bar */
/* Plotly's toolbar lies over the title's first line: shown only while the pointer is on the plot, never on a phone */
.js-plotly-plot .modebar-container { opacity: 0; transition: opacity 0.2s; }
.js-plotly-plot:hover .modebar-container { opacity: 1; }
@media (max-width: 640px) { .js-plotly-plot .modebar-container { display: none; } }
body.presenter .js-plotly-plot .modebar-container { display: none !important; }  /* a hall has no use for zoom tools */
/* The seed box has no room for a label over it in the run bar: its name stands inside it, before the number. */
#seed label { display: flex; align-items: center; }
#seed input { flex: 1 1 auto; width: calc(6ch + 2em); min-width: 0; }  /* six digits: New seed's */
#seed label::before { content: "Seed"; padding-left: 8px; color: var(--body-text-color-subdued); white-space: nowrap; }
#status { min-height: 1.5em; }
#status p { margin: 0; }
.sbon-candidate p { margin: 0.3em 0; }
#round-caption { min-height: 1.6em; font-weight: 600; }
#round-caption p { margin: 0.2em 0; }
/* The presenter view (the Presenter toggle, or ?view=presenter): one column, and on a 1280×720 projector at 150 %
   (853×480 CSS px) the run bar, a two-line round caption and the whole live chart in one window, type for a hall.
   The run bar is one row (the status line is left out: the caption over the chart says where the run is), the
   caption is two lines high, the gaps are small; the live chart takes the height left under them (VIEWPORT_JS,
   components.style.Look). Gradio also adds every rule here prefixed with ".gradio-container... .contain", which
   outranks a "body.presenter" rule (and never matches one): hence the !important weights. */
body.presenter #intro, body.presenter #reward-accordion, body.presenter #seed, body.presenter #new-seed { display: none; }
body.presenter .main { padding: 2px 8px !important; max-width: none !important; }
body.presenter .contain > .column, body.presenter #live-column { gap: 4px !important; }
body.presenter #main-row { flex-direction: column; gap: 8px !important; }
body.presenter #live-column { order: -1; }
body.presenter #run-bar { flex-wrap: nowrap !important; font-size: 20px; padding: 2px 4px !important; gap: 6px !important; }
body.presenter #run-bar button { font-size: 18px; padding-top: 4px !important; padding-bottom: 4px !important; }
body.presenter #run-bar #status { display: none !important; }
#present-timed, #presenter { flex: none !important; width: auto !important; min-width: 0 !important; white-space: nowrap;
                             margin: 0 !important; }
#present-rounds { min-width: fit-content !important; }
body.presenter #round-caption, body.presenter #round-caption * { font-size: var(--caption-px, 20px) !important;
                                                                 line-height: 1.3 !important; }
body.presenter #round-caption { min-height: 0 !important; height: calc(2 * 1.3 * 20px + 2px); overflow: hidden; }
body.presenter #round-caption p { margin: 0 !important; }
body.presenter #headline *, body.presenter #run-source *, body.presenter #savings-table * { font-size: 20px !important; }
body.presenter .tab-container button, body.presenter .tabs button[role=tab] { font-size: 18px; }
/* A table's cells wrap between words, never inside one (Gradio's Markdown would break "round" as "rou|nd" in a narrow
   column); on a phone the race's and the savings table's cells pad less (and the savings table's type is smaller), so that
   their columns fit the screen with the methods' names whole. */
.prose th, .prose td, #headline th, #headline td { overflow-wrap: normal !important; word-break: normal !important; }
@media (max-width: 640px) { #headline th, #headline td { padding: 6px 8px !important; }
                            #savings-table th, #savings-table td, #savings-table .cell-wrap {
                              font-size: 12px !important; padding-left: 2px !important; padding-right: 2px !important; } }
/* The status line wraps rather than cutting a method's name ("Specul…") when the run bar is narrow. */
#status { min-width: 12em; flex: 1 1 12em !important; overflow-wrap: anywhere; }
/* A phone: the run bar wraps inside the screen, and the live chart comes right under it, before the settings. Wrapped,
   it is a quarter of a phone's height: pinned, it would lie over what the visitor scrolls to (a table's header), so
   there it scrolls away with the page. */
@media (max-width: 640px) {
  #run-bar { flex-wrap: wrap; position: static !important; }
  #run-bar > * { min-width: 0 !important; flex: 0 0 auto !important; width: auto !important; }
  #run-bar #status { flex: 1 1 100% !important; }  /* a row of its own, wrapped within the screen */
  #run-bar button { min-width: fit-content !important; padding-left: 8px; padding-right: 8px; }
  #main-row { flex-direction: column; }
  #live-column { order: -1; }
  .gradio-container, #main-row, #live-column, #settings-column { max-width: 100vw; min-width: 0 !important; }
}
"""

PLOT_FONT = '"Open Sans", verdana, arial, sans-serif'  # plotly.js's own default: the page's figures set no family
# How much of the window the live chart may take in the presenter view: from its top, with the page at its top (as
# Run and Present rounds leave it), to the window's foot. The caption over it is two lines high in that view, so the
# chart's top does not move from round to round. Also the live chart's width, and the mean character width on English
# prose of the font the browser draws the figures in, which depends on the fonts the visitor's machine has: what fits
# a line of a title or an answer drawn as a figure. Sent with every request that draws figures in a look fitted to
# the window (components.style.Look).
VIEWPORT_JS = """() => { const plot = document.querySelector('#live-plot');
  const box = plot ? plot.getBoundingClientRect() : null, top = box ? box.top + window.scrollY : 200;
  let em = null;
  try {  // a browser without a canvas to measure with (or one that refuses it) is sized without the font
    const text = document.querySelector('#live-plot svg text'), pen = document.createElement('canvas').getContext('2d');
    pen.font = '100px ' + (text ? getComputedStyle(text).fontFamily : '%s');
    const prose = 'The quick brown fox jumps over the lazy dog, then rests: a short answer to the question.';
    em = pen.measureText(prose).width / prose.length / 100;
  } catch (e) { em = null; }
  return {screen: window.innerHeight, live: Math.round(window.innerHeight - top - 4),
          width: Math.round(box && box.width ? box.width : window.innerWidth), char_em: em}; }""" % PLOT_FONT
# The view follows the URL (?view=presenter) and the toggle, which keeps the URL in step, so a reload or a
# shared link opens in the same view.
PRESENTER_JS = """(on) => { document.body.classList.toggle('presenter', on);
  const url = new URL(window.location); if (on) url.searchParams.set('view', 'presenter'); else url.searchParams.delete('view');
  window.history.replaceState(null, '', url); }"""
# Run and Present rounds bring the live chart under the run bar in the presenter view: the page's top.
SCROLL_TO_LIVE_JS = "() => { if (document.body.classList.contains('presenter')) window.scrollTo({top: 0}); }"
# A clicker or the keyboard steps through the presented rounds (→ / PageDown / space, ← / PageUp), while
# the step buttons are shown; typing in a field is left alone.
KEYS_JS = """() => { document.addEventListener('keydown', (e) => {
  if (e.target.closest('input, textarea, select, [contenteditable]')) return;
  const forward = ['ArrowRight', 'PageDown', ' '].includes(e.key), back = ['ArrowLeft', 'PageUp'].includes(e.key);
  if (!forward && !back) return;
  const button = document.querySelector(forward ? '#present-next' : '#present-prev');
  if (button && button.offsetParent) { e.preventDefault(); button.click(); } }); }"""


# The presenter view's caption box is two lines of 20 px high, so the chart under it never moves; a caption that needs
# more (many clauses, a narrow window) is set smaller, down to CAPTION_MIN_PX, rather than losing its last words.
CAPTION_MIN_PX = 15
CAPTION_FIT_JS = """() => { const box = document.querySelector('#round-caption'); if (!box) return;
  const fit = () => { box.style.removeProperty('--caption-px');
    if (!document.body.classList.contains('presenter')) return;
    for (let px = 19; px >= %d && box.scrollHeight > box.clientHeight + 1; px--) box.style.setProperty('--caption-px', px + 'px'); };
  new MutationObserver(fit).observe(box, {childList: true, subtree: true, characterData: true});
  new MutationObserver(fit).observe(document.body, {attributes: true, attributeFilter: ['class']});
  window.addEventListener('resize', fit); fit(); }""" % CAPTION_MIN_PX


def look_for(presenter: bool, viewport: dict | None) -> Look:
    """The look the page asked for: the presenter view, sized to the window the browser reported."""
    return Look(presenter=bool(presenter)).sized(viewport)


def on_presenter(presenter: bool, viewport: dict | None, comp: Comparison | None, origin: str | None, kind: str,
                 running: float | None) -> dict[str, Any]:
    """The Presenter toggle: redraw every view in the chosen look (during a run, the next frames)."""
    look = look_for(presenter, viewport)
    if comp is None or running:
        return {"look": look}
    return {**show(Shown(comp, origin or "the run shown before", kind, look=look)), "look": look}


def on_present(comp: Comparison | None, present: int | str | None, look: Look, move: int | None = None,
               loop: bool = False) -> dict[str, Any]:
    """"Present rounds": the live chart shows one decision point at a time, with its caption, as the run
    drew it; each click, key press or timer tick moves one step from ``present``, the step shown (the button,
    ``move`` None, starts at the first; the last step is the run's result; timed, it starts over). While a run
    draws its own frames (``present`` is LIVE), one line says when; without a finished run, what to do."""
    if present == LIVE:
        return {"caption": "A run is going: its rounds can be presented once its result is shown."}
    if comp is None:
        return {"caption": NO_RUN}
    steps = present_steps(comp)
    if not steps:
        return {"caption": result_caption(comp)}
    step = 0 if move is None or present is None else present + move
    step = step % steps if loop else max(0, min(step, steps - 1))
    figure, caption = present_step(comp, step, look.chars())
    return {"present": step, "live_plot": look.apply(figure, live=True), "caption": caption,
            "present_prev": Update(visible=True, interactive=step > 0),
            "present_next": Update(visible=True, interactive=step < steps - 1)}


def on_present_tick(comp: Comparison | None, present: int | str | None, look: Look) -> dict[str, Any]:
    """The kiosk's timer: the next step, round after round, then from the start again; while a run draws its
    frames, nothing (the caption is the run's)."""
    return {} if present == LIVE else on_present(comp, present, look, move=1, loop=True)


def present_move(comp: Comparison | None, present: int | str | None, look: Look, move: int) -> dict[str, Any]:
    """◀ and ▶ (and a clicker's keys): one step back or on."""
    return on_present(comp, present, look, move=move)


def on_timed(timed: bool) -> dict[str, Any]:
    """The "timed" box starts and stops the kiosk's timer."""
    return {"present_timer": Update(value=PRESENT_STEP_S, active=bool(timed))}
