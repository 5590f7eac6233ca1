"""A built target directory, the demo's (eagle3ops.demo) and the Kimi fixture's (eagle3ops.kimi_fixture): the
layout both share (``model/``, ``conversations.jsonl``, ``heldout.jsonl`` beside the builder's own JSON record),
the directory beside it that a build writes into, and the sealing that puts a finished build in its place (the
record with the files' sha256s and their fingerprint, fsync, one directory swap): a second run that finds the
record current changes nothing, a failed or killed build leaves no half-built target."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

from eagle3ops.durable import fsync_tree, swap_dir_into_place

MODEL_DIR = "model"
CONVERSATIONS = "conversations.jsonl"
HELDOUT = "heldout.jsonl"


def target_paths(root: Path) -> dict:
    """Where a built target directory keeps its parts, as its builder reports them."""
    return {
        "out": str(root),
        "model_path": str(root / MODEL_DIR),
        "conversations_path": str(root / CONVERSATIONS),
        "heldout_path": str(root / HELDOUT),
    }


@contextlib.contextmanager
def building(root: Path, tag: str):
    """An empty directory beside ``root`` to build a target in (``.<name>.<tag>-<pid>``, sealed and swapped in
    by :func:`put_in_place`); what this process left there before is removed, and so is the directory when the
    build fails."""
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.{tag}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def put_in_place(tmp: Path, root: Path, meta_name: str, meta: dict, tag: str) -> None:
    """Seal a target built in ``tmp`` and swap it in as ``root``: ``meta`` gets the fingerprint of its files'
    sha256s (``meta["files"]``) and is written as ``meta_name``, the tree is fsynced, the directory swapped into
    place (a ``root`` already there is moved aside, ``tag`` in its name, and removed once the swap is done)."""
    meta["fingerprint"] = hashlib.sha256(json.dumps(meta["files"], sort_keys=True).encode()).hexdigest()
    (tmp / meta_name).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    fsync_tree(tmp)
    swap_dir_into_place(tmp, root, tag)
