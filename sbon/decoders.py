"""The ``decode`` setting's one place: how a run's decode loop opens a batch and feeds it one token per row.

- ``eager``: `transformers`' forward over a growable KV cache (``sbon.engine.GrowableLayer``), op by op.
- ``compiled``: one `torch.compile`d decode step over a static KV slab (``sbon.static_cache``), as gpt-fast
  does it, over at least two rows (the bf16 format's kernels' smallest, ``sbon.engine.WEIGHT_FORMATS``), padding
  rows' results dropped: on a CPU, inductor's C++ kernels with the row count and the length symbolic (one graph
  for every batch, which returns the last hidden states too: a run whose pruning signals do not read them drops
  them, and one build serves both kinds of run); on a CUDA device CUDA graphs captured from the eager step
  (sbon.cuda_graphs: no compiler, seconds), one per row bucket over the slab's whole length, the unwritten end
  masked. Each row's numbers depend on that row only, at any row count (tests/test_compiled_step.py).
- ``auto``: the path measured on this machine (sbon.machine, ``python -m sbon machine``): on a CPU ``compiled`` where
  the fastest path whose coupling was measured exact is this weight format's compiled step, ``eager`` elsewhere and
  before anything is measured; on a GPU ``compiled`` (CUDA graphs) unless the measurement chose eager.

On a CPU the compiled step is saved whole beside inductor's caches (``$SBON_CACHE/inductor``, sbon.aot_step): the
first process on a machine compiles and saves it, later ones load it in seconds instead of tracing it again. Where
it cannot be saved, the process traces it (its kernels from inductor's disk cache); where compiling is not
possible, the run decodes eagerly; where the step does not compile, the same step runs eagerly over the same slab
(the run says ``eager``); each with one logged line saying why.
"""

from __future__ import annotations

import logging
import os
import shutil
import weakref
from typing import Sequence

import torch

from . import aot_step
from .attention import load_kernel
from .cuda_graphs import GraphDecoder
from .engine import CACHE_KEYWORD, Batch, Generator, Prefix
from .errors import SBoNError, one_line
from .static_cache import SlabCache

log = logging.getLogger(__name__)

DECODE_PATHS = ("auto", "eager", "compiled")
# Tokens the slab's length is rounded up to, so that runs with prompts of nearby lengths share one compiled
# step on a GPU (whose graphs read the whole length).
SLAB_LENGTH_STEP = 64
MIN_ROWS = 2  # a step computes at least this many rows: the bf16 kernels' (WEIGHT_FORMATS["bf16"].min_rows)


def check_decode(name: str) -> None:
    if name not in DECODE_PATHS:
        raise SBoNError(f"unknown decode '{name}': use one of {', '.join(DECODE_PATHS)}")


class EagerDecoder:
    """`transformers`' forward, op by op, over the growable cache."""
    name = "eager"

    def __init__(self, gen: Generator):
        self.gen = gen

    def start(self, prefix: Prefix, candidate_ids: Sequence[int], keep_hidden: bool, max_new_tokens: int) -> Batch:
        return self.gen.start(prefix, candidate_ids, keep_hidden)

    def forward(self, batch: Batch, tokens: torch.Tensor) -> None:
        self.gen.forward(batch, tokens)

    def ready(self, rows: int | None = None, prompt_tokens: int = 0, max_new_tokens: int = 0) -> None:
        """Nothing to load: transformers' forward is ready with the model."""


def _step(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor, cache: SlabCache,
          keep_hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = model(input_ids=tokens, position_ids=positions, **{CACHE_KEYWORD: cache}, use_cache=True,
                output_hidden_states=keep_hidden)
    return out.logits[:, -1, :], out.hidden_states[-1][:, -1, :] if keep_hidden else None


class CompiledDecoder:
    """One compiled decode step over a static KV slab (see the module's docstring)."""

    def __init__(self, gen: Generator, graphs: bool | None = None, compile: bool = True, saved: bool | None = None,
                 inductor: dict | None = None):
        """``graphs``: the CUDA-graph layout (default: on a CUDA device); ``compile=False`` runs the same step
        eagerly over the same slab (what the tests check the layouts with on a CPU); ``saved``: the step is loaded
        from the disk, compiled and saved there first where it is not yet (sbon.aot_step), instead of traced in
        this process (default: where it compiles without the CUDA-graph layout); ``inductor``: inductor's settings
        the saved step is compiled with (default: sbon.aot_step.INDUCTOR_OPTIONS)."""
        self.gen = gen
        self.inductor = aot_step.INDUCTOR_OPTIONS if inductor is None else inductor
        self.graphs = gen.device.type == "cuda" if graphs is None else graphs
        self.compiled = compile
        self.saved = compile and not self.graphs if saved is None else saved
        # By thread count: Dynamo's guards hold the thread count its kernels were generated for. None: traced in this
        # process.
        self.loaded: dict[int, aot_step.SavedStep | None] = {}
        self.announced = not compile  # the first compiled step says it is compiling: it takes a while
        self.failed: str | None = None  # why the step failed to compile (it then runs eagerly over the slab)
        if compile and gen.device.type == "cpu" and (problem := load_kernel()):
            log.warning("decode compiled: the attention kernel %s; the step's attention uses matmuls", problem)
        self.step = _step if not compile else torch.compile(
            _step, fullgraph=True, dynamic=False, mode="reduce-overhead" if self.graphs else None)
        if compile:
            # transformers installs its hidden-state hooks at a model's first forward that asks for hidden states,
            # under a lock Dynamo cannot trace: one eager forward installs them before a step is compiled.
            with torch.inference_mode():
                gen.model(input_ids=torch.zeros(MIN_ROWS, 1, dtype=torch.long, device=gen.device),
                          output_hidden_states=True)

    @property
    def name(self) -> str:
        return "eager" if self.failed else "compiled"

    def rows(self, live: int) -> int:
        """Rows a step computes for ``live`` candidates, at least MIN_ROWS: on a CPU the live ones (the row count is
        a symbol of the one graph, as the length is), in the CUDA-graph layout the next power of two (a graph
        replays one shape: one graph per bucket)."""
        live = max(MIN_ROWS, live)
        return 1 << (live - 1).bit_length() if self.graphs else live

    @staticmethod
    def slab_length(prompt_tokens: int, max_new_tokens: int) -> int:
        # One token more than a step ever reads on a CPU: a view of the slab's whole length is contiguous, which the
        # compiled graph is not made for (its guards refuse such a view).
        return -(-(prompt_tokens + max_new_tokens + 1) // SLAB_LENGTH_STEP) * SLAB_LENGTH_STEP

    def start(self, prefix: Prefix, candidate_ids: Sequence[int], keep_hidden: bool, max_new_tokens: int) -> Batch:
        cache = SlabCache(prefix.cache, self.rows(len(candidate_ids)),
                          self.slab_length(len(prefix.prompt_ids), max_new_tokens))
        return Batch(list(candidate_ids), cache, prefix.logits.expand(len(candidate_ids), -1), keep_hidden)

    def slab_tokens(self, rows: int, prompt_tokens: int, max_new_tokens: int) -> int:
        """KV tokens a batch of ``rows`` candidates takes at once: every row's whole length (a growable cache holds
        only the tokens written so far)."""
        return self.rows(rows) * self.slab_length(prompt_tokens, max_new_tokens)

    def inputs(self, batch: Batch, tokens: torch.Tensor) -> tuple:
        """The step's arguments for these tokens (the slab made ready for them; calling it again gives the same)."""
        cache, live = batch.cache, len(tokens)
        rows = self.rows(live)
        # Padding rows: copies of the last token, their results dropped. Always a new tensor made here, in inference
        # mode, so that the graph's guards see the same kind of tensor whoever made the tokens.
        tokens = torch.cat([tokens, tokens[-1:].expand(rows - live)])
        cache.prepare(rows, cache.max_len if self.graphs else None)
        # A copy, not a view: an input that aliases another input the step writes to (the slab's length) makes
        # AOTAutograd merge the two, and a merged input is not static, so CUDA graphs would skip the step.
        positions = cache.layers[0].cumulative_length.view(1, 1).expand(rows, 1).clone()
        # The last hidden states always (the module's docstring): one graph for every run.
        return self.gen.model, tokens.view(-1, 1), positions, cache, True

    @staticmethod
    def likeness(args: tuple) -> tuple:
        """Equal for a batch's steps while its row count stays (``SavedStep.fits``' ``like``): between them only
        the slab's length grows, a dynamic dimension; everything else the step reads is the same objects, or made
        afresh the same way by inputs()."""
        _, tokens, _, cache, _ = args
        return weakref.ref(cache), tokens.shape[0], tokens.dtype

    @staticmethod
    def mark_dynamic(args: tuple) -> None:
        """One graph for every row count and length: those dimensions are symbols when the step is compiled."""
        _, tokens, positions, cache, _ = args
        torch._dynamo.maybe_mark_dynamic(tokens, 0)
        torch._dynamo.maybe_mark_dynamic(positions, 0)
        for layer in cache.layers:
            for kv in (layer.keys, layer.values):
                torch._dynamo.maybe_mark_dynamic(kv, 0)
                torch._dynamo.maybe_mark_dynamic(kv, 2)

    @torch.inference_mode()
    def forward(self, batch: Batch, tokens: torch.Tensor) -> None:
        live, which = len(tokens), torch.get_num_threads()
        if self.saved and which not in self.loaded:
            self.loaded[which] = self.load_or_build(self.inputs(batch, tokens))
        # The saved step's guards reject inputs marked dynamic, as the ones it was compiled from are: fresh ones.
        args = self.inputs(batch, tokens)
        step = self.loaded.get(which)
        if step is not None and not step.fits(*args, like=self.likeness(args)):
            log.warning("decode compiled: the saved step %s does not fit this batch; tracing it in this process",
                        step.path)
            self.loaded[which] = step = None
            self.announced = True
        if step is None:
            step = self.step
            if self.compiled and not self.graphs:
                self.mark_dynamic(args)
            if not self.announced:
                self.announced = True
                log.warning("decode compiled: compiling the step once in this process (longest the first time on a "
                            "machine; later processes find its kernels in %s)",
                            os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        try:
            logits, hidden = step(*args)
        except Exception as e:  # noqa: BLE001 - whatever the compiler raises: the same step runs eagerly
            if step is not self.step or not self.compiled:
                raise
            self._not_compiled(one_line(e))
            # The same position written again from the same tokens: whatever the failed step wrote is overwritten.
            logits, hidden = self.step(*self.inputs(batch, tokens))
        batch.cache.advance()
        batch.logits = logits[:live]
        if batch.keep_hidden:
            batch.hidden = hidden[:live]

    def ready(self, rows: int | None = None, prompt_tokens: int = 0, max_new_tokens: int = 0) -> None:
        """Load this thread count's saved step now (compiled and saved first where the disk holds none), with one
        two-row step on a short prompt, rather than in a run's first decode step: a run asks before its timers
        start, so that a process's first run counts its own steps as decoding, not seconds of loading. One step
        serves every run's shape (the run's ``rows`` and lengths, which the CUDA-graph decoder reads)."""
        if self.saved and torch.get_num_threads() not in self.loaded:
            prefix = self.gen.prefill(self.gen.encode_prompt("Hi"))
            self.forward(self.start(prefix, [0, 1], False, 2), prefix.logits.argmax(-1).expand(2))

    def saved_step(self, threads: int | None = None) -> aot_step.SavedStep | None:
        """The saved step this process uses now, or at ``threads`` CPU threads (None: none yet, or traced here)."""
        return self.loaded.get(threads or torch.get_num_threads())

    def load_or_build(self, args: tuple) -> aot_step.SavedStep | None:
        """The saved step for these arguments: loaded from the disk, or compiled and saved first; None (and one
        logged line saying why) where neither works, and this process traces the step itself."""
        try:
            path = aot_step.step_path(self.gen, self.inductor)
        except Exception as e:  # noqa: BLE001 - any reason the step cannot be named: the traced step still runs
            return self._not_saved(f"the step cannot be named ({one_line(e)})")
        if path.exists():
            try:
                return aot_step.load(_step, path)
            except Exception as e:  # noqa: BLE001 - a stale or damaged file: compiled again below
                log.warning("decode compiled: the saved step %s does not load (%s); compiling it again", path,
                            one_line(e))
        else:
            log.warning("decode compiled: compiling the step once on this machine (a minute or more) and saving it "
                        "to %s", path)
        try:
            self.mark_dynamic(args)
            aot_step.build(_step, args, path, self.inductor)
            return aot_step.load(_step, path, built=True)
        except torch._dynamo.exc.Unsupported as e:  # code Dynamo cannot trace whole: tracing here fails alike
            return self._not_compiled(one_line(e))
        except Exception as e:  # noqa: BLE001 - whatever else failed, the traced step still runs
            return self._not_saved(f"the step cannot be saved ({one_line(e)})")

    def _not_compiled(self, why: str) -> None:
        """From now on the step runs eagerly over the same slab (as ``compile=False``), with one logged line."""
        self.failed, self.step, self.compiled, self.saved, self.announced = why, _step, False, False, True
        self.loaded.clear()  # steps loaded for other thread counts too: every later step is the eager one
        log.warning("decode compiled: the step does not compile (%s); decoding eagerly over the same slab", why)

    def _not_saved(self, why: str) -> None:
        log.warning("decode compiled: %s; tracing it in this process", why)
        self.announced = True


def compile_problem(gen: Generator) -> str | None:
    """Why this generator's decode step cannot be compiled here (None: it can)."""
    if gen.device.type == "cpu":
        from torch._inductor import config as inductor
        named = inductor.cpp.cxx if isinstance(inductor.cpp.cxx, tuple) else (inductor.cpp.cxx,)
        if not any(shutil.which(c) for c in (*(c for c in named if c), "g++", "clang++")):
            return "no C++ compiler for torch.compile's CPU kernels (install g++)"
    elif gen.device.type != "cuda":
        return f"{gen.device} has no compiled decode step"
    if not getattr(gen.model.config, "_attn_implementation", None) in (None, "sdpa", "sbon_decode", "eager"):
        return f"attention {gen.model.config._attn_implementation} does not read a KV slab"
    return None


def auto_compiles(gen: Generator) -> bool:
    """``auto``: compiled where compiling is possible and ``auto``'s path here (sbon.machine.auto_path) is this
    weight format's compiled step. On a CPU that is where this machine's measured choice is that step (the step is
    loaded where a process on this machine saved it, compiled and saved otherwise); on a GPU CUDA graphs unless the
    measured choice for this format is eager."""
    from .machine import auto_path
    path = auto_path(gen.name, gen.device)
    if gen.device.type == "cuda":
        compiles = path.decode == "compiled" or path.weights != gen.weights
    else:
        compiles = path.decode == "compiled" and path.weights == gen.weights
    # asked last: where auto decodes eagerly anyway, nothing of the model is read (a scripted stand-in has none)
    return compiles and compile_problem(gen) is None


def decoder(gen: Generator, decode: str = "auto"):
    """The decoder a run uses: ``decoder.ready(rows, prompt_tokens, max_new_tokens)`` (what it loads once per process,
    or captures once for runs of that shape: their widest batch and lengths; asked before a run's timers start),
    ``decoder.start(prefix, ids, keep_hidden, max_new_tokens) -> Batch`` and ``decoder.forward(batch, tokens)``.
    Asked for ``compiled`` where it cannot be, one logged line says why."""
    check_decode(decode)
    if decode == "eager" or (decode == "auto" and not auto_compiles(gen)):
        return EagerDecoder(gen)
    problem = compile_problem(gen)
    if problem:
        log.warning("decode compiled: %s; decoding eagerly", problem)
        return EagerDecoder(gen)
    return _compiled(gen)


# Graphs of the one step function a process may hold: Dynamo counts them per code object, across generators,
# and each (generator, hidden states kept or not; on a GPU also each row bucket) is one; past torch's default
# limit (8) a fullgraph compile fails instead of running.
RECOMPILE_LIMIT = 64


def graphs(gen: Generator) -> GraphDecoder:
    """The generator's CUDA-graph decoder (sbon.cuda_graphs), one per generator, its graphs captured as runs need
    them or ahead; off CUDA its "graphs" run the step eagerly (what the tests and gpu-check's dry run use)."""
    if getattr(gen, "_graph_decoder", None) is None:
        gen._graph_decoder = GraphDecoder(gen, _step)
    return gen._graph_decoder


def _compiled(gen: Generator) -> CompiledDecoder | GraphDecoder:
    """One compiled decoder per generator, reused by every run (its graphs stay compiled): on a CUDA device, or
    where graphs were made for the generator, the CUDA-graph one."""
    if gen.device.type == "cuda" or getattr(gen, "_graph_decoder", None) is not None:
        return graphs(gen)
    _use_our_inductor_cache()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    if getattr(gen, "_compiled_decoder", None) is None:
        gen._compiled_decoder = CompiledDecoder(gen)
    return gen._compiled_decoder


def _use_our_inductor_cache() -> None:
    """Inductor's caches under $SBON_CACHE/inductor unless TORCHINDUCTOR_CACHE_DIR names another folder. (Importing
    torch's compiler already sets that variable to torch's default, a folder under /tmp that a restart may empty:
    that value is taken as unset.)"""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        torch_default = default_cache_dir()
    except ImportError:  # a torch without it: only an unset variable is ours to set
        torch_default = None

    from .cache import cache_dir
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, torch_default):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")


def compiled_state(gen: Generator, threads: int | None = None) -> str | None:
    """How far this generator's compiled step for ``threads`` CPU threads (default: torch's now) is on this machine:
    "loaded" (in this process), "saved" (on the disk: ``prepare`` loads it in seconds) or None (neither). Asking
    sets no thread count: torch's is the process's, which a run on another thread may be using."""
    _use_our_inductor_cache()  # where the saved steps are
    dec = getattr(gen, "_compiled_decoder", None)
    if dec is not None and dec.saved_step(threads) is not None:
        return "loaded"
    options = dec.inductor if dec is not None else aot_step.INDUCTOR_OPTIONS
    try:
        return "saved" if aot_step.any_saved() and aot_step.step_path(gen, options, threads).exists() else None
    except Exception as e:  # noqa: BLE001 - a step that cannot be named is never saved (load_or_build says so too)
        log.warning("decode compiled: the saved step cannot be named (%s)", one_line(e))
        return None


def prepare(gen: Generator, decode: str = "compiled") -> bool:
    """Load the compiled step into this process, where ``decode`` compiles (as ``decoder`` decides): from the disk,
    or compiled and saved there first where it is not yet (a minute or more on two cores). True where it is a saved
    step, loaded; False where ``decode`` decodes eagerly."""
    dec = decoder(gen, decode)
    if not isinstance(dec, CompiledDecoder):
        return False
    dec.ready()
    return compiled_state(gen) == "loaded"
