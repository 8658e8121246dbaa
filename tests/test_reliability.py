"""Reliability pieces that need no server: the background model load and its status line, and the
checks that refuse hostile replay files (the browser and API matrix is in tests/test_app_e2e.py)."""

import json
import threading
from pathlib import Path

import pytest

import components.model_cache as mc
from components.controls import MAX_PROMPT_CHARS, RunSettings
from components.model_cache import ModelCache
from sbon.errors import SBoNError

ROOT = Path(__file__).resolve().parents[1]


def test_background_load_says_what_it_is_doing_and_retries_after_a_failure(monkeypatch):
    monkeypatch.setattr(mc, "_warm_up", lambda gen: None)
    release, attempts = threading.Event(), []

    def load_gen(name, device):
        attempts.append(name)
        if len(attempts) == 1:
            raise SBoNError("the hub is not reachable")
        release.wait(10)
        return f"G:{name}"

    cache = ModelCache(load_gen=load_gen, load_rew=lambda name, generator, device: f"R:{name}")
    with pytest.raises(SBoNError, match="not reachable"):
        cache.load_async("smollm2-135m", "likelihood").result(timeout=10)
    assert cache.loading() == ""  # a failed load leaves no stale status
    job = cache.load_async("smollm2-135m", "likelihood")  # retried, not the failed future again
    assert cache.load_async("smollm2-135m", "likelihood") is job  # a second caller joins the same load
    for _ in range(100):
        if cache.loading():
            break
        threading.Event().wait(0.05)
    assert cache.loading().startswith("Step 1/3: loading the generator, SmolLM2-135M-Instruct") and cache.loading().endswith(" s")
    release.set()
    assert job.result(timeout=10) == ("G:smollm2-135m", "R:likelihood") and cache.loading() == ""
    assert attempts == ["smollm2-135m", "smollm2-135m"]


def test_prompt_length_is_capped_before_tokenizing():
    RunSettings(prompt="x" * MAX_PROMPT_CHARS).check()
    with pytest.raises(SBoNError, match="at most 20,000"):
        RunSettings(prompt="x" * (MAX_PROMPT_CHARS + 1)).check()


@pytest.fixture(scope="module")
def load_upload():
    """What the page's upload reads a file with (components.replays.on_upload)."""
    from components.saved_runs import load_upload
    return load_upload


def _upload(tmp_path, change=None, text=None) -> str:
    d = json.loads((ROOT / "assets" / "recorded_run.json").read_text())
    if change:
        change(d)
    path = tmp_path / "run.json"
    path.write_text(text if text is not None else json.dumps(d))
    return str(path)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["sbon"]["candidates"][0].update(final_reward=1e300), "holds the number 1e\\+300"),
    (lambda d: d["bon"]["candidates"][1].update(final_reward=float("inf")), "holds the number inf"),
    (lambda d: d["sbon"]["timings"].update(scoring=float("nan")), "holds the number nan"),
    (lambda d: d["sbon"]["candidates"][0].update(pruned_round=-1), "pruned in round -1, which the run does not have"),
    (lambda d: d["signal_scores"]["logprob"]["32"].__setitem__(0, float("-inf")), "holds the number -inf"),
])
def test_replays_with_impossible_numbers_are_refused(load_upload, tmp_path, change, message):
    with pytest.raises(SBoNError, match=message):
        load_upload(_upload(tmp_path, change))


def test_deeply_nested_json_is_refused_in_one_line(load_upload, tmp_path):
    with pytest.raises(SBoNError, match="nested too deeply"):
        load_upload(_upload(tmp_path, text="[" * 100_000 + "]" * 100_000))
    assert load_upload(_upload(tmp_path)).n > 0  # the shipped recording still replays


# -- a class behind one link: links, gallery files and page exports (components/share.py, gallery.py, page_export.py)

@pytest.fixture(scope="module")
def app_module():
    import app
    return app


@pytest.mark.parametrize("query, message", [
    ("run=../../etc/passwd", "its run id is malformed"),
    ("run=", "its run id is malformed"),
    ("run=ffffffff0123456789abcdef", "is not on this server"),  # made in the future: not expired, just unknown
    ("run=000000010123456789abcdef", "has expired: links work for 7 days"),
    ("gallery=no-such-run", "there is no gallery run named 'no-such-run'"),
])
def test_a_bad_link_says_why_in_one_line_and_the_page_still_shows_a_run(app_module, query, message):
    shown = app_module.open_link(query, "curves")
    assert message in shown["status"] and "\n" not in shown["status"] and shown["status"].startswith("⚠")
    assert "recorded run" in shown["source"] and shown["comparison"].n > 0  # the page opens on it, not blank


def test_a_gallery_file_that_fails_to_load_is_listed_with_one_line_and_the_others_open(tmp_path):
    from components.gallery import GALLERY, GalleryEntry, GalleryRuns

    broken, cut = tmp_path / "broken.json", tmp_path / "cut.json"
    broken.write_text('{"format": "sbon-comparison/1", "bon": 1}')
    cut.write_text(GALLERY["default"].file.read_text()[:5000])
    runs = GalleryRuns({"default": GALLERY["default"], "broken": GalleryEntry("broken", "A broken one", file_name=str(broken)),
                        "cut": GalleryEntry("cut", "A cut one", file_name=str(cut))})
    assert runs.get("default").comp.n > 0
    for key in ("broken", "cut"):
        with pytest.raises(SBoNError, match="missing or broken; the others still open") as e:
            runs.get(key)
        assert "\n" not in str(e.value) and str(tmp_path) not in str(e.value)  # no internal path shown


def test_a_shared_run_over_the_size_cap_is_refused_in_one_line(tmp_path):
    from components.share import ShareStore

    with pytest.raises(SBoNError, match="more than a shared run may be .* download it instead"):
        ShareStore(tmp_path, max_bytes=1000).put("x" * 1001)
    assert list(tmp_path.glob("*")) == []


def test_a_page_export_shows_hostile_model_text_as_text():
    from components.gallery import GALLERY
    from components.page_export import page_html
    from sbon.analysis.comparison import Comparison

    comp = Comparison.load(GALLERY["default"].file)
    hostile = "</script><script>alert(1)</script><img src=x onerror=alert(2)><!-- [x](javascript:alert(3))"
    for run in (comp.speculative, comp.bon):
        run.prompt += hostile
        run.candidates[0].text += hostile
    page = page_html(comp, "caption " + hostile, "origin " + hostile)
    assert page.count("<script>") == 2 and page.count("</script>") == 2  # Plotly's, and the page's own
    assert "<img src=x" not in page and "<!-- [x]" not in page and 'href="javascript' not in page
