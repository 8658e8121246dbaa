"""The generation first: everything a visitor triggers runs at a lower CPU priority than the torch thread.

Linux gives each thread its own nice value, and a thread starts with its creator's. So the app starts the
torch thread (components.torch_thread.TORCH_THREAD, which makes torch's own worker threads when it first
computes) at the priority it was started with, serves, then lowers its main thread and every thread the launch
started: the web server, Gradio's worker threads and every handler they run (page configs, queue polls, page
and gallery opens, the model line's timer, the static pages' first build) run at, or start from, the lower
priority. A class reading along
then takes only the cycles the generation leaves. Raising a priority again needs privileges, so nothing here
tries. Where the platform has no per-thread priority, these are no-ops.
"""

from __future__ import annotations

import logging
import os
import threading

VISITOR_NICE = 10  # how far below the generation the rest of the server runs (0 = same; 19 = lowest)
log = logging.getLogger("sbon.app")


def nice_of_this_thread() -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return None


def lower_this_thread(nice: int = VISITOR_NICE) -> bool:
    """Lower the calling thread to ``nice`` (never raises it); True when it runs at ``nice`` or lower now."""
    now = nice_of_this_thread()
    if now is None:
        return False
    if now >= nice:
        return True
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        return False
    return True


def thread_ids() -> set[int]:
    """The native ids of this process's threads now (Linux's /proc/self/task; empty elsewhere)."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def start_generation() -> set[int]:
    """Call once from the main thread before the server starts: start the torch thread at today's priority and
    return the threads that exist now (the generation's), which `serve_below_generation` leaves alone."""
    from .torch_thread import TORCH_THREAD

    TORCH_THREAD.submit(nice_of_this_thread).result()  # the torch thread exists from here on
    return thread_ids()


def serve_below_generation(generation: set[int], nice: int = VISITOR_NICE) -> bool:
    """Call from the main thread once the server is up: lower every thread started since `start_generation` (the
    web server's, Gradio's workers) and the main thread itself, so the threads they start later inherit the lower
    priority. Lowering after the launch, not before, keeps Gradio's start-up check of its own address (a request
    with a 3 s timeout) from failing on a machine that is busy with something else."""
    from .torch_thread import TORCH_THREAD

    lowered = lower_this_thread(nice)
    for tid in thread_ids() - generation:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:  # the thread ended meanwhile, or the platform has no per-thread priority
            pass
    torch_nice = TORCH_THREAD.submit(nice_of_this_thread).result()
    log.info("generation at nice %s, the rest of the server at nice %s", torch_nice, nice_of_this_thread())
    return lowered
