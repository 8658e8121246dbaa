"""What a visitor only reads, as plain files: every gallery story (the recorded run the page opens on is the
first), and each shared run, served beside the app at ``/pages/...`` and never through Gradio's queue.

Each page is "Download as a page" (components/page_export.py) with Plotly loaded from the app's own copy of
plotly's bundled script (``/pages/plotly-<version>.min.js``, cached for a year: its name changes with the
version), so a visitor's browser fetches Plotly once, whichever pages it opens. A page is built once and kept
as a file, written to a temporary name and renamed, so a reader never gets half of one:

- a gallery story's file is named by the content hash of its recorded run, so a new recording makes a new
  file on its next open (the old one is removed) and the page cannot show a stale run;
- a shared run's file is written when Share is pressed, beside its saved JSON (components/share.py), and
  goes when the link expires or is pushed out by the store's cap: its address then says so in one line.

Each file is also kept compressed (Brotli and gzip, made once), and sent as the visitor's browser accepts
it, with an ETag (the content hash) and Cache-Control, so a second look is a 304 and the server compresses
nothing per visitor. After the page, the browser fetches only Plotly's file: no Python handler runs for a
visitor who only reads.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlencode

import brotli
import plotly
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route, Router

from sbon.analysis.comparison import Comparison
from sbon.errors import SBoNError

from . import page_export
from .gallery import GalleryRuns, caption
from .priority import lower_this_thread
from .saved_runs import check_replayable
from .share import RUN_ID, ShareStore

log = logging.getLogger("sbon.pages")
PREFIX = "/pages"  # where the app mounts these routes
# Addresses between the pages and the app are relative, so they hold wherever the app is served (a Space's
# root, a proxy's sub-path): the interactive page links to "pages/...", a page to "../plotly-…" and "../../?…".
PLOTLY_FILE = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
PLOTLY_NAME = f"plotly-{plotly.__version__}.min.js"
FOREVER = "public, max-age=31536000, immutable"  # a name that changes with its content
PAGE_CACHE = "public, max-age=300"  # a gallery story's address: a new recording shows within minutes
ENCODINGS = (("br", ".br"), ("gzip", ".gz"))  # sent in this order of preference, when the browser accepts it


def gallery_path(key: str) -> str:
    """A gallery story's page, relative to the app's root."""
    return f"{PREFIX.lstrip('/')}/gallery/{key}"


def run_path(run_id: str) -> str:
    """A shared run's page, relative to the app's root."""
    return f"{PREFIX.lstrip('/')}/run/{run_id}"


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file in the same folder, then a rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_page(path: Path, text: str) -> None:
    """The page and its compressed copies, each written atomically; the plain file last, so a page that
    exists has its copies."""
    data = text.encode()
    write_atomically(path.with_name(path.name + ".br"), brotli.compress(data, quality=9))
    write_atomically(path.with_name(path.name + ".gz"), gzip.compress(data, 9, mtime=0))
    write_atomically(path, data)


def remove_page(path: Path) -> None:
    for p in (path, *(path.with_name(path.name + suffix) for _, suffix in ENCODINGS)):
        p.unlink(missing_ok=True)


def file_response(request: Request, path: Path, etag: str, cache: str, media_type: str) -> Response:
    """The file, or 304 when the browser already has this ETag; compressed as the browser accepts it."""
    headers = {"ETag": f'"{etag}"', "Cache-Control": cache, "Vary": "Accept-Encoding"}
    known = {t.strip().removeprefix("W/").strip('"') for t in request.headers.get("if-none-match", "").split(",")}
    if etag in known or "*" in known:
        return Response(status_code=304, headers=headers)
    accepted = request.headers.get("accept-encoding", "")
    for encoding, suffix in ENCODINGS:
        packed = path.with_name(path.name + suffix)
        if encoding in accepted and packed.is_file():
            return FileResponse(packed, media_type=media_type, headers={**headers, "Content-Encoding": encoding})
    return FileResponse(path, media_type=media_type, headers=headers)


def refusal(message: str, status: int) -> Response:
    """One line for a page that cannot be shown, never cached."""
    return PlainTextResponse(message + "\n", status_code=status, headers={"Cache-Control": "no-store"})


@dataclass
class StaticPages:
    gallery: GalleryRuns = field(metadata={"help": "the gallery's stories, by key"})
    shares: ShareStore = field(metadata={"help": "the shared runs; each one's page is kept beside its JSON"})
    folder: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "sbon-explorer" / "pages",
                         metadata={"help": "where the gallery's pages and the compressed Plotly are kept"})
    explain: Callable[[Comparison], object] = field(default=lambda comp: None, metadata={
        "help": "the reward that explains a run's verdicts in its candidates' details (None: no explanations)"})

    def __post_init__(self):
        self._locks: dict[Path, threading.Lock] = {}
        self._guard = threading.Lock()
        self._hashes: dict[Path, tuple[tuple[int, int], str]] = {}  # source file -> ((mtime, size), content hash)
        self.built = 0  # pages built by this process (the tests count them)

    # -- building ----------------------------------------------------------------------------------

    def _once(self, path: Path, build: Callable[[], str]) -> Path:
        """``path``, built by ``build`` if it is not there yet; callers of one path at once build it once."""
        with self._guard:
            lock = self._locks.setdefault(path, threading.Lock())
        with lock:
            if not path.is_file():
                lower_this_thread()  # below the generation, whoever's thread this is
                write_page(path, build())
                self.built += 1
        return path

    def source_hash(self, source: Path) -> str:
        """The content hash of a recorded run's file, read again only when the file changes."""
        st = source.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        known = self._hashes.get(source)
        if known is None or known[0] != stamp:
            known = (stamp, hashlib.sha256(source.read_bytes()).hexdigest()[:20])
            self._hashes[source] = known
        return known[1]

    def gallery_page(self, key: str) -> tuple[Path, str]:
        """A gallery story's page and its ETag, built from its file as it is now. SBoNError (one line) for an
        unknown story or one whose file is missing or broken."""
        run = self.gallery.get(key)  # unknown, or failed to load at start
        source = run.entry.file
        try:
            etag = self.source_hash(source)
        except OSError:
            raise SBoNError("this recorded run is missing or broken; the others still open") from None
        path = self.folder / f"gallery-{key}-{etag}.html"

        def build() -> str:
            comp = Comparison.load(source)
            check_replayable(comp)
            for old in self.folder.glob(f"gallery-{key}-*.html*"):  # an earlier recording's page
                old.unlink(missing_ok=True)
            return page_export.page_html(comp, caption(comp, run.entry), f"the gallery run “{run.entry.title}”",
                                         self.explain(comp), plotly_src=self.plotly_url,
                                         links=(("Open it in the explorer", "../../?" + urlencode({"gallery": key})),))
        return self._once(path, build), etag

    def shared_page(self, run_id: str) -> tuple[Path, str]:
        """A shared run's page, after the store's checks (an expired run's files go). SBoNError (one line)."""
        source = self.shares.check(run_id)  # malformed, expired (its JSON deleted) or gone
        path = source.with_suffix(".html")
        etag = run_id  # a shared run never changes under its id

        def build() -> str:
            comp = Comparison.load(source)
            check_replayable(comp)
            return page_export.page_html(comp, "", "a shared run", self.explain(comp), plotly_src=self.plotly_url,
                                         links=(("Open it in the explorer", "../../?" + urlencode({"run": run_id})),))
        return self._once(path, build), etag

    def write_shared(self, run_id: str) -> Path:
        """Build a shared run's page now (when Share is pressed), so its first visitor gets a file."""
        return self.shared_page(run_id)[0]

    def forget_shared(self, run_id: str) -> None:
        remove_page(self.shares.path(run_id).with_suffix(".html"))

    @property
    def plotly_url(self) -> str:
        """Plotly's address from a page at PREFIX/<kind>/<name>."""
        return f"../{PLOTLY_NAME}"

    def plotly_file(self) -> Path:
        """Plotly's bundled script, with its compressed copies made once."""
        path = self.folder / PLOTLY_NAME
        return self._once(path, lambda: PLOTLY_FILE.read_text(encoding="utf-8"))

    def warm(self) -> None:
        """Build Plotly's copies and every gallery story's page (in the background after start), so the first
        visitor of each gets a file too."""
        self.plotly_file()
        for key, run in self.gallery.runs.items():
            if run.comp is not None:
                try:
                    self.gallery_page(key)
                except SBoNError as e:
                    log.warning("static page of %s not built: %s", key, e)

    # -- serving -----------------------------------------------------------------------------------

    def routes(self) -> Router:
        """The routes to mount at PREFIX. The pages' handlers only look up a file (built once, on a worker
        thread when it is missing); everything else a reading browser asks for is Plotly's file."""
        from starlette.concurrency import run_in_threadpool

        async def plotly_js(request: Request) -> Response:
            path = await run_in_threadpool(self.plotly_file)
            return file_response(request, path, PLOTLY_NAME, FOREVER, "text/javascript")

        async def gallery(request: Request) -> Response:
            try:
                path, etag = await run_in_threadpool(self.gallery_page, request.path_params["key"])
            except SBoNError as e:
                return refusal(f"⚠ {e}", 404)
            return file_response(request, path, etag, PAGE_CACHE, "text/html; charset=utf-8")

        async def shared(request: Request) -> Response:
            run_id = request.path_params["run_id"]
            try:
                path, etag = await run_in_threadpool(self.shared_page, run_id)
            except SBoNError as e:
                if RUN_ID.fullmatch(run_id.strip()):
                    self.forget_shared(run_id.strip())  # expired or gone: its page goes too
                return refusal(f"⚠ {e}", 410 if "expired" in str(e) else 404)
            made = int(run_id[:8], 16)
            left = max(0, int(made + self.shares.ttl_s - self.shares.clock()))  # no copy outlives the link
            return file_response(request, path, etag, f"public, max-age={min(left, 86400)}", "text/html; charset=utf-8")

        return Router(routes=[Route(f"/{PLOTLY_NAME}", plotly_js), Route("/gallery/{key}", gallery),
                              Route("/run/{run_id}", shared)])

