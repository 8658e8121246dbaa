"""A class behind one link: N simulated visitors on one app while the lecturer's generation runs.

Starts `python app.py` on 127.0.0.1 (nothing else is contacted), runs one generation alone through `/compare`
(the baseline), then for each N and each way of reading (``--modes``): the same generation again while N visitors
open the page, gallery runs and shared links one after the other, pausing a few seconds between opens, and stop
by themselves when the generation ends (or at ``--max-seconds``).

The visitors do what a browser does, on plain HTTP (httpx, one keep-alive connection and one thread each):

- ``app``: the interactive page. A page open is the page's HTML, every file a real Chromium fetched for it (recorded
  once at the start: scripts, styles, fonts, the theme), the page's load events (each a queue join, answered on the
  event stream) and the change events their values fire; while the visitor reads, the model line's timer event every
  few seconds. A gallery open is the gallery's change event and the change events after it; a shared-link open is
  the page opened again on `?run=<id>` (a new tab: its files come from the browser's cache, so only the HTML).
- ``static``: the pages a visitor only reads (components/static_pages.py). A page open is the recorded run's page
  and Plotly's file (fetched once per visitor, then cached as a browser caches it); a gallery open is a story's
  page, a link open a shared run's page. No event, no queue.

Reported per N and mode: p50/p95 of each kind of open (request to the last byte or the last event's result), errors,
the generation's time against the baseline, the server's CPU seconds and peak memory, and the simulated visitors'
own CPU seconds (this process, which shares the cores with the app): on 2 cores the clients take CPU from the app
and the generation, so every number is an upper bound of what remote visitors would cost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from sbon.errors import SBoNError

from . import common
from .browser import serve_app

PROMPT = "What is Atlantis?"
MODES = ("static", "app")  # the static pages first: what a class is given
ACCEPT = {"Accept-Encoding": "gzip, deflate, br", "User-Agent": "sbon-load (a simulated browser)"}


def generation(args: argparse.Namespace) -> dict[str, Any]:
    """The one generation the visitors run beside: the page's defaults but N and the answer length."""
    return dict(prompt=PROMPT, n=args.n, max_new_tokens=args.max_new_tokens, seed=0)


def rss_mb(pid: int, children: bool = False) -> float:
    """The server's resident memory; with ``children``, its child processes' too (the decode step's background
    compile, which comes and goes and says nothing about the visitors)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in (proc, *(proc.children(recursive=True) if children else ()))) / 2**20
    except psutil.Error:
        return float("nan")


def cpu_s(pid: int, children: bool = True) -> float:
    """User and system CPU seconds of a process (and its children: the app's compile worker) so far."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return sum(sum(p.cpu_times()[:2]) for p in (proc, *(proc.children(recursive=True) if children else ())))
    except psutil.Error:
        return float("nan")


def clients_cpu_s() -> float:
    """This process's CPU seconds: the simulated visitors' (its child, the app, is not counted)."""
    return cpu_s(os.getpid(), children=False)


def percentile(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


# -- what a browser does, recorded once -------------------------------------------------------------

def record_browser(url: str) -> dict[str, Any]:
    """Open the page once in Chromium and keep what it asked for: the files (GETs outside the API), the queue joins
    of its open (load events first, then the change events they fire) and the timer's join."""
    from .browser import chromium

    joins, files = [], []
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()

        def seen(r):
            path = urlsplit(r.url).path
            if r.method == "POST" and path.endswith("/gradio_api/queue/join"):
                joins.append(json.loads(r.post_data or "{}"))
            elif r.method == "GET" and "/gradio_api/" not in path and r.url != url:
                files.append(r.url[len(url) - 1:])

        page.on("request", seen)
        page.goto(url)
        page.wait_for_selector("#scatter .scatterlayer .point", timeout=300_000)
        page.wait_for_timeout(12_000)  # the timer ticks a few times
        page.context.close()
    counts: dict[int, int] = {}
    for j in joins:
        counts[j["fn_index"]] = counts.get(j["fn_index"], 0) + 1
    timer = [j for j in joins if counts[j["fn_index"]] > 1]
    opening = [j for j in joins if counts[j["fn_index"]] == 1]
    if not timer or not opening:
        raise SBoNError(f"the page's open did not look as expected (joins: {joins})")
    strip = ("session_hash",)
    return {"files": list(dict.fromkeys(files)),
            "load": [{k: v for k, v in j.items() if k not in strip} for j in opening if j.get("trigger_id") == 0],
            "follow": [{k: v for k, v in j.items() if k not in strip} for j in opening if j.get("trigger_id") != 0],
            "timer": {k: v for k, v in timer[0].items() if k not in strip}}


def fn_index(url: str, api_name: str) -> int:
    import httpx

    config = httpx.get(url + "config", timeout=60).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)


class Browser:
    """One visitor's browser: a keep-alive connection, its cache of files, its Gradio session."""

    def __init__(self, url: str, timeout_s: float):
        import httpx

        self.url, self.http = url, httpx.Client(base_url=url.rstrip("/"), headers=ACCEPT, timeout=timeout_s)
        self.cached: set[str] = set()
        self.session = secrets.token_hex(6)

    def get(self, path: str, cache: bool = True) -> int:
        """GET a file as a browser does: once per visitor for what it may cache. Returns the bytes received."""
        if cache and path in self.cached:
            return 0
        with self.http.stream("GET", path) as r:
            if r.status_code != 200:
                raise SBoNError(f"GET {path}: HTTP {r.status_code}")
            # Received as sent (compressed): decompressing is the browser's work on the visitor's own machine, and
            # here it would take the shared cores from the server.
            size = sum(len(chunk) for chunk in r.iter_raw())
        if cache:
            self.cached.add(path)
        return size

    def events(self, joins: list[dict], query: str = "") -> None:
        """Post the queue joins (as the page posts them, with its query string) and read the session's event
        stream until each one's result came."""
        pending = set()
        for j in joins:
            r = self.http.post(f"/gradio_api/queue/join?{query}", json={**j, "session_hash": self.session})
            if r.status_code != 200:
                raise SBoNError(f"queue join {j['fn_index']}: HTTP {r.status_code} {r.text[:200]}")
            pending.add(r.json()["event_id"])
        with self.http.stream("GET", f"/gradio_api/queue/data?session_hash={self.session}") as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed" and msg.get("event_id") in pending:
                    if not msg.get("success", True):
                        raise SBoNError(f"event failed: {str(msg.get('output'))[:200]}")
                    pending.discard(msg["event_id"])
                    if not pending:
                        return
                elif msg.get("msg") in ("close_stream", "unexpected_error"):
                    break
        if pending:
            raise SBoNError(f"the event stream ended with {len(pending)} events unanswered")

    def close(self) -> None:
        self.http.close()


class Visitors:
    """N visitors, each a thread with its own simulated browser: open the page, then gallery runs and shared links
    in turn, pausing ``think`` seconds between opens (the interactive page's timer ticking meanwhile), until told to
    stop or out of opens."""

    def __init__(self, url: str, mode: str, n: int, keys: list[str], run_ids: list[str], args: argparse.Namespace,
                 recorded: dict[str, Any], gallery_fn: int, timer_s: float):
        self.url, self.mode, self.n, self.keys, self.run_ids, self.args = url, mode, n, keys, run_ids, args
        self.recorded, self.gallery_fn, self.timer_s = recorded, gallery_fn, timer_s
        self.think = (args.think_min, args.think_max)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.times: dict[str, list[float]] = {"page": [], "gallery": [], "link": []}
        self.browsers: list[Browser] = []
        self.abandoned = False  # set when the level ended with opens still going (counted once, in join)
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.visit, args=(i,), daemon=True) for i in range(n)]

    # what each kind of open is, per mode
    def read_static(self, b: Browser, path: str) -> None:
        """A static page as a browser reads it: the page, then Plotly (from the browser's cache after the first)."""
        b.get(path, cache=False)
        b.get(f"/pages/{self.plotly}")

    def open_page(self, b: Browser) -> None:
        if self.mode == "static":
            return self.read_static(b, "/pages/gallery/default")
        b.get("/", cache=False)
        for path in self.recorded["files"]:
            b.get(path)
        b.events(self.recorded["load"])
        b.events(self.recorded["follow"])

    def open_gallery(self, b: Browser, key: str) -> None:
        if self.mode == "static":
            return self.read_static(b, f"/pages/gallery/{key}")
        b.events([{"data": [key, "curves", None], "event_data": None, "fn_index": self.gallery_fn, "trigger_id": None}])
        b.events(self.recorded["follow"])

    def open_link(self, b: Browser, run_id: str) -> None:
        if self.mode == "static":
            return self.read_static(b, f"/pages/run/{run_id}")
        b.get(f"/?run={run_id}", cache=False)  # a new tab on the link: the page's files are in the cache
        b.events(self.recorded["load"], query=f"run={run_id}")
        b.events(self.recorded["follow"])

    @property
    def plotly(self) -> str:
        from components.static_pages import PLOTLY_NAME
        return PLOTLY_NAME

    def visit(self, i: int) -> None:
        rng = random.Random(i)
        self.stop.wait(rng.uniform(0, self.think[1]))  # visitors arrive spread over the first seconds
        b = Browser(self.url, self.args.max_seconds)
        with self.lock:
            self.browsers.append(b)
        try:
            try:
                self.timed("page", lambda: self.open_page(b))
            except Exception as e:  # noqa: BLE001 - a refused visitor is a result, not a crash
                self.error("page", e)
                return
            ticking = self.mode == "app"
            next_tick = time.perf_counter() + self.timer_s
            for _ in range(self.args.opens):
                for kind in ("gallery", "link"):
                    if self.stop.is_set():
                        return
                    try:
                        if kind == "gallery":
                            self.timed(kind, lambda: self.open_gallery(b, rng.choice(self.keys)))
                        else:
                            self.timed(kind, lambda: self.open_link(b, rng.choice(self.run_ids)))
                    except Exception as e:  # noqa: BLE001
                        self.error(kind, e)
                    reading_until = time.perf_counter() + rng.uniform(*self.think)
                    while not self.stop.is_set() and time.perf_counter() < reading_until:
                        if ticking and time.perf_counter() >= next_tick:  # the model line's timer
                            next_tick += self.timer_s
                            try:
                                b.events([self.recorded["timer"]])
                            except Exception as e:  # noqa: BLE001
                                self.error("timer", e)
                        # Until the next tick only where the page ticks: a static page has no timer, and a
                        # tick left in the past would make this wait return at once, in a loop.
                        self.stop.wait(max(0.0, min(reading_until, next_tick if ticking else reading_until)
                                           - time.perf_counter()))
        finally:
            b.close()

    def timed(self, kind: str, call) -> None:
        start = time.perf_counter()
        call()
        with self.lock:
            self.times[kind].append(time.perf_counter() - start)

    def error(self, kind: str, e: Exception) -> None:
        with self.lock:
            if self.abandoned:
                return
            self.errors.append(f"{kind}: {type(e).__name__}: {str(e)[:200]}")

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> int:
        """Wait for every visitor; those still in an open after ``timeout`` are errors (their open never ended in
        the level), and their connections are closed so they do not spill into the next level. Returns how many."""
        deadline = time.time() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.time()))
        left = sum(t.is_alive() for t in self.threads)
        if left:
            with self.lock:
                self.abandoned = True
                self.errors += [f"an open still going when the level ended ({left} visitors)"] + [""] * (left - 1)
                browsers = list(self.browsers)
            for b in browsers:
                b.close()
            for t in self.threads:
                t.join(10)
        return left


def generate(url: str, settings: dict[str, Any]) -> float:
    from gradio_client import Client

    # A long read timeout: on shared cores a run's event stream may stay quiet for minutes, which is slow, not failed.
    client = Client(url, verbose=False, download_files=False, httpx_kwargs={"timeout": 900})
    start = time.perf_counter()
    client.predict(**settings, api_name="/compare")
    return time.perf_counter() - start


def shared_ids(count: int) -> list[str]:
    """Shared runs for the visitors' links: the gallery's runs, kept in the app's store as a Share click keeps them
    (with their static pages)."""
    from components.gallery import GALLERY
    from components.replays import PAGES, SHARES

    files = [e.file for e in GALLERY.values() if e.file.is_file()]
    if not files:
        raise SBoNError("no gallery run is recorded: run `python -m components.record --gallery` first")
    ids = [SHARES.put(files[i % len(files)].read_text()) for i in range(count)]
    for run_id in ids:
        PAGES.write_shared(run_id)
    return ids


def one_level(url: str, mode: str, n: int, keys: list[str], run_ids: list[str], args: argparse.Namespace,
              baseline_s: float, recorded: dict[str, Any], gallery_fn: int, timer_s: float) -> dict[str, Any]:
    pid = url.pid
    visitors = Visitors(url, mode, n, keys, run_ids, args, recorded, gallery_fn, timer_s)
    peak, peak_all = [rss_mb(pid)], [rss_mb(pid, children=True)]
    done = threading.Event()

    def sample():
        while not done.wait(0.5):
            peak.append(rss_mb(pid))
            peak_all.append(rss_mb(pid, children=True))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load_before = list(os.getloadavg())
    server_cpu, client_cpu = cpu_s(pid), clients_cpu_s()
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
    wall = time.perf_counter() - started
    row = {"mode": mode, "visitors": n, "generation_s": gen_s, "baseline_s": baseline_s,
           "slowdown": gen_s / baseline_s - 1 if gen_s and baseline_s else None, "generation_error": gen_error,
           "errors": len(visitors.errors), "error_samples": [e for e in visitors.errors if e][:5], "visitors_not_stopped": left,
           "seconds": wall, "server_cpu_s": cpu_s(pid) - server_cpu, "clients_cpu_s": clients_cpu_s() - client_cpu,
           "server_peak_rss_mb": max(peak), "server_rss_end_mb": rss_mb(pid),
           "server_and_children_peak_rss_mb": max(peak_all),
           "load_average_before": load_before, "load_average_after": list(os.getloadavg())}
    for kind, xs in visitors.times.items():
        row[kind] = {"count": len(xs), "p50_s": percentile(xs, 50), "p95_s": percentile(xs, 95),
                     "max_s": max(xs) if xs else None}
    return row


def main(args: argparse.Namespace) -> int:
    json_path, _ = common.result_paths(args, "load")
    log = json_path.with_name(json_path.stem + "_server.log")
    from components.gallery import GALLERY
    from components.runs import MODEL_STATUS_IDLE_S

    keys = [k for k, e in GALLERY.items() if e.file.is_file()]
    run_ids = shared_ids(args.links)
    rows, t0 = [], time.perf_counter()
    env_start = common.environment()
    with serve_app(log, start_timeout_s=600) as url:  # importing gradio on busy shared cores can take minutes
        generate(url, generation(args))  # the first loads the models
        cpu_before = cpu_s(url.pid)
        baseline = [generate(url, generation(args)) for _ in range(args.baseline_runs)] or [float("nan")]
        baseline_cpu_s = (cpu_s(url.pid) - cpu_before) / max(1, args.baseline_runs)  # the server's CPU for one alone
        baseline_s = float(np.median(baseline))
        print(f"generation alone: {baseline_s:.1f} s (median of {len(baseline)}; load {os.getloadavg()[0]:.1f})",
              flush=True)
        recorded = record_browser(url) if "app" in args.modes else {}
        gallery_fn = fn_index(url, "gallery_open")
        if recorded:
            print(f"a browser's page open: {len(recorded['files'])} files, {len(recorded['load'])} load events, "
                  f"{len(recorded['follow'])} change events; the timer every {MODEL_STATUS_IDLE_S:g} s", flush=True)
        # One way of reading over every crowd size before the next: the server never gives memory back, so a
        # level's peak memory includes the levels before it, and only those of its own way of reading.
        for mode in args.modes:
            for n in args.visitors:
                row = one_level(url, mode, n, keys, run_ids, args, baseline_s, recorded, gallery_fn, MODEL_STATUS_IDLE_S)
                rows.append(row)
                p, g, lk = row["page"], row["gallery"], row["link"]
                print(f"N={n} {mode}: page p95 {fmt(p['p95_s'])} s, gallery p50/p95 {fmt(g['p50_s'])}/{fmt(g['p95_s'])} s "
                      f"({g['count']}), link p50/p95 {fmt(lk['p50_s'])}/{fmt(lk['p95_s'])} s ({lk['count']}), "
                      f"errors {row['errors']}, generation {fmt(row['generation_s'])} s "
                      f"(+{fmt(100 * row['slowdown'] if row['slowdown'] is not None else None, 0)} %), "
                      f"server {row['server_cpu_s']:.0f} CPU s, clients {row['clients_cpu_s']:.0f} CPU s, "
                      f"server peak {row['server_peak_rss_mb']:.0f} MiB, load {row['load_average_before'][0]:.1f}",
                      flush=True)
    env = common.environment()
    env.pop("torch_threads")  # this process's; the app's are its own
    common.write_json({"experiment": "load", "command": common.command_line(args),
                       "settings": {"visitors": args.visitors, "modes": args.modes, "opens": args.opens,
                                    "links": args.links, "think_s": [args.think_min, args.think_max],
                                    "max_seconds": args.max_seconds, "generation": generation(args),
                                    "baseline_runs": args.baseline_runs, "gallery_runs": keys,
                                    "timer_s": MODEL_STATUS_IDLE_S, "SBON_THREADS": os.environ.get("SBON_THREADS"),
                                    "clients": "this process: one thread and one httpx connection per visitor"},
                       "browser_open": recorded, "environment_at_start": env_start, "environment": env,
                       "baseline_s": baseline, "baseline_server_cpu_s": baseline_cpu_s, "seconds": time.perf_counter() - t0, "rows": rows}, json_path)
    df = pd.DataFrame([{"mode": r["mode"], "visitors": r["visitors"], "page p95": r["page"]["p95_s"],
                        "gallery p95": r["gallery"]["p95_s"], "link p95": r["link"]["p95_s"], "errors": r["errors"],
                        "slowdown %": None if r["slowdown"] is None else 100 * r["slowdown"],
                        "server CPU s": r["server_cpu_s"], "clients CPU s": r["clients_cpu_s"],
                        "peak MiB": r["server_peak_rss_mb"]} for r in rows])
    common.print_table("visitors opening the page, gallery runs and shared links during one generation", df, "{:.2f}")
    print(f"\nwrote {json_path}")
    return 0


def fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def add_parser(sub) -> None:
    p = sub.add_parser("load", help="N simulated browsers opening the page, gallery runs and shared links during a generation",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--visitors", type=int, nargs="+", default=[10, 50, 100, 200], help="the numbers of visitors, one level each")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="how the visitors read: the interactive page (app) or the static pages (static); one row each")
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
