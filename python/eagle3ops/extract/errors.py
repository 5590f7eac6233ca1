"""The extraction's error: what the user must act on (the message says what)."""


class ExtractError(RuntimeError):
    """A user-actionable extraction error."""
