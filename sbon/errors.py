"""The one error type users see for bad input: its message says what to change."""

import sys
from typing import Callable


class SBoNError(ValueError):
    """Invalid settings or inputs, raised before any generation starts."""


def one_line(e: BaseException) -> str:
    """An exception in one line for a log or a page: its type and the first line of its message, cut at 200
    characters (an SBoNError's message alone: it already says what to change)."""
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return first if isinstance(e, SBoNError) else f"{type(e).__name__}: {first}"


def exit_code(command: Callable[[], int]) -> int:
    """Run a command-line command: an SBoNError becomes its one-line message and exit code 2,
    Ctrl-C exit code 130, instead of a traceback."""
    try:
        return command()
    except SBoNError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
