"""When a benchmark result is up to date, and how it is written.

A result file records the inputs it was measured from (:func:`acceptance_inputs`, :func:`live_inputs`: file
fingerprints and the settings that change the numbers); a re-run whose inputs equal the recorded ones measures
nothing (``changed: false``). Results are written atomically and durably (:func:`write_result`), so a killed
run leaves the old result or none, never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eagle3ops.checkpoints import CheckpointError, resolve_checkpoint
from eagle3ops.durable import atomic_write_json, atomic_write_text, sha256_file

BIG = 1 << 30  # files above this are fingerprinted by size + mtime instead of sha256


class MissingInput(Exception):
    """An input of the measurement is not there (yet): the message names it."""


def fingerprint(paths: list[Path]) -> dict:
    """``{path: sha256}`` of each file; a file over :data:`BIG` by its size and mtime (a target's weights)."""
    out = {}
    for p in paths:
        st = p.stat()
        out[str(p)] = f"size={st.st_size},mtime={int(st.st_mtime)}" if st.st_size > BIG else sha256_file(p)
    return out


def acceptance_inputs(
    checkpoint: str, target: str, prompts: str, *, k: int, max_new_tokens: int, limit, baseline: str, **where
) -> dict:
    """What an offline acceptance measurement depends on: the draft checkpoint (resolved from a run or save
    directory), the target's config and weights, the prompts and the settings."""
    try:
        ckpt = resolve_checkpoint(checkpoint)
    except CheckpointError as e:
        raise MissingInput(str(e)) from None
    target, prompts = Path(target), Path(prompts)
    for p in (target / "config.json", prompts):
        if not p.is_file():
            raise MissingInput(f"{p}: missing (the target's config.json / the held-out prompts file)")
    files = [ckpt / "config.json", ckpt / "model.safetensors", target / "config.json", prompts]
    files += sorted(target.glob("*.safetensors"))
    return {
        "checkpoint": str(ckpt),
        "files": fingerprint(files),
        # ``where``: device and dtype, when not the defaults (cpu, float32)
        "settings": {"k": k, "max_new_tokens": max_new_tokens, "limit": limit, "baseline": baseline, **where},
    }


def live_inputs(sets: dict[str, str], *, server_key, url: str, settings: dict) -> dict:
    """What a live measurement depends on: the prompt sets' files (None for a set that is not a file), the
    server (``server_key``: what the serve phase says identifies it, its URL) and the settings."""
    files = {
        name: fingerprint([Path(p)])[str(Path(p))] if Path(p).is_file() else None for name, p in sets.items()
    }
    return {"sets": files, "server_key": server_key, "url": url, "settings": settings}


def recorded_inputs(out: str | os.PathLike):
    """The inputs the result at ``out`` records, None when there is no readable result."""
    try:
        return json.loads(Path(out).read_text()).get("inputs")
    except (OSError, ValueError):
        return None


def write_result(out: str | os.PathLike, result: dict) -> None:
    """``result`` as JSON at ``out`` (its directory created), atomically and durably."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, result)


def write_text_if_changed(out: str | os.PathLike, text: str) -> bool:
    """``text`` at ``out`` (atomically) unless it already holds exactly that; True when written."""
    out = Path(out)
    if out.is_file() and out.read_text() == text:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    return True
