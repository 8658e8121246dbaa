"""Where sbon keeps its files on this machine: converted models, the 4-bit blocks read from a GGUF file, compiled
decode steps and the measured decode choice. A leaf module, so that any part of the core may ask."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """sbon's files on this machine: $SBON_CACHE or ~/.cache/sbon."""
    return Path(os.environ.get("SBON_CACHE") or Path.home() / ".cache" / "sbon")


@contextlib.contextmanager
def one_at_a_time(lock: Path) -> Iterator[bool]:
    """Held by one process (or thread) at a time: an advisory lock on the file ``lock``, which the system drops
    when its holder ends, however it ends. Around making a file of the cache, so that a second process that needs it
    meanwhile (the app and a command line started together, a measuring child) waits and then reads what the first
    made, instead of making it again on the same cores. Where no lock can be taken (no fcntl, a cache that cannot be
    written) it holds nothing; it yields whether it holds the lock."""
    try:
        import fcntl
        lock.parent.mkdir(parents=True, exist_ok=True)
        held = open(lock, "w")
    except (ImportError, OSError):
        yield False
        return
    with held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield True
