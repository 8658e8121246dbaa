"""The GPU check's sizes and time budget: how big each part runs (``Sizes``: the GPU defaults, ``TINY`` for a CPU),
what the parts measure of the device, and the one rule that bounds the command's time (``run_parts``): each part
has its own limit (``PART_LIMIT_S``), a part starts only where that limit fits in the time left before the check's
limit, less the reserve for the files, and a part still running at its limit stops there with what it has."""

from __future__ import annotations

import math
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from . import common
from .gpu_stand_ins import TINY_ARCH

# The check fits one command of SESSION_S on a lent GPU machine (rented and shared GPUs often cap a command or a
# job at ten minutes, and a check that stops early leaves every later part unmeasured). The limit counts from the
# command's start, after Python's imports (STARTUP_S at most), and RESERVE_S of it is kept for writing the files.
SESSION_S = 600
STARTUP_S = 30
DEFAULT_TIME_LIMIT_S = 540
RESERVE_S = 10
# Each part's own limit at the default time limit, in seconds (a --time-limit scales them all): past it the part
# stops with what it has and the next part starts. `--parts all` (app, compiled, coupling, engine) fits the default
# limit whole, so each of them always starts.
PART_LIMIT_S = {"app": 210.0, "compiled": 90.0, "coupling": 90.0, "engine": 120.0, "paper-scale": 240.0, "vllm": 150.0}


@dataclass(frozen=True)
class Sizes:
    """How big each part runs: the GPU defaults, or ``TINY`` for a CPU test."""
    engine_n: tuple[int, ...] = (32, 128)  # candidates for the engine comparison
    engine_tokens: int = 256
    engine_median_length: int = 128  # median of the stand-in's forced lengths (log-normal, at most engine_tokens)
    engine_prompts: int = 1
    dtypes: tuple[str, ...] = ("bfloat16",)  # the engine part's dtypes
    engine_chunks: tuple[int, ...] = (1, 8)  # our engine's decode_chunk: 8 checks for finished rows once per 8 tokens
    coupling_dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    coupling_n: int = 16  # at most the smallest CUDA-graph bucket: both methods share one shape
    coupling_tokens: int = 64
    coupling_prompts: int = 1
    coupling_decodes: tuple[str, ...] = ("eager", "compiled")  # compiled: on a GPU its CUDA graphs
    paper_n: int = 512  # Speculative Rejection's candidates at paper scale
    paper_tokens: int = 256  # the length limit; forced lengths are drawn below it
    paper_median_length: int = 128  # median of the forced lengths (log-normal)
    step_batches: tuple[int, ...] = (1, 64, 256)  # rows for the decode ms/step measurement: the
    # largest one's caches (rows x step_context tokens of an 8B model) must fit beside its weights on one GPU
    step_context: int = 512  # tokens in each row's cache for that measurement
    step_repeats: int = 20
    compiled_rows: tuple[int, ...] = (1, 8)  # live rows for the compiled-step part (each a CUDA-graph bucket)
    compiled_context: int = 256  # prompt tokens in each row's cache for that part
    compiled_repeats: int = 50
    inductor: bool = False  # the compiled part also times inductor's step under the same graphs (a minute per bucket)
    app_runs: int = 2  # timed page-default comparisons of the app part (after one untimed)
    app_inductor: bool = True  # the app builds inductor's step under its graphs; the part waits for it, then times
    app_inductor_wait_s: float = 150.0  # the longest the part waits for that build (its compile: a minute or so)
    app_profile: bool = True  # last, the app part profiles one more comparison: where its host time goes
    app_n: int = 0  # the app part's N and max new tokens (0: the page's defaults)
    app_max_new_tokens: int = 0
    bandwidth_bytes: int = 2 ** 30  # buffer copied to measure memory bandwidth
    arch: dict | None = None  # config overrides of both stand-in architectures (the tiny mode shrinks them)


GPU = Sizes()
TINY = Sizes(engine_n=(4,), engine_tokens=8, engine_median_length=4, engine_prompts=1, dtypes=("float32", "bfloat16"),
             coupling_dtypes=("float32", "bfloat16"), coupling_n=4, coupling_tokens=12, coupling_prompts=1,
             paper_n=8, paper_tokens=16, paper_median_length=16, step_batches=(1, 4), step_context=16,
             step_repeats=2, compiled_rows=(1, 4), compiled_context=16, compiled_repeats=2,
             app_runs=1, app_inductor=False, app_profile=False, app_n=2, app_max_new_tokens=4,
             bandwidth_bytes=2 ** 22, arch=TINY_ARCH)


# -- measuring the device ---------------------------------------------------------------------------

def machine_name() -> str:
    """A results folder name: gpu-<model> from the device name (gpu-h100, gpu-a100 ...), else cpu-<cores>core."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0).lower()
        model = re.search(r"\b([a-z]\d{2,4}[a-z]?|rtx[\w -]*?\d{3,4})\b", name)
        return "gpu-" + re.sub(r"[^a-z0-9]+", "-", model.group(1) if model else name).strip("-")
    import os

    return f"cpu-{os.cpu_count()}core"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(device: torch.device, work: Callable[[], Any], repeats: int = 5) -> float:
    """The fastest of a few timed calls of ``work``, after one untimed call."""
    work()
    best = math.inf
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        work()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second the device moves in a large copy (read + write counted), best of a few."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_seconds(device, lambda: dst.copy_(src))


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# -- the time budget --------------------------------------------------------------------------------

class TimeUp(BaseException):
    """A part's limit passed: the part stops where it is and keeps what it has. Not an Exception, so that code
    which handles a failure where it is (a capture that falls back to eager, a diagnosis that records its error)
    lets it through to the part's end."""


def run_within(seconds: float, work: Callable[[], Any]) -> None:
    """Run ``work``; raise TimeUp inside it once ``seconds`` have passed (SIGALRM: the main thread of a Unix
    process; elsewhere the work runs to its end)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        work()
        return

    def alarm(signum, frame):
        raise TimeUp

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        work()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def part_limits(time_limit: float) -> dict[str, float]:
    """Each part's own limit under this time limit: its PART_LIMIT_S, in proportion to the default limit."""
    return {name: seconds * time_limit / DEFAULT_TIME_LIMIT_S for name, seconds in PART_LIMIT_S.items()}


def run_parts(ctx: Any, parts: Mapping[str, Callable[[Any, dict], None]], out: Path, deadline: float,
              environment: dict, limits: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """Run the parts in order, each part's file written as it ends, and say of each what became of it: its
    ``outcome`` (done, stopped, failed or not run), ``why`` where it is not done, its ``seconds`` and ``limit_s``.
    A part starts only where its own limit (``limits``) fits in the time left before ``deadline``
    (time.monotonic); else it is not run, with one line saying so, and the next part is tried. A part still running
    at its limit stops where it is, its file says so, and the next part starts; a part that fails does not stop
    the others."""
    outcomes: dict[str, dict[str, Any]] = {}
    for name, part in parts.items():
        left, limit = deadline - time.monotonic(), limits[name]
        shown = f"{round(limit, 1):g} s"
        if limit > left:
            why = f"its limit ({shown}) does not fit in the {max(0.0, left):.0f} s left"
            outcomes[name] = {"outcome": "not run", "why": why, "seconds": 0.0, "limit_s": limit}
            print(f"{name}: not run: {why}", file=sys.stderr)
            continue
        print(f"== {name} (at most {shown})", file=sys.stderr)
        record: dict[str, Any] = {"part": name, "environment": environment, "limit_s": limit}
        outcome: dict[str, Any] = {"outcome": "done"}
        start = time.perf_counter()
        try:
            run_within(limit, lambda: part(ctx, record))
        except TimeUp:
            outcome = {"outcome": "stopped", "why": f"its limit ({shown}) passed"}
            record["stopped"] = outcome["why"] + ": what this file holds is what the part had done by then"
            print(f"{name}: stopped at its limit ({shown}); going on with the next part", file=sys.stderr)
        except Exception as e:  # one command: a part that breaks must not cost the parts after it
            record["error"] = "".join(traceback.format_exception(e))[-4000:]
            outcome = {"outcome": "failed", "why": f"{type(e).__name__}: {e}".splitlines()[0]}
            print(f"{name}: failed ({outcome['why']}); going on with the next part", file=sys.stderr)
        record["seconds"] = outcome["seconds"] = time.perf_counter() - start
        common.write_json(record, out / f"{name}.json")
        outcomes[name] = {**outcome, "limit_s": limit}
    return outcomes
