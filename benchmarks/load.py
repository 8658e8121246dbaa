"""A class behind one link: N simulated visitors on one app while one generation runs.

Starts `python app.py` on 127.0.0.1 (nothing else is contacted), runs one generation alone through
`/compare` (the baseline), then for each N: the same generation again while N visitors
(`gradio_client`, one thread each) open the page (its recorded run), open gallery runs and shared links one after the
other with a short pause between them, and stop by themselves when the generation ends (or at
``--max-seconds``). Each visitor makes at most ``--opens`` opens of each kind. Reported per N: p50/p95
of a gallery open and of a shared-link open (seconds from the request to every view received),
errors, the generation's time against the baseline, and the server's peak memory.

The visitors run on the same machine as the app, so on 2 cores they take CPU from it too: the
numbers are an upper bound of what remote visitors would cost.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sbon.errors import SBoNError

from . import common
from .browser import serve_app

PROMPT = "What is Atlantis?"


def generation(args: argparse.Namespace) -> dict[str, Any]:
    """The one generation the visitors run beside: the page's defaults but N and the answer length."""
    return dict(prompt=PROMPT, n=args.n, max_new_tokens=args.max_new_tokens, seed=0)


def rss_mb(pid: int) -> float:
    import psutil

    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in (proc, *proc.children(recursive=True))) / 2**20
    except psutil.Error:
        return float("nan")


def percentile(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


class Visitors:
    """N visitors, each a thread with its own client: open the page, then gallery runs and shared links in
    turn, pausing ``think`` seconds between opens, until told to stop or out of opens."""

    def __init__(self, url: str, n: int, keys: list[str], run_ids: list[str], opens: int, think: tuple[float, float]):
        self.url, self.n, self.keys, self.run_ids, self.opens, self.think = url, n, keys, run_ids, opens, think
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.times: dict[str, list[float]] = {"page": [], "gallery": [], "link": []}
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.visit, args=(i,), daemon=True) for i in range(n)]

    def visit(self, i: int) -> None:
        from gradio_client import Client

        rng = random.Random(i)
        self.stop.wait(rng.uniform(0, self.think[1]))  # visitors arrive spread over the first seconds
        try:
            client = Client(self.url, verbose=False, download_files=False)
            self.timed("page", lambda: client.predict("curves", None, api_name="/page_open"))  # what a page load shows
        except Exception as e:  # noqa: BLE001 - a refused visitor is a result, not a crash
            self.error("page", e)
            return
        for _ in range(self.opens):
            for kind in ("gallery", "link"):
                if self.stop.is_set():
                    return
                try:
                    if kind == "gallery":
                        self.timed(kind, lambda: client.predict(rng.choice(self.keys), "curves", api_name="/gallery_open"))
                    else:
                        self.timed(kind, lambda: client.predict(f"run={rng.choice(self.run_ids)}", "curves",
                                                                api_name="/link_open"))
                except Exception as e:  # noqa: BLE001
                    self.error(kind, e)
                self.stop.wait(rng.uniform(*self.think))

    def timed(self, kind: str, call):
        start = time.perf_counter()
        out = call()
        with self.lock:
            self.times[kind].append(time.perf_counter() - start)
        return out

    def error(self, kind: str, e: Exception) -> None:
        with self.lock:
            self.errors.append(f"{kind}: {type(e).__name__}: {str(e)[:200]}")

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> int:
        """Wait for every visitor; the number still going after ``timeout``."""
        deadline = time.time() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.time()))
        return sum(t.is_alive() for t in self.threads)


def generate(url: str, settings: dict[str, Any]) -> float:
    from gradio_client import Client

    client = Client(url, verbose=False, download_files=False)
    start = time.perf_counter()
    client.predict(**settings, api_name="/compare")
    return time.perf_counter() - start


def shared_ids(count: int) -> list[str]:
    """Shared runs for the visitors' links: the gallery's runs, kept in the app's store as a Share click keeps them."""
    from components.gallery import GALLERY
    from components.share import ShareStore

    store = ShareStore()
    files = [e.file for e in GALLERY.values() if e.file.is_file()]
    if not files:
        raise SBoNError("no gallery run is recorded: run `python -m components.record --gallery` first")
    return [store.put(files[i % len(files)].read_text()) for i in range(count)]


def one_level(url: str, pid: int, n: int, keys: list[str], run_ids: list[str], args: argparse.Namespace,
              baseline_s: float) -> dict[str, Any]:
    visitors = Visitors(url, n, keys, run_ids, args.opens, (args.think_min, args.think_max))
    peak = [rss_mb(pid)]
    done = threading.Event()

    def sample():
        while not done.wait(0.5):
            peak.append(rss_mb(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load_before = list(os.getloadavg())
    started = time.perf_counter()
    visitors.start()
    limit = threading.Timer(args.max_seconds, visitors.stop.set)  # bounded in time, whatever the generation does
    limit.daemon = True
    limit.start()
    gen_error = None
    try:
        gen_s = generate(url, generation(args))
    except Exception as e:  # noqa: BLE001
        gen_s, gen_error = None, f"{type(e).__name__}: {str(e)[:200]}"
    visitors.stop.set()
    left = visitors.join(args.max_seconds - (time.perf_counter() - started) + 30)
    limit.cancel()
    done.set()
    sampler.join()
    row = {"visitors": n, "generation_s": gen_s, "baseline_s": baseline_s,
           "slowdown": gen_s / baseline_s - 1 if gen_s and baseline_s else None, "generation_error": gen_error,
           "errors": len(visitors.errors), "error_samples": visitors.errors[:5], "visitors_not_stopped": left,
           "server_peak_rss_mb": max(peak), "load_average_before": load_before, "load_average_after": list(os.getloadavg())}
    for kind, xs in visitors.times.items():
        row[kind] = {"count": len(xs), "p50_s": percentile(xs, 50), "p95_s": percentile(xs, 95),
                     "max_s": max(xs) if xs else None}
    return row


def main(args: argparse.Namespace) -> int:
    json_path, _ = common.result_paths(args, "load")
    log = json_path.with_name(json_path.stem + "_server.log")
    from components.gallery import GALLERY

    keys = [k for k, e in GALLERY.items() if e.file.is_file()]
    run_ids = shared_ids(args.links)
    rows, t0 = [], time.perf_counter()
    env_start = common.environment()
    with serve_app(log, start_timeout_s=600) as url:  # importing gradio on busy shared cores can take minutes
        baseline = [generate(url, generation(args)) for _ in range(1 + args.baseline_runs)][1:] or [float("nan")]  # the first loads models
        baseline_s = float(np.median(baseline))
        print(f"generation alone: {baseline_s:.1f} s (median of {len(baseline)}; load {os.getloadavg()[0]:.1f})",
              flush=True)
        for n in args.visitors:
            row = one_level(url, url.pid, n, keys, run_ids, args, baseline_s)
            rows.append(row)
            g, lk = row["gallery"], row["link"]
            print(f"N={n}: gallery open p50/p95 {fmt(g['p50_s'])}/{fmt(g['p95_s'])} s ({g['count']}), "
                  f"shared link p50/p95 {fmt(lk['p50_s'])}/{fmt(lk['p95_s'])} s ({lk['count']}), "
                  f"errors {row['errors']}, generation {fmt(row['generation_s'])} s "
                  f"(+{fmt(100 * row['slowdown'] if row['slowdown'] is not None else None, 0)} %), "
                  f"server peak {row['server_peak_rss_mb']:.0f} MiB", flush=True)
    env = common.environment()
    env.pop("torch_threads")  # this process's; the app's are its own
    common.write_json({"experiment": "load", "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
                       "settings": {"visitors": args.visitors, "opens": args.opens, "links": args.links,
                                    "think_s": [args.think_min, args.think_max], "max_seconds": args.max_seconds,
                                    "generation": generation(args), "baseline_runs": args.baseline_runs,
                                    "gallery_runs": keys, "SBON_THREADS": os.environ.get("SBON_THREADS")},
                       "environment_at_start": env_start, "environment": env, "baseline_s": baseline,
                       "seconds": time.perf_counter() - t0, "rows": rows}, json_path)
    df = pd.DataFrame([{"visitors": r["visitors"], "gallery p50": r["gallery"]["p50_s"], "gallery p95": r["gallery"]["p95_s"],
                        "link p50": r["link"]["p50_s"], "link p95": r["link"]["p95_s"], "errors": r["errors"],
                        "slowdown %": None if r["slowdown"] is None else 100 * r["slowdown"],
                        "peak MiB": r["server_peak_rss_mb"]} for r in rows])
    common.print_table("visitors opening gallery runs and shared links during one generation", df, "{:.2f}")
    print(f"\nwrote {json_path}")
    return 0


def fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def add_parser(sub) -> None:
    p = sub.add_parser("load", help="N simulated visitors opening gallery runs and shared links during a generation",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--visitors", type=int, nargs="+", default=[10, 50, 100], help="the numbers of visitors, one level each")
    p.add_argument("--opens", type=int, default=3, help="at most this many gallery opens and link opens per visitor")
    p.add_argument("--think-min", type=float, default=1.0, help="a visitor's shortest pause between opens (s)")
    p.add_argument("--think-max", type=float, default=4.0, help="a visitor's longest pause between opens (s)")
    p.add_argument("--max-seconds", type=float, default=120, help="a level's time limit: visitors stop by then")
    p.add_argument("--links", type=int, default=2,
                   help="shared runs the visitors' links name (a lecture hands out a few; each one's views are computed "
                        "on its first open, then kept)")
    p.add_argument("--n", type=int, default=16, help="N of the generation that runs meanwhile")
    p.add_argument("--max-new-tokens", type=int, default=64, help="its answer length")
    p.add_argument("--baseline-runs", type=int, default=1, help="generations alone (after one that loads the models)")
    p.add_argument("--out-dir", default=str(common.DEFAULT_OUT_DIR / "load"), help="where result files go")
    p.add_argument("--tag", default=None, help="suffix for the result file names")
    p.set_defaults(main=main)
