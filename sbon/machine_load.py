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

The decode-path probe (sbon.probe) needs a sharper question, asked over a fraction of a second: did this process's
threads get the cores they asked for (:class:`Contention`, from the kernel's per-thread run-queue delays,
:class:`ThreadWaits`, which a run's look at its thread team asks too)? And it
must not time beside the app's own runs, which the app tells it through a file (:class:`RunGate`), and what it does
before it times runs on cores nothing else wants (:func:`at_idle_priority`).
"""

from __future__ import annotations

import atexit
import os
import resource
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

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


# -- whether this process had its cores: what a timing of a decode path needs ---------------------------------------

# A timing is trusted where this process's threads waited for a core less than this (in cores, over the timing's
# wall time). Runnable threads that find no free core are what a neighbour, or another run, does to a timing; a
# thread that sleeps or spins waits for nothing, so the measure holds whatever torch's threads do between operations.
WAITED_CORES_TRUSTED = 0.1
PROC_TASKS = Path("/proc/self/task")


def _threads_waited(nice_at_most: int | None = None) -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a CPU, summed over its threads
    (the second field of ``/proc/self/task/*/schedstat``); None where the kernel does not keep it. With
    ``nice_at_most``, only the threads at that nice value or a higher priority: a thread's torch team, where the
    process runs its other threads below it (the app's server: components.priority)."""
    total, seen = 0, False
    try:
        tasks = list(PROC_TASKS.iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            if nice_at_most is not None and _nice(task) > nice_at_most:
                continue
            total += int((task / "schedstat").read_text().split()[1])
            seen = True
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9 if seen else None


def _nice(task: Path) -> int:
    """A thread's nice value, from ``/proc/self/task/<tid>/stat`` (its 19th field; the name before it may hold
    spaces and parentheses, so the fields are counted after its closing one)."""
    return int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])


class ThreadWaits:
    """The cores this process's threads waited for between ``start()`` and ``stop()``, runnable without a core, over
    the wall time; with ``team``, only the calling thread's torch team: the threads at its nice value or a higher
    priority (it and the workers it started; where the process runs its other threads below it, as the app's server
    does, not those). ``stop()`` gives None where the kernel keeps no such count."""

    def __init__(self, team: bool = False):
        self.team = team

    def start(self) -> "ThreadWaits":
        self.nice = None  # every thread of the process
        if self.team:
            try:
                self.nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            except (AttributeError, OSError):
                pass
        self.waited0, self.t0 = _threads_waited(self.nice), time.perf_counter()
        return self

    def stop(self) -> float | None:
        waited1, seconds = _threads_waited(self.nice), max(time.perf_counter() - self.t0, 1e-9)
        return None if self.waited0 is None or waited1 is None else max(0.0, waited1 - self.waited0) / seconds


class Contention:
    """Whether this process had the cores it asked for between ``start()`` and ``stop()``: ``stop()`` returns the
    cores its threads spent waiting for one (``waited_cores``, ``ThreadWaits``), or, where the kernel keeps no such
    count, what other processes used of this process's cores (``LoadMeter``'s ``others_cores``). ``trusted`` says
    whether a timing taken meanwhile measured the work, not the machine."""

    def start(self) -> "Contention":
        self.waits = ThreadWaits().start()
        self.meter = LoadMeter().start() if self.waits.waited0 is None else None
        return self

    def stop(self) -> float:
        waited = self.waits.stop()
        self.waited_cores = (self.meter.stop()["others_cores"] or 0.0) if self.meter is not None else waited or 0.0
        return self.waited_cores

    @property
    def trusted(self) -> bool:
        return self.waited_cores <= WAITED_CORES_TRUSTED


# -- runs generating in the app: what a probe beside them must not time -------------------------------------------

_GATES: dict[tuple[int, Path], "RunGate"] = {}  # RunGate.of_this_process's, by process and folder


class RunGate:
    """A file through which a process that runs generations (the app) tells a probe in another process when not to
    time: it holds how many runs are generating and a counter that changes whenever one starts. The probe takes a
    ``token()`` before a timing and compares it after: a timing taken beside a run is thrown away. The app names the
    file to its probe in the environment (``ENV``). The probe tells the app back since when it waits (``waiting``),
    so that runs sent back to back can leave it a gap (``starved``)."""
    ENV = "SBON_RUN_GATE"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.generating_now, self.started = 0, 0
        self.last_started: float | None = None  # time.time() at the start of this process's last run
        self._lock = threading.Lock()
        # Where the probe says since when it waits for the runs to end (time.time()); absent while it does not wait.
        self.waiting = self.path.with_name(self.path.name + ".waiting")

    @classmethod
    def of_this_process(cls, folder: str | os.PathLike) -> "RunGate":
        """This process's gate, ``runs-<pid>`` in ``folder``, removed when the process exits: one object per process
        and folder, so that every caller counts the same runs into the one file (a second object would overwrite the
        first's counts). The gates there of processes that no longer run (killed before they could remove theirs)
        are removed first."""
        import psutil
        folder = Path(folder)
        key = (os.getpid(), folder.resolve())
        if key not in _GATES:
            for old in folder.glob("runs-*"):
                pid = old.name[len("runs-"):].split(".")[0]
                if pid.isdigit() and not psutil.pid_exists(int(pid)):
                    old.unlink(missing_ok=True)
            _GATES[key] = gate = cls(folder / f"runs-{os.getpid()}")
            atexit.register(gate.path.unlink, missing_ok=True)
        return _GATES[key]

    @classmethod
    def from_env(cls) -> "RunGate | None":
        path = os.environ.get(cls.ENV)
        return cls(path) if path else None

    def _write(self) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(f"{self.generating_now} {self.started}")
            tmp.replace(self.path)
        except OSError:
            pass  # the probe then cannot tell runs apart from a neighbour: its contention check still holds

    @contextmanager
    def generating(self) -> Iterator[None]:
        """Around a run's generation."""
        with self._lock:
            self.generating_now += 1
            self.started += 1
            self.last_started = time.time()
            self._write()
        try:
            yield
        finally:
            with self._lock:
                self.generating_now -= 1
                self._write()

    def token(self) -> int | None:
        """None while a run is generating; else the number of runs started so far (a timing whose token before
        and after differ was taken beside a run). A missing or unreadable file: no run is known (0)."""
        try:
            now, started = (int(v) for v in self.path.read_text().split())
        except (OSError, ValueError):
            return 0
        return None if now > 0 else started

    def probe_waits(self, since: float | None) -> None:
        """The probe's side: it waits for the runs to end since ``since`` (time.time()); None: it no longer waits."""
        try:
            if since is None:
                self.waiting.unlink(missing_ok=True)
            else:
                self.waiting.write_text(repr(since))
        except OSError:
            pass  # the app then holds no run for the probe: the probe measures where runs leave it a gap

    def starved(self) -> bool:
        """The app's side, between runs: whether the probe has waited through a whole run of this process, with no
        gap between that run and the one before (it began waiting before the last run started): runs sent back to
        back, as a queue of visitors sends them, would leave it none."""
        try:
            since = float(self.waiting.read_text())
        except (OSError, ValueError):
            return False
        return self.generating_now == 0 and self.last_started is not None and since < self.last_started


GATE_POLL_S = 0.5  # while a run generates beside a timing: how often the timer looks whether the run ended


def quiet_token(gate: RunGate | None) -> int:
    """Wait while a run generates beside a timing, telling the app since when (RunGate.starved); then the gate's
    token (0 without a gate)."""
    if gate is None:
        return 0
    waiting = False
    try:
        while (token := gate.token()) is None:
            if not waiting:
                gate.probe_waits(time.time())
                waiting = True
            time.sleep(GATE_POLL_S)
        return token
    finally:
        if waiting:
            gate.probe_waits(None)


# -- this program's own background work: on cores nothing else wants ---------------------------------------------

T = TypeVar("T")


def lower_to_idle() -> None:
    """Run the calling thread, and the threads and processes it starts from now on, only where nothing else wants a
    core: Linux's SCHED_IDLE (a thread at it gives its core up the moment another one wakes; one at the lowest nice
    value delays each wake of a thread team by milliseconds), else the lowest nice value. Either still gets a sliver
    of a busy core, so whatever waits for its work never waits forever. Where a thread cannot be lowered alone (not
    Linux), the process is, if this is its only thread; else nothing changes."""
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 19)
    except (AttributeError, OSError):
        if threading.active_count() == 1:
            os.nice(19)


def at_idle_priority(work: Callable[[], T]) -> T:
    """``work()`` on a thread of its own lowered by ``lower_to_idle`` (the processes it starts, a C++ compiler's,
    inherit it), this thread waiting for it: work that times nothing and must not slow a run that starts meanwhile,
    in a process whose own thread must keep its priority for what it times (the decode-path probe: sbon.probe)."""
    from concurrent.futures import ThreadPoolExecutor

    def lowered() -> T:
        lower_to_idle()
        return work()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbon-idle") as pool:
        return pool.submit(lowered).result()
