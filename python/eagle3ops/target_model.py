"""The target model's directory, as every phase that reads it is given it (``--model``, ``extract_model_path``,
``prepare_model_path``, ...): a local path, checked before any work. Standard library only; imports no phase.

Hubs are not reachable from the project's machines (``HF_HUB_OFFLINE=1``): a name that is not a local path used
to reach transformers' hub lookup and came back as ``Repo id must be in the form 'repo_name'...`` (issue 32).
"""

from __future__ import annotations

import os
from pathlib import Path


def missing(path: str | os.PathLike, setting: str) -> str | None:
    """None when ``path`` exists on this host, else the message saying so; ``setting``: how the user gives it
    (``extract_model_path (or --model)``)."""
    if Path(path).exists():
        return None
    return (
        f"target model path {path} does not exist. Set {setting} to a local model directory; hubs are not "
        "reachable from here (HF_HUB_OFFLINE=1)."
    )


def require(path: str | os.PathLike, setting: str, error: type[Exception]) -> None:
    """Raise ``error`` with :func:`missing`'s message when ``path`` does not exist."""
    why = missing(path, setting)
    if why:
        raise error(why)
