"""Every way a finished run reaches the page without generating: the recorded run, an uploaded file, the
gallery, a link (`?run=<id>`, `?gallery=<key>`), and what Share and Download as a page make of the run shown.
Plain data in, {page element name: value} out (components/updates.py); app.py wires them.

The four run modules: `runs` generates a run on the page (live); `replays` shows a finished run without
generating (opened, uploaded, linked, from the gallery); `saved_runs` reads and writes a run as a file (no page
state); `record` is the command that makes the shipped recordings the replays open."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import plotly.graph_objects as go

from sbon.analysis.comparison import Comparison
from sbon.errors import SBoNError

from . import page_export, tables
from .controls import ASSETS, controls_for
from .gallery import GalleryRuns
from .page_text import LOCAL_ADDRESS
from .presenter import look_for
from .saved_runs import check_replayable, load_upload, temp_file
from .view_cache import computed_once
from .share import ShareStore, digest, link
from .static_pages import StaticPages, gallery_path, run_path
from .style import Look
from .updates import WARNING, FrozenFigure, Update
from .views import NO_RUN, Shown, as_kind, as_look, explaining_reward, show, source

RECORDED_RUN = ASSETS / "recorded_run.json"
log = logging.getLogger("sbon.app")

# The gallery, read and checked once at start (a file that fails stays listed with its reason), and the
# shared runs' store; a gallery run's link names it instead of copying it.
GALLERY = GalleryRuns(check=check_replayable)
GALLERY_DIGESTS = {digest(run.comp.to_json()): key for key, run in GALLERY.runs.items() if run.comp is not None}
SHARES = ShareStore()
# What a visitor only reads, as files served beside the app (components/static_pages.py).
PAGES = StaticPages(GALLERY, SHARES, explain=explaining_reward)


def show_recorded(kind: str, look: Look = Look()) -> dict[str, Any]:
    """The recorded run's views (the Replay button)."""
    return as_of_now(recorded_views(kind, look))


@computed_once(maxsize=8)
def recorded_views(kind: str, look: Look = Look()) -> dict[str, Any]:
    """The recorded run's views, computed once per trade-off kind and look: every page load shows them."""
    try:
        comp = Comparison.load(RECORDED_RUN)
    except SBoNError as e:
        return {"status": f"⚠ the recorded run could not be shown: {e}", "caption": NO_RUN}
    return show(Shown(comp, "the recorded run shipped with the app", kind, RECORDED_RUN, look))


def as_of_now(views: dict[str, Any]) -> dict[str, Any]:
    """Views computed once, with the one line that depends on this machine now rather than on the run: whether a
    Run here reproduces it (views.source), which changes as the app loads its models and measures its decode paths."""
    comp = views.get("comparison")
    return views if comp is None else {**views, "source": source(Shown(comp, views["origin"]))}


def on_open(kind: str, viewport: dict | None, params: dict[str, str]) -> dict[str, Any]:
    """The page opens on the run its link names (`?run=<id>`, `?gallery=<key>`), else the recorded run; in the
    presenter view when its URL asks (`?view=presenter`), whose toggle can be clicked from now on. `params`: the page's
    query parameters."""
    presenter = params.get("view") == "presenter"
    look = look_for(presenter, viewport)
    kind = as_kind(kind)
    query = {k: v for k, v in params.items() if k in ("run", "gallery")}
    views = open_link(urlencode(query), kind, look) if query else as_of_now(recorded_page(kind, look))
    return {**views, "look": look, "presenter": Update(value=presenter, interactive=True)}


def on_upload(path: str | None, kind: str, look: Look = Look()) -> dict[str, Any]:
    try:
        comp = load_upload(path)
    except SBoNError as e:
        return {"status": f"⚠ could not replay that file: {e}", WARNING: str(e)}
    except Exception as e:  # a file no check foresaw: still one line, and the views stay as they were
        log.exception("upload failed")
        return {"status": f"⚠ could not replay that file: {type(e).__name__}: {str(e)[:200]}"}
    return show(Shown(comp, f"uploaded file {Path(path).name}", kind, path, look), "Replaying the uploaded run")


# -- the gallery, shared links and the page export: a class behind one link --------------------------

def gallery_markdown() -> str:
    """The gallery's list: each run's title and its caption, written from its data, and its page (a file that
    reads with no handler behind it)."""
    return "\n".join(f"- **{tables.md_escape(run.entry.title)}** — {tables.md_escape(run.untitled)}"
                     + (f" · [open as a page]({gallery_path(key)})" if run.comp is not None else "")
                     for key, run in GALLERY.runs.items())


@computed_once(maxsize=2)
def recorded_page(kind: str, look: Look = Look()) -> dict[str, Any]:
    """The recorded run as every page load sends it: its figures serialized once."""
    return frozen(recorded_views(kind, look))


@computed_once(maxsize=64)
def gallery_views(key: str, kind: str, look: Look = Look()) -> dict[str, Any]:
    """Every view of a gallery run, computed once per (run, trade-off kind): a gallery open is a lookup
    and Gradio's serialization, never a model, a file read or the generation slot."""
    run = GALLERY.get(key)
    shown = Shown(run.comp, f"the gallery run “{run.entry.title}”", kind, run.entry.file, look)
    # the story is a starting point: every control takes its settings, so Run reruns the story's configuration
    automatic = tuple(name for name in ("kv_budget", "first_decision") if name not in run.entry.settings)
    source = f"Gallery: {tables.md_escape(run.caption)} · [open as a page]({gallery_path(key)})"
    return {**frozen(show(shown, source)), **controls_for(run.comp, automatic)}


@computed_once(maxsize=32)
def shared_views(run_id: str, kind: str, look: Look = Look()) -> dict[str, Any]:
    """Every view of a shared run, computed once per (run, kind): a class opening the lecture's link costs one."""
    comp = SHARES.get(run_id)
    check_replayable(comp)
    return {**frozen(show(Shown(comp, "a shared run", kind, look=look), "Showing the run this link was shared with")),
            **controls_for(comp)}


def frozen(views: dict[str, Any]) -> dict[str, Any]:
    """Views to keep and send many times: each figure serialized once (what Gradio's Plot would do per open)."""
    return {name: FrozenFigure(value.to_json()) if isinstance(value, go.Figure) else value
            for name, value in views.items()}


def warm_gallery() -> None:
    """Compute every gallery run's views once, in the background after start, so the first visitor's open is
    a lookup too."""
    for key, run in GALLERY.runs.items():
        if run.comp is not None:
            gallery_views(key, "curves")


def on_gallery(key: str | None, kind: str, look: Look = Look()) -> dict[str, Any]:
    if not key:
        return {}
    try:
        return as_of_now(gallery_views(str(key), as_kind(kind), as_look(look)))
    except SBoNError as e:
        return {"status": f"⚠ {e}"}


def open_link(query: str, kind: str, look: Look = Look()) -> dict[str, Any]:
    """A link's run: `run=<id>` (a shared run) or `gallery=<key>`, given as the page's query string."""
    params = dict(parse_qsl((query or "").lstrip("?"), keep_blank_values=True))
    kind, look = as_kind(kind), as_look(look)
    try:
        if "gallery" in params:
            return as_of_now(gallery_views(params["gallery"], kind, look))
        SHARES.check(params.get("run", ""))  # malformed, expired or gone: before the cache, which would still hold it
        return as_of_now(shared_views(params["run"].strip(), kind, look))
    except SBoNError as e:
        return {**as_of_now(recorded_page(kind, look)), "status": f"⚠ {e}; showing the recorded run instead"}


def on_share(comp: Comparison | None, page: str | None) -> dict[str, Any]:
    """A link that reopens exactly this run: a gallery run's own name, else the run kept under a new id.
    `page`: the address of the page asking (where the link points)."""
    if comp is None:
        return {"share_link": "", "status": "⚠ there is no run to share yet"}
    text = comp.to_json()
    page = page or LOCAL_ADDRESS
    key = GALLERY_DIGESTS.get(digest(text))
    try:
        if key:
            url, static = link(page, gallery=key), gallery_path(key)
        else:
            run_id = SHARES.put(text)
            url, static = link(page, run=run_id), run_path(run_id)
            PAGES.write_shared(run_id)  # its page now, so the class that opens it reads a file
    except SBoNError as e:
        return {"share_link": "", "status": f"⚠ {e}"}
    days = "" if key else f" for {SHARES.ttl_s / 86400:g} days"
    static = beside(page, static)
    return {"share_link": url, "status": f"Anyone with this link sees this run{days}: {url} · "
                                         f"[open as a page]({static}) (reads with no app behind it: {static})"}


def beside(page_url: str, path: str) -> str:
    """The address of ``path`` (relative to the app's root) on the server of ``page_url``."""
    parts = urlsplit(page_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/" + path, "", ""))


def on_page_export(comp: Comparison | None, origin: str | None) -> dict[str, Any]:
    """The run as one HTML file that opens in a browser with no server (components/page_export.py)."""
    if comp is None:
        return {"page_file": None, "status": "⚠ there is no run to export yet"}
    key = GALLERY_DIGESTS.get(digest(comp.to_json()))
    caption = GALLERY.runs[key].caption if key else ""
    html = page_export.page_html(comp, caption, origin or "", explaining_reward(comp))
    return {"page_file": temp_file(html, "sbon-page-", ".html"), "status": f"The page is ready ({len(html.encode()) / 1e6:.1f} MB): it opens in any "
                                          "browser, with no server and no network"}
