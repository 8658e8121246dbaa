"""What a handler asks of a page element besides a plain value, in plain data: the handlers in components/
return {page element name: value} and know nothing of Gradio; app.py's one converter (`for_gradio`) turns
these records into Gradio's updates, figures and notices."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

KEEP: Any = object()  # an Update's value when only other properties change

# A handler's {name: value} may also hold a one-line notice under this key: shown as a toast, not in an element.
WARNING = "warning"


@dataclass(frozen=True)
class Update:
    """A page element's new properties: only those given change (its value, label, visibility, whether it can
    be clicked, a dropdown's choices, a timer's activity). A timer's value is its interval in seconds."""
    value: Any = KEEP
    label: str | None = None
    visible: bool | None = None
    interactive: bool | None = None
    choices: list | None = None
    active: bool | None = None

    def given(self) -> dict[str, Any]:
        """The properties this update sets, by name."""
        return {f.name: v for f in fields(self)
                if (v := getattr(self, f.name)) is not (KEEP if f.name == "value" else None)}


@dataclass(frozen=True)
class FrozenFigure:
    """A plotly figure serialized once (its JSON), for views kept and sent to many visitors."""
    json: str


class Refused(Exception):
    """A request the page answers with a one-line dialog instead of doing it (a second Run, say)."""

    def __init__(self, message: str, duration_s: float | None = None):
        super().__init__(message)
        self.duration_s = duration_s
