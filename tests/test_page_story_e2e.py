"""What a class reads, in Chromium: no internal identifier in the visible text of the default page, the presenter
view and a finished run; the end of a run on a projector (1280×720 at 150 %: the answer each method returned and the
headline's first two statements inside the window, every legend whole, none a scroll box); the phone (390×844: the
live chart within the first two screens, no control off the right edge); a gallery story sets the controls. The
screenshots of the presenter's last step and the phone view go to $SBON_SCREENSHOTS (the docs' copies:
`SBON_SCREENSHOTS=assets/screenshots python -m pytest tests/test_page_story_e2e.py`), else to a temporary folder."""

import os
import re
import tempfile
from pathlib import Path

import pytest

from benchmarks.app_timing import click_run
from benchmarks.browser import PRESENTER, REPO, wait_until
from components.rounds import result_lines
from sbon.analysis.comparison import Comparison

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("SBON_SCREENSHOTS") or tempfile.mkdtemp(prefix="sbon-shots-"))
RUN_TIMEOUT_MS = 400_000
# Identifiers that must never reach the page's visible text: lowercase method, signal and preset names (whole words),
# the developer phrases a lecturer's walk found, and a processor's instruction sets (the page names the processor).
IDENTIFIERS = (r"\bsbon\b", r"\bbon\b", r"\blogprob\b", r"\bdeepconf\b", r"\bself-certainty\b", r"\bminilm-pref\b",
               r"\bsmollm2-135m\b", r"punctuation:no_comma", r"retired \(finished, eligible\)",
               r"decoded with the compiled step",
               r"Loaded on cpu", r"SBoN tokens / BoN tokens", r"IFEval ids and arguments", r"expected fraction",
               r"Counterfactual replay", r"\b1 candidates\b", r"AVX", r"\bBF16\b", r"\bAMX\b", r"\bfp32\b", r"\bint4\b")
# The page's visible text: what the body shows (code blocks of the API's how-to left out) and the visible inputs'
# values (a dropdown shows its choice there).
VISIBLE_TEXT_JS = """() => { const code = [...document.querySelectorAll('pre, code')];
  const was = code.map((c) => c.style.display); code.forEach((c) => { c.style.display = 'none'; });
  const text = document.body.innerText; code.forEach((c, i) => { c.style.display = was[i]; });
  const shown = [...document.querySelectorAll('input')]
    .filter((i) => i.offsetParent && ['text', 'number', 'search', ''].includes(i.type)).map((i) => i.value);
  return text + '\\n' + shown.join('\\n')
    + '\\n' + [...document.querySelectorAll('svg text')].map((t) => t.textContent).join('\\n'); }"""
TABS = ("Partial vs final reward", "Candidates", "Savings", "Rounds replay", "Trade-off", "Pruning signals", "Gallery",
        "Save and replay")


def _identifiers(page, where: str) -> list[str]:
    text = page.evaluate(VISIBLE_TEXT_JS)  # the API's how-to shows code on purpose: code blocks are left out
    return [f"{where}: {pattern!r} in …{text[max(0, m.start() - 60):m.end() + 60]!r}…"
            for pattern in IDENTIFIERS for m in [re.search(pattern, text)] if m]


def _every_tab(page, where: str) -> list[str]:
    found = _identifiers(page, where)
    for tab in TABS:
        page.get_by_role("tab", name=tab).click()
        page.wait_for_timeout(300)
        found += _identifiers(page, f"{where}, tab {tab}")
    return found


def _opened(windows, server, screen: str, query: str = ""):
    page = windows.open(server + query, screen)
    page.wait_for_selector("#live-plot .main-svg", timeout=120_000)
    wait_until(page, "document.querySelector('#run-source').innerText.length > 0", timeout=60_000)
    return page


def _legend_scrolls(page) -> list[str]:
    """Legends of the live chart that Plotly turned into a scroll box (a scrollbar of any height)."""
    return page.evaluate("""() => [...document.querySelectorAll('#live-plot .legend .scrollbar')]
      .filter((s) => s.getBoundingClientRect().height > 0).map((s) => s.outerHTML.slice(0, 80))""")


def test_no_identifier_on_the_default_page_the_presenter_view_or_a_finished_run(windows, server):
    page = _opened(windows, server, "desktop")
    try:
        found = _every_tab(page, "default page")
        page.locator("#prompt textarea").fill("Name a colour.")
        page.locator("#n input").fill("4")
        page.locator("#max-new-tokens input").fill("16")
        click_run(page, RUN_TIMEOUT_MS)
        found += _every_tab(page, "finished run")
    finally:
        windows.leave(page)
    page = _opened(windows, server, "projector", PRESENTER)
    try:
        found += _identifiers(page, "presenter view")
    finally:
        windows.leave(page)
    assert not found, "\n".join(found)


def test_the_presenters_last_step_shows_both_answers_and_the_headline_inside_the_projector(windows, server):
    recorded = Comparison.load(REPO / "assets" / "recorded_run.json")
    page = _opened(windows, server, "projector", PRESENTER)
    try:
        page.locator("#present-rounds").click()
        steps = len(recorded.speculative.decision_points)
        scrolls, legends = [], []
        for i in range(steps):
            wait_until(page, "(r) => document.querySelector('#round-caption').innerText.startsWith(r)",
                             arg=f"Round {i + 1}")
            page.wait_for_timeout(400)
            scrolls += _legend_scrolls(page)
            legends.append(page.evaluate("[...document.querySelectorAll('#live-plot .legend text')]"
                                         ".map((t) => t.textContent).join(' | ')"))
            page.locator("#present-next").click()
        wait_until(page, "document.querySelector('#round-caption').innerText.startsWith('Result')")
        wait_until(page, "document.querySelector('#live-plot').innerText.includes('Speculative Rejection returned')")
        page.evaluate("window.scrollTo(0, 0)")
        caption = page.locator("#round-caption").inner_text()
        assert result_lines(recorded) in caption
        shown = page.evaluate("""() => { const inside = (el) => { const r = el.getBoundingClientRect();
            return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight + 1 && r.right <= window.innerWidth + 1; };
          const notes = [...document.querySelectorAll('#live-plot .annotation')];
          const lines = [...document.querySelectorAll('#live-plot .annotation-text tspan.line')];
          return {caption: inside(document.querySelector('#round-caption')), answers: notes.length,
                  inside: notes.every(inside), text: notes.map((n) => n.textContent),
                  filled: Math.max(...lines.map((l) => l.getBoundingClientRect().width))
                          / document.querySelector('#live-plot').getBoundingClientRect().width}; }""")
        assert shown["caption"] and shown["answers"] == 2 and shown["inside"], shown
        # the answers' lines take the chart's width, as wrapped in the font the browser draws them in
        assert shown["filled"] >= 0.8, shown
        assert shown["text"][0].startswith("Best-of-N returned candidate") and \
            shown["text"][1].startswith("Speculative Rejection returned candidate"), shown
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "presenter-last-step.png"))
        assert not scrolls, scrolls
        # the diamonds (finished contenders, by their final reward) have their legend entry where they are drawn
        assert any("partial reward" in legend and "final reward" in legend for legend in legends), legends
        # a caption longer than its box's two lines (more clauses, a narrower window) is set smaller, not cut off
        longer = page.evaluate("""async () => { const box = document.querySelector('#round-caption');
            const p = box.querySelector('p') || box;
            p.textContent += ' · and a clause more than two lines of twenty-pixel type can hold here';
            await new Promise((done) => setTimeout(done, 200));
            return {fits: box.scrollHeight <= box.clientHeight + 1, px: parseFloat(getComputedStyle(p).fontSize),
                    chars: p.textContent.length}; }""")
        assert longer["fits"] and 15 <= longer["px"] < 20, longer
    finally:
        windows.leave(page)


def test_on_a_phone_the_live_chart_comes_early_and_nothing_runs_off_the_edge(windows, server):
    page = _opened(windows, server, "phone")
    try:
        seen = page.evaluate("""() => { const top = document.querySelector('#live-plot').getBoundingClientRect().top
            + window.scrollY;
          const off = [...document.querySelectorAll('button, input, textarea, label, #status')]
            .filter((e) => e.offsetParent && e.getBoundingClientRect().width > 0)
            .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
            .map((e) => (e.id || e.closest('[id]')?.id || e.tagName) + ':' + Math.round(e.getBoundingClientRect().right));
          const bar = [...document.querySelectorAll('#run-bar button, #run-bar label, #run-bar input[type=number]')]
            .filter((e) => e.offsetParent).map((e) => [e.id || e.closest('[id]')?.id, e.getBoundingClientRect()]);
          const overlap = [];
          bar.forEach(([a, r], i) => bar.slice(i + 1).forEach(([b, q]) => {
            if (r.left < q.right - 1 && q.left < r.right - 1 && r.top < q.bottom - 1 && q.top < r.bottom - 1
                && !r.width == 0 && a != b) overlap.push(a + '/' + b); }));
          return {top, screen: window.innerHeight, width: window.innerWidth, off, overlap,
                  page: document.documentElement.scrollWidth}; }""")
        page.locator("#live-plot").scroll_into_view_if_needed()
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "phone.png"))
        # Present rounds, to its last step: the answers each method returned, as text in the chart's place
        page.locator("#present-rounds").click()
        wait_until(page, "document.querySelector('#round-caption').innerText.startsWith('Round 1')")
        while page.locator("#present-next").is_enabled():
            page.locator("#present-next").click()
            page.wait_for_timeout(300)
        wait_until(page, "document.querySelector('#round-caption').innerText.startsWith('Result')")
        wait_until(page, "document.querySelectorAll('#live-plot .annotation-text').length == 2")
        result = page.evaluate("""() => { const chart = document.querySelector('#live-plot .main-svg')
            .getBoundingClientRect();
          return {chart: chart.right, text: [...document.querySelectorAll('#live-plot .annotation-text')]
            .map((t) => t.getBoundingClientRect().right)}; }""")
        page.screenshot(path=str(SHOTS / "phone-result.png"))
    finally:
        windows.leave(page)
    print(f"\nphone: live chart starts {seen['top']:.0f} px down ({seen['screen']} px a screen)")
    assert seen["top"] < 2 * seen["screen"], seen
    assert not seen["off"] and seen["page"] <= seen["width"] + 1, seen
    assert not seen["overlap"], seen  # the run bar's controls side by side or wrapped, never on top of each other
    assert result["text"] and max(result["text"]) <= result["chart"] + 1, result  # the answers inside the chart


def test_a_gallery_link_sets_the_controls_to_its_story(windows, server):
    page = _opened(windows, server, "desktop", "?gallery=high-alpha")
    try:
        wait_until(page, "document.querySelector('#alpha input[type=number]').value == '0.8'", timeout=60_000)
        assert "high α" in page.locator("#run-source").inner_text()
    finally:
        windows.leave(page)
