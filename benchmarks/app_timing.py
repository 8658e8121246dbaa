"""How long the explorer app takes, measured in a real browser: the numbers a lecturer waits through.

Starts `python app.py` in a fresh process, opens it in headless Chromium and presses Run with the
app's default settings (or those given: prompt, N, alpha, max new tokens, Best-of-N under the same
memory). The first click includes loading the models; the later ones find them loaded. For each
click it measures, in the browser, when the first decision point is drawn, when Speculative
Rejection's answer appears under the race, when the final frame (both runs done, every view drawn)
appears, and when the views drawn from the counterfactual prefix rewards (Trade-off, Pruning
signals) are filled in after it; and the longest time the live view (the round caption and the live
chart, what the audience watches) stood still between the click and the final frame, and the live
chart alone. ``--screenshots DIR`` then saves a picture of each view of the last
run: the README's screenshots are made this way. Needs `pip install -r requirements-dev.txt` and
Debian's chromium.

Every run also measures app start → page ready (the recorded run drawn) and app start → models ready (from the
app's log), and clicks Run as soon as the page is ready. `SBON_CACHE=$(mktemp -d)` before the command times a fresh
machine's first minute: the app, which inherits it, converts the packaged generator once while it serves.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

import torch

from sbon.engine import WEIGHT_FORMATS
from sbon.errors import SBoNError
from sbon.models import DEFAULT_GENERATOR, default_weights

from . import common
from .browser import UNPINNED_RUN_BAR, chromium, serve_app, wait_until

TIMEOUT_MS = 900_000
STILL_TARGET_S = 1.5  # the live view should never stand still longer than this during a run: a lecture watching it
# must see it move


STATUS = "document.querySelector('#status').innerText"
CAPTION = "document.querySelector('#round-caption').innerText"  # the live chart's title in the presenter view
ENDED = f"({STATUS}.includes('Done in') || {STATUS}.includes('⚠'))"  # finished, or refused with a warning


# Every change the browser makes to the live view, timed: a MutationObserver on the caption and the chart.
WATCH_JS = """() => { window.__sbonMoves = []; window.__sbonClick = performance.now();
  window.__sbonObservers = [['#live-plot', 'chart'], ['#round-caption', 'caption']].map(([sel, what]) => {
    const o = new MutationObserver(() => window.__sbonMoves.push([performance.now(), what]));
    o.observe(document.querySelector(sel), {subtree: true, childList: true, characterData: true, attributes: true});
    return o; }); }"""
MOVES_JS = """() => { window.__sbonObservers.forEach((o) => o.disconnect());
  return {click: window.__sbonClick, end: performance.now(), moves: window.__sbonMoves}; }"""


def longest_still(watched: dict[str, Any], what: tuple[str, ...] = ("chart", "caption")) -> tuple[float, float]:
    """(the longest time in seconds between two changes of ``what``, from the click to the end of the
    watch; when that still stretch began, seconds after the click)."""
    times = [watched["click"], *(t for t, w in watched["moves"] if w in what), watched["end"]]
    gap, start = max((b - a, a) for a, b in zip(times, times[1:]))
    return gap / 1000, (start - watched["click"]) / 1000


# What the page shows, for the message of a wait that timed out.
PAGE_STATE_JS = f"""() => ({{status: {STATUS}, caption: {CAPTION},
  live: (document.querySelector('#live-plot')?.innerText || '').slice(0, 200),
  visibility: document.visibilityState, focused: document.hasFocus()}})"""


def wait_for_page(page, condition: str, what: str, timeout_ms: float, arg: Any = None) -> None:
    """``wait_until(page, condition)``; where it times out, SBoNError saying what was awaited and what the page
    showed then."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        wait_until(page, condition, arg=arg, timeout=timeout_ms)
    except PlaywrightTimeout:
        raise SBoNError(f"waited {timeout_ms / 1000:.0f} s for {what}; the page showed "
                        f"{page.evaluate(PAGE_STATE_JS)}") from None


def click_run(page, timeout_ms: float = TIMEOUT_MS) -> dict[str, Any]:
    """Press Run; seconds from the click to the first decision point drawn and to the final frame,
    and the longest time the live view stood still in between (:func:`longest_still`). A run the app
    refuses or fails raises SBoNError with the app's message; one that shows no progress for ``timeout_ms``, with
    what the page showed."""
    before = page.locator("#status").inner_text()
    page.evaluate(WATCH_JS)
    clicked = time.perf_counter()
    page.locator("#run").click()
    # A run starts by blanking the live plot ("Waiting ..."), so the last run's frame and status are not
    # mistaken for this one's; settings the app refuses change the status to a warning instead.
    wait_for_page(page, f"(before) => document.querySelector('#live-plot').innerText.includes('Waiting') "
                        f"|| {CAPTION}.startsWith('Starting') || {CAPTION}.startsWith('Loading the models') "
                        f"|| ({STATUS}.includes('⚠') && {STATUS} != before)", "the run's start", timeout_ms, before)
    wait_for_page(page, f"document.querySelector('#live-plot').innerText.includes('Round 1') "
                        f"|| {CAPTION}.startsWith('Round 1') || {ENDED}", "the first round", timeout_ms)
    first = time.perf_counter() - clicked
    wait_for_page(page, f"document.querySelector('#headline').innerText.includes('Speculative Rejection answered') "
                        f"|| {ENDED}", "Speculative Rejection's answer", timeout_ms)
    answered = time.perf_counter() - clicked
    wait_for_page(page, ENDED, "the run's end", timeout_ms)
    final = time.perf_counter() - clicked
    watched = page.evaluate(MOVES_JS)
    still, still_at = longest_still(watched)
    chart_still, _ = longest_still(watched, ("chart",))
    status = page.locator("#status").inner_text()
    if "Done in" not in status:
        raise SBoNError(f"the run did not finish: {status}")
    headline = page.locator("#headline").inner_text()
    wait_for_page(page, f"{STATUS}.includes('every view ready') || {STATUS}.includes('⚠')", "every view",
                  timeout_ms)
    views = time.perf_counter() - clicked
    server = re.search(r"Done in ([\d.]+) s", status)
    return {"first_round_s": first if "first decision point" in status else None, "sbon_answer_s": answered,
            "final_frame_s": final, "views_ready_s": views, "server_done_s": float(server.group(1)) if server else None,
            "longest_still_s": still, "longest_still_from_s": still_at, "chart_longest_still_s": chart_still,
            "decode": decoded_with(status),
            "status": page.locator("#status").inner_text(), "headline": headline}


def decoded_with(status: str) -> str | None:
    """The decode step a finished run's status line names ("decoded ...", components.runs.decoded, in
    sbon.machine.step_words's words); None if none."""
    from sbon.machine import step_words
    said = re.search(r"decoded ([^;]*)", status)
    return next((decode for decode in ("compiled", "eager") for device in ("cpu", "cuda")
                 if said and step_words(decode, device) in said.group(1)), None)


def set_controls(page, args: argparse.Namespace) -> None:
    """Type the settings given on the command line into the page's controls; the rest keep the app's defaults."""
    for selector, value in (("#prompt textarea", args.prompt), ("#n input", args.n), ("#alpha input[type=number]", args.alpha),
                            ("#max-new-tokens input", args.max_new_tokens)):
        if value is not None:
            page.locator(selector).fill(str(value))
            page.locator(selector).press("Tab")  # commit the value, as a user leaving the field does
    if args.bon_same_memory:
        page.locator("#bon-same-memory input[type=checkbox]").check()


def screenshots(page, folder: Path) -> list[Path]:
    """A picture of each view of the run on show (the README's screenshots)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    page.add_style_tag(content=UNPINNED_RUN_BAR)

    def shot(name: str, selector: str | None = None) -> None:
        page.wait_for_timeout(1000)  # let plotly finish drawing
        paths.append(folder / name)
        if selector:
            page.locator(selector).screenshot(path=str(paths[-1]))
        else:  # the top of the page
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(paths[-1]))

    def tab(name: str) -> None:
        page.get_by_role("tab", name=name).click()

    shot("overview.png")
    shot("live.png", "#live-plot")
    tab("Partial vs final reward")
    shot("scatter.png", "#scatter")
    tab("Candidates")  # with the first pruned candidate the table has drawn selected
    page.locator("#candidates-table [role=gridcell]", has_text="pruned in round").first.click()
    page.keyboard.press("Escape")  # close the cell menu the click opened
    page.locator("#candidate-detail .sbon-generated").wait_for()
    shot("candidates.png", "#candidates-tab")
    tab("Savings")
    shot("savings.png", "#savings-tab")
    tab("Rounds replay")
    shot("rounds.png", "#rounds-plot")
    tab("Trade-off")
    shot("tradeoff.png", "#tradeoff-tab")
    page.get_by_label("heatmap").check()
    shot("tradeoff-heatmap.png", "#tradeoff-plot")
    return paths


def models_ready_after(log: Path, started: datetime) -> float | None:
    """Seconds from ``started`` to the app's 'models ready' log line (None if it never logged one)."""
    for line in log.read_text().splitlines():
        if "sbon.app models ready" in line:
            return (datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f") - started).total_seconds()
    return None


def main(args: argparse.Namespace) -> int:
    json_path, _ = common.result_paths(args, "app")
    log = json_path.with_name(json_path.stem + "_server.log")
    env = {"SBON_WEIGHTS": args.weights} if args.weights else {}
    rows, startup = [], {"load_average_at_start": list(os.getloadavg())}
    started, t0 = datetime.now(), time.perf_counter()
    with serve_app(log, env=env) as url, chromium() as browser:
        startup["server_answers_s"] = time.perf_counter() - t0
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(url)
        page.wait_for_selector("#scatter .scatterlayer .point", timeout=120_000)  # the recorded run is on show
        startup["page_ready_s"] = time.perf_counter() - t0
        startup["model_status_at_page_ready"] = page.locator("#model-status").inner_text()
        print(f"app start -> page ready {startup['page_ready_s']:.1f} s "
              f"(models: {startup['model_status_at_page_ready']})", flush=True)
        set_controls(page, args)
        prompt = page.locator("#prompt textarea").input_value()
        for i in range(1 + args.runs):
            row = {"click": i + 1, "models": "loading" if i == 0 else "loaded", **click_run(page),
                   "load_average_after": list(os.getloadavg())}  # busy cores make every number here an upper bound
            first = "none" if row["first_round_s"] is None else f"after {row['first_round_s']:.1f} s"
            print(f"click {row['click']} (models {row['models']}): first decision point {first}, Speculative "
                  f"Rejection's answer after {row['sbon_answer_s']:.1f} s, final frame after "
                  f"{row['final_frame_s']:.1f} s, every view after {row['views_ready_s']:.1f} s; the live view stood "
                  f"still at most {row['longest_still_s']:.2f} s (from {row['longest_still_from_s']:.1f} s; the chart "
                  f"alone {row['chart_longest_still_s']:.2f} s)", flush=True)
            rows.append(row)
        shots = screenshots(page, Path(args.screenshots)) if args.screenshots else []
    startup["models_ready_s"] = models_ready_after(log, started)
    if startup["models_ready_s"] is not None:
        print(f"app start -> models ready {startup['models_ready_s']:.1f} s (from the app's log)")
    env = common.environment()
    env.pop("torch_threads")  # this process's, not the app's: the app's are in the server log beside
    common.write_json({"experiment": "app", "settings": {"prompt": prompt, "runs": args.runs, "n": args.n, "alpha": args.alpha,
                                                     "max_new_tokens": args.max_new_tokens,
                                                     "bon_same_memory": args.bon_same_memory, "others": "app defaults",
                                                     "SBON_THREADS": os.environ.get("SBON_THREADS"),
                                                     "weights": args.weights or default_weights(torch.device("cpu"),
                                                                                                DEFAULT_GENERATOR),
                                                     # set: forced for the app; None: the app's own (measured) choice
                                                     "SBON_WEIGHTS": args.weights or os.environ.get("SBON_WEIGHTS"),
                                                     "SBON_DECODE": os.environ.get("SBON_DECODE"),
                                                     "SBON_CACHE": os.environ.get("SBON_CACHE")},
                       "environment": env, "startup": startup, "clicks": rows}, json_path)
    df = pd.DataFrame(rows)[["click", "models", "first_round_s", "sbon_answer_s", "final_frame_s", "views_ready_s",
                             "server_done_s", "longest_still_s", "chart_longest_still_s"]]
    common.print_table(f"the app's run in the browser ({prompt[:60]!r}):", df, "{:.1f}")
    worst = max(r["longest_still_s"] for r in rows)
    print(f"\nlongest still live view over the clicks: {worst:.2f} s (target ≤ {STILL_TARGET_S} s: "
          f"{'met' if worst <= STILL_TARGET_S else 'missed'}; load average now {os.getloadavg()[0]:.1f})")
    print(f"\nwrote {json_path}" + "".join(f", {p}" for p in shots))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("app", help="click-to-frame times of the app's default run in headless Chromium",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="clicks after the first (which loads the models)")
    p.add_argument("--prompt", default=None, help="prompt to run (default: the app's default prompt)")
    p.add_argument("--n", type=int, default=None, help="N (default: the app's)")
    p.add_argument("--alpha", type=float, default=None, help="alpha (default: the app's)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="max new tokens (default: the app's)")
    p.add_argument("--bon-same-memory", action="store_true", help="tick 'Best-of-N under the same memory'")
    p.add_argument("--weights", default=None, choices=list(WEIGHT_FORMATS),
                   help="the generator's weight format in the app (SBON_WEIGHTS; default: the app's)")
    p.add_argument("--screenshots", default=None, help="save a picture of each view of the last run in this folder")
    p.add_argument("--out-dir", default=str(common.DEFAULT_OUT_DIR), help="where result files go")
    p.add_argument("--tag", default=None, help="suffix for the result file names")
    p.set_defaults(main=main)
