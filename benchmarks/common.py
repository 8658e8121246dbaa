"""What every experiment shares: prompts, models, environment, timing, memory, result files."""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from sbon.algorithms import Done, Event, best_of_n
from sbon.config import RunConfig
from sbon.decoders import auto_compiles
from sbon.engine import Generator, SamplingConfig
from sbon.machine import cpu_flags
from sbon.options import add_options, resolved
from sbon.models import (DEFAULT_GENERATOR, DEFAULT_REWARD, default_device, default_dtype_name, load_generator,
                         load_reward)
from sbon.results import RunResult
from sbon.rewards import RewardModel

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = REPO / "benchmarks" / "data"  # the prompt sets shipped in the repository (see its README.md)
DEFAULT_OUT_DIR = REPO / "benchmarks" / "results"
PROMPTS_FILE = "alpaca_eval_prompts.jsonl"

# The environment variables a result file's command records where they are set: they change its numbers or times.
COMMAND_ENV = ("OMP_NUM_THREADS", "SBON_WEIGHTS", "SBON_DECODE")


# -- protocols: which version of the paper a run follows ---------------------------------------

@dataclass(frozen=True)
class Protocol:
    """Sampling and prompt selection of one version of the paper. Lengths (N, new tokens) stay each
    experiment's CPU-sized defaults under both: the paper's (N in the thousands, up to 2048 new
    tokens on H100s) would take days on a CPU; every result file records the lengths it used."""

    name: str
    temperature: float
    top_p: float
    top_k: int  # 0 = off
    prompt_order: str  # "first": the file's first k prompts; "random": k drawn with --prompt-seed
    source: str


PROTOCOLS = {
    # The workshop version's own sampling settings are not published in the official code (which is
    # the NeurIPS version's) and its text is not available to us: this protocol is the project's
    # settings since its first benchmarks, so that earlier result files stay comparable.
    "workshop": Protocol("workshop", SamplingConfig.temperature, SamplingConfig.top_p, SamplingConfig.top_k, "first",
                         "this project's benchmark defaults since the first runs (sbon.engine.SamplingConfig), "
                         "the file's first k prompts; not read from the workshop paper"),
    "neurips": Protocol("neurips", 1.0, 1.0, 50, "random",
                        "Sun et al., NeurIPS 2024 (arXiv 2410.20290), Section 5: prompts randomly sampled from "
                        "AlpacaFarm-Eval; sampling = the official code's main.py defaults (temperature 1, "
                        "top_k 50, top_p 1)"),
}
DEFAULT_PROTOCOL = "workshop"


def apply_protocol(args: argparse.Namespace) -> None:
    """Fill the sampling options left unset on the command line from --protocol."""
    proto = PROTOCOLS[args.protocol]
    for name in ("temperature", "top_p", "top_k", "prompt_order"):
        if getattr(args, name, None) is None:
            setattr(args, name, getattr(proto, name))


def protocol_record(args: argparse.Namespace) -> dict[str, Any]:
    """What a result file says about the protocol: its name and settings, and what was overridden."""
    proto = PROTOCOLS[args.protocol]
    overridden = {k: getattr(args, k) for k in ("temperature", "top_p", "top_k", "prompt_order")
                  if getattr(args, k) != getattr(proto, k)}
    return {**asdict(proto), "overridden": overridden}


# -- prompts ----------------------------------------------------------------------------------

def data_dir(override: str | os.PathLike | None = None) -> Path:
    return Path(override or os.environ.get("SBON_DATA_DIR") or DEFAULT_DATA_DIR)


def load_prompts(k: int, data: str | os.PathLike | None = None, file: str = PROMPTS_FILE,
                 offset: int = 0, order: str = "first", seed: int = 0) -> list[dict]:
    """k prompts of a prompt file (dicts with id, dataset, instruction): the first k after `offset`,
    or with order="random" k drawn without replacement with `seed` (the first k after `offset` of
    the file shuffled by random.Random(seed))."""
    path = data_dir(data) / file
    if not path.exists():
        raise SystemExit(f"error: prompt file {path} not found: pass --data-dir (the folder holding {file})")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if order == "random":
        random.Random(seed).shuffle(rows)
    elif order != "first":
        raise ValueError(f"prompt order must be 'first' or 'random', got {order!r}")
    return rows[offset:offset + k]


def prompts_from(args: argparse.Namespace) -> list[dict]:
    return load_prompts(args.k, args.data_dir, args.prompts_file, args.offset, args.prompt_order, args.prompt_seed)


# -- models -----------------------------------------------------------------------------------

def load_models(generator: str = DEFAULT_GENERATOR, reward: str = DEFAULT_REWARD, device: str | None = None,
                dtype: str | None = None) -> tuple[Generator, RewardModel]:
    from transformers.utils import logging as tf_logging

    tf_logging.set_verbosity_error()
    torch_dtype = getattr(torch, dtype) if dtype else None
    gen = load_generator(generator, device=device, dtype=torch_dtype)
    return gen, load_reward(reward, generator=gen, device=device)


def sampling_from(args: argparse.Namespace) -> SamplingConfig:
    """The sampling settings of a parsed command line (after apply_protocol)."""
    return SamplingConfig(args.temperature, args.top_p, args.top_k)


def warm_up(gen: Generator, reward: RewardModel, sampling: SamplingConfig, runner: "Runner | None" = None,
            decode: str = "auto") -> None:
    """One tiny run on the decode path the timed runs take, so that one-time costs (lazy initialisation, allocator
    growth) are not timed. On a remote runner (--ray) the workers time the runs, and each warms up its own models."""
    if runner is not None and runner.remote:
        return
    timed_run(best_of_n(gen, reward, "Say hello.", 2, max_new_tokens=4, sampling=sampling, seed=0, decode=decode))


# -- running ----------------------------------------------------------------------------------

def timed_run(events: Iterator[Event], on_event: Callable[[Event, float], None] | None = None) -> RunResult:
    """Run an algorithm to the end (after a garbage collection, so that no earlier run's garbage
    is collected inside this one's timers); `on_event(event, seconds since start)`."""
    gc.collect()
    start = time.perf_counter()
    for event in events:
        if on_event is not None:
            on_event(event, time.perf_counter() - start)
        if isinstance(event, Done):
            return event.result
    raise RuntimeError("the algorithm stopped without a result")


class LocalRunner:
    """Runs an experiment's prompts in this process, one after another, on this process's models. The
    Ray runner (benchmarks/distributed.py ``Pool``) has the same interface; an experiment gets its runner
    from ``benchmarks.runners.setup`` and passes it down -- nothing is global."""
    remote = False
    record: dict[str, Any] | None = None  # what the result file says about the workers (None: this process)

    def map(self, work: Callable[..., Any], prompts: Sequence[dict], gen: Generator, reward: RewardModel,
            bar: tqdm | None = None, steps: int = 1) -> Iterator[tuple[dict, Any]]:
        for p in prompts:
            yield p, work(gen, reward, p, bar=bar)

    def close(self) -> None:
        pass


Runner = LocalRunner  # the interface; distributed.Pool implements it on Ray workers
LOCAL = LocalRunner()


def map_prompts(work: Callable[..., Any], prompts: Sequence[dict], gen: Generator, reward: RewardModel,
                bar: tqdm | None = None, steps: int = 1, runner: Runner = LOCAL) -> Iterator[tuple[dict, Any]]:
    """(prompt, work(gen, reward, prompt)) for every prompt, in prompt order: the one loop of an
    experiment over its prompts. Locally `work` gets `bar=bar` and moves it itself; on Ray workers
    (benchmarks/distributed.py) it runs on the workers' own models, so it must be a picklable function
    of (gen, reward, prompt) such as a functools.partial of a module-level function, and `bar`
    moves `steps` per prompt done."""
    yield from runner.map(work, prompts, gen, reward, bar=bar, steps=steps)


def progress(total: int, desc: str, disable: bool = False) -> tqdm:
    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, disable=disable, dynamic_ncols=True)


class PeakRSS:
    """Peak resident memory of this process while the block runs, sampled by a thread.

    torch's CPU allocations are invisible to tracemalloc, so this reads the process RSS
    (psutil) every `interval` seconds. `peak - baseline` is the growth over what was resident
    when the block started; short spikes between samples can be missed. On CUDA, the
    device's own peak allocation counter is used instead (exact).
    """

    def __init__(self, device: torch.device | str = "cpu", interval: float = 0.002):
        self.device = torch.device(device)
        self.interval = interval
        self.baseline = self.peak = 0
        self._stop = threading.Event()

    @property
    def method(self) -> str:
        return ("torch.cuda.max_memory_allocated" if self.device.type == "cuda"
                else f"process RSS (psutil) sampled every {self.interval * 1000:g} ms by a thread")

    @property
    def growth(self) -> int:
        return max(0, self.peak - self.baseline)

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = self.peak = torch.cuda.memory_allocated(self.device)
            return self
        import psutil

        self.baseline = self.peak = psutil.Process().memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        self._stop.set()
        self._thread.join()
        import psutil

        self.peak = max(self.peak, psutil.Process().memory_info().rss)


# -- environment and result files -------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    """The checkout's commit (with "+dirty sbon/" where the engine has changes), or $SBON_GIT_COMMIT where the
    code runs from a copy without its .git (a GPU machine's)."""
    if os.environ.get("SBON_GIT_COMMIT"):
        return os.environ["SBON_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "sbon"], cwd=REPO, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty sbon/" if dirty else "") if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def command_line(args: argparse.Namespace) -> str:
    """The command as it ran, for a result file: the variables that change the numbers or the times, the niceness,
    and the arguments as ``benchmarks.__main__.main`` was given them (the same whether it ran from a shell or was
    called in-process, where ``sys.argv`` is the caller's)."""
    env = " ".join(f"{k}={os.environ[k]}" for k in COMMAND_ENV if k in os.environ)
    argv = getattr(args, "argv", None)
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(x for x in (env, f"nice -n {os.nice(0)}" if os.nice(0) else "",
                                "python -m benchmarks " + " ".join(argv)) if x)


def environment(gen: Generator | None = None, runner: Runner = LOCAL) -> dict[str, Any]:
    """Where the numbers come from: versions, device, threads, CPU and how busy it was."""
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),  # the CPU's own instructions, whatever class a run emulates on it
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git_commit": git_commit(),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if runner.record is not None:
        env["distributed"] = runner.record  # each Ray worker's own environment, and any retried or failed prompts
    if gen is not None:
        env["device"] = str(gen.device)
        env["dtype"] = str(gen.model.dtype).removeprefix("torch.")
        env["weights"] = gen.weights
        # The decode path of runs left at the default (``auto``) here; a run's own result says which it took.
        env["auto_decode"] = "compiled" if auto_compiles(gen) else "eager"
        if gen.device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name(gen.device)
    return env


def jsonable(obj: Any) -> Any:
    """Numbers, lists and dicts only: numpy scalars become floats, NaN becomes null."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return None if not np.isfinite(obj) else float(obj)
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    return obj


def write_json(payload: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(payload), indent=1))
    return path


def write_plot(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(path), include_plotlyjs="cdn")
    return path


def result_paths(args: argparse.Namespace, name: str) -> tuple[Path, Path]:
    out = Path(args.out_dir)
    stem = name + (f"_{args.tag}" if getattr(args, "tag", None) else "")
    return out / f"{stem}.json", out / f"{stem}.html"


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean, median, min and max, ignoring NaN."""
    a = np.asarray([v for v in values if v is not None], dtype=float)
    a = a[np.isfinite(a)]
    if not len(a):
        return {"mean": float("nan"), "median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"mean": float(a.mean()), "median": float(np.median(a)), "min": float(a.min()), "max": float(a.max())}


# -- command line -----------------------------------------------------------------------------

def add_common_args(p: argparse.ArgumentParser, k: int = 20, n: int = 32, max_new_tokens: int = 256,
                    protocol: str = DEFAULT_PROTOCOL) -> None:
    """The options every experiment takes. Sampling options left out come from --protocol
    (apply_protocol, called by `python -m benchmarks` after parsing)."""
    p.add_argument("--protocol", choices=list(PROTOCOLS), default=protocol,
                   help="the paper version whose sampling and prompt selection to follow: " + "; ".join(
                       f"{q.name}: temperature {q.temperature:g}, top-p {q.top_p:g}, top-k {q.top_k or 'off'}, "
                       f"{q.prompt_order} prompts" for q in PROTOCOLS.values()))
    g = p.add_argument_group("models and data")
    g.add_argument("--generator", default=DEFAULT_GENERATOR, help="generator preset, folder or hub id")
    g.add_argument("--reward", default=DEFAULT_REWARD, help="reward preset, folder or hub id")
    resolved(g.add_argument("--device", default=None, help="cpu, cuda ... (by default cuda where there is one)"),
             lambda: default_device())
    resolved(g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                            help="generator dtype (by default the device's weight format, sbon.models.default_weights)"),
             default_dtype_name)
    resolved(g.add_argument("--threads", type=int, default=None, help="torch CPU threads (by default torch's choice)"),
             torch.get_num_threads)
    resolved(g.add_argument("--data-dir", default=None, help=f"folder of {PROMPTS_FILE} (by default $SBON_DATA_DIR, "
                                                             "else benchmarks/data)"), lambda: data_dir())
    g.add_argument("--prompts-file", default=PROMPTS_FILE)
    g.add_argument("--offset", type=int, default=0, help="skip this many prompts (of the shuffled file when random)")
    g.add_argument("--k", type=int, default=k, help="number of prompts")
    g.add_argument("--prompt-order", choices=["first", "random"], default=None,
                   help="the file's first k prompts, or k drawn at random with --prompt-seed (default: from --protocol)")
    g.add_argument("--prompt-seed", type=int, default=0, help="seed of the random prompt draw")
    s = p.add_argument_group("sampling")
    # Help, types and checks come from RunConfig (one settings path); the sampling defaults come from --protocol.
    protocol_default = {"default": None, "help": "default: from --protocol"}
    add_options(s, RunConfig(n=n, max_new_tokens=max_new_tokens),
                only=("n", "max_new_tokens", "temperature", "top_p", "top_k", "seed"),
                overrides={"n": {"type": int}, "temperature": protocol_default, "top_p": protocol_default,
                           "top_k": protocol_default}, show_default=False)
    o = p.add_argument_group("output")
    o.add_argument("--out-dir", default=str(DEFAULT_OUT_DIR), help="where result files go")
    o.add_argument("--tag", default=None, help="suffix for the result file names")
    o.add_argument("--no-plot", action="store_true", help="write no HTML plot")
    o.add_argument("--quiet", action="store_true", help="no progress bar")


def base_settings(args: argparse.Namespace, gen: Generator, reward: RewardModel | None,
                  prompts: Sequence[dict] | None = None) -> dict[str, Any]:
    """The settings every result file records: protocol, models, prompts, lengths and sampling."""
    return {"protocol": protocol_record(args), "generator": args.generator,
            "reward": getattr(reward, "name", args.reward), "k": args.k, "offset": args.offset,
            "prompts_file": args.prompts_file, "prompt_order": args.prompt_order, "prompt_seed": args.prompt_seed,
            "prompt_ids": [p["id"] for p in prompts] if prompts is not None else None, "n": args.n,
            "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
            "top_k": args.top_k, "seed": args.seed}


def print_table(title: str, df, float_format: str = "{:.3f}") -> None:
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 50, "display.max_rows", 500):
        print(f"\n{title}")
        print(df.to_string(index=False, float_format=lambda x: float_format.format(x)))
