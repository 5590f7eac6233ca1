"""The prepare phase's error."""

from eagle3ops.conversations import InputError


class PrepareError(InputError):
    """A problem the user must act on; the message says what and where (``problems``: one ``file:line: what``
    each). An input's own problem, raised by :mod:`eagle3ops.conversations` as an :class:`InputError`, reaches
    the caller of :func:`eagle3ops.prepare.dataset.prepare` as this."""
