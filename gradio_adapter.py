"""The five things the page needs from Gradio that its public API does not offer, in one place.

- How many events wait in one concurrency group of the queue (the generation slot's line, for the
  "place N, about S s to wait" status): Gradio counts them but does not expose the count.
- A description, type range and choices for each parameter and the return of an endpoint made by
  ``gr.api``: Gradio derives only the types from the signature; its API components keep their
  schema in ``_api_info``.
- A page that stays idle when nothing happens (PageScripts): Gradio's status tracker times a pending event with a
  requestAnimationFrame loop that only the event's end stops, and the loader shown while the page opens is removed
  before that end reaches it. Its loop then runs at the display's frame rate for as long as the page stays open, on
  every visitor's machine (about a tenth of a core in headless Chromium, more on a slow laptop).
- A server that stays idle when nothing happens (quiet_queue): Gradio's queue looks for a new event every
  millisecond while none waits (50 ms on Windows), and for progress to send every 10 ms: over a thousand wake-ups
  a second of the server's event loop, which cost a Space's two cores several percent of one while nobody visits and
  take the interpreter's lock from the run's thread as often while one generates.
- A plot whose redraw fails is drawn afresh (PageScripts): Gradio's Plot redraws a figure with ``Plotly.react`` and
  lets an error escape, which leaves the rest of that update undone (the status line of a finished run among it).
  plotly.js's react keeps the margin a container-referenced legend reserved (plotly/plotly.js#6612), so a figure
  after one with such a legend can find a plot area of negative height: "Something went wrong with axis scaling".

All five read Gradio's internals, which change between major versions: SUPPORTED_GRADIO is the range
requirements.txt allows; tests/test_gradio_adapter.py checks the first two and quiet_queue on a real Blocks with the
installed version, and tests/test_app_e2e.py checks that an opened page stays idle and that a run's figures after the
recorded run's reach every view.
"""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr

SUPPORTED_GRADIO = ((6, 0), (7, 0))  # requirements.txt: gradio>=6.0,<7
# How often the queue looks for a new event while none waits, and for progress to send (quiet_queue): an event starts
# at most this much later; gr.Progress, which the page does not use, is sent at most this often.
QUEUE_POLL_S = 0.02


def waiting_in(demo: gr.Blocks, concurrency_id: str) -> int:
    """Events waiting in `demo`'s queue for the concurrency group `concurrency_id` (0 before the queue has one)."""
    queue = getattr(demo, "_queue", None)
    group = getattr(queue, "event_queue_per_concurrency_id", {}).get(concurrency_id)
    return len(group.queue) if group is not None else 0


def describe_endpoint(demo: gr.Blocks, api_name: str, parameter: Callable[[str], dict[str, Any]],
                      parameters: list[str], returns: str) -> None:
    """Give endpoint `api_name`'s inputs, in order named `parameters`, the JSON schema `parameter(name)` adds (its
    "description", a range, choices) and each output the description `returns`, in view_api() and the API page.
    Gradio shows an input's own words under "additional_description"; its "description" is the type's. Call it
    inside the `with demo:` block that made the endpoint: Gradio fixes the API's description when the block ends."""
    fn = next(f for f in demo.fns.values() if f.api_name == api_name)
    for name, component in zip(parameters, fn.inputs):
        schema = dict(parameter(name))
        if "description" in schema:
            schema["additional_description"] = schema.pop("description")
        component._api_info = {**component._api_info, **schema}
        component.label = name
    for component in fn.outputs:
        component._api_info = {**component._api_info, "description": returns}


def quiet_queue(demo: gr.Blocks) -> None:
    """Make `demo`'s queue (after ``demo.queue()``) look for a new event while none waits, and for progress to send,
    every QUEUE_POLL_S, where Gradio's own intervals are shorter. An interval a Gradio does not have is left out."""
    queue = getattr(demo, "_queue", None)
    for interval in ("sleep_when_free", "progress_update_sleep_when_free"):
        if isinstance(getattr(queue, interval, None), (int, float)):
            setattr(queue, interval, max(getattr(queue, interval), QUEUE_POLL_S))


# The frames of a status tracker's timer (they only set the elapsed time it shows: Gradio 6's callback reads
# performance.now() and divides by 1e3) are dropped while no tracker is on the page's screen: no timer is shown then,
# and a tracker whose timer is shown starts its loop afresh when its next event is pending. Any other callback, or a
# timer's callback in a Gradio that words it otherwise, passes unchanged. It must run before Gradio's modules, which
# keep the browser's requestAnimationFrame as they load: first in the page's <head> (PageScripts), where a ``head``
# given to Gradio is inserted by those modules.
IDLE_TIMERS_JS = """(() => {
  const request = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (callback) => {
    const source = String(callback);
    if (!(source.includes("performance.now()") && source.includes("/1e3"))) return request(callback);
    return request((time) => {
      if (document.querySelector("[data-testid=status-tracker]:not(.hide)")) callback(time);
    });
  };
})();"""
# Plotly.react as Gradio's Plot calls it, but a redraw that throws is drawn again from nothing (Plotly.purge, then
# Plotly.newPlot), with one line in the console. Gradio's plot module loads plotly.js when the page first shows a plot
# and sets window.Plotly to it; the react its module calls is that object's, which this wraps as it is set.
PLOT_REDRAW_JS = """(() => {
  const guarded = (plotly) => {
    if (!plotly || typeof plotly.react !== "function" || plotly.react.redrawsAfresh) return plotly;
    const react = plotly.react;
    plotly.react = function (gd, ...figure) {
      const afresh = (error) => {
        console.warn("a plot is drawn afresh: its redraw failed: " + error);
        plotly.purge(gd);
        return plotly.newPlot(gd, ...figure);
      };
      try {
        const drawn = react.call(this, gd, ...figure);
        return drawn && typeof drawn.catch === "function" ? drawn.catch(afresh) : drawn;
      } catch (error) { return afresh(error); }
    };
    plotly.react.redrawsAfresh = true;
    return plotly;
  };
  let plotly = guarded(window.Plotly);
  Object.defineProperty(window, "Plotly", {configurable: true, get: () => plotly, set: (p) => { plotly = guarded(p); }});
})();"""


class PageScripts:
    """ASGI middleware (``Middleware(PageScripts)`` in the app's middleware): IDLE_TIMERS_JS and PLOT_REDRAW_JS first in
    the <head> of the page Gradio serves at "/"; every other response passes untouched."""

    SCRIPT = f"<script>{IDLE_TIMERS_JS}\n{PLOT_REDRAW_JS}</script>".encode()

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") != "/":
            return await self.app(scope, receive, send)
        start, body = None, []

        async def with_script(message):
            nonlocal start
            if message["type"] == "http.response.start" and any(
                    k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in message["headers"]):
                start = message  # the page's: sent with its body, once the body's length is known
                return
            if message["type"] != "http.response.body" or start is None:
                return await send(message)
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            page, headers = b"".join(body), start["headers"]
            if b"<head>" in page:
                page = page.replace(b"<head>", b"<head>" + self.SCRIPT, 1)
                headers = [(k, str(len(page)).encode() if k.lower() == b"content-length" else v) for k, v in headers]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, with_script)
