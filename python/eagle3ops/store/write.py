"""The extraction's hot-path durable writes: :func:`atomic_write_bytes` and :func:`atomic_write_many`, the same
guarantee as :mod:`eagle3ops.durable` (temp file beside the target, fsync, ``os.replace``, directory fsync; the
target is old-complete or new-complete) with the tuning measured in docs/performance.md (batch writeback,
fallocate, fdatasync). Their temp names follow durable's pattern, ``.{name}.{pid}.{thread}.tmp``.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import threading
from pathlib import Path

from eagle3ops.durable import fsync_dir

# ---------- durable-write options ----------
# Module-level so bench/write_path.py can A/B them in one process; the environment variables set them for a run.
# None of them changes the guarantee: with ``fsync`` a file's bytes are durable before its rename, and the rename
# is durable (directory fsync) before atomic_write_bytes returns. BATCH_SYNC (the extraction writer's scheme) is on
# by default since it won where measured; the others are off (no measurable win: bench/write_path.py,
# docs/performance.md).


def _env_mib(name: str) -> int:
    """``$name`` in MiB (fractions allowed) as bytes; 0 when unset or not a number."""
    try:
        return max(0, int(float(os.environ.get(name, "") or 0) * 2**20))
    except ValueError:
        return 0


#: Streaming writeback: write the payload in chunks of this many bytes and start each chunk's writeback
#: (``sync_file_range(SYNC_FILE_RANGE_WRITE)``) as soon as it is in the page cache, so the final fsync finds
#: little left to flush. 0 = off (one pass of writes, then fsync). Linux only; a no-op elsewhere.
WRITEBACK_CHUNK = _env_mib("EAGLE3OPS_WRITEBACK_MIB")


#: With WRITEBACK_CHUNK: before starting a chunk's writeback, wait for the previous chunk's to finish (at most
#: two chunks of a file dirty or in flight per writer thread).
WRITEBACK_WAIT = os.environ.get("EAGLE3OPS_WRITEBACK_WAIT", "") == "1"


#: Allocate the file's final size (fallocate(2), mode 0) before writing it. Linux only; skipped where the file
#: system does not support it (never glibc's posix_fallocate emulation, which would write every block twice).
PREALLOCATE = os.environ.get("EAGLE3OPS_PREALLOCATE", "") == "1"


#: fdatasync instead of fsync for the data file. Correct for a new file on Linux: fdatasync flushes the
#: metadata needed to read the data back (size, block allocation); only timestamps may be lost, and the
#: rename + directory fsync still make the name durable.
DATASYNC = os.environ.get("EAGLE3OPS_FDATASYNC", "") == "1"


#: Batch sync: a writer thread writes all the files of its batch to the page cache and starts their writeback
#: (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait) before it fsyncs the first, so the disk has
#: the whole batch in flight instead of one file per thread (:func:`atomic_write_many`). Then each file is
#: fsynced and renamed in order, and the batch's directory fsynced once. WRITEBACK_CHUNK does not apply there (each
#: file's writeback is started whole, right after its last write).
#: On by default (its gain over one file in flight per thread: docs/performance.md, "2026-11-30: batch sync");
#: ``EAGLE3OPS_BATCH_SYNC=0`` turns it off.
BATCH_SYNC = os.environ.get("EAGLE3OPS_BATCH_SYNC", "1") != "0"


_SYNC_FILE_RANGE_WAIT_BEFORE = 1


_SYNC_FILE_RANGE_WRITE = 2


_SYNC_FILE_RANGE_WAIT_AFTER = 4


_SYNC_FILE_RANGE_WAIT_ALL = (
    _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER
)


# errnos meaning "this call is not supported here" (a hint we can skip), never an I/O error
_UNSUPPORTED = {errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.ESPIPE}


@functools.cache
def _libc_fn(name: str, *argtypes):
    """``name`` from the C library as ``f(*args) -> None`` raising OSError, or None where it does not exist (not
    Linux, no such symbol). ctypes.CDLL releases the GIL around the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [getattr(ctypes, t) for t in argtypes]
    fn.restype = ctypes.c_int

    def call(*args) -> None:
        if fn(*args) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    return call


def _sync_file_range():
    """``f(fd, offset, nbytes, flags)``, or None off Linux (CPython 3.10-3.13 has no os.sync_file_range)."""
    fn = getattr(os, "sync_file_range", None)
    # int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags)
    return fn if fn is not None else _libc_fn("sync_file_range", "c_int", "c_int64", "c_int64", "c_uint")


def _preallocate(fd: int, size: int) -> None:
    # int fallocate(int fd, int mode, off_t offset, off_t len): glibc's is the 64-bit one on LP64 Linux
    fallocate = _libc_fn("fallocate", "c_int", "c_int", "c_int64", "c_int64")
    if fallocate is None or size <= 0:
        return
    try:
        fallocate(fd, 0, 0, size)  # mode 0: allocate the blocks and extend the size
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise  # ENOSPC included: the caller reports a full disk before any byte is written


def _write_views(fd: int, views: list[memoryview], chunk: int, wait_prev: bool) -> None:
    """Write ``views`` back to back; with ``chunk``, start the writeback of every ``chunk`` bytes as soon as they
    are written (and optionally wait for the previous chunk's). I/O errors are raised, never swallowed: a
    sync_file_range that waited consumes the file's writeback error, and the final fsync would no longer see it."""
    sfr = _sync_file_range() if chunk > 0 else None
    if sfr is None:
        chunk = 0
    off = started = 0  # bytes written; bytes whose writeback was started
    prev = None  # (offset, length) of the last range whose writeback was started
    for view in views:
        while view:
            n = os.write(fd, view if not chunk else view[: chunk - (off - started)])
            view = view[n:]
            off += n
            if chunk and off - started >= chunk:
                try:
                    if wait_prev and prev is not None:
                        sfr(fd, prev[0], prev[1], _SYNC_FILE_RANGE_WAIT_ALL)
                    sfr(fd, started, off - started, _SYNC_FILE_RANGE_WRITE)
                except OSError as e:
                    # Only the file's first call (a plain WRITE, nothing waited on) may say "not supported here";
                    # any later error is raised whatever its errno, as a waited-on error is gone for the fsync.
                    if prev is not None or e.errno not in _UNSUPPORTED:
                        raise
                    chunk = 0  # not supported on this file system: plain writes from here on
                prev = (started, off - started)
                started = off


def _sync_data(fd: int) -> None:
    """fsync the data file (fdatasync with the DATASYNC option, where the platform has it)."""
    (os.fdatasync if DATASYNC and hasattr(os, "fdatasync") else os.fsync)(fd)


def _temp_and_views(path: Path, data) -> tuple[Path, list[memoryview], int]:
    """The temp name beside ``path`` (unique per process and thread), ``data`` as byte views, their total size."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    parts = data if isinstance(data, (list, tuple)) else [data]
    views = [memoryview(part).cast("B") for part in parts]
    return tmp, views, sum(len(v) for v in views)


def atomic_write_bytes(
    path: str | os.PathLike, data, *, fsync: bool = True, sync_dir: bool | None = None
) -> int:
    """Write ``data`` (bytes, or a list of buffers written back to back without joining) to ``path`` so that
    ``path`` is either absent/old or complete. Returns bytes written.

    ``fsync``: the file's data is on disk before the rename. ``sync_dir`` (default: ``fsync``): fsync the
    directory after the rename, so the new name survives a power cut. A caller writing many files may pass
    False and fsync the directory once for a batch before it records the batch in the manifest (the same
    guarantee: a manifest line only names a durable file); it was no faster than a directory fsync per file
    where measured (bench/write_path.py, docs/performance.md), so the extraction's writer keeps one per file
    unless told otherwise. With ``fsync``, the module options WRITEBACK_CHUNK,
    WRITEBACK_WAIT, PREALLOCATE and DATASYNC change how the bytes get to disk, not the guarantee."""
    path = Path(path)
    tmp, views, total = _temp_and_views(path, data)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        e.filename = str(path)  # the file the caller asked for, not our temp name
        raise
    try:
        if fsync and PREALLOCATE:
            _preallocate(fd, total)
        _write_views(fd, views, WRITEBACK_CHUNK if fsync else 0, WRITEBACK_WAIT)
        if fsync:
            _sync_data(fd)
    except BaseException as e:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # os.write names no file: say which one (eagle3ops.cli prints it)
        raise
    os.close(fd)
    os.replace(tmp, path)
    if fsync if sync_dir is None else sync_dir:
        fsync_dir(path.parent)
    return total


def atomic_write_many(items, *, fsync: bool = True, sync_dir: bool | None = None) -> list[int]:
    """:func:`atomic_write_bytes` for several files at once, with the same guarantee for each (a file's bytes are
    durable before its rename; with ``sync_dir``, default ``fsync``, the renames are durable before this returns)
    but in two passes: first every file is written to a temp file and its writeback started without waiting
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, Linux; skipped where unsupported), then each is fsynced and renamed
    in order, then each directory fsynced once. ``items``: ``(path, data)`` pairs; returns the bytes written per
    file. On an error every temp file not yet renamed is removed; files already renamed stay (complete and
    fsynced, without a manifest line: the store adopts them on the next plan). An OSError names the file."""
    sfr = _sync_file_range() if fsync else None
    pending: list[list] = []  # [fd or -1, tmp path or None, final path, size]
    current = None
    try:
        for path, data in items:
            current = path = Path(path)
            tmp, views, total = _temp_and_views(path, data)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            pending.append([fd, tmp, path, total])
            if fsync and PREALLOCATE:
                _preallocate(fd, total)
            _write_views(fd, views, 0, False)
            if sfr is not None:
                try:
                    sfr(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # 0 bytes = to the end of the file; does not wait
                except OSError as e:
                    if e.errno not in _UNSUPPORTED:
                        raise
                    sfr = None  # not supported on this file system: the fsyncs below do all the work
        for entry in pending:
            fd, tmp, current, _ = entry
            if fsync:
                _sync_data(fd)
            entry[0] = -1
            os.close(fd)
            os.replace(tmp, current)
            entry[1] = None
    except BaseException as e:
        for fd, tmp, _, _ in pending:
            if fd >= 0:
                os.close(fd)
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None and current is not None:
            e.filename = str(current)
        raise
    if fsync if sync_dir is None else sync_dir:
        for d in dict.fromkeys(entry[2].parent for entry in pending):
            fsync_dir(d)
    return [entry[3] for entry in pending]
