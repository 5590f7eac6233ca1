"""What the errors a user acts on share. Standard library only; imports nothing of eagle3ops."""

from __future__ import annotations


class WithDetails:
    """Mixed into an error the user acts on (``class TrainError(WithDetails, Exception)``): raised as
    ``TrainError(message, **details)``; the message says what, where and what to do, and ``details`` (a dict)
    go into the command's JSON result."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details
