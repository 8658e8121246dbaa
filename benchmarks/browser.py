"""The explorer app in a real browser: `python app.py` on a free port, and headless Chromium.

Shared by the browser test (tests/test_app_e2e.py) and the app timing (`python -m benchmarks app`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from sbon.errors import SBoNError

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# The flags the environment's probe started Chromium with: no sandbox (containers), no GPU, no network chatter.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppURL(str):
    """The app's URL, with its server's process id and log file."""
    pid: int
    log: Path


@contextmanager
def serve_app(log: Path, start_timeout_s: float = 120, env: dict[str, str] | None = None,
              args: tuple[str, ...] = ("app.py",)) -> Iterator[AppURL]:
    """Start `python app.py` in a fresh process, yield its URL once it answers, stop it afterwards.
    Its output goes to ``log``; a server that does not start raises SBoNError with the log's tail.
    ``env`` adds to the environment (e.g. SBON_CACHE for a fresh machine's empty cache); ``args``
    replace `app.py` (e.g. a script that hides packages first)."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **(env or {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = AppURL(f"http://127.0.0.1:{port}/")
    url.pid, url.log = proc.pid, log
    try:
        deadline = time.time() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise SBoNError(f"the app did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def chromium():
    """A headless Chromium browser from Playwright (``pip install playwright``) and Debian's chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SBoNError("playwright is not installed: pip install -r requirements-dev.txt") from None
    if not Path(CHROMIUM).exists():
        raise SBoNError(f"chromium is not installed at {CHROMIUM} (apt-get install chromium, or set $CHROMIUM)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# How often a wait re-checks the page. Playwright's default re-checks it at each animation frame: where a headless
# window draws no frames (a window the browser throttles, a machine too busy), such a wait is not checked again
# until its timeout, whatever the page shows meanwhile.
POLL_MS = 100


def wait_until(page, expression: str, arg: Any = None, timeout: float | None = None) -> None:
    """``page.wait_for_function``, re-checked every POLL_MS (None: Playwright's default timeout)."""
    page.wait_for_function(expression, arg=arg, timeout=timeout, polling=POLL_MS)


class Windows:
    """Browser windows kept open between uses, one per window size (and slot, for visitors side by side). Opening
    a page in one navigates it: a new document and a new Gradio session, as a new visitor gets, at about a third of
    the cost of a new browser context, whose renderer starts and compiles the page's scripts again (seconds of CPU
    per page). A use ends on a blank page, so nothing of it keeps polling the app."""

    def __init__(self, browser):
        self.browser = browser
        self._windows: dict[tuple, tuple[Any, set[str]]] = {}  # (size, ratio, slot) -> its page, its init scripts

    def open(self, url: str, size: str | tuple[int, int] = "desktop", slot: int = 0, init_script: str | None = None):
        """The window of this size (a name in SCREENS, or a CSS viewport at ratio 1) and slot, showing ``url``.
        ``init_script`` runs before the page's own scripts, in this open and every later one of the window."""
        (width, height), ratio = SCREENS[size] if isinstance(size, str) else (size, 1)
        key = (width, height, ratio, slot)
        if key not in self._windows or self._windows[key][0].is_closed():
            context = self.browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=ratio)
            self._windows[key] = (context.new_page(), set())
        page, scripts = self._windows[key]
        if init_script and init_script not in scripts:
            page.add_init_script(init_script)
            scripts.add(init_script)
        page.goto(url)
        return page

    @staticmethod
    def leave(page) -> None:
        """End a use of the window: the app's page is left (its session ends, its timers stop)."""
        if not page.is_closed():
            page.goto("about:blank")


def open_tab(page, name: str) -> None:
    """Click the page's tab called ``name``; on a narrow screen Gradio folds the last tabs into an
    overflow menu, which is opened first."""
    tab = page.get_by_role("tab", name=name)
    if tab.count() and tab.first.is_visible():
        tab.first.click()
        return
    page.get_by_label("More tabs").click()
    # The opened menu lies under the tab bar in the stacking order: click its item directly.
    page.locator(".overflow-menu button, .overflow-dropdown button", has_text=name).first.dispatch_event("click")


# -- layout checks: what a phone and a projector show ---------------------------------------------------

# The screens the page is checked on: (name, CSS viewport, device pixel ratio). A 1280×720 window at
# 150 % zoom is an 853×480 CSS viewport at ratio 1.5.
SCREENS = {"desktop": ((1440, 900), 1), "projector": ((853, 480), 1.5), "phone": ((390, 844), 2),
           "hd": ((1920, 1080), 1)}
PRESENTER = "?view=presenter"  # the URL that opens the page in the presenter view
# Every plot of the page: (name, the tab it is on or None, its element).
PLOTS = (("live", None, "#live-plot"), ("scatter", "Partial vs final reward", "#scatter"),
         ("rounds", "Rounds replay", "#rounds-plot"), ("tokens", "Savings", "#tokens-plot"),
         ("times", "Savings", "#times-plot"), ("tradeoff", "Trade-off", "#tradeoff-plot"),
         ("signals", "Pruning signals", "#signals-plot"))

# Every plot title, axis title, tick label, legend and slider must lie inside both the plot's SVG and
# the element that holds it; the title, the legend, the x-axis title and the slider must not overlap, and
# plotly's toolbar, where it is shown without a pointer on the plot, must not lie over the title; the labels of data
# points neither overlap nor run past the plot area (which cuts them), nor do an x-axis's tick labels.
_PLOT_TEXT = """(sel) => { const root = document.querySelector(sel); const plot = root && root.querySelector('.js-plotly-plot');
  if (!plot) return {problems: [`${sel}: no plot`], tick_px: 0};
  const svg = plot.querySelector('svg.main-svg').getBoundingClientRect(), host = root.getBoundingClientRect();
  const box = {left: Math.max(svg.left, host.left), right: Math.min(svg.right, host.right),
               top: Math.max(svg.top, host.top), bottom: Math.min(svg.bottom, host.bottom)};
  const problems = [], found = {};
  const parts = [['title', '.g-gtitle .gtitle'], ['x-axis title', '.g-xtitle .xtitle'], ['y-axis title', '.g-ytitle .ytitle'],
                 ['legend', '.legend'], ['tick label', '.xtick text, .ytick text'], ['slider', '.slider-container']];
  for (const [name, q] of parts) for (const e of root.querySelectorAll(q)) {
    const r = e.getBoundingClientRect(); if (!r.width) continue; found[name] = r;
    if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
      problems.push(`${sel}: ${name} '${e.textContent.slice(0, 40)}' clipped`); }
  const hit = (a, b) => a && b && a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  for (const [a, b] of [['title', 'legend'], ['x-axis title', 'legend'], ['title', 'slider'], ['legend', 'slider'], ['x-axis title', 'slider'],
                        ['y-axis title', 'title']])
    if (hit(found[a], found[b])) problems.push(`${sel}: ${a} overlaps ${b}`);
  const bar = root.querySelector('.modebar-container .modebar');  // plotly's toolbar, where it is shown
  const shown = bar && getComputedStyle(bar.parentElement).display != 'none' && getComputedStyle(bar.parentElement).opacity != '0';
  if (shown && hit(bar.getBoundingClientRect(), found['title'])) problems.push(`${sel}: the toolbar overlaps the title`);
  // Labels of data points (a curve's α labels): none over another, none cut by the plot area's edge.
  const area = root.querySelector('.nsewdrag') && root.querySelector('.nsewdrag').getBoundingClientRect();
  const labels = [...root.querySelectorAll('.textpoint text')].filter((e) => e.textContent.trim())
    .map((e) => [e.textContent, e.getBoundingClientRect()]).filter(([, r]) => r.width);
  labels.forEach(([a, r], i) => { labels.slice(0, i).forEach(([b, q]) => {
    if (hit(r, q)) problems.push(`${sel}: point labels '${a}' and '${b}' overlap`); });
    if (area && (r.left < area.left - 1 || r.right > area.right + 1 || r.top < area.top - 1))
      problems.push(`${sel}: point label '${a}' cut by the plot area's edge`); });
  // Tick labels of one axis side by side, none over its neighbour.
  for (const axis of root.querySelectorAll('.xaxislayer-above')) {
    const ticks = [...axis.querySelectorAll('.xtick text')].map((e) => [e.textContent, e.getBoundingClientRect()])
      .filter(([t, r]) => t.trim() && r.width).sort((a, b) => a[1].left - b[1].left);
    ticks.slice(1).forEach(([t, r], i) => { if (hit(r, ticks[i][1])) problems.push(`${sel}: tick labels '${ticks[i][0]}' and '${t}' overlap`); }); }
  const tick = root.querySelector('.xtick text');
  return {problems, tick_px: tick ? parseFloat(getComputedStyle(tick).fontSize) : 0}; }"""


def plot_text_problems(page, selector: str) -> tuple[list[str], float]:
    """(what is clipped or overlapping in the plot at ``selector``, its tick labels' font size in px)."""
    found = page.evaluate(_PLOT_TEXT, selector)
    return found["problems"], found["tick_px"]


def check_plots(page, shots: Path | None = None, prefix: str = "") -> dict[str, tuple[list[str], float]]:
    """Open every plot of the page in turn and check its text (plot_text_problems); with ``shots``,
    save a picture of each as ``{prefix}{name}.png`` there."""
    results = {}
    for name, tab, selector in PLOTS:
        if tab:
            open_tab(page, tab)
        page.locator(selector).scroll_into_view_if_needed()
        wait_until(page, "(s) => document.querySelector(s + ' .js-plotly-plot .main-svg')", arg=selector)
        time.sleep(0.5)  # plotly lays a new tab's figure out again once it is visible
        results[name] = plot_text_problems(page, selector)
        if shots is not None:
            shots.mkdir(parents=True, exist_ok=True)
            page.locator(selector).screenshot(path=str(shots / f"{prefix}{name}.png"))
    return results


def run_controls_beside_plot(page) -> dict[str, Any]:
    """Scroll as a lecturer would, so the live plot's drawing area is in the middle of the window (the
    run bar sticks to the top), and say whether the Run button and that whole area are on screen together, and
    which of the run bar's controls run off its right end or out of it (``cut_off``, by their ids)."""
    page.evaluate("""() => { const bar = document.querySelector('#run-bar').getBoundingClientRect();
        const area = document.querySelector('#live-plot .nsewdrag');
        const r = area.getBoundingClientRect();
        if (r.top < bar.bottom || r.bottom > window.innerHeight) area.scrollIntoView({block: 'center'}); }""")
    time.sleep(0.3)
    return page.evaluate("""() => { const r = (s) => document.querySelector(s).getBoundingClientRect();
        const run = r('#run'), area = r('#live-plot .nsewdrag'), h = window.innerHeight;
        const bar = r('#run-bar'), right = Math.min(bar.right, window.innerWidth) + 1;
        const cut = [...document.querySelectorAll('#run-bar > *')].filter((e) => e.getBoundingClientRect().width
            && (e.getBoundingClientRect().right > right || e.getBoundingClientRect().bottom > bar.bottom + 1));
        return {run_visible: run.top >= 0 && run.bottom <= h, plot_visible: area.top >= bar.bottom - 1 && area.bottom <= h,
                cut_off: cut.map((e) => e.id), run: [run.top, run.bottom], plot_area: [area.top, area.bottom], viewport: h}; }""")


# The presenter view's promise, measured in CSS pixels (a 1280×720 projector at 150 % is 853×480 of them):
# the Run button, the round caption and the whole live chart (its SVG) inside the window, under the run
# bar, and the smallest text of the live chart.
_PRESENTER_SCREEN = """() => { const r = (s) => document.querySelector(s).getBoundingClientRect();
  const h = window.innerHeight, w = window.innerWidth, run = r('#run'), cap = r('#round-caption');
  const chart = r('#live-plot .main-svg'), bar = r('#run-bar'), legend = document.querySelector('#live-plot .legend');
  const inside = (b) => b.top >= 0 && b.bottom <= h + 0.5 && b.left >= 0 && b.right <= w + 0.5;
  const texts = [...document.querySelectorAll('#live-plot svg text')].filter((t) => t.textContent.trim()
      && t.getBoundingClientRect().width);
  const sizes = texts.map((t) => parseFloat(getComputedStyle(t).fontSize));
  const rows = [...document.querySelectorAll('#live-plot .ytick text')].filter((t) => t.getBoundingClientRect().width)
      .map((t) => t.textContent.trim());
  const words = document.querySelector('#round-caption .prose, #round-caption .md') || document.querySelector('#round-caption');
  const line = parseFloat(getComputedStyle(words).lineHeight) || 26;
  const box = (b) => b && [Math.round(b.top), Math.round(b.bottom)];
  const lb = legend && legend.getBoundingClientRect();
  return {run: inside(run), caption: inside(cap) && cap.top >= bar.bottom - 1,
          chart: inside(chart) && chart.top >= cap.bottom - 1 && chart.top >= bar.bottom - 1,
          legend_inside: !lb || (lb.top >= chart.top - 1 && lb.bottom <= chart.bottom + 1 && lb.right <= chart.right + 1),
          run_box: box(run), caption_box: box(cap), chart_box: box(chart), legend_box: box(lb),
          caption_lines: Math.round(words.scrollHeight / line), labelled_rows: rows,
          caption_text: document.querySelector('#round-caption').innerText, min_text_px: Math.min(...sizes),
          viewport: [w, h]}; }"""
# The savings table: both method columns inside the window and nothing scrolled off to the side.
_SAVINGS_COLUMNS = """() => { const table = document.querySelector('#savings-table');
  const heads = [...table.querySelectorAll('th, [role=columnheader]')].map((e) => [e.innerText.trim(), e.getBoundingClientRect()]);
  const shown = heads.filter(([t, b]) => t && b.left >= 0 && b.right <= window.innerWidth + 0.5).map(([t]) => t);
  const scrollers = [...table.querySelectorAll('*')].filter((e) => e.scrollWidth > e.clientWidth + 1
      && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX));
  return {shown, scrolls_sideways: scrollers.length > 0}; }"""


def presenter_screen(page) -> dict[str, Any]:
    """Bring the live view to the top as Run and Present rounds do, and say what the window shows
    (:data:`_PRESENTER_SCREEN`)."""
    page.evaluate("window.scrollTo({top: 0})")
    time.sleep(0.3)
    return page.evaluate(_PRESENTER_SCREEN)


# Words of the page's tables that a cell breaks inside (one word on two lines: Markdown's cells may break anywhere) or
# lets spill over its edge: each as "element id: 'word' in 'the cell's text'". A break after a hyphen is a break
# between words.
_BROKEN_WORDS = r"""() => { const found = [];
  for (const cell of document.querySelectorAll('th, td')) {
    if (!cell.offsetParent || !cell.innerText.trim()) continue;  // not drawn (a table measuring its columns unseen)
    const box = cell.getBoundingClientRect(), style = getComputedStyle(cell);
    const left = box.left + parseFloat(style.paddingLeft) - 1, right = box.right - parseFloat(style.paddingRight) + 1;
    const texts = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node; (node = texts.nextNode());) for (const word of node.textContent.matchAll(/[^\s-]+-?/g)) {
      const range = document.createRange();
      range.setStart(node, word.index); range.setEnd(node, word.index + word[0].length);
      const lines = [...range.getClientRects()].filter((r) => r.width);
      if (lines.length > 1 || lines.some((r) => r.left < left || r.right > right))
        found.push(`${cell.closest('[id]')?.id}: '${word[0]}' in '${cell.innerText.slice(0, 40)}'`); } }
  return found; }"""


def broken_words(page, once: str | None = None, timeout: float | None = None) -> list[str]:
    """The words of the page's visible tables broken inside or spilling out of their cells (:data:`_BROKEN_WORDS`):
    now, or ``once`` the JavaScript expression holds, in the same evaluation (a table that a run replaces within a
    moment is measured as it stood when the expression held)."""
    if once is None:
        return page.evaluate(_BROKEN_WORDS)
    return page.wait_for_function(f"() => ({once}) ? ({_BROKEN_WORDS})() : null", timeout=timeout,
                                  polling=POLL_MS).json_value()


def savings_columns(page) -> dict[str, Any]:
    """Open the Savings tab and say which of its column headers lie inside the window, and whether
    any part of the table scrolls sideways."""
    open_tab(page, "Savings")
    # The table is drawn again whenever the run's last views arrive (after its status says it is done): its header
    # row shows Gradio's placeholder column numbers meanwhile. Measured once the methods' header is back.
    wait_until(page, "[...document.querySelectorAll('#savings-table th, #savings-table [role=columnheader]')]"
                     ".some((e) => e.innerText.trim() == 'Best-of-N')")
    page.locator("#savings-table").scroll_into_view_if_needed()
    time.sleep(0.3)
    return page.evaluate(_SAVINGS_COLUMNS)


# The run bar stays pinned at the top while the page scrolls; a picture of one view below it sets it in place.
UNPINNED_RUN_BAR = "#run-bar { position: static !important; }"


def presenter_screenshots(folder: Path, url: str, browser) -> list[Path]:
    """The README's first pictures: the presenter view on a 1280×720 projector at 150 % and at 1920×1080,
    stepped to the recorded run's first round."""
    paths = []
    for screen, name in (("projector", "presenter-1280x720-150.png"), ("hd", "presenter-1920x1080.png")):
        (width, height), ratio = SCREENS[screen]
        page = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=ratio).new_page()
        page.goto(url + PRESENTER)
        page.wait_for_selector("#scatter .scatterlayer .point", timeout=120_000)
        page.locator("#present-rounds").click()
        wait_until(page, "document.querySelector('#round-caption').innerText.startsWith('Round 1')")
        time.sleep(1)
        paths.append(folder / name)
        page.screenshot(path=str(paths[-1]))
        page.context.close()
    return paths


def layout_screenshots(folder: Path, screens: tuple[str, ...] = ("projector", "phone")) -> dict[str, list[str]]:
    """Serve the app, and on each screen save the first view (run bar and live plot) and every plot
    as ``{screen}-{name}.png`` in ``folder``; return the problems check_plots found per screen.
    `python -c "from benchmarks.browser import *; layout_screenshots(Path('assets/screenshots'))"`
    makes the README's phone and projector pictures, and the presenter view's (presenter_screenshots)."""
    found: dict[str, list[str]] = {}
    with serve_app(folder / ".app.log") as url, chromium() as browser:
        presenter_screenshots(folder, url, browser)
        for screen in screens:
            (width, height), ratio = SCREENS[screen]
            page = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=ratio).new_page()
            page.goto(url)
            page.wait_for_selector("#scatter .scatterlayer .point", timeout=120_000)
            run_controls_beside_plot(page)
            page.screenshot(path=str(folder / f"{screen}-screen.png"))
            page.add_style_tag(content=UNPINNED_RUN_BAR)  # pinned, it covers the top of each plot pictured below
            found[screen] = [p for problems, _ in check_plots(page, folder, prefix=f"{screen}-").values() for p in problems]
            page.context.close()
    (folder / ".app.log").unlink(missing_ok=True)
    return found
