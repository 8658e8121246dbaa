"""This machine: what it is (``fingerprint``) and ``auto``'s decode path,
chosen by measurement (``Choice``, ``choose``) and cached per machine.

A decode path is a weight format (``sbon.engine.WEIGHT_FORMATS``) and a decode step (``eager`` or ``compiled``,
``sbon.decoders``). ``sbon.probe`` times every path this machine can run and measures whether a row's logits depend
on its batch there; ``choose`` picks the fastest path that meets the rule: on a CPU the coupled sampling must be exact
(the same bits for a row decoded alone and within a batch), on a GPU the measured divergence is reported. The choice is
cached under a hash of the fingerprint, so a choice measured on another CPU, under other instruction-set limits, with
another thread count, another torch version, another version of the probe or another set of weight formats is never
used. Until a choice is
measured, runs use the safe path (``safe_path``: on a CPU the one exact without measuring). A choice whose timings
were taken while other work held the cores, or whose compiled steps are still being built, is provisional
(``Choice.provisional``): runs take it, and it is measured again.

``auto_path`` is ``auto``'s one rule: the path a run that starts now takes, which the library, the command line and
the app all ask.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import torch

from .cache import cache_dir

log = logging.getLogger(__name__)

# The row counts a page-default run (N=16) decodes at: all candidates, after the first decision point, the last one.
ROWS = (16, 7, 1)
REPORT_ROWS = 7  # the row count a choice's reason quotes
# Environment variables that limit the instructions torch and oneDNN use (how other CPU classes are emulated).
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
              "TORCHINDUCTOR_CPP_VEC_ISA")
# /proc/cpuinfo flags that change which decode path is fast or exact here.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # either gives a CPU native bfloat16 matrix products
# float32 gives a row the same bits at any batch size on one thread on any CPU (sbon.engine.WEIGHT_FORMATS); a run
# on the safe path takes more where they are checked to give the same bits (sbon.probe.safe_threads).
SAFE_THREADS = 1
# Why a choice measured on one thread, because other work stalled the thread team (sbon.probe.probe), is provisional:
# runs take it on one thread until a path is chosen at the thread count they would decode with on free cores.
ALONE = "measured on one core while other programs kept the others busy"
# How choices are measured (sbon.probe): a choice measured another way is in another file and never read.
PROBE_VERSION = 2


# -- what this machine is -----------------------------------------------------------------------------------------

def cpu_model() -> str:
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    for line in _cpuinfo().splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return [f for f in CPU_FLAGS if f in have]
    return []


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def device_name(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return device.type


# torch's own thread count in this process before anyone set it (one per core, or OMP_NUM_THREADS)
TORCH_THREADS = torch.get_num_threads()


def decode_threads() -> int:
    """The CPU threads a measured path decodes with: SBON_THREADS if set, else torch's default (one per core)."""
    threads = os.environ.get("SBON_THREADS")
    return max(1, int(threads)) if threads else TORCH_THREADS


def threads_may_change(device: str | torch.device, threads: int) -> bool:
    """Whether a run on ``device`` may take another thread count than ``threads``: on a CPU, from more than one
    thread, unless SBON_THREADS asks for a count."""
    return threads > 1 and torch.device(device).type == "cpu" and not os.environ.get("SBON_THREADS")


@contextmanager
def on_threads(count: int) -> Iterator[None]:
    """torch on ``count`` CPU threads inside the block, and on the count it had before after it."""
    before = torch.get_num_threads()
    if count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def prefill_threads(device: str | torch.device) -> AbstractContextManager[None]:
    """Around a run's prefill: one CPU thread, wherever a run may take another count than the process's
    (``threads_may_change``). A run that starts beside other work decodes on one thread (sbon.probe.run_threads) where
    its step gives the bits of the measured count, but a prefill need not: in bfloat16, a prefill of a few hundred
    prompt tokens gives other bits on two threads than on one. Prefilled on whatever count the moment gives, the same
    prompt and seed would give a run under load other candidates than on free cores; one prompt on one thread costs
    little beside a run's decode."""
    threads = torch.get_num_threads()
    return on_threads(1 if threads_may_change(device, threads) else threads)


def start_threads(generator: str, device: str | torch.device = "cpu") -> int:
    """The CPU threads a process that runs ``generator`` on ``device`` decodes with, the app's and the command line's
    alike: SBON_THREADS if set; else, on a CPU of at most two cores where no decode path is chosen yet (none
    measured, or a choice that names none: nothing was exact, or nothing could be timed beside a busy neighbour),
    SAFE_THREADS (the float32 path runs meanwhile, exact without measuring on one thread, and on shared cores its
    threads would wait on each other at every operation); else torch's default, the count a choice is measured at
    (``decode_threads``). Each run then sets its own at its start: one thread where other work holds the cores
    (sbon.probe.run_threads); on the safe path, ``decode_threads`` where the team is free and gives one thread's bits
    (sbon.probe.safe_threads)."""
    if os.environ.get("SBON_THREADS") or torch.device(device).type != "cpu" or (os.cpu_count() or 1) > 2:
        return decode_threads()
    measured = cached_choice(generator, "cpu", decode_threads())
    return decode_threads() if measured is not None and measured.weights else SAFE_THREADS


def fingerprint(device: str | torch.device = "cpu", threads: int | None = None) -> dict:
    """What decides which decode path is fast and exact here: the CPU and the instruction sets in force (the
    capability torch's kernels use, the limits set in the environment, the CPU's own flags), the thread count
    (``threads``, default: the one in use now), torch's version, the device, and the weight formats there are to
    choose from: a machine that measured its choice before a format was added measures again, with it."""
    from .engine import WEIGHT_FORMATS
    device = torch.device(device)
    return {"cpu": cpu_model(), "capability": torch.backends.cpu.get_cpu_capability(),
            "limits": {name: os.environ[name] for name in ISA_LIMITS if os.environ.get(name)},
            "flags": cpu_flags(), "threads": threads or torch.get_num_threads(), "torch": torch.__version__,
            "device": device_name(device), "probe": PROBE_VERSION, "formats": list(WEIGHT_FORMATS)}


def cache_key(machine: dict) -> str:
    """The file name's hash of a fingerprint."""
    return hashlib.blake2b(json.dumps(machine, sort_keys=True).encode(), digest_size=10).hexdigest()


# -- a measured path and the choice ------------------------------------------------------------------------------

@dataclass
class Measured:
    """One decode path as measured on this machine."""
    weights: str = field(metadata={"help": "the weight format (sbon.engine.WEIGHT_FORMATS)"})
    decode: str = field(metadata={"help": "eager or compiled (sbon.decoders)"})
    ms: dict[int, float] = field(default_factory=dict, metadata={"help": "rows -> milliseconds per decode step"})
    exact: bool | None = field(default=None, metadata={"help": "a row's logits are the same bits alone and within a "
                                                                "batch (None: not measured)"})
    divergence: float | None = field(default=None, metadata={"help": "the largest difference of a logit between a "
                                                                      "row decoded alone and within a batch"})
    problem: str | None = field(default=None, metadata={"help": "why it did not run here (then no times)"})
    trusted: int = field(default=0, metadata={"help": "rounds timed at every row count while this process had its "
                                                      "cores (sbon.machine_load.Contention); 0: its times are upper "
                                                      "bounds taken beside other work"})
    products_ms: dict[int, float] = field(default_factory=dict, metadata={
        "help": "eager paths on a CPU: rows -> milliseconds of the step's matrix products alone (its Linear layers and "
                "LM head), which a compiled step runs unchanged: what orders and bounds the builds (sbon.probe)"})

    @property
    def name(self) -> str:
        return f"{self.weights} {self.decode}"

    @property
    def runs(self) -> bool:
        return self.problem is None and bool(self.ms)

    @property
    def pending(self) -> bool:
        """A compiled step not built yet: nothing wrong, nothing timed."""
        return self.problem is None and not self.ms and self.exact is None

    def per_step(self) -> float:
        """What paths are ranked by: milliseconds per step, averaged over the row counts a run decodes at."""
        return sum(self.ms.values()) / len(self.ms)

    def at(self, rows: int = REPORT_ROWS) -> float:
        return self.ms.get(rows, self.per_step())


def eligible(path: Measured, device: str) -> bool:
    """A path ``auto`` may take: it ran here and, on a CPU, its coupling was measured exact."""
    return path.runs and (path.exact is True or torch.device(device).type != "cpu")


def safe_path(device: str | torch.device = "cpu") -> tuple[str, str]:
    """The path runs take before anything is measured: on a CPU float32 op by op (on SAFE_THREADS threads: exact
    without measuring), on a GPU bfloat16 on CUDA graphs (captured in seconds, no compiler: sbon.cuda_graphs)."""
    return ("fp32", "eager") if torch.device(device).type == "cpu" else ("bf16", "compiled")


@dataclass
class Choice:
    """``auto``'s decode path on one machine for one generator, and what it was chosen from."""
    generator: str
    fingerprint: dict
    paths: list[Measured]
    weights: str | None = None  # the chosen path (None: no path met the rule; runs keep the safe one)
    decode: str | None = None
    reason: str = ""  # one line, with identifiers (the command line's)
    words: str = ""  # the same in words, for the page
    pending: list[str] = field(default_factory=list)  # compiled paths whose step is not built yet
    provisional: str = ""  # why this choice is measured again ('' where it is final), in words
    tries: dict[str, int] = field(default_factory=dict)  # weight format -> builds of its compiled step begun here
    # The chosen compiled step built for one thread, on which a run that starts beside other work decodes
    # (sbon.probe.one_thread_step): "same" where it gives the bits of the thread count measured; else why it is not
    # used; "" where it was not tried yet.
    one_thread: str = ""

    @property
    def key(self) -> str:
        return cache_key(self.fingerprint)

    def chosen(self) -> Measured | None:
        """The chosen path as measured (None where no path is chosen)."""
        return next((p for p in self.paths if (p.weights, p.decode) == (self.weights, self.decode)), None)

    @property
    def device(self) -> str:
        return "cpu" if self.fingerprint["device"] == "cpu" else "cuda"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> "Choice":
        rows = lambda ms: {int(k): v for k, v in ms.items()}  # noqa: E731 - JSON's keys are strings
        paths = [Measured(**{**p, "ms": rows(p["ms"]), "products_ms": rows(p.get("products_ms", {}))})
                 for p in d["paths"]]
        return cls(**{**d, "paths": paths})


def weight_words(weights: str) -> str:
    """A weight format in words a student reads (no identifiers): its ``words``, else its description up to its
    first aside; a format not registered by its name."""
    from .engine import WEIGHT_FORMATS
    fmt = WEIGHT_FORMATS.get(weights)
    return weights if fmt is None else fmt.words or re.split(r" \(|:|,", fmt.description)[0]


def step_words(decode: str, device: str = "cpu") -> str:
    """A decode step (sbon.decoders) in words a student reads (no identifiers)."""
    if decode != "compiled":
        return "one operation at a time"
    return "recorded once and replayed on the GPU (CUDA graphs)" if torch.device(device).type == "cuda" else \
        "compiled into one step"


def title(weights: str, decode: str, device: str = "cpu") -> str:
    """A path in words a student reads (no identifiers): the weight format's words (``weight_words``), and the
    step's (``step_words``)."""
    return f"{weight_words(weights)}, {step_words(decode, device)}"


def how_decoded(weights: str | None, decode: str | None, device: str = "cpu") -> str:
    """How a run decodes, to follow "decoded" in a sentence: "with" its path's ``title``; what is known of it where
    the weight format or the step is not (None: a run saved without it, a step not decided yet)."""
    if weights and decode:
        return f"with {title(weights, decode, device)}"
    return f"with {weight_words(weights)}" if weights else step_words(decode or "eager", device)


def choose(generator: str, machine: dict, paths: list[Measured], pending: Sequence[str] = (),
           provisional: str = "", tries: dict[str, int] | None = None) -> Choice:
    """The fastest eligible path (milliseconds per step averaged over ROWS), with its reason; ``provisional``: why
    it will be measured again ('' where it is final)."""
    device = "cpu" if machine["device"] == "cpu" else "cuda"
    choice = Choice(generator, machine, list(paths), pending=list(pending), provisional=provisional,
                    tries=dict(tries or {}))
    ok = sorted((p for p in paths if eligible(p, device)), key=Measured.per_step)
    safe = next((p for p in paths if (p.weights, p.decode) == safe_path(device) and p.runs), None)
    later = f" (provisional: {provisional})" if provisional else ""
    if not ok:
        measured = any(p.ms or p.problem for p in paths)  # else nothing was timed (sbon.probe.STALLED)
        choice.reason = (("no path measured here " + ("was exact" if device == "cpu" else "ran") if measured else
                          "no path timed here") + f": runs keep {' '.join(safe_path(device))}{later}")
        why = ("no way measured here gives each candidate the same text in both methods" if device == "cpu" else
               "no other way ran here") if measured else "nothing was timed here yet"
        choice.words = (title(*safe_path(device), device) + (", exact without measuring" if device == "cpu" else "")
                        + f": {why}{later}")
        return choice
    best = ok[0]
    choice.weights, choice.decode = best.weights, best.decode
    rule = "the fastest exact path" if device == "cpu" else "the fastest path"
    beside = f" ({safe.name}: {safe.at():.1f})" if safe is not None and safe is not best else ""
    beside_words = (f" ({title(safe.weights, safe.decode, device)}: {safe.at():.1f} ms)"
                    if safe is not None and safe is not best else "")
    diverges = (f"; a row's logits differ by up to {best.divergence:.2g} with its batch"
                if device != "cpu" and best.divergence else "")
    choice.reason = (f"{best.weights} weights, {best.decode} step: {best.at():.1f} ms per step at {REPORT_ROWS} rows"
                     f"{beside}, {rule} measured on this machine{diverges}")
    rule_words = ("the fastest way measured on this machine that gives each candidate the same text in both methods"
                  if device == "cpu" else "the fastest way measured on this machine")
    choice.words = (f"{title(best.weights, best.decode, device)}: {best.at():.1f} ms per step for {REPORT_ROWS} "
                    f"candidates, {rule_words}{beside_words}{diverges}{later}")
    return choice


# -- the cache ---------------------------------------------------------------------------------------------------

def choice_path(generator: str, machine: dict) -> Path:
    return cache_dir() / "machine" / f"{generator.replace('/', '--')}-{cache_key(machine)}.json"


def save_choice(choice: Choice) -> Path:
    """Written whole or not at all (the app reads it while the probe writes it)."""
    path = choice_path(choice.generator, choice.fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(choice.to_json())
    tmp.replace(path)
    return path


def cached_choice(generator: str, device: str | torch.device = "cpu", threads: int | None = None) -> Choice | None:
    """The choice measured on this machine (this fingerprint, at ``threads``) for ``generator``; None where there is
    none, or where the file's own fingerprint is not this machine's (it is never used then). A file that does not
    read (half written by a process that was killed, damaged) is ignored, with one logged line, and measured again."""
    machine = fingerprint(device, threads)
    path = choice_path(generator, machine)
    try:
        choice = Choice.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        if path not in _UNREADABLE:
            _UNREADABLE.add(path)
            log.warning("machine: the cached choice %s does not read (%s: %s); measuring again", path,
                        type(e).__name__, e)
        return None
    if choice.fingerprint != machine or choice.generator != generator:
        return None
    return choice


_UNREADABLE: set[Path] = set()  # choice files already said not to read (the page asks every few seconds)


# -- auto's one rule ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AutoPath:
    """The decode path of a run that starts now, and where it comes from."""
    weights: str
    decode: str  # "eager" or "compiled"
    threads: int | None = None  # the CPU threads it was measured at (None: nothing measured, or a GPU)
    choice: Choice | None = None  # this machine's measured choice (None: nothing measured yet)
    forced: bool = False  # SBON_WEIGHTS or SBON_DECODE chose part of it, not the measured choice

    @property
    def measured(self) -> bool:
        return self.choice is not None and self.choice.weights is not None


def auto_path(generator: str | None, device: str | torch.device = "cpu", threads: int | None = None) -> AutoPath:
    """``auto``'s decode path for a run of ``generator`` on ``device`` that starts now, at ``threads`` CPU threads
    (default: the number in use): the one rule the library (``sbon.models.default_weights``, ``sbon.decoders``), the
    command line and the app (``components.decode_paths``) all follow.

    SBON_WEIGHTS and SBON_DECODE force their part. Otherwise this machine's measured choice, final or provisional;
    where it names no path, or is provisional and measured slower, and runs may take one thread, the one measured on
    one thread beside other work (``alone_choice``), whose runs take one thread; with a forced weight format, the
    fastest eligible step measured for it. Where nothing is measured, the safe path
    (``safe_path``): float32 op by op on a CPU, exact without measuring; on a GPU bfloat16 on CUDA graphs."""
    from .engine import weight_format
    device = torch.device(device)
    cpu = device.type == "cpu"
    weights = os.environ.get("SBON_WEIGHTS") or None
    if weights:
        weight_format(weights)  # an unknown name is refused in one line
    decode = os.environ.get("SBON_DECODE") or None
    decode = None if decode == "auto" else decode
    count = (threads or torch.get_num_threads()) if cpu else None
    choice = cached_choice(generator, device, count) if generator else None
    if generator and not weights and cpu:
        choice = alone_choice(generator, choice, count) or choice
    measured = choice if choice is not None and choice.weights else None
    if measured is not None and weights in (None, measured.weights):
        path = (measured.weights, measured.decode)
    else:
        fmt = weights or safe_path(device)[0]
        steps = sorted((p for p in (choice.paths if choice else []) if p.weights == fmt and eligible(p, device.type)),
                       key=Measured.per_step)
        path = (fmt, steps[0].decode if steps else safe_path(device)[1])
    return AutoPath(path[0], decode or path[1], measured.fingerprint.get("threads") if measured and cpu else None,
                    choice, forced=bool(weights or decode))


def alone_choice(generator: str, choice: Choice | None, threads: int) -> Choice | None:
    """What runs at ``threads`` CPU threads take where they may take one thread (``threads_may_change``) and
    ``choice``, this count's, names no path, or is provisional and its path measured slower per step than that one
    (while this count's compiled steps are still built, say): the choice measured on one thread while other work
    stalled the team (sbon.probe.probe), on one thread. Always provisional (ALONE): the count itself is measured once
    the cores are free. None elsewhere, and where it names no path."""
    if not threads_may_change("cpu", threads):
        return None
    alone = cached_choice(generator, "cpu", 1)
    if alone is None or not alone.weights:
        return None
    if choice is not None and choice.weights:
        mine, theirs = choice.chosen(), alone.chosen()
        if not choice.provisional or mine is None or theirs is None or theirs.at() >= mine.at():
            return None
    return alone if alone.provisional else replace(alone, provisional=ALONE)


# -- the class of machine a run names ----------------------------------------------------------------------------

def cpu_isa() -> str:
    """The instruction set torch's CPU kernels run with here (ATEN_CPU_CAPABILITY may lower it, as it emulates
    another class of CPU), and whether bfloat16 is native (AVX-512 BF16 or AMX, unless ONEDNN_MAX_CPU_ISA rules it
    out)."""
    capability = torch.backends.cpu.get_cpu_capability()
    words = {"AVX512": "AVX-512", "AVX2": "AVX2", "DEFAULT": "no vector extensions"}.get(capability, capability)
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    native_bf16 = bool(BF16_FLAGS & set(cpu_flags())) and capability == "AVX512" \
        and (not limit or "BF16" in limit or "AMX" in limit or limit == "ALL")
    return words + (" with BF16" if native_bf16 else "")


def machine_device(machine: str) -> str:
    """The device type a run recorded on the class of machine ``machine`` (``machine_class``'s line) decoded on."""
    return "cuda" if machine.endswith(" (GPU)") else "cpu"


def machine_class(device: str | torch.device = "cpu") -> str:
    """One line naming the class of machine a run on ``device`` runs on, as each result records it
    (``RunResult.machine``): 'NVIDIA H100 80GB HBM3 (GPU)', 'AMD EPYC 9B14 (AVX-512 with BF16)'. Two runs with the
    same seed, settings, weight format and decode path give the same candidates on the same class; another class
    may round differently (bfloat16 emulated or native, AVX2 or AVX-512 kernels), so a page says whether Run here
    reproduces a recorded run, and whose wall times it shows."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device_name(device)} (GPU)"
    if device.type == "mps":
        return "an Apple GPU (MPS)"
    return f"{cpu_model()} ({cpu_isa()})"
