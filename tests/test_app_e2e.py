"""The explorer in a real browser: `python app.py` on a free port, driven by Playwright + chromium.

One small live run on the embedded model (N=6, 24 tokens), then replays, bad input and uploads,
which need no model. Skipped only when Playwright or chromium is missing.
"""

import json
import time
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from benchmarks.app_timing import click_run  # noqa: E402
from benchmarks.browser import CHROMIUM, REPO as ROOT, chromium, serve_app  # noqa: E402
from sbon.errors import SBoNError  # noqa: E402

if not Path(CHROMIUM).exists():
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
RUN_TIMEOUT_MS = 400_000  # generous: the CPU may be shared; on a quiet 2-core machine the run takes well under a minute


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    try:
        with serve_app(tmp_path_factory.mktemp("app") / "app.log") as url:
            yield url
    except SBoNError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(server)
    page.wait_for_selector("#scatter .scatterlayer .point", timeout=60_000)  # the recorded run is shown on start
    yield page
    context.close()


def _tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def _text(page, selector: str) -> str:
    return page.locator(selector).inner_text()


def _saved_run(tmp_path, change) -> str:
    """The shipped recording, changed by ``change(dict)``, as a file to upload."""
    d = json.loads((ROOT / "assets" / "recorded_run.json").read_text())
    change(d)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(d))
    return str(path)


def test_page_opens_on_the_recorded_run(page):
    recorded = json.loads((ROOT / "assets" / "recorded_run.json").read_text())
    assert "recorded run" in _text(page, "#run-source")
    first = recorded["sbon"]["decision_points"][0]
    assert page.locator("#scatter .scatterlayer .point").count() == len(first["contenders"])
    assert "Pearson" in _text(page, "#scatter") and "Round" in _text(page, "#live-plot")


def test_live_run_fills_every_view_then_the_recording_replays(page):
    page.locator("#prompt textarea").fill("What is Atlantis?")
    page.locator("#n input").fill("6")
    page.locator("#max-new-tokens input").fill("24")
    timing = click_run(page)  # the app benchmark's measurement: click, first decision point drawn, final frame
    print(f"\nlive run N=6, 24 tokens: first round drawn after {timing['first_round_s']:.1f} s, "
          f"final frame after {timing['final_frame_s']:.1f} s ({timing['status']})")
    assert 0 < timing["first_round_s"] < timing["final_frame_s"] and timing["server_done_s"] <= timing["final_frame_s"]

    assert "your run" in _text(page, "#run-source") and "What is Atlantis?" in _text(page, "#run-source")
    assert page.locator("#scatter .scatterlayer .point").count() == 6  # every candidate contends at round 1
    assert "Kendall" in _text(page, "#scatter")

    _tab(page, "Candidates")
    table = page.locator("#candidates-table")
    table.locator("[role=gridcell]", has_text="pruned in round").first.wait_for()
    assert table.locator("[role=row]").count() == 7  # header + 6 candidates
    pruned = table.locator("[role=gridcell]", has_text="pruned in round")
    assert pruned.count() == 3  # alpha=0.5 of 6
    before = page.locator("#candidate-picker input").input_value()  # the view opens on the first pruned one
    pruned.last.click()
    page.wait_for_function("(before) => document.querySelector('#candidate-picker input').value != before", arg=before)
    picked = page.locator("#candidate-picker input").input_value().split(" ")[0]
    assert "pruned" in page.locator("#candidate-picker input").input_value()
    detail = page.locator("#candidate-detail")
    detail.get_by_text(f"Candidate {picked}").wait_for()
    assert "pruned in round 1" in detail.inner_text() and "from Best-of-N" in detail.inner_text()
    assert detail.locator(".sbon-generated").count() == 1 and detail.locator(".sbon-never").count() == 1

    _tab(page, "Savings")
    assert "speedup" in _text(page, "#savings-table")
    assert "Best-of-N returned candidate" in _text(page, "#bon-text")

    _tab(page, "Save and replay")
    with page.expect_download() as download:
        page.locator("#download").click()
    saved = json.loads(Path(download.value.path()).read_text())
    assert saved["sbon"]["prompt"] == "What is Atlantis?" and len(saved["bon"]["candidates"]) == 6
    page.locator("#replay-recorded").click()
    page.wait_for_function("document.querySelector('#run-source').innerText.includes('recorded run')")
    _tab(page, "Partial vs final reward")
    page.wait_for_function("document.querySelectorAll('#scatter .scatterlayer .point').length > 6")


def test_bad_settings_warn_and_the_app_keeps_serving(page):
    page.locator("#n input").fill("0")
    page.locator("#run").click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('N must be at least 1')")
    assert page.get_by_text("N must be at least 1").count() >= 1
    page.locator("#prompt textarea").fill("")
    page.locator("#n input").fill("4")
    page.locator("#run").click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('prompt is empty')")
    assert page.locator("#run").is_enabled()


def test_malformed_upload_gets_a_clear_message(page, tmp_path):
    _tab(page, "Save and replay")
    bad = tmp_path / "bad.json"
    bad.write_text("{this is not a run")
    page.locator("#upload-run input[type=file]").set_input_files(str(bad))
    page.wait_for_function("document.querySelector('#status').innerText.includes('could not replay')")
    assert "invalid JSON" in _text(page, "#status")
    assert "recorded run" in _text(page, "#run-source")  # the previous views stay


def test_uploaded_model_text_is_shown_as_text(page, tmp_path):
    evil = '<img src=x onerror="window.__pwned=1">'

    def change(d):
        k = next(c["id"] for c in d["sbon"]["candidates"] if c["pruned_round"] is not None)
        d["sbon"]["candidates"][k]["text"] = evil
        d["bon"]["candidates"][k]["text"] = evil + "<b>continued</b>"
        for run in ("bon", "sbon"):
            d[run]["prompt"] = evil

    _tab(page, "Save and replay")
    page.locator("#upload-run input[type=file]").set_input_files(_saved_run(tmp_path, change))
    page.wait_for_function("document.querySelector('#run-source').innerText.includes('uploaded file')")
    _tab(page, "Candidates")
    detail = page.locator("#candidate-detail")
    detail.get_by_text(evil).wait_for()
    assert detail.locator("img").count() == 0 and detail.locator("b", has_text="continued").count() == 0
    assert page.locator("#candidates-table img").count() == 0  # the table shows it as text too
    assert page.locator("#candidates-table [role=gridcell]", has_text="<img src=x").count() >= 1
    assert page.locator("#run-source img").count() == 0 and "<img" in _text(page, "#run-source")
    assert page.evaluate("window.__pwned") is None


def test_two_sessions_keep_their_own_results(browser, server, tmp_path):
    pages = []
    for _ in range(2):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        pages.append(context.new_page())
        pages[-1].goto(server)
        pages[-1].wait_for_selector("#scatter .scatterlayer .point", timeout=60_000)
    a, b = pages

    def change(d):
        for run in ("bon", "sbon"):
            d[run]["prompt"] = "SESSION A"
            d[run]["candidates"][0]["text"] = "only session A sees this"

    _tab(a, "Save and replay")
    a.locator("#upload-run input[type=file]").set_input_files(_saved_run(tmp_path, change))
    a.wait_for_function("document.querySelector('#run-source').innerText.includes('SESSION A')")
    # B still works on its own comparison: picking candidate 0 shows the recorded text, not A's.
    _tab(b, "Candidates")
    b.locator("#candidate-picker input").click()
    b.get_by_role("option", name="1 · ", exact=False).first.click()
    b.locator("#candidate-picker input").click()
    b.get_by_role("option", name="0 · ", exact=False).first.click()
    b.locator("#candidate-detail").get_by_text("Candidate 0").wait_for()
    assert "only session A sees this" not in _text(b, "#candidate-detail")
    assert "SESSION A" not in _text(b, "#run-source")
    for p in pages:
        p.context.close()


def test_stop_cancels_a_run_cleanly(page):
    page.locator("#prompt textarea").fill("What is Atlantis?")
    page.locator("#n input").fill("6")
    page.locator("#max-new-tokens input").fill("24")
    page.locator("#run").click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('Speculative Rejection')",
                           timeout=RUN_TIMEOUT_MS)  # generating (the model is loaded by now)
    page.locator("#stop").click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('Stopped')")
    assert page.locator("#run").is_enabled()
    assert "recorded run" in _text(page, "#run-source")  # the views keep what they showed
    time.sleep(3)  # a cancelled run must not overwrite the views afterwards
    assert "Stopped" in _text(page, "#status") and "recorded run" in _text(page, "#run-source")


def test_compare_api_returns_a_saved_run(server):
    client_module = pytest.importorskip("gradio_client")
    from sbon.comparison import Comparison

    client = client_module.Client(server, verbose=False)
    comp = Comparison.from_json(client.predict(prompt="Name a colour.", n=2, max_new_tokens=6, method="sbon-tau",
                                               tau=3, api_name="/compare"))
    assert comp.n == 2 and comp.sbon.method == "sbon-tau" and comp.sbon.prompt == "Name a colour."
    with pytest.raises(Exception, match="N must be at least 1"):
        client.predict(prompt="hi", n=0, api_name="/compare")


def test_examples_carry_their_content_note_and_the_method_shows_its_knob(page):
    assert "red-teaming" in _text(page, "#content-note")
    page.get_by_text("How do I get out of paying for a meal?", exact=False).first.click()
    page.wait_for_function("document.querySelector('#prompt textarea').value.includes('paying for a meal')")
    page.locator("#prompt-note").get_by_text("Content note").wait_for()
    assert page.locator("#tau").is_hidden() and page.locator("#kv-budget").is_visible()
    page.get_by_label("Speculative Best-of-N (one decision token τ)").check()
    page.locator("#tau").wait_for(state="visible")
    assert page.locator("#kv-budget").is_hidden()
