"""A class behind one link: the gallery's recorded runs (each still loads and tells its story, its caption
written from its data), shared-run links, and the page export opened in Chromium with the network blocked.
The bad-input rows (malformed, unknown and expired links, a broken gallery file, hostile text in a page)
are in tests/test_reliability.py."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from benchmarks.browser import wait_until
from components.gallery import GALLERY, GalleryRuns, caption, facts, read_index
from components.share import ShareStore
from sbon.analysis.comparison import Comparison

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "</script><script>alert(1)</script><img src=x onerror=alert(2)> [click](https://evil.example/)"


def test_the_gallery_holds_the_six_stories_each_recorded_with_its_settings_and_commit():
    index = read_index()
    assert len(GALLERY) >= 6 and set(index) == set(GALLERY), "record the missing ones: python -m components.record --gallery"
    for key, entry in GALLERY.items():
        line = index[key]
        comp = Comparison.load(entry.file)
        made_by = "python -m components.record " + ("--seeds " if key == "default" else f"--gallery {key}")
        assert line["commit"] and line["command"].startswith(made_by)
        # The settings the index says made the file are the ones the file's runs record, and the entry's own.
        for name, value in {**entry.settings, "n": comp.n}.items():
            assert line["settings"][name] == value
        assert comp.speculative.settings["seed"] == line["settings"]["seed"] and comp.speculative.prompt == line["settings"]["prompt"]
        assert comp.speculative.reward == line["settings"]["reward"] and comp.speculative.method == line["settings"]["method"]


@pytest.mark.parametrize("key", list(GALLERY))
def test_each_gallery_run_loads_tells_its_story_and_its_caption_matches_its_data(key):
    entry = GALLERY[key]
    run = GalleryRuns({key: entry}).get(key)  # loads and passes the app's replay checks? see test_app_handlers
    f = facts(run.comp)
    assert f.story_errors(entry) == []
    # The caption is written from the data, and the one the index shows is the one the data gives today.
    assert run.caption == caption(run.comp, entry) == read_index()[key]["caption"]
    winner = {"kept": "Best-of-N's winner kept", "pruned": "Best-of-N's winner pruned in round"}.get(entry.winner)
    if winner:
        assert winner in run.caption
    if entry.violation_pruned:
        assert f.violation_pruned > 0 and f"{f.violation_pruned} had already broken an instruction" in run.caption
    if entry.open_pruned:
        assert f.open_pruned > 0 and f"{f.open_pruned} still had every instruction open" in run.caption


def test_the_gallery_list_names_each_run_once_beside_its_caption():
    from components.replays import gallery_markdown
    from components.tables import md_escape

    lines = gallery_markdown().splitlines()
    assert len(lines) == len(GALLERY)
    for line, (key, entry) in zip(lines, GALLERY.items()):
        run = GalleryRuns({key: entry}).get(key)
        assert line.count(md_escape(entry.title)) == 1 and md_escape(run.untitled) in line, line
        assert run.caption == f"{entry.title}: {run.untitled}"  # the page and the run's own line keep the title


def test_the_stories_differ_where_their_titles_say():
    f = {key: facts(GalleryRuns({key: e}).get(key).comp) for key, e in GALLERY.items()}
    assert f["high-alpha"].alpha > f["default"].alpha and f["high-alpha"].pruned > f["default"].pruned
    assert f["single-tau"].method == "sbon-tau" and f["single-tau"].points == 1
    assert f["reward-free"].signal not in ("reward", f["reward-free"].reward)
    assert f["early-violation"].winner == "kept" and f["open-instruction"].winner == "pruned"


def test_a_caption_claim_the_data_contradicts_is_caught():
    entry = GALLERY["default"]
    comp = Comparison.load(entry.file)
    lying = type(entry)(entry.key, entry.title, winner="pruned", violation_pruned=True)
    errors = facts(comp).story_errors(lying)
    assert any("winner was kept" in e for e in errors) and any("breaking an instruction" in e for e in errors)


def test_a_shared_run_reopens_exactly_and_old_ones_go(tmp_path):
    now = [1_800_000_000.0]
    store = ShareStore(tmp_path, ttl_s=100, max_files=3, clock=lambda: now[0])
    text = GALLERY["default"].file.read_text()
    ids = [store.put(text) for _ in range(3)]
    assert len(set(ids)) == 3
    assert store.get(ids[0]).to_json() == Comparison.from_json(text).to_json()
    store.put(text)  # a fourth: the oldest goes, so at most max_files are kept
    assert len(list(tmp_path.glob("*.json"))) == 3
    now[0] += 101
    with pytest.raises(Exception, match="expired"):
        store.get(ids[-1])


def test_the_page_is_one_file_under_the_size_limit_with_every_view_and_the_caption():
    from components.page_export import MAX_PAGE_BYTES, figures_of, page_html

    run = GalleryRuns({"open-instruction": GALLERY["open-instruction"]}).get("open-instruction")
    page = page_html(run.comp, run.caption)
    assert len(page.encode()) <= MAX_PAGE_BYTES
    assert "http://" not in page.split("<script>", 1)[0] and "<script src" not in page  # nothing fetched
    assert html.escape(run.caption) in page
    for div_id in figures_of(run.comp):
        assert f'id="{div_id}"' in page


@pytest.mark.slow
def test_the_page_draws_every_view_in_chromium_with_the_network_blocked(tmp_path, browser):
    from components.page_export import figures_of, page_html

    from components.tables import first_pruned

    run = GalleryRuns({"early-violation": GALLERY["early-violation"]}).get("early-violation")
    comp = Comparison.from_json(run.comp.to_json())
    shown = first_pruned(comp)  # the candidate the page opens
    comp.speculative.candidates[shown].text += HOSTILE  # model text is shown as text, as in every view of the page
    comp.bon.candidates[shown].text += HOSTILE
    path = tmp_path / "run.html"
    path.write_text(page_html(comp, run.caption))
    context = browser.new_context()
    asked = []

    def block(route):
        asked.append(route.request.url)
        route.abort()

    context.route(lambda url: not url.startswith("file:"), block)  # no network at all
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: errors.append(f"dialog: {d.message}"))
    page.goto(path.as_uri())
    for div_id in figures_of(run.comp):
        page.wait_for_selector(f"#{div_id} .main-svg", timeout=30_000)
    assert asked == [] and errors == []
    assert page.locator("#caption").inner_text() == run.caption
    assert page.locator("#candidates details").count() == run.comp.n
    assert page.locator("img[src=x], a[href*='evil']").count() == 0
    assert "<img src=x" in page.locator("#candidates").inner_text()
    assert run.comp.speculative.best.text.strip()[:40] in page.locator("#answers").inner_text()
    context.close()


@pytest.mark.slow
def test_gallery_links_share_and_page_export_work_in_chromium(server, windows):
    """The page as a student meets it: a gallery link opens its run, a bad link says why in one line, a gallery
    choice opens at once, Share gives a link that reopens the run, and the page export downloads. The app and
    the browser are the browser tests' (tests/conftest.py)."""
    status = "(document.querySelector('#status')?.innerText || '')"
    page = windows.open(server + "?gallery=open-instruction", (1400, 1000))
    wait_until(page, f"{status}.includes('Gallery:')", timeout=120_000)
    assert "winner pruned in round" in page.locator("#status").inner_text()
    assert "gallery run" in page.locator("#run-source").inner_text()

    page.goto(server + "?run=not-a-run")
    wait_until(page, f"{status}.includes('malformed')", timeout=120_000)
    assert "recorded run" in page.locator("#run-source").inner_text()

    page.get_by_role("tab", name="Gallery").click()
    page.locator("#gallery label", has_text="A high α").click()
    wait_until(page, f"{status}.includes('A high α')", timeout=60_000)
    page.get_by_role("tab", name="Save and replay").click()
    page.locator("#share").click()
    wait_until(page, "document.querySelector('#share-link textarea, #share-link input').value.includes('?')",
                     timeout=60_000)
    shared = page.locator("#share-link textarea, #share-link input").first.input_value()
    assert shared.endswith("?gallery=high-alpha")
    page.locator("#page-export").click()
    wait_until(page, f"{status}.includes('The page is ready')", timeout=120_000)
    with page.expect_download() as download:
        page.locator("#page-file a").first.click()
    assert download.value.suggested_filename.endswith(".html")

    # A run that is not in the gallery is kept on the server under a run id, and its link reopens it.
    page.locator("#upload-run input[type=file]").set_input_files(str(ROOT / "tests" / "data" / "recorded_run_v1.json"))
    wait_until(page, f"{status}.includes('Replaying the uploaded run')", timeout=120_000)
    # the gallery run's link and page went with it: they would share another run than the one on the screen
    assert page.locator("#share-link textarea, #share-link input").first.input_value() == ""
    assert page.locator("#page-file a").count() == 0
    page.locator("#share").click()
    wait_until(page, "document.querySelector('#share-link textarea, #share-link input').value.includes('?run=')",
                     timeout=60_000)
    link = page.locator("#share-link textarea, #share-link input").first.input_value()
    source = page.locator("#run-source").inner_text()
    other = windows.open(link, (1400, 1000), slot=1)  # anyone with the link
    wait_until(other, f"{status}.includes('Showing the run this link was shared with')", timeout=120_000)
    assert source.split("·", 1)[1] == other.locator("#run-source").inner_text().split("·", 1)[1]
    windows.leave(other)
    windows.leave(page)


def test_a_visitor_waiting_for_the_generation_slot_sees_their_place_and_an_estimated_wait():
    from components.runs import Runs

    slot = Runs(lambda settings: iter(()))
    slot.generating, slot.waiting, slot.seconds = 1, lambda: 2, [30.0, 40.0, 50.0]
    status = slot.request(None)["status"]
    assert "3 runs ahead of yours" in status and "place 4" in status and "about 120 s to wait" in status
    slot.generating, slot.waiting = 0, lambda: 0
    assert slot.request(None)["status"] == "Starting…"


def test_the_page_opens_on_the_recorded_seed_whose_partial_rewards_predicted_best_and_the_weak_case_says_why():
    from components.controls import OPENING_SEED, RunSettings
    from components.gallery import prediction, weakness

    runs = {key: GalleryRuns({key: GALLERY[key]}).get(key).comp for key in ("default", "coin-toss")}
    opening, weak = runs["default"], runs["coin-toss"]
    seeds = [int(s) for s in read_index()["default"]["command"].split("--seeds")[1].split()]
    # the seed the page opens on is the page's default seed, one of those the command measured
    assert opening.speculative.settings["seed"] == OPENING_SEED == RunSettings().seed and OPENING_SEED in seeds
    assert weak.speculative.settings["seed"] in seeds and weak.speculative.prompt == opening.speculative.prompt  # the same defaults
    assert prediction(opening) > prediction(weak)  # the measure chose it over the weak case
    decided, kendall = prediction(opening)
    assert decided >= 1 and kendall > 0 and weakness(opening) == ""
    decided, kendall = prediction(weak)
    assert decided == 0 and kendall < 0
    text = GalleryRuns({"coin-toss": GALLERY["coin-toss"]}).get("coin-toss").caption
    assert f"Why it is weak: at every decision point the scores were within the reward's noise of the cut, and at the " \
           f"first the partial rewards' Kendall with the final rewards was {kendall:.2f}: close to a coin toss." in text


def test_the_opening_run_is_recorded_only_by_the_command_that_chooses_its_seed(capsys):
    """The gallery's entry for the page's opening run says which seeds were measured (the test above reads them), so
    only `--seeds` records it; `--gallery` alone records every other story."""
    from components.record import main

    assert main(["--gallery", "default"]) == 2
    assert "python -m components.record --seeds " in capsys.readouterr().err
