"""The durable file primitives: one definition each of a file's sha256, an atomic write (bytes, text, JSON) and a
directory swap, for every phase.

**Standard library only, and no other eagle3ops import** (Python >= 3.9): ``storage.py`` and ``services.py``
import this file, and they also run on targets without eagle3ops (the PVE host), where Ansible ships it as
``module_utils/eagle3ops_durable.py`` (a symlink to this file). ``tests/unit/core/test_durable.py`` enforces the
rule for this file, ``storage.py``, ``pve.py`` and ``services.py``.

An atomic write here means: the bytes go to a temp file beside the target (same directory, so the rename never
crosses a file system), named ``.{name}.{pid}.{thread}.tmp``; the temp file is fsynced, renamed over the target
(``os.replace``, atomic on POSIX), then the directory is fsynced so that the new name survives a power cut. The
target is always either the old complete file or the new complete file; on any error the temp file is removed
and the error, an OSError naming the target (not the temp name), is raised.

The extraction's hot path keeps its own tuned writer (``store.atomic_write_bytes`` / ``atomic_write_many``:
batch writeback, fallocate, fdatasync options, measured in docs/performance.md) with the same guarantee and temp
name pattern; it shares :func:`fsync_dir` with this file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

__all__ = [
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "fsync_dir",
    "fsync_tree",
    "sha256_file",
    "swap_dir_into_place",
    "temp_path",
]


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of the file at ``path``, read in blocks (never the whole file at once)."""
    with open(path, "rb") as f:
        if hasattr(hashlib, "file_digest"):  # Python 3.11+: the loop runs in C
            return hashlib.file_digest(f, "sha256").hexdigest()
        h = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
        return h.hexdigest()


def tree_sha256(root: str | os.PathLike, leave_out: str) -> dict[str, str]:
    """``{path relative to root: sha256}`` of every file below ``root``, but those named ``leave_out`` (the tree's
    own record of itself) and Python's ``__pycache__`` (written when a loader imports the tree's own code)."""
    root = Path(root)
    return {
        str(p.relative_to(root)): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != leave_out and "__pycache__" not in p.parts
    }


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync the directory ``path`` (makes the renames and creations in it durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(path: str | os.PathLike) -> Path:
    """The temp name an atomic write of ``path`` uses: beside it, hidden, unique per process and thread."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def atomic_write_bytes(
    path: str | os.PathLike,
    data,
    *,
    mode: int = 0o666,
    mode_from: str | os.PathLike | None = None,
    mtime_from: str | os.PathLike | None = None,
    fsync: bool = True,
) -> int:
    """Write ``data`` (bytes-like, or a list of buffers written back to back) to ``path`` atomically and durably
    (module docstring); returns the bytes written. The parent directory must exist.

    ``mode``: permission bits of the new file before the umask (``0o666`` is what ``open(path, "w")`` gives).
    ``mode_from``: if this file exists, the new file gets its exact mode and (where permitted) its owner, e.g.
    the file being replaced. ``mtime_from``: the new file gets this file's atime/mtime. ``fsync=False`` skips
    both fsyncs (atomic, not durable)."""
    path = Path(path)
    tmp = temp_path(path)
    parts = data if isinstance(data, (list, tuple)) else [data]
    total = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as e:
        _name_target(e, path, tmp)
        raise
    try:
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                total += len(view)
                while view:
                    view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        ref = Path(mode_from) if mode_from is not None else None
        if ref is not None and ref.exists():
            st = ref.stat()
            with contextlib.suppress(PermissionError):
                os.chown(tmp, st.st_uid, st.st_gid)  # before chmod: a chown may clear set-id bits
            os.chmod(tmp, st.st_mode & 0o7777)
        if mtime_from is not None:
            mst = os.stat(mtime_from)
            os.utime(tmp, ns=(mst.st_atime_ns, mst.st_mtime_ns))
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):
            _name_target(e, path, tmp)
        raise
    if fsync:
        fsync_dir(path.parent)
    return total


def atomic_write_text(path: str | os.PathLike, text: str, **kw) -> int:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8 (same keyword arguments)."""
    return atomic_write_bytes(path, text.encode("utf-8"), **kw)


def atomic_write_json(path: str | os.PathLike, obj, *, default=None, **kw) -> int:
    """:func:`atomic_write_bytes` of ``obj`` as JSON: ``indent=2``, sorted keys, a final newline (the format of
    every JSON file eagle3ops writes). ``default``: as for ``json.dumps`` (``str`` writes anything)."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=default) + "\n"
    return atomic_write_text(path, text, **kw)


def read_json_object(path: str | os.PathLike) -> dict | None:
    """The JSON object in the file at ``path`` (a stamp or meta record, as :func:`atomic_write_json` writes them);
    None when the file is missing or unreadable, or holds no JSON object: the caller redoes what it records."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


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


def _name_target(e: OSError, path: Path, tmp: Path) -> None:
    """Make ``e`` name the file the caller asked for, not our temp name (eagle3ops.cli prints the filename)."""
    if e.filename is None or str(e.filename) == str(tmp):
        e.filename = str(path)
        e.filename2 = None
