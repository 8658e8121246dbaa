"""The one error type users see for bad input: its message says what to change."""


class SBoNError(ValueError):
    """Invalid settings or inputs, raised before any generation starts."""
