"""What a visitor only reads, served as files (components/static_pages.py): atomic writes, a stale or missing
file rebuilt or refused, ETag/304 and Cache-Control, compressed copies, a shared run's expiry, hostile text in a
shared run; and, in Chromium against the real app, no Python handler after a static page arrives."""

import json
import os
import re
import threading
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from benchmarks.browser import wait_until
from components.gallery import GALLERY, GalleryEntry, GalleryRuns
from components.priority import lower_this_thread, nice_of_this_thread
from components.share import ShareStore
from components.static_pages import PLOTLY_NAME, PREFIX, StaticPages, gallery_path, run_path, write_atomically

SOURCE = GALLERY["default"].file
HOSTILE = "</script><script>alert(1)</script><img src=x onerror=alert(2)><!-- [x](javascript:alert(3))"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pages(tmp_path):
    """Static pages over one gallery story (a copy of the recorded run, so the test can re-record it) and a
    store of shared runs with a clock the test moves."""
    source = tmp_path / "story.json"
    source.write_text(SOURCE.read_text())
    entry = GalleryEntry("story", "A story", file_name=str(source))
    clock = Clock()
    shares = ShareStore(tmp_path / "links", ttl_s=1000, clock=clock)
    pages = StaticPages(GalleryRuns({"story": entry}), shares, folder=tmp_path / "pages")
    pages.source, pages.clock = source, clock
    return pages


@pytest.fixture
def http(pages):
    with TestClient(Starlette(routes=[Mount(PREFIX, app=pages.routes())])) as client:
        yield client


def _page_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*"))


def test_an_interrupted_write_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "page.html"
    write_atomically(path, b"old page")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, b"new page, never seen half-written")
    assert path.read_bytes() == b"old page"
    assert _page_files(tmp_path) == ["page.html"]  # the temporary file went too


def test_a_gallery_page_is_a_file_with_an_etag_a_304_and_plotly_from_one_cached_copy(pages, http):
    page = http.get("/" + gallery_path("story"), headers={"Accept-Encoding": "identity"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    etag, cache = page.headers["etag"], page.headers["cache-control"]
    assert re.fullmatch(r'"[0-9a-f]{20}"', etag) and "max-age" in cache
    assert f'<script src="../{PLOTLY_NAME}"></script>' in page.text and "Plotly.newPlot" in page.text
    assert len(page.content) < 1_000_000  # Plotly (4.7 MB) is not inlined
    assert "script-src 'self'" in page.text  # the page may fetch its own server's Plotly, nothing else
    assert http.get("/" + gallery_path("story"), headers={"If-None-Match": etag}).status_code == 304

    js = http.get(f"{PREFIX}/{PLOTLY_NAME}", headers={"Accept-Encoding": "br"})
    assert js.status_code == 200 and js.headers["content-encoding"] == "br"
    assert js.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert len(js.content) > 3_000_000  # decoded by the client: plotly's whole bundle
    assert http.get(f"{PREFIX}/{PLOTLY_NAME}", headers={"If-None-Match": js.headers["etag"]}).status_code == 304

    gz = http.get("/" + gallery_path("story"), headers={"Accept-Encoding": "gzip"})
    assert gz.headers["content-encoding"] == "gzip" and gz.text == page.text
    assert pages.built == 2  # the page and Plotly's copies, each once


def test_a_class_asking_for_a_page_at_once_builds_it_once(pages):
    results, threads = [], [threading.Thread(target=lambda: results.append(pages.gallery_page("story")))
                            for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 6 and len(set(results)) == 1 and pages.built == 1


def test_a_new_recording_makes_a_new_page_and_a_missing_file_is_rebuilt_or_refused(pages, http):
    first = http.get("/" + gallery_path("story"))
    old_files = _page_files(pages.folder)
    assert len(old_files) == 3  # the page and its Brotli and gzip copies

    recording = json.loads(pages.source.read_text())
    recording["sbon"]["prompt"] = recording["bon"]["prompt"] = "A prompt recorded again"
    pages.source.write_text(json.dumps(recording))  # a new recording, while the app serves
    second = http.get("/" + gallery_path("story"))
    assert second.headers["etag"] != first.headers["etag"]
    assert "A prompt recorded again" in second.text and "A prompt recorded again" not in first.text
    assert not set(old_files) & set(_page_files(pages.folder))  # the stale page went

    for p in pages.folder.glob("*.html*"):  # the built page lost (e.g. a cleaned temporary folder)
        p.unlink()
    assert http.get("/" + gallery_path("story")).text == second.text  # rebuilt, the same page

    pages.source.unlink()  # the recorded run itself gone: refused in one line, never a stale page
    gone = http.get("/" + gallery_path("story"))
    assert gone.status_code == 404 and gone.text.count("\n") == 1 and "missing or broken" in gone.text
    unknown = http.get("/" + gallery_path("no-such-story"))
    assert unknown.status_code == 404 and "there is no gallery run named 'no-such-story'" in unknown.text


def test_a_shared_run_has_its_page_until_its_link_expires_then_its_files_go_and_its_address_says_so(pages, http):
    run_id = pages.shares.put(SOURCE.read_text())
    pages.write_shared(run_id)  # what Share does
    folder = pages.shares.folder
    assert {p.name for p in folder.glob("*")} == {f"{run_id}.{s}" for s in ("json", "html", "html.br", "html.gz")}
    page = http.get("/" + run_path(run_id))
    assert page.status_code == 200 and page.headers["etag"] == f'"{run_id}"'
    assert int(page.headers["cache-control"].split("max-age=")[1]) <= 1000  # no copy outlives the link
    assert pages.built == 1  # the click built it; the visitor read a file

    pages.clock.now += 1001
    expired = http.get("/" + run_path(run_id))
    assert expired.status_code == 410 and expired.headers["cache-control"] == "no-store"
    assert expired.text == ("⚠ this shared run has expired: links work for 0.0115741 days; "
                            "ask for a new link or a downloaded file\n")
    assert list(folder.glob("*")) == []  # the run and its page, compressed copies included
    malformed = http.get("/" + run_path("../../etc"))
    assert malformed.status_code == 404


def test_the_store_cap_takes_a_shared_runs_page_with_it(tmp_path):
    shares = ShareStore(tmp_path, max_files=1, clock=Clock())
    pages = StaticPages(GalleryRuns({}), shares, folder=tmp_path / "pages")
    first = shares.put(SOURCE.read_text())
    pages.write_shared(first)
    shares.put(SOURCE.read_text())  # over the cap: the oldest run goes, page and all
    assert not list(tmp_path.glob(f"{first}.*"))


def test_hostile_text_in_a_shared_run_is_shown_as_text_in_its_static_page(pages, http):
    recording = json.loads(SOURCE.read_text())
    for side in ("bon", "sbon"):
        recording[side]["prompt"] += HOSTILE
        recording[side]["candidates"][0]["text"] += HOSTILE
    run_id = pages.shares.put(json.dumps(recording))
    page = http.get("/" + run_path(run_id)).text
    assert page.count("<script") == 2 and page.count("</script>") == 2  # Plotly's file, and the page's own
    assert "<img src=x" not in page and "<!-- [x]" not in page and 'href="javascript' not in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page  # shown, as text


def test_a_thread_lowered_below_the_generation_stays_there():
    seen = []

    def visitor():
        before = nice_of_this_thread()
        seen.append((before, lower_this_thread(before + 5), nice_of_this_thread()))

    t = threading.Thread(target=visitor)
    t.start()
    t.join(10)
    (before, lowered, after), = seen
    assert lowered and after == before + 5
    assert nice_of_this_thread() == before  # per thread: the caller's own priority is untouched


# -- in Chromium against the real app -----------------------------------------------------------------

def _reading(browser, url: str):
    """Open ``url`` in a fresh browser; every request it makes, and the page once its figures are drawn."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    wait_until(page, "document.querySelectorAll('.sbon-figure .main-svg').length >= 7", timeout=120_000)
    return page, requests


@pytest.mark.slow
def test_a_gallery_story_and_a_shared_run_read_as_static_pages_start_no_python_handler(server, browser, windows, tmp_path):
    """A reader's browser asks for the page and Plotly's file, nothing else: no config, no queue, no event, so
    no Python handler runs after the page arrives. The shared run is made by Share on the interactive page."""
    page, requests = _reading(browser, server + gallery_path("early-violation"))
    assert requests == [server + gallery_path("early-violation"), server + "pages/" + PLOTLY_NAME]
    assert "an early violation" in page.locator("#caption").inner_text()
    explorer = page.locator("#links a").get_attribute("href")
    assert explorer == "../../?gallery=early-violation"
    page.context.close()

    # A run that is not in the gallery: Share keeps it and writes its page at once.
    recording = json.loads(SOURCE.read_text())
    recording["sbon"]["prompt"] = recording["bon"]["prompt"] = "A shared prompt " + HOSTILE
    upload = tmp_path / "run.json"
    upload.write_text(json.dumps(recording))
    app = windows.open(server, (1400, 1000))
    status = "(document.querySelector('#status')?.innerText || '')"
    app.get_by_role("tab", name="Save and replay").click()
    app.locator("#upload-run input[type=file]").set_input_files(str(upload))
    wait_until(app, f"{status}.includes('Replaying the uploaded run')", timeout=120_000)
    app.locator("#share").click()
    wait_until(app, f"{status}.includes('open as a page')", timeout=60_000)
    static = app.locator("#status a", has_text="open as a page").get_attribute("href")
    assert re.fullmatch(re.escape(server) + r"pages/run/[0-9a-f]{24}", static)
    windows.leave(app)

    page, requests = _reading(browser, static)
    assert requests == [static, server + "pages/" + PLOTLY_NAME]
    assert "<img src=x onerror=alert(2)>" in page.locator("body").inner_text()  # hostile text shown as text
    assert page.locator("img").count() == 0
    page.context.close()
