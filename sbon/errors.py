"""The one error type users see for bad input: its message says what to change."""

import sys
from typing import Callable


class SBoNError(ValueError):
    """Invalid settings or inputs, raised before any generation starts."""


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
