"""How busy the machine was while a run ran: the context every wall time needs.

Wall time is what a user waits, but it measures the machine as much as the method: another process on the
same cores can turn a 2x speedup into a 0.3x "slowdown" without changing one token. So each run records, beside
its times, what else the machine was doing (:class:`LoadMeter`), and :func:`busy` says, in one place, when that
was enough to make its wall time an upper bound. The run's own costs (decode steps, tokens) do not depend on it.

The measure: CPU time that *other* processes used on this process's cores during the run, in cores
(``others_cores``): the busy ticks of those CPUs in ``/proc/stat`` minus this process's own CPU time
(``getrusage``, every thread: torch's workers included), over the wall time. It reacts at once, unlike the
1-minute load average, a decaying average that a busy process starting with a run of seconds has moved little by
its end (the 1-minute averages at the start and the end are recorded too). Where ``/proc/stat`` cannot be read (not Linux), the load average
at the start stands in for it. Another run *in this process* (a second request of the app) counts as its own
time, not another's.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

BUSY_OTHERS_CORES = 0.5  # other processes used more than half a core on average: the wall time is inflated
PROC_STAT = Path("/proc/stat")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
IDLE_FIELDS = (3, 4)  # idle, iowait: the other fields of a cpuN line are time some process (or the kernel) used


def cores() -> list[int]:
    """The CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _busy_seconds(cpus: list[int]) -> float | None:
    """Seconds of non-idle time on these CPUs since boot, or None where /proc/stat cannot be read."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    wanted, ticks = {f"cpu{i}" for i in cpus}, 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:
            # guest time is already counted in user time: leave out the two guest fields (the 9th and 10th)
            ticks += sum(int(v) for i, v in enumerate(fields[:8]) if i not in IDLE_FIELDS)
    return ticks / TICKS if ticks else None


def _own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


class LoadMeter:
    """Measures what the machine did beside this process between ``start()`` and ``stop()``; ``stop()``
    returns the record a run keeps (``RunResult.load``). Also a context manager (then read ``.record``)."""

    def __init__(self):
        self.record: dict[str, Any] = {}

    def start(self) -> "LoadMeter":
        self.cpus = cores()
        self.t0, self.busy0, self.own0, self.load0 = time.perf_counter(), _busy_seconds(self.cpus), _own_seconds(), \
            _load_average()
        return self

    def stop(self) -> dict[str, Any]:
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        busy1, own = _busy_seconds(self.cpus), _own_seconds() - self.own0
        others = None if self.busy0 is None or busy1 is None else max(0.0, (busy1 - self.busy0) - own) / seconds
        self.record = {"cores": len(self.cpus), "seconds": round(seconds, 3),
                       "others_cores": None if others is None else round(others, 3),
                       "own_cores": round(own / seconds, 3),
                       "load_average_start": self.load0, "load_average_end": _load_average()}
        return self.record

    def __enter__(self) -> "LoadMeter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def busy(load: dict[str, Any] | None) -> bool:
    """Whether a run's wall time was inflated by other work: other processes used more than BUSY_OTHERS_CORES
    of its cores on average, or (without that measure) the 1-minute load average at its start exceeded the
    cores. A run recorded without a load record (files saved before it existed) is not called busy."""
    if not load:
        return False
    if load.get("others_cores") is not None:
        return load["others_cores"] > BUSY_OTHERS_CORES
    start, n = load.get("load_average_start"), load.get("cores")
    return start is not None and bool(n) and start > n


def busy_note(loads: dict[str, dict[str, Any] | None]) -> str:
    """One line for the runs (label -> load record) that ran on a busy machine; '' when none did."""
    busy_ones = {label: load for label, load in loads.items() if busy(load)}
    if not busy_ones:
        return ""
    parts = []
    for label, load in busy_ones.items():
        others = load.get("others_cores")
        parts.append(f"{label}: other processes used {others:.1f} of {load['cores']} cores on average" if others is not None
                     else f"{label}: load average {load['load_average_start']:.1f} on {load['cores']} cores")
    return ("⚠ The machine was busy during this run (" + "; ".join(parts) + "): its wall times are upper bounds. "
            "Decode steps and tokens do not depend on the load.")
