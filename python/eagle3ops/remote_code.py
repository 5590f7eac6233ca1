"""A target whose tokenizer, config or processor is remote code (an ``auto_map`` in tokenizer_config.json,
config.json, preprocessor_config.json or processor_config.json, naming Python files of the model directory):
refused before any work unless ``eagle3ops_trust_remote_code`` (``--trust-remote-code``) is set, and refused
when a file its ``auto_map`` names is missing. Every phase that loads the target's tokenizer or config asks
:func:`check` first. Standard library only; imports no phase.

Why a refusal and not a fallback: transformers (5.17) knows ``kimi_k25`` natively and, without
``trust_remote_code``, builds its *own* tokenizer from ``tiktoken.model``, with another pre-tokenisation split;
SGLang serves with ``--trust-remote-code``, so a draft trained on the native ids is served on other ids and
loses acceptance without any error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

VARIABLE = "eagle3ops_trust_remote_code"
FLAG = "--trust-remote-code"
# the files whose auto_map transformers reads, in the order they are reported
AUTO_MAP_FILES = ("tokenizer_config.json", "config.json", "preprocessor_config.json", "processor_config.json")


class RemoteCodeError(ValueError):
    """The target's remote code is not allowed, or a file it names is missing (a message for the user)."""


def _modules(auto_map: object) -> list[str]:
    """The Python files one ``auto_map`` names: ``"module.Class"`` or ``[slow, fast]`` (None allowed); a
    reference into another repository (``repo--module.Class``) is left out (not a file of this directory)."""
    refs = []
    for value in auto_map.values() if isinstance(auto_map, dict) else []:
        refs += value if isinstance(value, list | tuple) else [value]
    return sorted(
        {r.rsplit(".", 1)[0] + ".py" for r in refs if isinstance(r, str) and "--" not in r and "." in r}
    )


def remote_code(model_dir: str | os.PathLike) -> dict[str, list[str]]:
    """``{json file: [python files its auto_map names]}`` of a local model directory (empty: no remote code)."""
    out = {}
    for name in AUTO_MAP_FILES:
        try:
            cfg = json.loads((Path(model_dir) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # absent or unreadable: the phase's own loading says what is wrong with it
        files = _modules(cfg.get("auto_map")) if isinstance(cfg, dict) else []
        if files:
            out[name] = files
    return out


def check(model_dir: str | os.PathLike, trust_remote_code: bool, *, setting: str = VARIABLE) -> dict:
    """What :func:`remote_code` found, after refusing (:class:`RemoteCodeError`) a file its ``auto_map`` names
    that is missing, then remote code that ``trust_remote_code`` does not allow; ``setting``: how the user sets
    the flag where this runs (the message names it and the command-line flag)."""
    found = remote_code(model_dir)
    for source, files in found.items():
        for f in files:
            if not (Path(model_dir) / f).is_file():
                raise RemoteCodeError(
                    f"{Path(model_dir) / f}: missing, but {Path(model_dir) / source} names it in its auto_map "
                    "(the target's own code). Copy the whole model directory again (every .py file with it)."
                )
    if found and not trust_remote_code:
        what = "; ".join(f"{src} auto_map -> {', '.join(files)}" for src, files in found.items())
        raise RemoteCodeError(
            f"{model_dir}: the target's tokenizer/config is remote code ({what}) and {setting} is false. "
            f"Set {setting}: true ({FLAG}) for a model directory you trust. Without it transformers may load a "
            "native substitute (Kimi-K2.5: its own tiktoken conversion) that tokenises differently from the "
            f"remote code SGLang serves with {FLAG}."
        )
    return found


def require_trusted(model_dir: str | os.PathLike, trust_remote_code: bool, error: type[Exception]) -> dict:
    """:func:`check`, its refusal raised as ``error`` (a phase's own error type, or the CLI's CommandError)."""
    try:
        return check(model_dir, trust_remote_code)
    except RemoteCodeError as e:
        raise error(str(e)) from None
