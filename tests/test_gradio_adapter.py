"""The page's two reads of Gradio's internals (gradio_adapter.py), on a real Blocks with the installed Gradio:
the version is one the adapter supports, a concurrency group's waiting events are counted, and an endpoint's
parameters and return get their descriptions."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import gradio as gr

import gradio_adapter

ROOT = Path(__file__).resolve().parent.parent


def _version(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


def test_the_installed_gradio_is_in_the_supported_range_and_requirements_say_the_same():
    low, high = gradio_adapter.SUPPORTED_GRADIO
    assert low <= _version(gr.__version__) < high
    pin = next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("gradio"))
    assert pin.split(" #")[0].strip() == f"gradio>={low[0]}.{low[1]},<{high[0]}"


def test_the_adapter_describes_an_endpoint_on_a_real_blocks():
    def add(a: int, b: int = 2) -> int:
        return a + b

    with gr.Blocks() as demo:  # described while the page is built, as app.py does
        gr.api(add, api_name="add")
        gradio_adapter.describe_endpoint(demo, "add", lambda name: {"description": f"the number {name}"}, ["a", "b"],
                                         returns="their sum")
    info = demo.get_api_info()["named_endpoints"]["/add"]
    assert [p["parameter_name"] for p in info["parameters"]] == ["a", "b"]
    assert [p["python_type"]["description"] for p in info["parameters"]] == ["the number a", "the number b"]
    assert info["returns"][0]["python_type"]["description"] == "their sum"


def test_the_adapter_counts_the_events_waiting_for_a_busy_slot_on_a_served_blocks():
    """Three calls to a one-at-a-time endpoint: one runs (held until released), two wait; then none."""
    from gradio_client import Client

    release = threading.Event()

    def hold(x: int) -> int:
        release.wait(timeout=60)
        return x

    with gr.Blocks() as demo:
        gr.api(hold, api_name="hold", concurrency_limit=1, concurrency_id="slot")
    assert gradio_adapter.waiting_in(demo, "slot") == 0  # not served yet: no queue
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        jobs = [client.submit(x, api_name="/hold") for x in range(3)]
        assert _within(30, lambda: gradio_adapter.waiting_in(demo, "slot") == 2)
        assert gradio_adapter.waiting_in(demo, "other") == 0
        release.set()
        assert [job.result(timeout=60) for job in jobs] == [0, 1, 2]
        assert gradio_adapter.waiting_in(demo, "slot") == 0
    finally:
        release.set()
        demo.close()


def _within(seconds: float, condition) -> bool:
    """Poll `condition` until it holds or `seconds` pass (a bound, not a sleep-then-assert)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_served_blocks_whose_queue_is_quieted_stays_idle_and_still_serves():
    """Gradio's queue looks for new events every millisecond while none waits: a served Blocks with nothing to do
    spends several percent of a core on it (about 0.2 CPU-s in 3 s here). Quieted, as the app's queue is, this
    process spends under a third of that while it waits, and an event sent then is still served."""
    from gradio_client import Client

    def inc(x: int) -> int:
        return x + 1

    with gr.Blocks() as demo:
        gr.api(inc, api_name="inc")
    demo.queue()
    gradio_adapter.quiet_queue(demo)
    demo.launch(prevent_thread_lock=True, quiet=True)
    try:
        time.sleep(1)  # the server's start settles
        before = time.process_time()
        time.sleep(3)
        idle_cpu_s = time.process_time() - before
        assert idle_cpu_s < 0.07, f"{idle_cpu_s:.3f} CPU-s in 3 s of an idle server"
        assert Client(demo.local_url, verbose=False).predict(1, api_name="/inc") == 2
    finally:
        demo.close()
