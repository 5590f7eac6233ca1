"""Directory-level atomic replacement, shared by the steps that build a whole directory (demo, prepare)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from eagle3ops.store import fsync_dir


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file and directory under ``root`` (before a directory is renamed into place)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def swap_dir_into_place(tmp: str | os.PathLike, dest: str | os.PathLike, tag: str = "old") -> None:
    """Rename the finished directory ``tmp`` to ``dest``; an existing ``dest`` is moved aside first and removed
    only after the rename, so ``dest`` is always either the old or the new complete directory."""
    tmp, dest = Path(tmp), Path(dest)
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}.{tag}-{os.getpid()}"
        os.replace(dest, old)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
