"""A run from the page: the Run click answered at once (refused, queued or starting), the run itself drawn as it
goes (each decision point, Speculative Rejection's answer, every view at the end), Stop, the `/compare` API's
run, and the line that says which models are loaded. Plain data in, {page element name: value} out
(components/updates.py); the run's events come from the function app.py gives (on a ZeroGPU Space, a lent GPU).

The four run modules: `runs` generates a run on the page (live); `replays` shows a finished run without
generating (opened, uploaded, linked, from the gallery); `saved_runs` reads and writes a run as a file (no page
state); `record` is the command that makes the shipped recordings the replays open."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, wait
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from sbon.algorithms import Done
from sbon.analysis.comparison import (Comparison, ComparisonDone, ComparisonReady, CounterfactualScored,
                                      MethodEvent)
from sbon.errors import SBoNError
from sbon.machine import how_decoded
from sbon.results import RunResult
from sbon.models import check_instructions_judged, generator_title, reward_title

from . import tables
from .controls import DEFAULTS, RunSettings, settings_from
from .page_text import device_words
from .instructions import ignored
from .live import LiveTracker, ProgressChart
from .model_cache import MODELS, hub_fetches, sources
from .torch_thread import on_one_thread
from .replays import GALLERY
from .rounds import round_figure
from .updates import WARNING, Refused, Update
from .views import LIVE, NOT_PRESENTING, SHOWN, Shown, as_look, redrawn, restored, show, what_if_pending

LIVE_FRAME_EVERY_S = 1.0  # while Best-of-N runs, its growing token counts are redrawn this often: the browser
# redraws the chart on the cores the run decodes on, and the caption's clock moves between frames, so the screen
# never stands still for long (benchmarks/app_timing.py's STILL_TARGET_S)
MODEL_STATUS_LOADING_S, MODEL_STATUS_IDLE_S = 1.0, 5.0  # how often the model line refreshes
STATUS_EVERY_S = 0.5  # token progress refreshes the status line at most this often; figures only per round
ONE_THREAD = (", on one thread: other programs were busy on this machine's cores, and one thread runs faster "
              "beside them")
RUNNING_NOTE = "the views below still show the previous run until this one ends"
QUEUED_S = 2.0  # a run that waited this long for the generation slot says so beside its own time
RUN_OUTPUTS = (*SHOWN, "running", "stop_btn", "model_status")
IDLE = {"running": None, "stop_btn": Update(visible=False)}  # what a run leaves when it ends
PRELOAD: list[Future] = []  # the background load of the default models, once started
log = logging.getLogger("sbon.app")


class Runs:
    """The one generation slot the Run button and the API share: the runs in it now, how long the last ones
    held it (the waiting estimate), and the runs waiting for it (`waiting`: the queue's own count)."""

    def __init__(self, events: Callable[[RunSettings], Iterator], waiting: Callable[[], int] = lambda: 0):
        self.events = events  # settings -> the comparison's events
        self.waiting = waiting
        self.generating = 0  # runs inside the generation slot now (the Run button's and the API's)
        self.seconds: list[float] = []  # how long each Run held the slot

    @contextmanager
    def _holding(self) -> Iterator[Iterator[float]]:
        """The slot, held: it gives the seconds this run first leaves the decode paths' probe (MODELS.share: the runs
        before left it no gap), to be waited out before the generation, then the probe times nothing meanwhile."""
        self.generating += 1
        try:
            yield MODELS.share()
        finally:
            self.generating -= 1

    def expected_s(self) -> float:
        """What one run in the queue is expected to take: the median of the last runs here, else the recorded
        run's own times."""
        last = sorted(self.seconds[-9:])
        if last:
            return last[len(last) // 2]
        run = GALLERY.runs["default"].comp
        return run.speculative.wall_time + run.bon.wall_time if run is not None else 30.0

    def request(self, running: float | None, look: Any = None, viewport: dict | None = None) -> dict[str, Any]:
        """The Run click, answered at once (outside the generation queue): refuse a second Run of this
        session with a one-line reason, else say whether the run starts now or waits its turn behind
        another session's run, so no click goes unanswered. The page's look takes the window's size at the click
        (``viewport``; a window resized or a phone turned since the page opened), which the run's figures fit."""
        if running:
            raise Refused(f"A run is already going ({time.time() - running:.0f} s so far): wait for it to end or "
                          "press Stop.", duration_s=6)
        ahead = self.generating + self.waiting()
        busy = ahead > 0
        status = (f"⏳ Queued: {ahead} run{'s' if ahead > 1 else ''} ahead of yours for the one generation slot of "
                  f"this device (place {ahead + 1}), about {ahead * self.expected_s():.0f} s to wait; the gallery "
                  "opens at once meanwhile." if busy else "Starting…")
        # The caption too: the presenter view shows the caption, not the status line.
        return {"running": time.time(), "status": status, "caption": status, "stop_btn": Update(visible=True),
                "summary": f"**New run {'queued' if busy else 'starting'}** — {RUNNING_NOTE}.",
                "look": as_look(look).sized(viewport)}

    def run(self, *values: Any) -> Iterator[dict[str, Any]]:
        """Check the settings, wait for the models if they are still loading, then run the comparison,
        drawing each decision point as it is taken, the race of both methods in place of the headline,
        and every view at the end. `values`: the controls' (SETTING_NAMES), the trade-off's kind, the
        comparison, origin and look the page shows, and when Run was clicked (``request``'s ``running``)."""
        started = time.perf_counter()
        try:
            with self._holding() as measuring:
                for left in measuring:
                    line = f"⏳ This machine's ways of decoding are being measured: the run starts in {left:.0f} s " \
                           "(later runs go faster)."
                    yield {"status": line, "caption": line}
                with MODELS.generating():  # the decode paths' probe times nothing meanwhile
                    yield from self._run(*values)
        finally:  # also when Stop cancels it: nothing of this run reaches the page after this line is logged
            self.seconds.append(time.perf_counter() - started)
            log.info("run ended: it held the generation slot %.1f s", self.seconds[-1])

    def compare(self, settings: RunSettings) -> str:
        """The `/compare` API's run: the comparison as JSON, in the same slot as the Run button's."""
        settings.check()
        check_instructions_judged(settings.reward, settings.instructions)  # a caller's, not a builder's leftovers
        with self._holding() as measuring:
            for _ in measuring:
                pass
            with MODELS.generating():
                MODELS.load_async(settings.generator, settings.reward).result()
                for event in on_one_thread(self.events(settings)):
                    if isinstance(event, ComparisonDone):
                        return event.comparison.to_json()
        raise SBoNError("the comparison stopped without a result")

    def _run(self, *values: Any) -> Iterator[dict[str, Any]]:
        *setting_values, kind, shown, origin, look, requested = values
        look = as_look(look)
        # Seconds since the Run click (``request``'s time, kept in the session): the wait for the slot, where
        # other visitors' runs held it, which the run's own clock below leaves out.
        queued = time.time() - requested if requested else 0.0
        def ended(why: str) -> dict[str, Any]:
            """A run that ends without a result: why, in the status line, the caption (the presenter view shows it, not
            the status line) and a warning; the views it had replaced put back (drawn only then)."""
            return {"status": f"⚠ {why}", "caption": f"⚠ {why}", WARNING: why, **IDLE, **restored(shown, origin),
                    **redrawn(shown, look)}

        try:
            settings = settings_from(setting_values)
        except SBoNError as e:
            yield ended(str(e))
            return
        clicked = time.perf_counter()
        methods = (settings.method, "bon")
        if settings.instructions.strip() and settings.run_instructions is None:  # said, never silently dropped
            yield {WARNING: ignored(settings.reward)}
        tracker = LiveTracker(settings.max_new_tokens, started=clicked, reward=settings.reward)
        yield {"status": "Starting…", "stop_btn": Update(visible=True), **NOT_PRESENTING, "present": LIVE,
               "live_plot": look.apply(round_figure(None, settings.n), live=True), "caption": tracker.caption(),
               "sbon_text": Update(label="Speculative Rejection returned", value=""),
               "bon_text": Update(label="Best-of-N returned", value=""),
               "source": f"**Running:** your settings, seed {settings.seed} — {RUNNING_NOTE}.",
               "summary": tracker.race(methods)}
        try:
            load = MODELS.load_async(settings.generator, settings.reward)
            while not load.done():  # the first Run after start may find the models still loading
                yield {"status": f"{MODELS.loading() or 'Waiting for the models'} (then the run starts)",
                       "model_status": models_status(), "caption": f"Loading the models… · {tracker.elapsed:.1f} s"}
                wait([load], timeout=STATUS_EVERY_S)
            load.result()
            last_status, last_frame, ready, answer = 0.0, None, None, ""  # last_frame: Best-of-N's last progress frame
            progress = ProgressChart(settings.n, look)
            # A heartbeat (None) while no event comes: the caption's clock moves through a long step.
            for event in on_one_thread(self.events(settings), heartbeat_s=STATUS_EVERY_S):
                if tracker.update(event):  # a decision point: one new frame
                    yield {"status": tracker.status(), "summary": tracker.race(methods) + answer,
                           "caption": tracker.caption(),  # the same line the clock's updates send
                           "live_plot": look.apply(round_figure(tracker.views[-1], tracker.n, title_prefix="Live · ",
                                                                earlier=tracker.views[:-1], reward=settings.reward),
                                                   live=True)}
                elif isinstance(event, MethodEvent) and event.method != "bon" and isinstance(event.event, Done):
                    label, text = tables.returned_text(event.event.result, "Speculative Rejection")
                    answer = "\n\n" + tables.early_answer(event.event.result)
                    yield {"sbon_text": Update(label=label, value=text), "summary": tracker.race(methods) + answer,
                           "status": tracker.status(), "caption": tracker.caption()}
                elif isinstance(event, ComparisonReady):  # both runs done: every view but the prefix-scored ones
                    for result in (event.comparison.speculative, event.comparison.bon):
                        MODELS.observe(result)
                    ready = done_line(tracker, queued, event.comparison, settings)
                    shown = Shown(event.comparison, "your run", kind, look=look)
                    yield {**show(shown, f"{ready} · {tracker.status()}"), **what_if_pending(look),
                           "model_status": models_status()}
                elif isinstance(event, ComparisonDone):  # every view again, now with the prefix-scored ones (Gradio
                    # blanks the candidates table when those alone are updated), but not the live chart: its rounds
                    # may be presented since the result was shown
                    shown = Shown(event.comparison, "your run", kind, look=look)
                    yield {**show(shown, f"{ready}; every view ready after {tracker.elapsed:.1f} s", chart=False), **IDLE}
                elif (isinstance(event, CounterfactualScored) or tracker.elapsed - last_status >= STATUS_EVERY_S
                      or (tracker.phase == "bon" and last_frame is None)):
                    last_status = tracker.elapsed
                    update = {"status": f"{ready} · {tracker.status()}" if ready else tracker.status()}
                    if not ready:
                        update.update(summary=tracker.race(methods) + answer, caption=tracker.caption())
                    if tracker.phase == "bon" and (last_frame is None
                                                   or tracker.elapsed - last_frame >= LIVE_FRAME_EVERY_S):
                        # No decision point to draw while Best-of-N runs: its candidates' tokens grow instead.
                        last_frame = tracker.elapsed
                        update["live_plot"] = progress.frame(tracker)
                    yield update
        except SBoNError as e:
            yield {**ended(str(e)), "model_status": models_status()}
        except Exception as e:  # keep serving: one failed run must not take the app down
            log.exception("run failed")
            yield {**ended(f"the run failed: {type(e).__name__}: {e}"), "model_status": models_status()}


def decoded(run: RunResult) -> str:
    """How a finished run of this app decoded, for its status line, in the model line's words (sbon.machine.title):
    its weight format and step, and one thread where the run started while other work held the cores
    (components.decode_paths.DecodePaths._cpu_threads)."""
    paths = MODELS.decode_paths
    measured = paths.path(run.generator).threads if paths else None
    one_thread = run.threads == 1 and measured is not None and measured > 1
    decode = run.decode or "eager"
    return f"decoded {how_decoded(run.weights, decode, str(MODELS.device()))}" + (ONE_THREAD if one_thread else "")


def done_line(tracker: LiveTracker, queued: float, comp: Comparison, settings: RunSettings) -> str:
    """The status line's start once both runs are done: the run's own time (from when the slot was its, model loading
    included) and, where it waited QUEUED_S or more behind other visitors' runs, that wait too; logged with the
    settings."""
    first = tracker.first_round_at
    log.info("runs finished: %.1f s from its start (%.1f s after the click), first round %s s, settings %s",
             tracker.elapsed, queued + tracker.elapsed, f"{first:.1f}" if first else "none", settings.to_dict())
    return (f"Done in {tracker.elapsed:.1f} s from "
            + (f"its start, after {queued:.0f} s in the queue" if queued >= QUEUED_S else "the click")
            + (f"; first decision point drawn after {first:.1f} s" if first else "")
            + f"; {decoded(comp.speculative)}")


def on_stop(comp: Comparison | None, origin: str | None) -> dict[str, Any]:
    """The Stop click's answer, at once (it cancels the run): what the views show now."""
    return {**_stopped(comp, origin), **IDLE, **restored(comp, origin)}


def after_stop(comp: Comparison | None, origin: str | None, look: Any = None) -> dict[str, Any]:
    """Once the run is cancelled: the live chart and both answers it had replaced put back, and the stop said again
    over any progress line the run had sent before it ended."""
    return {**_stopped(comp, origin), **IDLE, **redrawn(comp, as_look(look))}


def _stopped(comp: Comparison | None, origin: str | None) -> dict[str, str]:
    scoring = comp is not None and origin == "your run" and not comp.partials  # stopped after the final frame
    status = ("Stopped while Best-of-N's prefixes were scored: the Trade-off and Pruning-signals views of this run "
              "stay empty" if scoring else "Stopped: the views still show the previous run")
    return {"status": status, "caption": status}


# -- the models: what is loaded, the defaults' load at start ------------------------------------------

def models_status() -> str:
    """One line for the page, true now: what is loading, what is loaded (per generator and reward),
    and the last failed load. Computed on every page load and timer tick, never at build time."""
    step = MODELS.loading()
    gens, rews = MODELS.loaded()
    parts = []
    if step:
        parts.append(f"⏳ {step} — Run waits for it; replays work now.")
    elif not gens and PRELOAD and not PRELOAD[0].done():
        parts.append("⏳ Loading the default models…")
    if gens or rews:
        parts.append(f"Ready on {device_words(MODELS.device())}: {', '.join(generator_title(g) for g in gens) or 'no generator'}"
                     f", judged by {', '.join(reward_title(r) for r in rews) or 'no reward yet'}.")
    elif not step:
        parts.append("No model is loaded: the next Run loads the ones it asks for.")
    parts += [line for g in gens if (line := MODELS.decode_status(g, alone=len(gens) == 1))]
    for (g, r), why in MODELS.failures().items():
        parts.append(f"⚠ loading {generator_title(g)} with {reward_title(r)} failed: {why}")
    return " ".join(parts)


def on_model_timer() -> dict[str, Any]:
    """Refresh the model line: each second while something loads, else every few seconds, so a load
    or eviction by another session's run shows here too."""
    line = models_status()
    return {"model_status": line, "model_timer": Update(value=MODEL_STATUS_LOADING_S if "⏳" in line else MODEL_STATUS_IDLE_S)}


def start_loading_models() -> None:
    """Load the default models in the background as soon as the app serves, and say where from."""
    for source in sources(DEFAULTS.generator, DEFAULTS.reward):
        log.info("models: %s%s", source.describe(), " (first time only: a one-time conversion)" if source.first_time else "")
    fetches = hub_fetches(DEFAULTS.generator, DEFAULTS.reward)
    log.info("will fetch from the hub: %s", ", ".join(fetches) if fetches else "nothing (every model is local)")
    PRELOAD.append(MODELS.load_async(DEFAULTS.generator, DEFAULTS.reward))
    PRELOAD[0].add_done_callback(_log_load)


def _log_load(load: Future) -> None:
    if load.exception() is not None:
        log.warning("the default models did not load: %s", load.exception())
    else:
        log.info("models ready: %s and %s", DEFAULTS.generator, DEFAULTS.reward)
