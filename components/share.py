"""Shared runs: "Share this run" keeps the run's saved JSON on the server under a run id, and a link
`?run=<id>` reopens exactly that run for anyone who has it, until it expires.

The id starts with the time it was made (hex seconds), so a link to a run whose file has gone can
still say that it expired rather than that it never existed; the rest is random, so ids cannot be
guessed from each other. Files over a size cap are refused; the store keeps at most ``max_files``
runs (the oldest go first) and drops runs older than ``ttl_s``, so a long-lived server does not fill
its disk. Gallery runs need no file: their links name them (`?gallery=<key>`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

from sbon.analysis.comparison import Comparison
from sbon.errors import SBoNError

RUN_ID = re.compile(r"[0-9a-f]{8}[0-9a-f]{16}")


@dataclass
class ShareStore:
    folder: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "sbon-explorer" / "links",
                         metadata={"help": "where shared runs are kept"})
    ttl_s: float = field(default=7 * 24 * 3600, metadata={"help": "how long a link works (seconds)"})
    max_bytes: int = field(default=5_000_000, metadata={"help": "the largest run (saved JSON) that can be shared"})
    max_files: int = field(default=2000, metadata={"help": "how many shared runs are kept at most"})
    clock: object = field(default=time.time, repr=False)

    def put(self, text: str) -> str:
        """Keep one run's saved JSON and return its new id."""
        data = text.encode()
        if len(data) > self.max_bytes:
            raise SBoNError(f"this run is {len(data) / 1e6:.1f} MB, more than a shared run may be "
                            f"({self.max_bytes / 1e6:.0f} MB): download it instead")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.prune()
        run_id = f"{int(self.clock()):08x}{secrets.token_hex(8)}"
        fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path(run_id))  # a reader never sees half a file
        return run_id

    def path(self, run_id: str) -> Path:
        return self.folder / f"{run_id}.json"

    def get(self, run_id: str) -> Comparison:
        """The run with this id, or an SBoNError of one line: a malformed id, an expired run, an unknown one."""
        return Comparison.load(self.check(run_id))

    def check(self, run_id: str) -> Path:
        """The file of the run with this id, after the checks `get` makes (a cached run expires too)."""
        run_id = (run_id or "").strip()
        if not RUN_ID.fullmatch(run_id):
            raise SBoNError("this link does not name a shared run (its run id is malformed)")
        made = int(run_id[:8], 16)
        path = self.path(run_id)
        if self.clock() - made > self.ttl_s:
            self.remove(run_id)
            raise SBoNError(f"this shared run has expired: links work for {self.ttl_s / 86400:g} days; "
                            "ask for a new link or a downloaded file")
        if not path.is_file():
            raise SBoNError("this shared run is not on this server (the link is wrong, or the server was restarted)")
        return path

    def remove(self, run_id: str) -> None:
        """The run's JSON and every file made from it (its static page and that page's compressed copies)."""
        for p in self.folder.glob(f"{run_id}.*"):
            p.unlink(missing_ok=True)

    def prune(self) -> None:
        """Drop expired runs, then the oldest while more than max_files are kept."""
        now, kept = self.clock(), []
        for p in self.folder.glob("*.json"):
            made = int(p.stem[:8], 16) if RUN_ID.fullmatch(p.stem) else 0
            if now - made > self.ttl_s:
                self.remove(p.stem)
            else:
                kept.append((made, p))
        for _, p in sorted(kept)[:max(0, len(kept) - self.max_files + 1)]:
            self.remove(p.stem)


def link(page_url: str, **query: str) -> str:
    """The page's address with only this query (e.g. run=<id>): what a visitor copies."""
    parts = urlsplit(page_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), ""))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
