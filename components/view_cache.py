"""The views' cache: a view computed once per arguments, however many visitors ask for it at once."""

from __future__ import annotations

import functools
import threading
from typing import Callable


def computed_once(maxsize: int) -> Callable:
    """lru_cache for views, where a second caller of the same arguments waits for the first one's result
    instead of computing it again beside it (a class opening one link at once)."""
    def wrap(fn: Callable) -> Callable:
        cached, locks, guard = functools.lru_cache(maxsize=maxsize)(fn), {}, threading.Lock()

        @functools.wraps(fn)
        def once(*args):
            with guard:
                lock = locks.setdefault(args, threading.Lock())
            with lock:
                return cached(*args)
        return once
    return wrap
