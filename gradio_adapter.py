"""The two things the page needs from Gradio that its public API does not offer, in one place.

- How many events wait in one concurrency group of the queue (the generation slot's line, for the
  "place N, about S s to wait" status): Gradio counts them but does not expose the count.
- A description, type range and choices for each parameter and the return of an endpoint made by
  ``gr.api``: Gradio derives only the types from the signature; its API components keep their
  schema in ``_api_info``.

Both read Gradio's internals, which change between major versions: SUPPORTED_GRADIO is the range
requirements.txt allows, and tests/test_gradio_adapter.py checks both calls on a real Blocks with
the installed version.
"""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr

SUPPORTED_GRADIO = ((6, 0), (7, 0))  # requirements.txt: gradio>=6.0,<7


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
