"""The speculators release eagle3ops is written against (requirements/speculators.txt): the prepare phase calls its
preprocessing, the train phase's shim patches its trainer and checkpointer. Standard library only; each phase
says in its own error what the pin means for it."""

from __future__ import annotations

import importlib.metadata

PINNED = "0.9.0"


def installed_version() -> str | None:
    """The version of the speculators installed in this interpreter's environment; None when there is none."""
    try:
        return importlib.metadata.version("speculators")
    except importlib.metadata.PackageNotFoundError:
        return None
