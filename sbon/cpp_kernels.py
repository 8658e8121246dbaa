"""sbon's C++ kernels (``sbon/kernels/*.cpp``): each built on a machine's first use into sbon's cache, a folder per
source, flags, torch and Python version, and loaded from there later. A kernel registers its CPU code for an
operator whose schema the module that calls it defines (with the shape function ``torch.compile`` traces it with)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from .errors import one_line

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent / "kernels"


def build(name: str, flags: Sequence[str], what: str) -> str | None:
    """Build (the first time on a machine) and load ``kernels/{name}.cpp`` with the compiler ``flags``: None, or why
    not, as "does not build here (…)" for a line that names the kernel first. ``what`` names the kernel in the line
    logged while it builds."""
    from torch.utils.cpp_extension import load

    from .cache import cache_dir
    source = SOURCES / f"{name}.cpp"
    key = hashlib.blake2b(b"\0".join([source.read_bytes(), " ".join(flags).encode(), torch.__version__.encode(),
                                      sys.version.encode()]), digest_size=8).hexdigest()
    folder = cache_dir() / "kernels" / f"{name}-{key}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not any(folder.glob("*.so")):
            log.warning("%s: compiling its kernel once on this machine (seconds) in %s", what, folder)
        # -fopenmp: at::parallel_for splits the work over torch's threads only where it is compiled with OpenMP, as
        # inductor's kernels are.
        with _building(folder):
            load(name=f"sbon_{name}_{key}", sources=[str(source)], extra_cflags=[*flags, "-fopenmp"],
                 extra_ldflags=["-fopenmp"], build_directory=str(folder), is_python_module=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a failed build: the caller does without it
        return f"does not build here ({one_line(e)})"
    return None


@contextlib.contextmanager
def _building(folder: Path) -> Iterator[None]:
    """One process at a time builds or loads ``folder``'s kernel (sbon.cache.one_at_a_time). torch's own lock there
    (a file its builder deletes when done) is then left only by a builder that was killed midway (a measuring child
    ends with the app, by a signal): every later load would wait on it forever, so it is removed, where the lock is
    held (where it is not, a builder may be at work)."""
    from .cache import one_at_a_time
    with one_at_a_time(folder / "build.flock") as held:
        if held:
            (folder / "lock").unlink(missing_ok=True)
        yield
