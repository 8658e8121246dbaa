"""What the page runs in the browser: its CSS (the sticky run bar, the presenter view's one column and hall
type) and the presenter view's scripts (the view follows the URL and the toggle, the window's size for the
live chart, Run bringing the chart into sight, a clicker's keys stepping through Present rounds). app.py
wires them to the page's events; the figures for each view are drawn by components.style.Look."""

# The run bar sticks to the top of the window, so Run/Stop and the race stay in view beside the
# live plot at any scroll position and zoom; plot text is sized for a projector.
CSS = """
.gradio-container { overflow: clip !important; }  /* hidden would make it a scroll box and unstick the bar */
#run-bar { position: sticky; top: 0; z-index: 50; background: var(--background-fill-primary);
           border-bottom: 1px solid var(--border-color-primary); padding: 6px 4px; align-items: center; }
#run-bar button { min-width: 6em; white-space: nowrap; }
#run-bar { flex-wrap: nowrap; gap: 8px; }
.js-plotly-plot, #live-plot, #scatter, #rounds-plot { scroll-margin-top: 90px; }  /* not under the run bar */
/* Plotly's toolbar lies over the title's first line: shown only while the pointer is on the plot, never on a phone */
.js-plotly-plot .modebar-container { opacity: 0; transition: opacity 0.2s; }
.js-plotly-plot:hover .modebar-container { opacity: 1; }
@media (max-width: 640px) { .js-plotly-plot .modebar-container { display: none; } }
#status { min-height: 1.5em; }
#status p { margin: 0; }
.sbon-candidate p { margin: 0.3em 0; }
#round-caption { min-height: 1.6em; font-weight: 600; }
#round-caption p { margin: 0.2em 0; }
/* The presenter view (the Presenter toggle, or ?view=presenter): one column, the run bar, the round
   caption and the live chart first, type for a hall. Its figures are drawn for it (components.style.Look). */
body.presenter #intro, body.presenter #reward-accordion, body.presenter #seed, body.presenter #new-seed { display: none; }
body.presenter #main-row { flex-direction: column; }
body.presenter #live-column { order: -1; }
body.presenter #run-bar { flex-wrap: wrap; font-size: 20px; }
body.presenter #run-bar button { font-size: 18px; }
body.presenter #status { flex-basis: 100%; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
#present-timed, #presenter { flex: none !important; width: auto !important; min-width: 0 !important; white-space: nowrap; }
#present-rounds { min-width: fit-content !important; }
body.presenter #round-caption, body.presenter #round-caption * { font-size: 20px !important; line-height: 1.3; }
body.presenter #round-caption { min-height: 2.7em; }
body.presenter #headline *, body.presenter #run-source *, body.presenter #savings-table * { font-size: 20px !important; }
body.presenter .tab-container button, body.presenter .tabs button[role=tab] { font-size: 18px; }
"""

# How much of the window the live chart may take: the window less the run bar and a two-line caption.
# Sent with every request that draws figures for the presenter view (components.style.Look).
VIEWPORT_JS = """() => { const bar = document.querySelector('#run-bar');
  const cap = document.querySelector('#round-caption');
  const caption = Math.max(cap ? cap.offsetHeight : 0, 2 * 1.3 * 20 + 8);
  const top = bar ? Math.max(bar.offsetHeight, bar.getBoundingClientRect().bottom) : 80;
  return {screen: window.innerHeight, live: Math.round(window.innerHeight - top - caption - 52)}; }"""
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
