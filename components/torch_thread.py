"""The one thread that calls torch, and how many CPU threads torch uses: `configure_threads` (the app's count,
set once by app.py's main()), `TORCH_THREAD` and `on_one_thread` (a run's events, each computed there, with
heartbeats while a step is long). The models' cache (components/model_cache.py) loads on the same thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Iterator, TypeVar

import torch

from sbon.machine import start_threads
from sbon.models import DEFAULT_GENERATOR, default_device

T = TypeVar("T")


def configure_threads() -> int:
    """Set torch's CPU threads for the app's runs and return how many are in use (sbon.machine.start_threads, for
    the default generator).

    Why more than one where a path is measured: a path measured exact on two threads (bf16 and int4 are, where the
    CPU computes bfloat16 natively) decodes a step of 16 candidates in about 0.6 of one thread's time on idle cores
    (benchmarks/results/*/step)."""
    torch.set_num_threads(start_threads(DEFAULT_GENERATOR, default_device()))
    return torch.get_num_threads()


# The one thread that calls torch: it loads the models and computes every run's events. torch's CPU threads
# (an OpenMP team) belong to the thread that calls into torch, and once a second thread has called it, the
# one that decodes runs markedly slower on two cores (the idle team's threads still take their share). Gradio
# advances a run's generator from whichever thread of its pool is free, and model loads would otherwise run on
# a thread of their own: so both go here.
TORCH_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbon-torch")
_END = object()


def on_one_thread(events: Iterator[T], heartbeat_s: float | None = None) -> Iterator[T | None]:
    """The items of ``events``, each computed on TORCH_THREAD; closing this closes ``events`` there. With
    ``heartbeat_s``, None comes whenever no item has for that long (a long step, e.g. a reward's pass over
    every answer), so a page can show that it is still working.

    The next item is already being computed while the caller handles this one: a page drawing an update
    (Gradio serializing and sending it) would otherwise hold the run still for that long at every update."""
    try:
        pending = TORCH_THREAD.submit(next, events, _END)
        while True:
            try:
                item = pending.result(timeout=heartbeat_s)
            except FutureTimeout:
                yield None
                continue
            if item is _END:
                return
            pending = TORCH_THREAD.submit(next, events, _END)
            yield item
    finally:
        close = getattr(events, "close", None)
        if close is not None and threading.current_thread().name.startswith("sbon-torch"):
            close()  # finalized on the torch thread itself (a garbage collection there): waiting would deadlock
        elif close is not None:
            TORCH_THREAD.submit(close).result()
