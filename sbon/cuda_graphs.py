"""The ``compiled`` decode step on a CUDA device: CUDA graphs captured from the eager step over a static KV slab,
the way gpt-fast and vLLM capture theirs (``torch.cuda.CUDAGraph`` around one step, static input and output
buffers, a warm-up on a side stream first). No compiler: a capture records the kernels one eager step launches, in
well under a second, and a replay launches them all at once. Where the eager step is bound by kernel launches (a
small model's step on a GPU), that is most of the step's time.

- **Slabs.** A graph reads and writes fixed addresses, so the decoder keeps its slabs (sbon.static_cache) from batch
  to batch: a batch takes a free slab of its length and enough rows and copies its prompt's KV into it; the
  unwritten end of the slab, and whatever an earlier batch left there, is masked. A slab's length is a power of two
  (``slab_length``), so runs with prompts of nearby lengths share a slab and its graphs.
- **Rows.** A step computes ``graph_rows(live)`` rows, padding rows' results dropped: at least GRAPH_MIN_ROWS, else
  the next power of two. Every run of N <= GRAPH_MIN_ROWS candidates (Best-of-N's batches and Speculative
  Rejection's survivors alike) therefore decodes through one graph shape, and a row's numbers in one shape depend
  on that row only: a survivor's logits are its Best-of-N twin's bits. A launch-bound step costs about the same
  for 16 rows as for 4. Above GRAPH_MIN_ROWS the shapes of the two methods can differ, and so can the bits.
- **Graphs.** One per (slab, rows), each computing the last hidden states too (a run whose pruning signal reads
  them takes them, others drop them: the logits are the same either way). Captured before a run's timers start
  (``ready``: the graphs of its plan), where a step first needs them, or ahead (``capture_ahead``:
  components.decode_paths captures the page-default run's at model load).
- **Attention.** The step reads the slab through sbon.attention's one-query matmuls, not SDPA: SDPA's kernel for a
  masked slab gave a row different bits from run to run on a GPU, which broke the coupling above.
- **Numbers frozen at a capture.** A graph replays the arguments it recorded; a model that takes a Python number
  from the cache's length inside its step would replay that number at every later length, silently. Before its
  first capture, a decoder whose model type is not in LENGTH_CHECKED runs the step at three lengths of a small slab
  of its own and compares the operations (``length_frozen``); where they differ, or one reads a value back to
  Python, it decodes eagerly over the slabs instead, said in one logged line, as where a capture fails.
- **Where capture fails**, one logged line says why and the decoder runs the same step eagerly over the same slab
  from then on (``failed``; its runs record the ``eager`` path). Where the step itself fails over a slab (a model
  whose attention cannot read one), found where a capture fails over a slab no batch holds (a run's ``ready``, a
  capture ahead), runs decode as sbon.decoders' eager decoder does, `transformers`' forward over a growable cache
  (``slab_fails``).

- **Inductor under the graphs**, optional: ``build_faster`` compiles the step with inductor (without its own CUDA
  graphs; a minute or so) and captures it beside the plain step over a slab of its own, on a thread other than the
  runs', then times the two graphs of each row count against each other where no run generates, and keeps the
  faster; ``adopt``, on the runs' thread between two runs, hands that slab to the runs. A run therefore never waits
  for the compiler, and both methods of a comparison replay the same graph of a shape.

Without CUDA (the tests) a "graph" runs the step eagerly at each replay (``run_eagerly``): the slabs, rows and
buffers are the same, only the replay differs. ``inductor=True`` compiles every graph's step with inductor (what
gpu-check's compiled part times), on the runs' own thread.
"""

from __future__ import annotations

import functools
import importlib
import logging
import statistics
import threading
import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .attention import one_query_steps
from .engine import Batch, Generator, Prefix
from .errors import one_line
from .machine_load import RunGate, quiet_token
from .static_cache import SlabCache

log = logging.getLogger(__name__)

GRAPH_MIN_ROWS = 16  # see the module's docstring (rows)
GRAPH_MIN_LENGTH = 256  # the shortest slab, in tokens; longer ones are powers of two
MAX_SLABS = 2  # slabs (with their graphs) a decoder keeps; the least recently used free one goes first
WARM_UP_STEPS = 2  # eager steps on a side stream before a capture: lazy initialisation happens outside the graph
# build_faster's timing: rounds of replays of each graph in turn, each kept only where no run started or generated
# meanwhile; the median round decides.
FASTER_ROUNDS = 5
FASTER_REPLAYS = 20
# Where build_faster's thread waits while a run generates: calls made once per traced instruction, operation or graph
# node in torch's compiler, where no outer frame holds a lock a run could need (a wait anywhere, inside a logging
# handler or an import, could hold a run up until it ends, which it then never would).
PAUSE_POINTS = (("torch._dynamo.symbolic_convert", "InstructionTranslatorBase.step"),
                ("torch.fx.experimental.proxy_tensor", "ProxyTorchDispatchMode.__torch_dispatch__"),
                ("torch.fx.interpreter", "Interpreter.run_node"),
                ("torch._inductor.graph", "GraphLowering.run_node"),
                ("torch._inductor.scheduler", "Scheduler.can_fuse"),
                ("torch._inductor.codegen.simd", "SIMDScheduling.codegen_node"))

# Model types whose graph step the test suite checks for the same operations at every length (tests/test_cuda_graphs.py,
# the architectures test): their decoders skip that check (``length_frozen``) at run time.
LENGTH_CHECKED = frozenset({"llama", "falcon", "bloom", "stablelm", "gpt2", "qwen3", "mistral", "gemma2"})
READS_BACK = ("aten._local_scalar_dense.default", "aten.item.default")  # operations that wait for a value on the host

Step = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]  # (model, tokens, positions, cache, keep_hidden)
Replay = Callable[[], tuple[torch.Tensor, torch.Tensor]]


def graph_rows(live: int) -> int:
    """Rows a step computes for ``live`` candidates (see the module's docstring)."""
    return max(GRAPH_MIN_ROWS, 1 << (max(1, live) - 1).bit_length())


def slab_length(tokens: int) -> int:
    """The slab's length for a batch whose rows hold up to ``tokens`` tokens."""
    return max(GRAPH_MIN_LENGTH, 1 << (tokens - 1).bit_length())


def run_length(prompt_tokens: int, max_new_tokens: int) -> int:
    """The slab's length of a run: its prompt, its new tokens and the one a step writes beyond the last."""
    return slab_length(prompt_tokens + max_new_tokens + 1)


def plan(n: int, prompt_tokens: int, max_new_tokens: int) -> list[tuple[int, int]]:
    """The (rows, length) of the graphs a run of ``n`` candidates may replay, largest first: its rows shrink from
    ``graph_rows(n)`` by halves down to GRAPH_MIN_ROWS as candidates finish or are pruned."""
    length, rows = run_length(prompt_tokens, max_new_tokens), graph_rows(n)
    out = []
    while rows >= GRAPH_MIN_ROWS:
        out.append((rows, length))
        rows //= 2
    return out


def capture_cuda(body: Callable[[], tuple], pool) -> Replay:
    """``body`` (one step over static buffers) as a CUDA graph in ``pool``: warmed up on a side stream, captured,
    replayed on the current stream. Its outputs are static tensors that each replay overwrites."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARM_UP_STEPS):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # No pause inside a capture (build_faster's thread waits at its calls while a run generates): the run's thread
    # may capture a graph of its own meanwhile. Each capture on a stream of its own (torch's default is one stream
    # for every capture), and thread_local, so that a call on another thread cannot invalidate this one.
    _capturing.now = True
    try:
        with torch.cuda.graph(graph, pool=pool, stream=torch.cuda.Stream(), capture_error_mode="thread_local"):
            outputs = body()
    finally:
        _capturing.now = False

    def replay() -> tuple:
        graph.replay()
        return outputs
    return replay


def run_eagerly(body: Callable[[], tuple], pool) -> Replay:
    """A "graph" where there is no CUDA: the step runs eagerly at each replay, over the same buffers. Run once here,
    as capture_cuda warms up: a step that fails, fails at its capture on any device."""
    body()
    return body


def inductor_step(step: Step) -> Step:
    """``step`` compiled by inductor for one shape (each row count and slab length its own graph), without inductor's
    own CUDA graphs: the capture around it records its kernels."""
    return torch.compile(step, fullgraph=True, dynamic=False)


class Slab:
    """A static KV slab that outlives its batches, with the static inputs and the graphs captured over it."""

    def __init__(self, prefix: Prefix, capacity: int, max_len: int):
        self.cache = SlabCache(prefix.cache, capacity, max_len)
        device = self.cache.layers[0].slab_keys.device
        with torch.inference_mode(False):  # written in place by every step, outside inference mode too
            self.tokens = torch.zeros(capacity, 1, dtype=torch.long, device=device)
            self.length = self.cache.layers[0].cumulative_length.clone()
        self.graphs: dict[int, Replay] = {}
        self.owner: weakref.ref | None = None
        self.used = time.monotonic()

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    def free(self) -> bool:
        """No batch decodes in this slab now (its batch ended, was dropped, or moved to another cache)."""
        batch = self.owner() if self.owner is not None else None
        return batch is None or batch.cache is not self.cache or not len(batch)

    def body(self, model: torch.nn.Module, step: Step, rows: int) -> Callable[[], tuple]:
        """One step of ``rows`` rows over this slab, reading ``tokens`` and ``length`` (what a graph captures)."""
        def run() -> tuple:
            for layer in self.cache.layers:  # no Python number may reach a kernel: a graph would keep it
                layer.view(rows, self.max_len)
                layer.cumulative_length.copy_(self.length)  # the step writes there (and counts it up)
            positions = self.length.view(1, 1).expand(rows, 1).clone()
            with one_query_steps(model):  # sbon.attention: SDPA's kernel for a masked slab is not exact here
                logits, hidden = step(model, self.tokens[:rows], positions, self.cache, True)
            return logits, hidden
        return run


class Operations(TorchDispatchMode):
    """Every operation dispatched, with its tensors' shapes, strides, offsets and dtypes and its other arguments:
    what a CUDA graph records of it, but the addresses."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def plain(x):
            return (tuple(x.shape), x.stride(), x.storage_offset(), x.dtype) if isinstance(x, torch.Tensor) else x
        self.ops.append((str(func), tree_map(plain, args), tree_map(plain, kwargs or {})))
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def step_operations(gen: Generator, step: Step, rows: int = GRAPH_MIN_ROWS, lengths: int = 3) -> list[list[tuple]]:
    """The operations (``Operations``) of ``step`` over a slab of its own, at ``lengths`` successive lengths."""
    slab, traces = Slab(gen.prefill(gen.encode_prompt("Hi")), rows, GRAPH_MIN_LENGTH), []
    for _ in range(lengths):
        slab.length.fill_(slab.cache.get_seq_length())
        with Operations() as recorded:
            slab.body(gen.model, step, rows)()
        slab.cache.advance()
        traces.append(recorded.ops)
    return traces


def length_frozen(traces: Sequence[list[tuple]]) -> str | None:
    """Why a graph captured at the first of these lengths would not replay the step at the others (None: it would):
    an operation that reads a value back to Python, or the first that differs between two lengths."""
    reads = [op for op, *_ in traces[0] if op in READS_BACK]
    if reads:
        return f"its step reads a value back to Python ({reads[0]})"
    for trace in traces[1:]:
        if trace != traces[0]:
            changed = next((a[0] for a, b in zip(traces[0], trace) if a != b), "the number of operations")
            return ("its step takes numbers from the KV cache's length, which a graph keeps at their captured "
                    f"values ({changed})")
    return None


@dataclass
class Faster:
    """What ``GraphDecoder.build_faster`` built: a slab of its own with, per row count, the graph measured faster of
    the two (the plain step's or inductor's), and what it measured."""
    slab: Slab
    ms: dict[int, dict[str, float]]  # rows -> {"plain": ms per replay, "inductor": ms per replay}, median rounds
    compile_s: float  # compiling and capturing, all row counts together
    seconds: float  # the whole build, its timing included
    decoder: weakref.ref  # the decoder it was built for: its graphs read that model's weights

    @property
    def inductor_rows(self) -> list[int]:
        """The row counts whose runs replay inductor's step."""
        return sorted(rows for rows, ms in self.ms.items() if ms["inductor"] < ms["plain"])

    def summary(self) -> dict:
        """Plain data for a result file."""
        return {"ms": {str(rows): ms for rows, ms in sorted(self.ms.items())}, "inductor_rows": self.inductor_rows,
                "compile_s": self.compile_s, "seconds": self.seconds}


class GraphDecoder:
    """The ``compiled`` decoder on a CUDA device (see the module's docstring): ``start`` and ``forward`` as
    sbon.decoders' decoders."""

    def __init__(self, gen: Generator, step: Step, capture: Callable | None = None, inductor: bool = False):
        """``step``: the eager decode step (sbon.decoders' ``_step``); ``capture``: how a step becomes a graph
        (default: ``capture_cuda`` on a CUDA device, else ``run_eagerly``); ``inductor``: compile the step with
        inductor before capturing it."""
        self.gen = gen
        self.capture = capture or (capture_cuda if gen.device.type == "cuda" else run_eagerly)
        self.plain_step = step
        self.step = inductor_step(step) if inductor else step
        self.inductor = inductor
        self.faster: Faster | None = None  # the build adopted (None: every graph is the plain step's)
        self.slabs: list[Slab] = []
        self.pool = None  # one memory pool for every graph: a replay's outputs are copied out before the next
        self.failed: str | None = None  # why capturing failed (steps then run eagerly over the slabs)
        self.slab_fails: str | None = None  # why the step fails over a slab (batches then take a growable cache)
        self.capture_s = 0.0  # seconds spent capturing, all graphs together
        self.length_checked = getattr(gen.model.config, "model_type", None) in LENGTH_CHECKED

    @property
    def name(self) -> str:
        return "eager" if self.failed else "compiled"

    @staticmethod
    def rows(live: int) -> int:
        return graph_rows(live)

    def start(self, prefix: Prefix, candidate_ids: Sequence[int], keep_hidden: bool, max_new_tokens: int) -> Batch:
        if self.slab_fails:
            return self.gen.start(prefix, candidate_ids, keep_hidden)
        slab = self._slab(prefix, graph_rows(len(candidate_ids)), run_length(len(prefix.prompt_ids), max_new_tokens))
        batch = Batch(list(candidate_ids), slab.cache, prefix.logits.expand(len(candidate_ids), -1), keep_hidden)
        slab.owner = weakref.ref(batch)
        return batch

    def _slab(self, prefix: Prefix, rows: int, length: int) -> Slab:
        """A free slab of this length with at least ``rows`` rows (the smallest), loaded with the prefix; a new one
        where none is free (the least recently used free ones beyond MAX_SLABS dropped, with their graphs)."""
        slab = self._free_slab(rows, length)
        if slab is not None:
            slab.cache.load(prefix.cache)
        else:
            slab = Slab(prefix, rows, length)
            self.slabs.append(slab)
            idle = sorted((s for s in self.slabs if s is not slab and s.free()), key=lambda s: s.used)
            for s in idle[:max(0, len(self.slabs) - MAX_SLABS)]:
                self.slabs.remove(s)
        slab.used = time.monotonic()
        return slab

    def _free_slab(self, rows: int, length: int) -> Slab | None:
        """The slab a batch of ``rows`` rows and this length takes (the smallest free one that fits; None: none)."""
        free = [s for s in self.slabs if s.free() and s.max_len == length and s.capacity >= rows]
        return min(free, key=lambda s: s.capacity, default=None)

    def slab_tokens(self, rows: int, prompt_tokens: int, max_new_tokens: int) -> int:
        """KV tokens a run of batches of up to ``rows`` candidates newly allocates: its slab's rows times its whole
        length, none where a free slab of that shape is kept already (or where batches take a growable cache)."""
        widest, length = graph_rows(rows), run_length(prompt_tokens, max_new_tokens)
        free = self.slab_fails or self._free_slab(widest, length) is not None
        return 0 if free else widest * length

    def _slab_of(self, batch: Batch) -> Slab:
        return next(s for s in self.slabs if s.cache is batch.cache)

    def graph(self, slab: Slab, rows: int) -> Replay:
        """The slab's graph of ``rows`` rows, captured now where it is not yet; the eager step where capturing
        failed (once: one logged line, and this decoder stays eager)."""
        body = slab.body(self.gen.model, self.step, rows)
        if self.failed:
            return body
        if not self.length_checked:
            self._check_lengths()
            if self.failed:
                return body
        if rows not in slab.graphs:
            start = time.perf_counter()
            try:
                if self.pool is None and self.gen.device.type == "cuda":
                    self.pool = torch.cuda.graph_pool_handle()
                slab.graphs[rows] = self.capture(body, self.pool)
            except Exception as e:  # noqa: BLE001 - any failure: the same step runs eagerly, the run goes on
                self.failed = one_line(e)
                self._check_slab(slab, rows, body)
                return body
            finally:
                slab.cache.advance(0)  # the views back to the live rows and written tokens
                self.capture_s += time.perf_counter() - start
        return slab.graphs[rows]

    def _check_lengths(self) -> None:
        """Once, before the first capture of a model type outside LENGTH_CHECKED: where its step's operations change
        with the cache's length (``length_frozen``), this decoder runs the step eagerly over its slabs from now on,
        said in one logged line. A step that fails here is left to the capture, which says why."""
        self.length_checked = True
        start = time.perf_counter()
        try:
            why = length_frozen(step_operations(self.gen, self.plain_step))
        except Exception:  # noqa: BLE001 - the capture meets the same failure and handles it
            return
        finally:
            self.capture_s += time.perf_counter() - start
        if why:
            self.failed = why
            log.warning("decode compiled: %s; decoding eagerly over the same slab", why)

    def _check_slab(self, slab: Slab, rows: int, body: Callable[[], tuple]) -> None:
        """After a failed capture, one logged line: the same step eagerly over the slab from now on, or, where that
        step fails too, `transformers`' forward over a growable cache (``slab_fails``). The step is tried only over a
        slab no batch holds: a batch's slab would take its writes."""
        if slab.free():
            try:
                body()
            except Exception as e:  # noqa: BLE001 - whatever the model raises: the slab is not for it
                self.slab_fails = one_line(e)
                self.slabs.clear()  # their memory is of no more use
                log.warning("decode compiled: the step cannot run over a static KV slab (%s); decoding eagerly "
                            "with a growable KV cache", self.slab_fails)
                return
        log.warning("decode compiled: the CUDA graph of %d rows could not be captured (%s); decoding eagerly over the "
                    "same slab", rows, self.failed)

    @torch.inference_mode()
    def ready(self, rows: int | None = None, prompt_tokens: int = 0, max_new_tokens: int = 0) -> None:
        """Capture the graphs a run will replay (``plan``: its batches of up to ``rows`` candidates on a prompt of
        ``prompt_tokens``), over the slab its first batch will take, where they are not captured yet: a run asks
        before its timers start, so that its first steps count decoding, not capturing. Nothing without ``rows``."""
        if rows is None or self.failed:
            return
        todo = plan(rows, prompt_tokens, max_new_tokens)
        widest, length = todo[0]
        slab = self._free_slab(widest, length)
        if slab is None or not all(r in slab.graphs for r, _ in todo):
            slab = self._slab(self.gen.prefill(self.gen.encode_prompt("Hi")), widest, length)
            slab.owner = None
            for r, _ in todo:
                self.graph(slab, r)

    @torch.inference_mode()
    def capture_ahead(self, rows: int, length: int, prefix: Prefix) -> None:
        """Capture the graph of ``rows`` rows over a free slab of ``length`` tokens (made from ``prefix`` where
        there is none), before any run needs it."""
        slab = self._slab(prefix, rows, length)
        slab.owner = None
        self.graph(slab, rows)

    def build_faster(self, todo: Sequence[tuple[int, int]], runs: RunGate | None = None,
                     compiler: Callable[[Step], Step] | None = None) -> Faster:
        """Inductor's step under the graphs of ``todo`` (``plan``'s (rows, length), one length), where it is faster:
        compiled, captured beside the plain step over a new slab of the plan's widest rows, both graphs of each row
        count timed in turns, and the faster kept in the slab (see the module's docstring). On a thread other than
        the runs': it reads and writes nothing of theirs, in its own memory pool and, on a GPU, its own stream.

        ``runs``: this process's runs (sbon.machine_load.RunGate: ``generating_now``, ``token()``).
        The build starts once none generates, and waits at its next step of tracing (PAUSE_POINTS) while one
        does: compiling is mostly Python, and a thread that holds the interpreter's lock makes a run's thread wait
        for it at each of its torch calls, which made a run many times slower. A round of timings taken beside a
        run is taken again. ``compiler``: how the step is compiled (default: ``inductor_step``). Raises what
        compiling or capturing raised."""
        start = time.perf_counter()
        if runs is None:
            return self._build_faster(todo, runs, compiler or inductor_step, start)
        quiet_token(runs)  # the compiler's imports (seconds) cannot wait midway: not beside a run
        with _paused_while_generating(runs):
            return self._build_faster(todo, runs, compiler or inductor_step, start)

    def _build_faster(self, todo: Sequence[tuple[int, int]], runs: RunGate | None,
                      compiler: Callable[[Step], Step], start: float) -> Faster:
        fast, model = compiler(self.plain_step), self.gen.model
        cuda = self.gen.device.type == "cuda"
        stream = torch.cuda.Stream(self.gen.device) if cuda else None
        with torch.inference_mode(), torch.cuda.stream(stream) if cuda else nullcontext():
            widest, length = todo[0]
            slab = Slab(self.gen.prefill(self.gen.encode_prompt("Hi")), widest, length)
            pool = torch.cuda.graph_pool_handle() if cuda else None
            pairs = {}
            for rows, _ in todo:
                pairs[rows] = {"plain": self.capture(slab.body(model, self.plain_step, rows), pool),
                               "inductor": self.capture(slab.body(model, fast, rows), pool)}
                for replay in pairs[rows].values():  # the first call compiles where capture did not call it
                    replay()
            self.gen.synchronize()
            compile_s = time.perf_counter() - start
            ms = {rows: _time_replays(pair, runs, self.gen.synchronize) for rows, pair in pairs.items()}
            slab.cache.advance(0)
        slab.graphs = {rows: pair["inductor" if ms[rows]["inductor"] < ms[rows]["plain"] else "plain"]
                       for rows, pair in pairs.items()}
        return Faster(slab, ms, compile_s, time.perf_counter() - start, weakref.ref(self))

    def adopt(self, faster: Faster) -> None:
        """Hand ``faster``'s slab and graphs to the runs, in place of a free slab of its shape: on the runs' thread,
        between two runs (both methods of a comparison then replay the same graphs). Nothing where capturing failed,
        or where ``faster`` was built for another decoder (a model loaded again since: its graphs read the old one)."""
        if self.failed or faster.decoder() is not self:
            return
        new = faster.slab
        shape = (new.capacity, new.max_len)
        self.slabs = [s for s in self.slabs if not (s.free() and (s.capacity, s.max_len) == shape)]
        new.used = time.monotonic()
        self.slabs.insert(0, new)
        self.faster = faster

    @torch.inference_mode()
    def forward(self, batch: Batch, tokens: torch.Tensor) -> None:
        if not isinstance(batch.cache, SlabCache):  # a growable cache (slab_fails)
            self.gen.forward(batch, tokens)
            return
        slab, live = self._slab_of(batch), len(tokens)
        rows = graph_rows(live)
        slab.tokens[:live].copy_(tokens.view(-1, 1))
        if rows > live:  # padding rows: copies of the last token, their results dropped
            slab.tokens[live:rows].copy_(tokens[-1:].view(1, 1).expand(rows - live, 1))
        slab.length.fill_(slab.cache.get_seq_length())
        # After the inputs: a capture made here (a graph first needed midway through a run) warms up over this very
        # slab, so its steps must be this step, writing what the replay then writes.
        replay = self.graph(slab, rows)
        logits, hidden = replay()
        # Lengths only: a step sets the views it reads itself, and remaking them after every replay is Python time a
        # launch-bound step cannot spare.
        slab.cache.advance(views=False)
        # Copies: the next replay of any graph of this decoder overwrites its outputs (one memory pool).
        batch.logits = logits[:live].clone()
        if batch.keep_hidden:
            batch.hidden = hidden[:live].clone()


def pause_points() -> list[tuple[type, str, Callable]]:
    """PAUSE_POINTS as (class, method name, method) (their modules imported now; one that a torch has moved or
    renamed is left out, and the build waits at the others)."""
    points = []
    for module, name in PAUSE_POINTS:
        owner_path, _, method = name.rpartition(".")
        try:
            owner = importlib.import_module(module)
            for part in owner_path.split("."):
                owner = getattr(owner, part)
            points.append((owner, method, getattr(owner, method)))
        except (ImportError, AttributeError):
            continue
    return points


_capturing = threading.local()  # ``now``: this thread is capturing a CUDA graph (capture_cuda), which must not pause


@contextmanager
def _paused_while_generating(runs: RunGate):
    """Within it, this thread holds still at a call of one of PAUSE_POINTS while one of ``runs`` generates (outside a
    capture): those methods are wrapped meanwhile (_pause_points_wrapped), so that only their calls pay for the check
    (a profile function, which sees every call of the thread, made the compile itself several times slower)."""
    def hold() -> None:
        if not getattr(_capturing, "now", False):
            while runs.generating_now:
                time.sleep(0.01)
    with _pause_points_wrapped(hold):
        yield


_holds = threading.local()  # ``check``: what this thread calls at a pause point while it builds (the wrappers')
_wrapped: list[tuple[type, str, object]] = []  # each wrapped method's class, name and own attribute before
_wrap_users = 0  # the builds within _pause_points_wrapped now: the last one out puts the methods back
_wrap_lock = threading.Lock()
_INHERITED = object()  # a method the class inherits: its wrapper is deleted again, not replaced


@contextmanager
def _pause_points_wrapped(hold: Callable[[], None]):
    """The pause points' methods wrapped, for every thread, with a call of the calling thread's ``hold`` (other
    threads call none), and put back as they were when the last build that wrapped them ends."""
    global _wrap_users
    with _wrap_lock:
        if _wrap_users == 0:
            for owner, name, fn in pause_points():
                _wrapped.append((owner, name, owner.__dict__.get(name, _INHERITED)))
                setattr(owner, name, _holding(fn))
        _wrap_users += 1
    _holds.check = hold
    try:
        yield
    finally:
        _holds.check = None
        with _wrap_lock:
            _wrap_users -= 1
            while _wrap_users == 0 and _wrapped:
                owner, name, own = _wrapped.pop()
                if own is _INHERITED:
                    delattr(owner, name)
                else:
                    setattr(owner, name, own)


def _holding(fn: Callable) -> Callable:
    """``fn`` that first calls the calling thread's check, where it has one (it builds: _pause_points_wrapped)."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        check = getattr(_holds, "check", None)
        if check is not None:
            check()
        return fn(*args, **kwargs)
    return paused


def _time_replays(replays: dict[str, Replay], runs: RunGate | None, sync: Callable[[], None]) -> dict[str, float]:
    """Milliseconds per replay of each of ``replays``: the median of FASTER_ROUNDS rounds, each timing every replay
    FASTER_REPLAYS times in turn, begun where no run generates and kept only where none started meanwhile (as the
    probe times its paths, sbon.probe.time_paths)."""
    rounds: list[dict[str, float]] = []
    while len(rounds) < FASTER_ROUNDS:
        before = quiet_token(runs)
        times = {}
        for name, replay in replays.items():
            sync()
            began = time.perf_counter()
            for _ in range(FASTER_REPLAYS):
                replay()
            sync()
            times[name] = 1e3 * (time.perf_counter() - began) / FASTER_REPLAYS
        if runs is None or runs.token() == before:
            rounds.append(times)
    return {name: statistics.median(r[name] for r in rounds) for name in replays}
