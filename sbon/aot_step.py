"""The compiled decode step saved to disk and loaded by later processes (``decode compiled`` on a CPU).

Why: a process that compiles the step with `torch.compile` traces `transformers`' forward with Dynamo first, and
that tracing alone takes longer than the app's warm start allows, even where inductor's disk cache already holds
the kernels (benchmarks/results/*/step). `torch.compile`'s ahead-of-time mode (``aot_compile``) keeps what tracing
made (Dynamo's bytecode, its guards and inductor's kernels) in one file, which a later process loads in seconds
instead of tracing again. The first process on a machine compiles and saves it.

The step takes the model and the KV slab as Python objects, which Dynamo guards by identity; such guards cannot be
saved, so they are left out (``_serializable``). What they checked is in the file's name instead: a hash of
everything that changes the step's graph or its numbers (``step_key``): the model's weights, configuration and
attention, the weight format, the torch, transformers, kernels and Python versions, this
package's decode code, the CPU's vector instructions and the thread count inductor generated its kernels for.
Guards that can be saved (every tensor's dtype, shape rules and strides, the thread count) are checked before each
call: all of them where the caller says something but a dynamic dimension's size may have changed since they last
held, only those a size can change (the shape rules) and those on global state otherwise (``SavedStep.fits``); a
process that changes its thread count loads, or compiles and saves, the step for the new one. Saving a step deletes
the saved steps no process has loaded for two weeks (``forget_unused``): those an update renamed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .attention import load_kernel
from .engine import tensor_bytes, weights_digest

log = logging.getLogger(__name__)

# Inductor's settings the step is compiled with unless a decoder names others (part of the saved step's name).
# The C++ wrapper calls the step's kernels from C++ instead of from generated Python, which spends a noticeable part of
# a step calling them; built apart from the kernels at a low optimisation level, it adds little to the first compile
# (optimised together with them, it makes the first compile several times longer). The same kernels: the same numbers.
INDUCTOR_OPTIONS: dict[str, Any] = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True}

# This package's files whose code runs inside the step or saves it (a change in any of them changes the saved step).
STEP_SOURCES = ("decoders.py", "static_cache.py", "attention.py", "engine.py", "int4.py", "aot_step.py",
                "cpp_kernels.py", *sorted(f"kernels/{p.name}" for p in (Path(__file__).parent / "kernels").glob("*.cpp")))


def step_key(gen, options: dict[str, Any], threads: int | None = None) -> str:
    """The saved step's name: a hash of everything its graph and numbers depend on (see the module's docstring);
    ``threads``: the CPU thread count it is for (default: torch's now)."""
    import transformers

    h = hashlib.blake2b(digest_size=16)
    here = Path(__file__).parent
    for part in (torch.__version__, transformers.__version__, kernels_version(), sys.version, cpu_features(),
                 threads or torch.get_num_threads(), gen.weights, gen.model.config.to_json_string(),
                 getattr(gen.model.config, "_attn_implementation", None),
                 # whether the step calls the attention kernel: asked here too (built where it is not yet), so that a
                 # process that has not made a compiled decoder yet names the step as the one that saved it did
                 load_kernel() is None,
                 weights_hash(gen.model), sorted(options.items()),
                 *((here / name).read_bytes() for name in STEP_SOURCES)):
        h.update(part if isinstance(part, bytes) else repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def kernels_version() -> str | None:
    """The `kernels` package's version, where it is installed: transformers then routes some model functions
    through it, and the saved step keeps no guard on them (``_serializable``)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("kernels")
    except PackageNotFoundError:
        return None


def cpu_features() -> tuple:
    """The CPU's vector instructions inductor may compile for (a step compiled with them crashes a CPU without), and
    the instruction-set limits in force (an emulated CPU class compiles for its own: sbon.machine.ISA_LIMITS)."""
    from .machine import ISA_LIMITS
    import os
    return (*sorted((name, getattr(torch.cpu, name)()) for name in dir(torch.cpu)
                    if name.startswith("_is_") and name.endswith("_supported")),
            ("capability", torch.backends.cpu.get_cpu_capability()),
            *((name, os.environ[name]) for name in ISA_LIMITS if os.environ.get(name)))


def weights_hash(model: torch.nn.Module) -> str:
    """A hash of every parameter's and buffer's name, shape, dtype and bytes (kept on the model: computed once)."""
    if getattr(model, "_sbon_weights_hash", None) is None:
        h = weights_digest()
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
            h.update(tensor_bytes(t) if t.numel() else b"")
        model._sbon_weights_hash = h.hexdigest()[:32]
    return model._sbon_weights_hash


def step_path(gen, options: dict[str, Any], threads: int | None = None) -> Path:
    return _steps() / f"{step_key(gen, options, threads)}.pt"


def any_saved() -> bool:
    """Whether this machine holds any saved step. Naming one (``step_key``) builds the attention kernel where it is
    not built yet and hashes the weights: seconds that a machine which never saved a step need not wait for."""
    return any(_steps().glob("*.pt"))


def _steps() -> Path:
    """Beside inductor's own caches ($SBON_CACHE/inductor, or TORCHINDUCTOR_CACHE_DIR): one folder to empty, or
    to point elsewhere, for a cold compile."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return Path(cache_dir()) / "sbon-step"


def _serializable(guards: Sequence[Any]) -> list[bool]:
    """Dynamo's guards a file can hold: none by identity (the model, the slab, functions) nor on globals, and none on
    an object whose class is defined inside a function, nor on anything reached through one (their names contain its
    name), which a file cannot name: the `kernels` package, which transformers uses where it is installed, wraps
    model functions such as Llama's rotary embedding in such classes. They are the library's code, whose version
    the step's key names."""
    from torch._dynamo.guards import CheckFunctionManager
    unsaved = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    local = [g.name for g in guards if g.has_value and "<locals>" in type(g.value).__qualname__]
    return [not (g.is_global or g.guard_type in unsaved or unsaved & set(g.derived_guard_types)
                 or any(name in g.name for name in local)) for g in guards]


class SavedStep:
    """A step loaded from its file: ``fits(*args, like=...)`` checks the saved guards, ``step(*args)`` runs it."""

    def __init__(self, fn: Callable, path: Path, built: bool = False):
        self.fn, self.path, self.built = fn, path, built  # built: compiled and saved by this process
        fn.disable_guard_check()  # checked once per call by fits(), which says so instead of raising
        root = fn._artifacts.guard_manager.root
        # Checking the whole tree (every tensor of the model and the slab) costs a noticeable part of a step. Of its
        # guards, the only ones a dynamic dimension's size can change are the shape rules between symbols (sizes and
        # strides: Dynamo's epilogue guards); the root's own leaf guards check global state (threads, grad mode...),
        # which no argument carries.
        self.size_guards = (*root.get_leaf_guards(), *root.get_epilogue_lambda_guards())
        self.checked: Any = None  # the ``like`` of the last whole check that held

    def fits(self, *args: Any, like: Any = None) -> bool:
        """The saved guards hold for these arguments. ``like``: a value equal for arguments that differ only in the
        sizes of dimensions compiled dynamic (None: unknown); after a whole check held for an equal one, only the
        guards those sizes (or global state) can change are checked. Nothing is checked under
        ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``, as a traced step's guards are not."""
        from torch._dynamo.eval_frame import _is_skip_guard_eval_unsafe_stance
        if _is_skip_guard_eval_unsafe_stance():
            return True
        if like is not None and like == self.checked:
            f_locals = self.fn.prepare_f_locals(*args)
            return all(guard(f_locals) for guard in self.size_guards)
        fits = self.fn.guard_check(*args)
        self.checked = like if fits else None
        return fits

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


# A saved step that no process has loaded for this long is deleted when another is saved. An update of torch,
# transformers or this package's decode code renames the step (``step_key``), and its old file, ten megabytes or so,
# would otherwise stay forever; a step in use is loaded, and so kept, by every process that decodes with it.
UNUSED_DAYS = 14


def load(step: Callable, path: Path, built: bool = False) -> SavedStep:
    """The step saved at ``path`` (``step``: the function it was compiled from, whose module's globals it reads),
    marked as used now (its modification time: what :func:`forget_unused` keeps steps by)."""
    try:
        os.utime(path)
    except OSError:  # a folder this process may read but not write: the step still loads
        pass
    with open(path, "rb") as f:
        return SavedStep(torch.compiler.load_compiled_function(f, f_globals=step.__globals__), path, built)


def build(step: Callable, args: tuple, path: Path, options: dict[str, Any]) -> None:
    """Compile ``step`` for ``args`` (their dimensions marked dynamic where the graph must not specialise) with
    inductor's ``options`` and save it at ``path`` (written whole or not at all: other processes may read the
    folder)."""
    compiled = torch.compile(step, fullgraph=True, dynamic=False,
                             options={"guard_filter_fn": _serializable, **options})
    fn = compiled.aot_compile((args, {}))
    path.parent.mkdir(parents=True, exist_ok=True)
    fn.save_compiled_function(str(path))  # serialised whole, then written to a temporary file and renamed
    forget_unused(path.parent)


def forget_unused(folder: Path, days: float = UNUSED_DAYS) -> list[Path]:
    """Delete the steps saved in ``folder`` that no process has loaded for ``days`` (see UNUSED_DAYS); return them."""
    before, gone = time.time() - days * 86400, []
    for path in folder.glob("*.pt"):
        try:
            if path.stat().st_mtime < before:
                path.unlink()
                gone.append(path)
        except OSError:  # gone already (another process), or not ours to delete: nothing to do
            pass
    if gone:
        log.info("decode compiled: deleted %d saved step(s) unused for %g days", len(gone), days)
    return gone
