"""The generation first: everything a visitor triggers runs at a lower CPU priority than the torch thread.

Linux gives each thread its own nice value, and a thread starts with its creator's. So the app starts the
torch thread (components.model_cache.TORCH_THREAD, which makes torch's own worker threads when it first
computes) at the priority it was started with, then lowers its main thread: the web server, Gradio's worker
threads and every handler they run (page configs, queue polls, page and gallery opens, the model line's
timer, the static pages' first build) start from it and inherit the lower priority. A class reading along
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


def serve_below_generation(nice: int = VISITOR_NICE) -> bool:
    """Call once from the main thread before the server starts: start the torch thread at today's priority,
    then lower this thread so the server's threads, started after, run below it."""
    from .model_cache import TORCH_THREAD

    torch_nice = TORCH_THREAD.submit(nice_of_this_thread).result()  # the torch thread exists from here on
    lowered = lower_this_thread(nice)
    log.info("generation at nice %s, the rest of the server at nice %s", torch_nice, nice_of_this_thread())
    return lowered
