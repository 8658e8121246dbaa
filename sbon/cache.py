"""Where sbon keeps its files on this machine: converted models, the 4-bit blocks read from a GGUF file, compiled
decode steps and the measured decode choice. A leaf module, so that any part of the core may ask."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """sbon's files on this machine: $SBON_CACHE or ~/.cache/sbon."""
    return Path(os.environ.get("SBON_CACHE") or Path.home() / ".cache" / "sbon")
