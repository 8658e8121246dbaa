"""`python -m benchmarks machines`: every decode path and the app's page-default run, under each CPU class this
machine can emulate (benchmarks.cpu_classes).

Each class runs in a child process with the class's limits in its environment, one class at a time. The child
checks that the limits hold (:func:`benchmarks.cpu_classes.isa_check`), then:

- the step table of every path: each weight format (``--formats``) eagerly, and those of ``--compiled`` with the
  compiled step, at the row counts a page-default run uses (benchmarks.step, interleaved as there), and whether
  each format keeps the coupling exact here (a row's tokens the same in one batch and in smaller ones);
- the app's probe of every path (sbon.probe, as `python -m sbon machine` runs it) and the path it chose
  (:func:`app_path`);
- the page-default comparison through the app's own run path (``Runs.compare``, what `/compare` calls), warm, in a
  process of its own (as the app's runs: not in the process that measured every path): the models loaded and the
  compiled step ready where the app would use it, one untimed run, then ``--runs`` timed ones, each with the decode
  path it took and how many candidates diverged from their Best-of-N twin; with ``--every-path``, the same on the
  compiled step of every other exact format of ``--compiled``, so that the choice stands against each alternative
  in one file.

One result file per class (``--out-dir``); `python -m benchmarks report` makes the docs' and the README's tables
from them. The cores may be shared: every file records the load average at its start and end.

``--neighbour N`` measures instead what a shared machine does to the app's own choice (``neighbour-<class>.json``):
one fresh start on quiet cores, then N fresh starts each beside one busy loop (a process spinning on one core) with
one page-default run pressed while the app measures and one once its measuring ended; each start records when each
choice was saved, the path it named, the threads its runs take and whether it was provisional, and both runs
(with each move of their threads between their steps: sbon.probe.ThreadWatch). After
the last, the busy loop stopped, the page-default comparison warm in that start's cache, against the quiet start's.
Its summary gives, per start, when its runs took the quiet start's final path (and thread count) for good
(``fast_path_after_s``) and when its measuring ended (``settled_after_s``). A
fresh start has its own ``$SBON_CACHE`` without a measured choice; its compiled steps are those already saved on this
machine unless ``--fresh-steps``. Last, the warm comparison in the quiet start's cache beside a busy loop, as the app
runs it (a run that starts beside other work decodes on one thread: sbon.probe.run_threads), and with
``--busy-baseline`` also with ``SBON_THREADS`` at the measured count, which keeps every run on it (one timed run:
runs beside a loop can take minutes each there).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import common
from .cpu_classes import CPU_CLASSES, isa_check, limit_problems

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "cpu-2core-epyc" / "machines"
ROWS = [1, 7, 16]  # a page-default run's row counts: the last survivors, Speculative Rejection's, Best-of-N's
# Targets on 2 quiet cores: the page-default comparison, warm, in seconds, per class.
COMPARE_TARGET_S = {"avx512-bf16": 12.0, "avx512": 20.0, "avx2": 25.0}
STEP_TARGET_MS = {True: 12.0, False: 20.0}  # the step at 1 row, with native bf16 or without


def app_path(generator: str, device=None) -> dict[str, str]:
    """The decode path the app takes on this machine for ``generator`` (sbon.machine.auto_path, the one rule), and
    why. ``device``: the app's (default: sbon.models.default_device)."""
    from sbon.machine import auto_path
    from sbon.models import default_device
    path = auto_path(generator, device or default_device())
    reason = path.choice.reason if path.choice else "nothing measured on this machine yet: the safe path"
    return {"weights": path.weights, "decode": path.decode, "reason": reason,
            "provisional": path.choice.provisional if path.choice else ""}


def _events(settings):
    """The comparison's events, as the app makes them for the Run button and `/compare` (ModelCache.comparison)."""
    from components.model_cache import MODELS
    yield from MODELS.comparison(settings)


def compare_warm(runs: int, settings=None) -> dict[str, Any]:
    """The page-default comparison through the app's run path, warm: models loaded, the compiled step loaded where
    the app decodes with it (built here first where it is not saved yet: not timed), one untimed run, then ``runs``
    timed ones."""
    from components.controls import DEFAULTS
    from components.model_cache import MODELS
    from components.torch_thread import TORCH_THREAD
    from components.runs import Runs
    from sbon.analysis.comparison import Comparison
    from sbon.decoders import prepare

    settings = settings or DEFAULTS
    start = time.perf_counter()
    gen, _ = MODELS.load_async(settings.generator, settings.reward).result()
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    if app_path(settings.generator, gen.device)["decode"] == "compiled":
        TORCH_THREAD.submit(prepare, gen).result()  # what the app builds in the background, here before timing
    compile_s = time.perf_counter() - start
    slot = Runs(_events)
    timed = []
    for i in range(1 + runs):
        start = time.perf_counter()
        comp = Comparison.from_json(slot.compare(settings))
        seconds = time.perf_counter() - start
        if not i:  # on a GPU the first run queues the build of its CUDA graphs on the torch thread: not timed
            TORCH_THREAD.submit(lambda: None).result()
            compile_s += time.perf_counter() - start - seconds
        else:
            timed.append({"seconds": seconds, "weights": comp.speculative.weights, "decode": comp.speculative.decode,
                          "threads": comp.speculative.threads, "load": comp.speculative.load,
                          "diverged": sum(comp.diverged(k) for k in range(comp.n)), "n": comp.n})
    return {"settings": settings.config().settings(), "load_s": load_s, "compile_or_load_step_s": compile_s,
            "runs": timed, "seconds": [r["seconds"] for r in timed]}


def run_class(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """This process, already under class ``name``'s limits: everything the file records (each comparison in a child
    process of its own). Every torch call runs on the app's one torch thread (components.torch_thread), as in the
    app: once a second thread has called torch, the thread that decodes runs markedly slower on two cores, and the
    step table would time that instead."""
    from components.torch_thread import TORCH_THREAD

    def on_torch(fn, *a, **kw):
        return TORCH_THREAD.submit(fn, *a, **kw).result()

    cls = CPU_CLASSES[name]
    environment_start = common.environment()
    check = on_torch(isa_check)
    record: dict[str, Any] = {"class": name, "title": cls.title, "limits": cls.env, "isa": check,
                              "limit_problems": limit_problems(cls, check), "environment_start": environment_start}
    print(f"{name}: {cls.title}; {check['capability']}, bf16 {check['matmul_bf16_gflops']:.0f} GFLOP/s, fp32 "
          f"{check['matmul_fp32_gflops']:.0f}; limits {'hold' if not record['limit_problems'] else 'DO NOT HOLD: '}"
          + "; ".join(record["limit_problems"]), file=sys.stderr, flush=True)
    if args.probe:  # the app's own measurement of every path here (sbon.probe), cached as the app finds it
        from sbon.probe import probe
        choice = on_torch(probe, args.generator, "cpu", build=bool(args.compiled), progress=lambda line: print(
            f"{name}: probe: {line}", file=sys.stderr, flush=True))
        record["probe"] = json.loads(choice.to_json())
    record["app_path"] = app_path(args.generator)
    if args.runs:  # in a process of its own, as the app's runs: not in the one that measured every path
        from sbon.cache import cache_dir
        record["compare"] = _start(name, args, cache_dir(), busy=False, mode="compare")
        print(f"{name}: page-default /compare, warm: {_runs(record['compare'])}", file=sys.stderr, flush=True)
        if args.every_path:
            record["compare_every_path"] = every_path(name, args, record)
    record.update(on_torch(step_table, name, args))
    record["environment"] = common.environment()
    return record


def every_path(name: str, args: argparse.Namespace, record: dict[str, Any]) -> dict[str, Any]:
    """The page-default comparison on the compiled step of every other format of ``--compiled`` that the probe
    measured exact here (each in its own process, its path forced, its step built first where it is not saved), so
    that the app's choice stands against each alternative in one file."""
    from sbon.cache import cache_dir
    chosen = (record["app_path"]["weights"], record["app_path"]["decode"])
    exact = {p["weights"] for p in record.get("probe", {}).get("paths", []) if p.get("exact")}
    out = {}
    for fmt in [f for f in args.compiled if f in exact]:
        if (fmt, "compiled") != chosen:
            out[fmt] = _start(name, args, cache_dir(), busy=False, mode="compare",
                              force={"SBON_WEIGHTS": fmt, "SBON_DECODE": "compiled"})
            print(f"{name}: page-default /compare, warm, on {fmt}'s compiled step: {_runs(out[fmt])}",
                  file=sys.stderr, flush=True)
    return out


def _runs(compare: dict[str, Any]) -> str:
    """A comparison's runs in one line: each one's seconds and path, or why there are none."""
    return ", ".join(f"{r['seconds']:.1f} s ({r['weights']}, {r['decode']})" for r in compare.get("runs", [])) \
        or f"failed ({compare.get('failed')})"


def step_table(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The step table of every path and each format's exactness (benchmarks.step), at ``args.threads``."""
    import torch
    from sbon.engine import WEIGHT_FORMATS, SamplingConfig
    from sbon.models import load_generator

    from .step import StepSettings, divergence_rate, run_step

    s = StepSettings(rows=args.rows, formats=args.formats, compiled=args.compiled,
                     threads=args.threads, warm_steps=args.warm_steps, steps=args.steps, repeats=args.repeats,
                     divergence_n=6, divergence_split=2, divergence_tokens=args.divergence_tokens, divergence_prompts=1)
    torch.set_num_threads(s.threads)
    sampling = SamplingConfig()
    gens, failed = {}, {}
    for fmt in s.formats:
        try:
            gens[fmt] = load_generator(args.generator, device="cpu", weights=fmt)
        except Exception as e:  # noqa: BLE001 - a format this class cannot run: one line, the others go on
            failed[fmt] = f"{type(e).__name__}: {e}"
            print(f"{name}: {fmt} does not load here: {failed[fmt]}", file=sys.stderr)
    s.formats = list(gens)
    s.compiled = [f for f in s.compiled if f in gens]
    prompts = [p["instruction"] for p in common.load_prompts(1)]
    prompt_ids = next(iter(gens.values())).encode_prompt(prompts[0])
    step = run_step(gens, prompt_ids, s, sampling, None, quiet=True)
    exact = {fmt: divergence_rate(g, prompts, s, sampling) for fmt, g in gens.items()}
    return {"step_settings": {**asdict(s), "generator": args.generator}, "failed_formats": failed,
            "probes": step["probes"], "table": step["table"], "compile_s": step["compile_s"], "divergence": exact,
            "batch_invariant": {f: WEIGHT_FORMATS[f].batch_invariant for f in gens}}


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The numbers a table shows for one class: the fastest exact path at 1 row, the app's path and its
    comparison's median seconds, each against its target."""
    ms = {(r["format"], r["rows"]): r["ms_per_step"] for r in record["table"]}
    exact = {f for f, d in record["divergence"].items() if d["rate"] == 0}
    paths = sorted({f for f, _ in ms}, key=lambda f: ms.get((f, 1), float("inf")))
    fastest = next((p for p in paths if p.split()[0] in exact), None)
    cls = CPU_CLASSES[record["class"]]
    median = lambda seconds: sorted(seconds)[len(seconds) // 2] if seconds else None  # noqa: E731
    compare = median(record.get("compare", {}).get("seconds"))
    by_path = {f"{fmt} compiled": median(r.get("seconds")) for fmt, r in record.get("compare_every_path", {}).items()
               if r.get("seconds")}
    if by_path and compare is not None:
        by_path[f"{record['app_path']['weights']} {record['app_path']['decode']}"] = compare
    return {"fastest_exact": fastest, "fastest_exact_ms": ms.get((fastest, 1)) if fastest else None,
            "step_target_ms": STEP_TARGET_MS[cls.bf16], "compare_s": compare,
            "compare_target_s": COMPARE_TARGET_S.get(record["class"]), "compare_by_path_s": by_path,
            "chosen_against_fastest": compare / min(by_path.values()) if by_path else None}


def main(args: argparse.Namespace) -> int:
    if args.in_class:
        if args.in_mode == "start":
            record = fresh_start(args)
        elif args.in_mode == "compare":
            from components.torch_thread import TORCH_THREAD, configure_threads
            record = {"torch_threads": TORCH_THREAD.submit(configure_threads).result(), **compare_warm(args.runs)}
        else:
            record = run_class(args.in_class, args)
        print(json.dumps(record))
        return 0
    out = Path(args.out_dir)
    if args.neighbour is not None:
        for name in args.classes:
            started = time.perf_counter()
            record = {**neighbour(name, args), "experiment": "machines --neighbour", "command": common.command_line(args),
                      "environment": common.environment(), "seconds": time.perf_counter() - started}
            path = common.write_json(record, out / f"neighbour-{name}.json")
            print(f"{name}: {record['summary']}; wrote {path}", file=sys.stderr, flush=True)
        return 0
    for name in args.classes:
        cls = CPU_CLASSES[name]
        argv = [sys.executable, "-m", "benchmarks", "machines", "--in-class", name, *args.argv[1:]]
        print(f"{name} ({cls.title}): {' '.join(f'{k}={v}' for k, v in cls.env.items()) or 'no limits'} ...",
              file=sys.stderr, flush=True)
        started = time.perf_counter()
        done = subprocess.run(argv, env=cls.environ(), stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
        if done.returncode:
            print(f"{name}: the child failed (exit status {done.returncode}); the other classes go on", file=sys.stderr)
            continue
        record = json.loads(done.stdout.strip().splitlines()[-1])
        record.update({"experiment": "machines", "command": common.command_line(args),
                       "seconds": time.perf_counter() - started})
        record["summary"] = summary(record)
        path = out / f"{name}.json"
        common.write_json(record, path)
        line = record["summary"]
        print(f"{name}: fastest exact path at 1 row {line['fastest_exact']} {line['fastest_exact_ms'] or 0:.1f} ms "
              f"(target {line['step_target_ms']:g}); page-default /compare warm "
              f"{line['compare_s'] if line['compare_s'] is None else round(line['compare_s'], 1)} s "
              f"(target {line['compare_target_s']:g}); wrote {path}", file=sys.stderr, flush=True)
    return 0


# -- the app's own choice on a shared machine ---------------------------------------------------------------------

BUSY_LOOP = "while True: pass"
SETTLE_TIMEOUT_S = 1800.0  # a start whose measuring child has not ended by then is recorded as not settled


def fresh_start(args: argparse.Namespace) -> dict[str, Any]:
    """This process as a fresh app start (its own $SBON_CACHE, set by the parent): load the default models, which
    starts the app's measuring child; press one page-default run at once; then follow the saved choice until the
    child ends, and press another. Returns the choices as they were saved (seconds from start, with the threads its
    runs take), both runs (seconds, path and threads) and the last choice."""
    from components.controls import DEFAULTS
    from components.model_cache import MODELS
    from components.runs import Runs
    from components.torch_thread import TORCH_THREAD, configure_threads
    from sbon.analysis.comparison import Comparison

    start = time.perf_counter()
    TORCH_THREAD.submit(configure_threads).result()
    MODELS.load_async(DEFAULTS.generator, DEFAULTS.reward).result()
    slot = Runs(_events)
    changes = _ThreadChanges()

    def run() -> dict[str, Any]:
        began = time.perf_counter()
        with changes:
            side = Comparison.from_json(slot.compare(DEFAULTS)).speculative
        return {"at_s": began - start, "s": time.perf_counter() - began, "weights": side.weights,
                "decode": side.decode, "threads": side.threads, "thread_changes": changes.seen}

    first = run()
    record: dict[str, Any] = {"run_at_s": first["at_s"], "run_s": first["s"], "run": first, "choices": []}
    child = MODELS.decode_paths._children.get(DEFAULTS.generator)
    seen = None
    while time.perf_counter() - start < SETTLE_TIMEOUT_S:
        path = MODELS.decode_paths.path(DEFAULTS.generator)
        now = (path.weights, path.decode, path.choice.provisional if path.choice else None, path.threads)
        if path.choice is not None and now != seen:
            seen = now
            record["choices"].append({"s": time.perf_counter() - start, "weights": now[0], "decode": now[1],
                                      "provisional": now[2], "threads": now[3]})
        if child is None or child.poll() is not None:
            break
        time.sleep(1.0)
    record["settled"] = child is not None and child.poll() is not None
    record["choice"] = record["choices"][-1] if record["choices"] else None
    record["run_settled"] = run()  # a run once the measuring ended, beside the loop where the start was
    return record


class _ThreadChanges(logging.Handler):
    """Inside its block: each change of a run's threads between its steps (sbon.probe.ThreadWatch's logged line,
    which carries the count), as (seconds into the block, the count)."""

    def __enter__(self) -> "_ThreadChanges":
        self.seen: list[tuple[float, int]] = []
        self.began = time.perf_counter()
        logger = logging.getLogger("sbon.probe")
        self.level = logger.level
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
        logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("sbon.probe").removeHandler(self)
        logging.getLogger("sbon.probe").setLevel(self.level)

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "threads"):
            self.seen.append((round(time.perf_counter() - self.began, 1), record.threads))


def _start(name: str, args: argparse.Namespace, cache: Path, busy: bool, mode: str,
           force: dict[str, str] | None = None, runs: int | None = None) -> dict[str, Any]:
    """One child under class ``name``'s limits with ``cache`` as its $SBON_CACHE: a fresh start (``mode``
    "start") or the warm comparison ("compare"); beside one busy loop where ``busy``; ``force``: the
    SBON_WEIGHTS/SBON_DECODE/SBON_THREADS that force its path (sbon.machine.auto_path); ``runs``: timed comparisons
    (default: ``args.runs``)."""
    env = {**CPU_CLASSES[name].environ(), "SBON_CACHE": str(cache), **(force or {})}
    argv = [sys.executable, "-m", "benchmarks", "machines", "--in-class", name, "--in-mode", mode,
            "--runs", str(runs or args.runs)]
    loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
    try:
        load0 = os.getloadavg()[0]
        done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    if done.returncode:
        return {"failed": f"exit status {done.returncode}"}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "busy_loop": busy, "load_average_start": load0,
            "load_average_end": os.getloadavg()[0]}


def fresh_cache(fresh_steps: bool) -> Path:
    """A new $SBON_CACHE holding links to this machine's models (and, unless ``fresh_steps``, its saved compiled
    steps and kernels), without a measured choice."""
    from sbon.cache import cache_dir
    cache = Path(tempfile.mkdtemp(prefix="sbon-fresh-"))
    keep = {"machine"} | ({"inductor", "kernels"} if fresh_steps else set())
    for entry in cache_dir().iterdir():
        if entry.name not in keep:
            (cache / entry.name).symlink_to(entry)
    return cache


def neighbour(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The quiet start, ``args.neighbour`` starts beside a busy loop, and the comparison after it stopped."""
    quiet_cache = fresh_cache(args.fresh_steps)
    quiet = _start(name, args, quiet_cache, busy=False, mode="start")
    print(f"{name}: quiet start: {quiet.get('choice')}", file=sys.stderr, flush=True)
    starts, cache = [], quiet_cache
    for i in range(args.neighbour):
        cache = fresh_cache(args.fresh_steps)
        starts.append(_start(name, args, cache, busy=True, mode="start"))
        print(f"{name}: start {i + 1} beside a busy loop: {starts[-1].get('choice')}", file=sys.stderr, flush=True)
    after = _start(name, args, cache, busy=False, mode="compare")
    quiet_compare = _start(name, args, quiet_cache, busy=False, mode="compare")
    beside = _start(name, args, quiet_cache, busy=True, mode="compare")
    print(f"{name}: the comparison beside a busy loop: {beside.get('seconds')} s", file=sys.stderr, flush=True)
    kept = _start(name, args, quiet_cache, busy=True, mode="compare", force={"SBON_THREADS": str(
        quiet_compare["torch_threads"])}, runs=1) if args.busy_baseline and "torch_threads" in quiet_compare else None
    for used in {quiet_cache, cache}:
        shutil.rmtree(used, ignore_errors=True)  # links, a choice and (with --fresh-steps) steps built for the test
    fast = _path(quiet.get("choice"))
    # the lower median: of two runs the faster, so that one run slowed by something else does not decide alone
    median = lambda r: sorted(r["seconds"])[(len(r["seconds"]) - 1) // 2] if r.get("seconds") else None  # noqa: E731
    return {"class": name, "quiet_start": quiet, "starts": starts, "compare_after": after,
            "compare_quiet": quiet_compare, "compare_beside_loop": beside, "compare_beside_loop_kept_threads": kept,
            "summary": {"compare_beside_loop_s": median(beside),
                        "compare_beside_loop_kept_threads_s": median(kept) if kept else None,
                "same_choice_as_quiet": sum(fast is not None and _path(s.get("choice")) == fast for s in starts),
                "starts": len(starts), "compare_after_s": median(after), "compare_quiet_s": median(quiet_compare),
                "quiet_fast_path_s": reached(quiet, fast), "fast_path_after_s": [reached(s, fast) for s in starts],
                "settled_after_s": [s["choices"][-1]["s"] if s.get("choices") else None for s in starts]}}


def _path(choice: dict | None) -> tuple[str, str, int | None] | None:
    """A recorded choice's path and the threads its runs take (None in files written before they were recorded)."""
    return (choice["weights"], choice["decode"], choice.get("threads")) if choice else None


def reached(start: dict, fast: tuple[str, str, int | None] | None) -> float | None:
    """Seconds from a start until its runs took ``fast``, the quiet start's final path, and kept it (None: never)."""
    since = None
    for choice in start.get("choices", []):
        if _path(choice) != fast:
            since = None
        elif since is None:
            since = choice["s"]
    return since


def add_parser(sub) -> None:
    p = sub.add_parser("machines", help="every decode path and the page-default run under each emulated CPU class",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", nargs="+", default=list(CPU_CLASSES), choices=list(CPU_CLASSES),
                   help="CPU classes to emulate, one at a time")
    p.add_argument("--formats", nargs="+", default=["fp32", "bf16", "int4", "int4-fp32", "int4-bf16dot", "int4-amx",
                                                    "int4-fma"],
                   help="weight formats of the step table (sbon.engine.WEIGHT_FORMATS)")
    p.add_argument("--compiled", nargs="*", default=["int4", "int4-fp32", "int4-bf16dot", "int4-amx", "int4-fma"],
                   help="formats also timed with the compiled step (minutes each to compile on two cores)")
    p.add_argument("--rows", nargs="+", type=int, default=ROWS, help="rows per step")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the step table")
    p.add_argument("--warm-steps", type=int, default=2, help="untimed steps before each timing")
    p.add_argument("--steps", type=int, default=8, help="timed steps per timing")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds of the step table")
    p.add_argument("--divergence-tokens", type=int, default=16, help="tokens per candidate of the exactness check")
    p.add_argument("--runs", type=int, default=2, help="timed page-default comparisons per class (0: none)")
    p.add_argument("--every-path", action="store_true",
                   help="also the page-default comparison on the compiled step of every other exact format of "
                        "--compiled (built first where it is not saved: minutes each), against the app's choice")
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="skip the app's probe (sbon.probe): the app's path is then whatever this machine cached before")
    p.add_argument("--generator", default="smollm2-135m")
    p.add_argument("--out-dir", default=str(DEFAULT_OUT), help="one file per class here")
    p.add_argument("--neighbour", type=int, default=None,
                   help="instead: a quiet fresh start, then this many fresh starts (0: none) each beside one busy loop "
                        "with one page-default run during the app's measuring, and the comparisons after "
                        "(neighbour-<class>.json)")
    p.add_argument("--busy-baseline", action="store_true",
                   help="with --neighbour: also the comparison beside the busy loop on the measured thread count "
                        "(SBON_THREADS), as the app ran before it took one thread there (minutes per run)")
    p.add_argument("--fresh-steps", action="store_true",
                   help="with --neighbour: each start also builds its compiled steps anew (minutes each)")
    p.add_argument("--in-class", default=None, help=argparse.SUPPRESS)  # the child's own run
    p.add_argument("--in-mode", default="class", help=argparse.SUPPRESS)
    p.set_defaults(main=main)
