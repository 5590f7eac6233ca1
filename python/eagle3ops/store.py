"""The crash-safe hidden-state store.

Layout of a data directory (the speculators 0.9.0 offline contract, plus our bookkeeping)::

    DATA/                      Arrow dataset (input_ids, loss_mask, seq_len), from `prepare`
    DATA/hidden_states/hs_{i}.safetensors      one per Arrow row i: token_ids [T] int64,
                                               hidden_states [T, K+1, H] (K aux, then pre-norm last)
    DATA/hidden_states/extract_meta.json       what the files are (model, layer ids, H, dtype)
    DATA/hidden_states/manifest-rank{r}.jsonl  append-only, one line per finished sample

Guarantees:
- A file appears under its final name only complete: written to ``.hs_{i}.safetensors.<pid>.tmp``,
  fsynced, then ``os.replace``d (atomic on POSIX), then the directory is fsynced.
- The manifest is the source of truth for resume. A line is appended only after its file is renamed,
  so a manifest line always names a complete file. A torn last line (kill -9 mid-append) is ignored.
- Resume never loads tensors: remaining = all rows - manifest rows - (files not in the manifest whose
  safetensors *header* matches the expected shape; those are adopted into the manifest).
- Lengths (the seed's ``sample_lengths.json``) come from the manifest for free.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shutil
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops.durable import fsync_dir

HS_DIR = "hidden_states"
DAMAGED_DIR = "damaged"  # hidden_states/damaged/: files the checks found damaged, moved aside (never deleted)
VERIFY_LEVELS = ("size", "checksum")
META_NAME = "extract_meta.json"
MANIFEST_GLOB = "manifest-rank*.jsonl"
_FILE_RE = re.compile(r"^hs_(\d+)\.safetensors$")
# temp files of atomic_write_bytes in hidden_states/: ".{final name}.{pid}.{thread}.tmp"
_TMP_RE = re.compile(
    r"^\.(?:hs_\d+\.safetensors|extract_meta\.json|manifest-rank\d+\.jsonl)\.(?:(\d+)\.)?.*\.tmp$"
)

FP8_DTYPE = "float8_e4m3fn"
FP8_SCALES_KEY = "hidden_states_scales"  # hs_connectors 0.9.0 fp8_utils.SCALES_KEY
# bytes per element for the dtypes we write
DTYPE_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
_ST_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F8_E4M3": "float8_e4m3fn",
    "I64": "int64",
}


class StoreError(RuntimeError):
    """A problem with the store that the user must act on; the message says what to do."""


class DiskSpaceError(StoreError):
    """Not enough free space for what is left to write."""


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers cannot be in flight: we clean before we write
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------- durable-write options ----------
# Module-level so bench/write_path.py can A/B them in one process; the environment variables set them for a run.
# None of them changes the guarantee: with ``fsync`` a file's bytes are durable before its rename, and the rename
# is durable (directory fsync) before atomic_write_bytes returns. BATCH_SYNC (the extraction writer's scheme) is on
# by default since it won on the H200 box's NVMe; the others are off (no measurable win there or on this project's
# VM disk: bench/write_path.py, docs/performance.md).


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
#: On by default: 1.42x the extraction throughput of one file in flight per thread on the H200 box's NVMe
#: (docs/performance.md); ``EAGLE3OPS_BATCH_SYNC=0`` turns it off.
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


def _crc32(payload) -> int:
    crc = 0
    for part in payload if isinstance(payload, (list, tuple)) else [payload]:
        crc = zlib.crc32(part, crc)
    return crc


def _xxh3():
    """A new xxh3-64 hasher, or None where the ``xxhash`` package (a dependency of ``datasets``) is missing."""
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash.xxh3_64()


def content_hash(payload) -> tuple[str, int]:
    """``("h", xxh3-64)`` of ``payload`` (bytes or a list of buffers, hashed back to back without joining), or
    ``("c", crc32)`` without xxhash. xxh3 runs at memory speed (several GB/s per core, GIL released) where zlib's
    crc32 managed ~0.6-1 GB/s on the 2-core box: the writer threads compute it over the bytes they already hold
    (docs/performance.md, "Content checksum")."""
    h = _xxh3()
    if h is None:
        return "c", _crc32(payload)
    for part in payload if isinstance(payload, (list, tuple)) else [payload]:
        h.update(part)
    return "h", h.intdigest()


def file_hashes(path: str | os.PathLike, kinds: set[str], on_bytes=None, chunk: int = 8 << 20) -> dict:
    """Re-read ``path`` once and return ``{kind: value}`` for ``kinds`` (``"h"`` xxh3-64, ``"c"`` crc32);
    ``on_bytes(n)`` is called per chunk read (progress)."""
    h = _xxh3() if "h" in kinds else None
    crc = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            part = view[:n]
            if h is not None:
                h.update(part)
            if "c" in kinds:
                crc = zlib.crc32(part, crc)
            if on_bytes is not None:
                on_bytes(n)
    out = {}
    if h is not None:
        out["h"] = h.intdigest()
    if "c" in kinds:
        out["c"] = crc
    return out


def atomic_write_bytes(
    path: str | os.PathLike, data, *, fsync: bool = True, sync_dir: bool | None = None
) -> int:
    """Write ``data`` (bytes, or a list of buffers written back to back without joining) to ``path`` so that
    ``path`` is either absent/old or complete. Returns bytes written.

    ``fsync``: the file's data is on disk before the rename. ``sync_dir`` (default: ``fsync``): fsync the
    directory after the rename, so the new name survives a power cut. A caller writing many files may pass
    False and fsync the directory once for a batch before it records the batch in the manifest (the same
    guarantee: a manifest line only names a durable file); measured on this project's VM disk that was
    *slower* than a directory fsync per file (bench/write_path.py, docs/performance.md), so the extraction's
    writer keeps one per file unless told otherwise. With ``fsync``, the module options WRITEBACK_CHUNK,
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


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_safetensors_header(path: str | os.PathLike) -> dict:
    """Read only the JSON header of a safetensors file (no tensor bytes). Raises ValueError if invalid."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("file shorter than the 8-byte safetensors header length")
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 1024 * 1024 or 8 + n > size:
            raise ValueError(f"header length {n} does not fit in a {size}-byte file")
        header = json.loads(f.read(n))
    data_len = size - 8 - n
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if end != data_len:
        raise ValueError(f"tensor data covers {end} bytes but the file holds {data_len} (truncated?)")
    return header


@dataclass(frozen=True)
class ManifestEntry:
    """One finished sample: ``i`` index, ``n`` seq_len, ``b`` file size in bytes, ``r`` rank, and the content
    checksum of the whole file when the writer computed one: ``h`` xxh3-64 (new lines) or ``c`` crc32 (older)."""

    index: int
    seq_len: int
    nbytes: int
    crc32: int | None = None
    rank: int = 0
    xxh3: int | None = None
    ctime_ns: int | None = None  # the file's st_ctime_ns right after its rename (``t``)

    def to_line(self) -> str:
        d = {"i": self.index, "n": self.seq_len, "b": self.nbytes, "r": self.rank}
        if self.crc32 is not None:
            d["c"] = self.crc32
        if self.xxh3 is not None:
            d["h"] = self.xxh3
        if self.ctime_ns is not None:
            d["t"] = self.ctime_ns
        return json.dumps(d, separators=(",", ":")) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> ManifestEntry:
        return cls(
            int(d["i"]), int(d["n"]), int(d["b"]), d.get("c"), int(d.get("r", 0)), d.get("h"), d.get("t")
        )

    @property
    def checksums(self) -> dict:
        out = {}
        if self.xxh3 is not None:
            out["h"] = self.xxh3
        if self.crc32 is not None:
            out["c"] = self.crc32
        return out


def _ctime_ns(path) -> int | None:
    try:
        return os.stat(path).st_ctime_ns
    except OSError:
        return None


def _entry(index: int, seq_len: int, nbytes: int, payload, checksum: bool, rank: int, path) -> ManifestEntry:
    """The manifest entry of a file just renamed into place: size, content checksum, inode change time."""
    t = _ctime_ns(path)
    if not checksum:
        return ManifestEntry(index, seq_len, nbytes, None, rank, None, t)
    kind, value = content_hash(payload)
    if kind == "h":
        return ManifestEntry(index, seq_len, nbytes, None, rank, value, t)
    return ManifestEntry(index, seq_len, nbytes, value, rank, None, t)


@dataclass
class ManifestScan:
    """Finished samples recorded in the manifests. ``entries`` (index -> ManifestEntry) is built on first use:
    resume planning needs only :meth:`indices`, and building 100k entry objects was half its time."""

    torn_lines: list[str] = field(default_factory=list)  # "file:line" of ignored partial lines
    lines: int = 0  # valid lines read (duplicates included)
    _parsed: dict[int, ManifestEntry] = field(default_factory=dict, repr=False)
    _pending: list[list[dict]] = field(default_factory=list, repr=False)  # validated rows, file order
    _all_indices: list[list[int]] = field(default_factory=list, repr=False)  # every line's index, file order

    def duplicates(self) -> dict[int, int]:
        """Index -> number of lines, for every index recorded more than once (older runs that wrote a row
        twice, e.g. two runs on one directory). The last line wins everywhere; a rewrite keeps only it."""
        if self.lines == len(self.indices()):
            return {}
        from collections import Counter

        c = Counter(i for chunk in self._all_indices for i in chunk)
        return {i: n for i, n in sorted(c.items()) if n > 1}

    @property
    def entries(self) -> dict[int, ManifestEntry]:
        self._materialise()
        return self._parsed

    def rows(self) -> dict[int, dict]:
        """Index -> the winning manifest line as a dict (``i``, ``n``, ``b``, ``r``, optional ``h``/``c``), without
        building entry objects (what the disk check reads: 10x cheaper than :attr:`entries` at 100k lines)."""
        out: dict[int, dict] = {}
        for e in self._parsed.values():
            out[e.index] = {
                "i": e.index,
                "n": e.seq_len,
                "b": e.nbytes,
                "r": e.rank,
                "h": e.xxh3,
                "c": e.crc32,
                "t": e.ctime_ns,
            }
        for rows in self._pending:  # later files win, as in _materialise (pending rows come after _parsed)
            for d in rows:
                out[d["i"]] = d
        return out

    def indices(self) -> set[int]:
        """Indices of every finished sample (no entry objects built)."""
        out = set(self._parsed)
        for rows in self._pending:
            out.update(d["i"] for d in rows)
        return out

    def _materialise(self) -> None:
        for rows in self._pending:
            for d in rows:
                self._parsed[d["i"]] = ManifestEntry(
                    d["i"], d["n"], d["b"], d.get("c"), d.get("r", 0), d.get("h"), d.get("t")
                )
        self._pending.clear()


def _parse_manifest_file(path: Path, scan: ManifestScan) -> None:
    with open(path, "rb") as f:
        data = f.read()
    # Fast path (one C-level json parse of the whole file instead of one json.loads per line: 6x faster at
    # 100k lines, see docs/performance.md "Resume"); any torn or odd line falls back to the line-by-line path.
    body = data.rstrip(b"\n")
    if body and data.endswith(b"\n") and b"\n\n" not in body:
        try:
            rows = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
            ok = all(
                type(d["i"]) is int
                and type(d["n"]) is int
                and type(d["b"]) is int
                and type(d.get("r", 0)) is int
                for d in rows
            )
        except (ValueError, KeyError, TypeError):
            ok = False
        if ok:
            scan._pending.append(rows)
            scan.lines += len(rows)
            scan._all_indices.append([d["i"] for d in rows])
            return
    scan._materialise()  # keep file order: a later file's line wins
    lines = data.split(b"\n")
    # the last element is b"" when the file ends in a newline; anything else is a torn tail
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        complete = lineno < len(lines)  # followed by a newline
        try:
            d = json.loads(raw)
            entry = ManifestEntry.from_dict(d)
        except (ValueError, KeyError, TypeError) as e:
            if complete and lineno < len(lines) - 1:
                raise StoreError(
                    f"{path}:{lineno}: corrupt manifest line in the middle of the file ({e}). "
                    "Move the file aside and re-run: files not in a manifest are re-validated by header."
                ) from e
            scan.torn_lines.append(f"{path}:{lineno}")
            continue
        scan._parsed[entry.index] = entry
        scan.lines += 1
        scan._all_indices.append([entry.index])


META_KEYS = ("layer_ids", "hidden_size", "dtype", "num_layers", "model_fingerprint", "dataset_fingerprint")
MODEL_CHANGE_ACTIONS = ("refuse", "discard", "accept")


class ModelChangedError(StoreError):
    """The target model differs from the one a store's hidden states came from."""


def weight_changes(old: dict, new: dict) -> list[str]:
    """What changed in the target's weight files between two metas (``model_weights``: name -> [size, mtime_ns,
    header digest]; ``model_content_hash``: name -> full-content digest, only when asked for). Only what both
    metas record is compared (a meta from before these facts compares by ``model_fingerprint`` alone). Matching
    content hashes win over changed timestamps (a copy with new mtimes is the same model)."""
    ow, nw = old.get("model_weights"), new.get("model_weights")
    oc, nc = old.get("model_content_hash"), new.get("model_content_hash")
    if isinstance(oc, dict) and isinstance(nc, dict) and oc.get("algo") == nc.get("algo"):
        of, nf = oc.get("files") or {}, nc.get("files") or {}
        return [f"{n}: content differs" for n in sorted(set(of) | set(nf)) if of.get(n) != nf.get(n)]
    if not isinstance(ow, dict) or not isinstance(nw, dict):
        return []
    out = []
    for name in sorted(set(ow) | set(nw)):
        a, b = ow.get(name), nw.get(name)
        if a is None or b is None:
            out.append(f"{name}: {'added' if a is None else 'removed'}")
            continue
        what = []
        if a[0] != b[0]:
            what.append(f"size {a[0]} -> {b[0]}")
        if a[2] != b[2]:
            what.append("safetensors header differs")
        if a[1] != b[1]:
            what.append(
                f"modified {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(b[1] / 1e9))}, recorded "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(a[1] / 1e9))}"
            )
        if what:
            out.append(f"{name}: {', '.join(what)}")
    return out


def meta_decision(
    old: dict, new: dict, meta_path, on_model_change: str = "refuse"
) -> tuple[str, dict | None]:
    """Compare a store's recorded meta with a run's: ``("ok", None)``, ``("update", meta to write)`` (migration
    of an older meta, new weight facts the user accepted or a content hash proved the same) or ``("discard",
    None)``; raises StoreError (ModelChangedError for the model) when the run must not resume into the store."""
    if on_model_change not in MODEL_CHANGE_ACTIONS:
        raise StoreError(f"on_model_change {on_model_change!r}: use one of {', '.join(MODEL_CHANGE_ACTIONS)}")
    diff = {k: (old.get(k), new.get(k)) for k in META_KEYS if old.get(k) != new.get(k)}
    model_diff = diff.pop("model_fingerprint", None)
    weights = weight_changes(old, new)
    if diff:
        details = ", ".join(f"{k}: stored {a!r} vs requested {b!r}" for k, (a, b) in diff.items())
        raise StoreError(
            f"{meta_path}: this store holds hidden states made with different settings ({details}). "
            "Resuming would mix incompatible samples. Use a new data directory, or move "
            f"{Path(meta_path).parent} aside to start over."
        )
    if model_diff or weights:
        if on_model_change == "discard":
            return "discard", None
        if on_model_change == "accept" and not model_diff:
            return "update", _merged_meta(old, new)
        what = "; ".join(weights) if weights else "config.json or the weight files' names/sizes differ"
        raise ModelChangedError(
            f"{meta_path}: the target model changed since these hidden states were extracted from "
            f"{old.get('model_path') or 'it'} ({what}). Resuming would mix two models' states. To start over, "
            "use a fresh data directory (--data / extract_data_dir) or --on-model-change discard "
            "(extract_on_model_change: discard; the old states are moved aside to hidden_states.old-<time>). "
            "To keep the old store, put the old weights back"
            + (
                ""
                if model_diff
                else "; if the weights are the same files copied with new timestamps, "
                "--model-hash (extract_model_hash: true) compares their content, or --on-model-change accept "
                "records them as they are now"
            )
            + "."
        )
    merged = _merged_meta(old, new)
    return ("update", merged) if merged != old else ("ok", None)


def _merged_meta(old: dict, new: dict) -> dict:
    """``old`` with the weight facts of ``new`` (what a migrated or accepted meta records)."""
    merged = dict(old)
    for k in ("model_weights", "model_content_hash"):
        if new.get(k) is not None:
            merged[k] = new[k]
    return merged


class HiddenStateStore:
    """Reads and writes one data directory's ``hidden_states/`` folder."""

    def __init__(self, data_dir: str | os.PathLike, rank: int = 0):
        self.data_dir = Path(data_dir)
        self.dir = self.data_dir / HS_DIR
        self.rank = rank
        self._manifest_fh = None
        self._dir_ready = False
        self._lock = threading.Lock()

    # ---------- paths ----------
    def path(self, index: int) -> Path:
        return self.dir / f"hs_{index}.safetensors"

    @property
    def meta_path(self) -> Path:
        return self.dir / META_NAME

    def manifest_path(self, rank: int | None = None) -> Path:
        return self.dir / f"manifest-rank{self.rank if rank is None else rank}.jsonl"

    # ---------- metadata ----------
    def read_meta(self) -> dict | None:
        if not self.meta_path.exists():
            return None
        return json.loads(self.meta_path.read_text())

    def ensure_meta(self, meta: dict, *, on_model_change: str = "refuse") -> str | None:
        """Record what this store holds; refuse to mix states from a different model/layers/dtype.

        ``on_model_change``: what to do when the target model differs from the one the states came from
        (:func:`meta_decision`): ``refuse`` (default), ``discard`` (move ``hidden_states/`` aside, never delete,
        and start over; returns where it went) or ``accept`` (the weights' timestamps/headers changed but the
        user says it is the same model: record the new facts and resume). A meta written before the weight facts
        existed is migrated (they are added) when everything it does record matches."""
        self.dir.mkdir(parents=True, exist_ok=True)
        old = self.read_meta()
        if old is None:
            atomic_write_json(self.meta_path, meta)
            return None
        action, merged = meta_decision(old, meta, self.meta_path, on_model_change)
        if action == "discard":
            moved = self.discard()
            atomic_write_json(self.meta_path, meta)
            return moved
        if action == "update":
            atomic_write_json(self.meta_path, merged)
        return None

    def discard(self) -> str:
        """Move this store's ``hidden_states/`` aside to ``hidden_states.old-<time>`` (never deleted) and recreate
        it empty. Returns the new place of the old states."""
        self.close()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest = self.data_dir / f"{HS_DIR}.old-{stamp}"
        k = 1
        while dest.exists():
            dest = self.data_dir / f"{HS_DIR}.old-{stamp}.{k}"
            k += 1
        os.rename(self.dir, dest)
        self.dir.mkdir()
        fsync_dir(self.data_dir)
        self._dir_ready = True
        return str(dest)

    # ---------- manifest ----------
    def _listdir(self) -> list[str]:
        try:
            return os.listdir(self.dir)
        except FileNotFoundError:
            return []

    def scan_manifest(self, names: list[str] | None = None) -> ManifestScan:
        """Parse every ``manifest-rank*.jsonl`` (``names``: a listing of :attr:`dir` the caller already has;
        a 100k-file directory costs 0.1-0.2 s to list and glob.glob walked it in Python, 0.3-0.6 s more)."""
        scan = ManifestScan()
        names = self._listdir() if names is None else names
        for n in sorted(n for n in names if n.startswith("manifest-rank") and n.endswith(".jsonl")):
            _parse_manifest_file(self.dir / n, scan)
        return scan

    def open_manifest(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.manifest_path()
        # Repair a torn tail first so our first line does not glue onto it.
        if path.exists() and path.stat().st_size:
            with open(path, "rb+") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    data = path.read_bytes()
                    keep = data.rfind(b"\n") + 1
                    f.truncate(keep)
        # unbuffered: a failed append leaves nothing in a buffer for close() to retry (and fail on) later
        self._manifest_fh = open(path, "ab", buffering=0)  # noqa: SIM115 - long-lived append handle

    def append_manifest(self, entries: Iterable[ManifestEntry], *, fsync: bool = False) -> None:
        """Append whole lines (one write per call, under a lock: safe from several writer threads). On an
        I/O error (a full disk) the part of the lines that got out is cut off again, so no torn line is left,
        and the error names the manifest."""
        with self._lock:
            if self._manifest_fh is None:
                self.open_manifest()
            fh = self._manifest_fh
            data = memoryview("".join(e.to_line() for e in entries).encode())
            before = os.fstat(fh.fileno()).st_size
            try:
                while data:
                    data = data[fh.write(data) :]
                if fsync:
                    os.fsync(fh.fileno())
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.ftruncate(fh.fileno(), before)
                if e.filename is None:
                    e.filename = str(self.manifest_path())
                raise

    def close(self) -> None:
        if self._manifest_fh is not None:
            fh, self._manifest_fh = self._manifest_fh, None
            try:
                os.fsync(fh.fileno())
            except OSError as e:
                if e.filename is None:
                    e.filename = str(self.manifest_path())
                raise
            finally:
                fh.close()

    # ---------- writing samples ----------
    def write_sample(
        self,
        index: int,
        payload,
        seq_len: int,
        *,
        fsync: bool = True,
        checksum: bool = True,
        sync_dir: bool | None = None,
    ) -> ManifestEntry:
        """Atomically write one serialized safetensors payload (bytes or a list of buffers, e.g.
        :func:`eagle3ops.extract.sample_parts`); returns its (not yet appended) manifest entry.
        ``sync_dir=False``: the caller fsyncs :attr:`dir` itself before appending the entry (see
        :func:`atomic_write_bytes`)."""
        self._ensure_dir()
        nbytes = atomic_write_bytes(self.path(index), payload, fsync=fsync, sync_dir=sync_dir)
        return _entry(index, seq_len, nbytes, payload, checksum, self.rank, self.path(index))

    def _ensure_dir(self) -> None:
        if not self._dir_ready:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._dir_ready = True

    def write_samples(
        self, samples, *, fsync: bool = True, checksum: bool = True, sync_dir: bool | None = None
    ) -> list[ManifestEntry]:
        """:meth:`write_sample` for a batch through :func:`atomic_write_many` (all of the batch's files in flight
        at once, one directory fsync). ``samples``: ``(index, payload, seq_len)`` triples; returns their (not yet
        appended) manifest entries, in order."""
        samples = list(samples)
        self._ensure_dir()
        sizes = atomic_write_many(
            [(self.path(i), payload) for i, payload, _ in samples], fsync=fsync, sync_dir=sync_dir
        )
        return [
            _entry(index, seq_len, nbytes, payload, checksum, self.rank, self.path(index))
            for (index, payload, seq_len), nbytes in zip(samples, sizes, strict=True)
        ]

    def clean_temp_files(self) -> list[str]:
        """Remove temp files left by a killed writer (never a final-name file, never the temp file of a
        writer process that is still alive, e.g. another rank's)."""
        removed = []
        if self.dir.exists():
            for name in os.listdir(self.dir):
                m = _TMP_RE.match(name)
                if not m or (m.group(1) and _pid_alive(int(m.group(1)))):
                    continue
                (self.dir / name).unlink(missing_ok=True)
                removed.append(name)
        return removed

    # ---------- resume ----------
    def existing_files(self) -> Iterator[int]:
        if not self.dir.exists():
            return
        # listdir + string tests: 3x cheaper than scandir + a regex per name at 100k files
        for name in os.listdir(self.dir):
            if name.startswith("hs_") and name.endswith(".safetensors"):
                num = name[3:-12]
                if num.isdigit() and num.isascii():
                    yield int(num)

    def validate_header(
        self, index: int, seq_len: int, num_states: int, hidden_size: int, dtype: str
    ) -> str | None:
        """None when the file's header matches the expected sample, else the reason it does not."""
        try:
            h = read_safetensors_header(self.path(index))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"unreadable safetensors header ({e})"
        hs, tok = h.get("hidden_states"), h.get("token_ids")
        if not hs or not tok:
            return "missing hidden_states or token_ids"
        if hs["shape"] != [seq_len, num_states, hidden_size]:
            return f"hidden_states shape {hs['shape']} != {[seq_len, num_states, hidden_size]}"
        if _ST_DTYPES.get(hs["dtype"]) != dtype:
            return f"hidden_states dtype {hs['dtype']} != {dtype}"
        if dtype == FP8_DTYPE:
            sc = h.get(FP8_SCALES_KEY)
            if not sc or sc["dtype"] != "F32" or sc["shape"] != [seq_len, num_states, 1]:
                got = f"{sc['dtype']}{sc['shape']}" if sc else "missing"
                return f"{FP8_SCALES_KEY} {got} != F32[{seq_len}, {num_states}, 1]"
        if tok["shape"] != [seq_len] or tok["dtype"] != "I64":
            return f"token_ids {tok['dtype']}{tok['shape']} != I64[{seq_len}]"
        return None

    def check_files(
        self,
        rows: Iterable[dict],
        seq_lens,
        *,
        num_states: int,
        hidden_size: int,
        dtype: str,
        level: str = "size",
    ) -> tuple[dict[int, str], int]:
        """Check finished samples against the disk. ``rows``: manifest lines as dicts (``i`` index, ``b`` size,
        optional ``h``/``c`` checksums: :meth:`ManifestScan.rows`). ``level="size"`` (cheap, no tensor bytes
        read): the file exists, its size is the one the manifest recorded, its safetensors header matches the
        row (shape, dtype, byte coverage; compared byte for byte with the header our writer makes, parsed only
        when it differs). ``level="checksum"``: also re-read the whole file and compare its content checksum with
        the manifest's (lines without one, e.g. adopted files, are counted as unchecked). ``seq_lens[i]``: the
        row's expected length. Returns (index -> reason for every damaged or missing file, files without a
        checksum). At 100k files this is one open/fstat/read/close each: bench/resume_plan.py."""
        if level not in VERIFY_LEVELS:
            raise StoreError(f"verify level {level!r}: use one of {', '.join(VERIFY_LEVELS)}")
        damaged: dict[int, str] = {}
        unchecked = 0
        expected: dict[int, tuple[bytes, int]] = {}
        d = str(self.dir)
        checksum = level == "checksum"
        os_stat, os_open, os_read, os_close, rdonly = os.stat, os.open, os.read, os.close, os.O_RDONLY
        for r in rows:
            i = r["i"]
            nb = r["b"]
            n = seq_lens[i]
            path = f"{d}/hs_{i}.safetensors"
            try:
                st = os_stat(path)
            except FileNotFoundError:
                damaged[i] = "missing (the manifest lists it, the file is gone)"
                continue
            except OSError as err:
                damaged[i] = f"cannot be read ({err.strerror})"
                continue
            size = st.st_size
            if size != nb:
                damaged[i] = (
                    "zero-length file" if size == 0 else f"{size} bytes, the manifest recorded {nb}"
                ) + (" (truncated)" if 0 < size < nb else "")
                continue
            # The header is read unless the inode is provably untouched since its writer made it: its change
            # time is the one recorded right after the rename (any write, truncate, chmod or replacement sets
            # ctime to now, and no system call sets it back). A copy (storage migration, backup restore) has new
            # ctimes, so its files are read and compared every time, as are lines without ``t``.
            if r.get("t") is None or st.st_ctime_ns != r["t"]:
                exp = expected.get(n)
                if exp is None:
                    exp = expected[n] = sample_header(n, num_states, hidden_size, dtype)
                try:
                    fd = os_open(path, rdonly)
                    try:
                        head = os_read(fd, len(exp[0]))
                    finally:
                        os_close(fd)
                except OSError as err:
                    damaged[i] = f"cannot be read ({err.strerror})"
                    continue
                if head != exp[0] or size != exp[1]:  # another writer's header layout: parse and compare
                    reason = self.validate_header(i, n, num_states, hidden_size, dtype)
                    if reason is not None:
                        damaged[i] = reason
                        continue
            if checksum:
                want = {k: r[k] for k in ("h", "c") if r.get(k) is not None}
                if not want:
                    unchecked += 1
                    continue
                try:
                    got = file_hashes(path, set(want))
                except OSError as err:
                    damaged[i] = f"cannot be read ({err.strerror})"
                    continue
                if got != want:
                    damaged[i] = "content checksum differs from the manifest's (bytes changed on disk)"
        return damaged, unchecked

    def quarantine(self, damaged: dict[int, str]) -> list[dict]:
        """Move damaged sample files aside into ``hidden_states/damaged/`` (never deleted; a name taken by an
        earlier one gets ``.1``, ``.2``, ...), log each one in ``damaged/damaged.jsonl``, and drop their manifest
        entries. Files first, then the manifests: a kill in between leaves entries whose file is gone, which the
        next plan finds missing and drops. Returns one record per index (``moved_to`` None when nothing was there)."""
        if not damaged:
            return []
        ddir = self.dir / DAMAGED_DIR
        ddir.mkdir(exist_ok=True)
        records = []
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        for i, reason in sorted(damaged.items()):
            src = self.path(i)
            dest = None
            if os.path.lexists(src):
                dest = ddir / src.name
                k = 1
                while os.path.lexists(dest):
                    dest = ddir / f"hs_{i}.{k}.safetensors"
                    k += 1
                os.rename(src, dest)
            records.append(
                {"index": i, "file": str(src), "reason": reason, "moved_to": dest and str(dest), "time": now}
            )
        fsync_dir(ddir)
        fsync_dir(self.dir)
        with open(ddir / "damaged.jsonl", "a") as f:
            f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())
        self.rewrite_manifests(set(damaged))
        return records

    def rewrite_manifests(self, drop: set[int] = frozenset()) -> int:
        """Rewrite the manifests without the entries of ``drop`` and with one line per index (the one that wins
        on read: the last, in file order); torn lines go too. Each file is replaced atomically (temp, fsync,
        rename, directory fsync), and only the losing lines of a duplicate are dropped, so a kill between two
        files leaves a store that reads the same. Only for a process that owns the directory (one run, before
        its workers start): another process appending to a manifest meanwhile would lose its lines. Returns the
        number of lines removed."""
        self.close()  # our append handle would point at the replaced file
        files = sorted(
            self.dir / n for n in self._listdir() if n.startswith("manifest-rank") and n.endswith(".jsonl")
        )
        parsed: list[tuple[Path, list[tuple[int, int | None, bytes]]]] = []
        last: dict[int, tuple[int, int]] = {}
        for fi, path in enumerate(files):
            rows = []
            for li, raw in enumerate(path.read_bytes().split(b"\n")):
                if not raw.strip():
                    continue
                try:
                    idx = ManifestEntry.from_dict(json.loads(raw)).index
                except (ValueError, KeyError, TypeError):
                    idx = None  # torn or corrupt: ignored on read, dropped here
                rows.append((li, idx, raw))
                if idx is not None:
                    last[idx] = (fi, li)
            parsed.append((path, rows))
        removed = 0
        for fi, (path, rows) in enumerate(parsed):
            keep = [
                raw
                for li, idx, raw in rows
                if idx is not None and idx not in drop and last.get(idx) == (fi, li)
            ]
            if len(keep) == len(rows):
                continue
            removed += len(rows) - len(keep)
            atomic_write_bytes(path, b"".join(r + b"\n" for r in keep), sync_dir=False)
        if removed:
            fsync_dir(self.dir)
        return removed

    def plan(
        self,
        seq_lens: list[int],
        *,
        num_states: int,
        hidden_size: int,
        dtype: str,
        indices: Iterable[int] | None = None,
        adopt: bool = True,
        verify: str | None = "size",
        repair: bool | None = None,
    ) -> ResumePlan:
        """Work out what is left to do from the manifest (+ header check of unlisted files).

        ``verify``: every manifest entry of ``indices`` is checked against the disk first (:meth:`check_files`,
        ``size`` or ``checksum``; None trusts the manifest). A damaged or missing file counts as not done.
        ``repair`` (default: ``adopt``): move damaged files aside, drop their entries and collapse duplicate
        manifest lines (:meth:`quarantine`, :meth:`rewrite_manifests`); without it nothing is changed on disk."""
        repair = adopt if repair is None else repair
        names = self._listdir()  # listed once: manifests and unlisted sample files come from it
        scan = self.scan_manifest(names)
        done = scan.indices()
        wanted = range(len(seq_lens)) if indices is None else indices
        wanted_set = set(wanted)
        damaged: dict[int, str] = {}
        unchecked = 0
        if verify:
            rows = scan.rows()
            listed = wanted_set & done
            damaged, unchecked = self.check_files(
                [rows[i] for i in sorted(listed)],
                seq_lens,
                num_states=num_states,
                hidden_size=hidden_size,
                dtype=dtype,
                level=verify,
            )
        duplicates = scan.duplicates()
        moved: list[dict] = []
        if repair and damaged:
            moved = self.quarantine(damaged)  # rewrites the manifests too (duplicates collapse)
        elif repair and duplicates:
            self.rewrite_manifests()
        done = done - set(damaged)
        adopted: list[ManifestEntry] = []
        invalid: dict[int, str] = {}
        missing = wanted_set - done
        present = set(names) if missing else set()
        for i in sorted(missing):  # a file under its final name but not in a manifest: check its header
            if i in damaged or f"hs_{i}.safetensors" not in present:
                continue  # a damaged file is redone, never adopted (its header may be fine, its bytes not)
            reason = self.validate_header(i, seq_lens[i], num_states, hidden_size, dtype)
            if reason is None:
                adopted.append(self._adopted_entry(i, seq_lens[i], checksum=adopt))
            else:
                invalid[i] = reason
        if adopt and adopted:
            self.append_manifest(adopted, fsync=True)
        done_set = set(done) | {e.index for e in adopted}
        remaining = [i for i in wanted if i not in done_set]
        return ResumePlan(
            remaining=remaining,
            done=len(wanted_set & done_set),
            adopted=len(adopted),
            invalid=invalid,
            torn_lines=scan.torn_lines,
            bytes_needed=sum(sample_nbytes(seq_lens[i], num_states, hidden_size, dtype) for i in remaining),
            tokens_remaining=sum(seq_lens[i] for i in remaining),
            damaged=damaged,
            moved_aside=moved,
            duplicates=sum(n - 1 for n in duplicates.values()),
            unchecked=unchecked,
        )

    def _adopted_entry(self, index: int, seq_len: int, *, checksum: bool) -> ManifestEntry:
        """The entry of a complete file whose manifest line was lost (killed between rename and append). Its
        bytes were fsynced before the rename, so their checksum now is the writer's; with ``checksum`` (a real
        run; a read-only plan does not record it) it is read back once, so the checksum level covers it too."""
        path = self.path(index)
        st = os.stat(path)
        h = file_hashes(path, {"h"}).get("h") if checksum and _xxh3() is not None else None
        return ManifestEntry(index, seq_len, st.st_size, None, self.rank, h, st.st_ctime_ns)

    def lengths(self) -> dict[int, int]:
        """Index -> seq_len of every finished sample, from the manifest alone."""
        return {i: e.seq_len for i, e in self.scan_manifest().entries.items()}


@dataclass
class ResumePlan:
    remaining: list[int]
    done: int
    adopted: int
    invalid: dict[int, str]
    torn_lines: list[str]
    bytes_needed: int
    tokens_remaining: int
    damaged: dict[int, str] = field(default_factory=dict)  # index -> why (found by the verify check)
    moved_aside: list[dict] = field(default_factory=list)  # what quarantine() did with them
    duplicates: int = 0  # surplus manifest lines (same index more than once)
    unchecked: int = 0  # checksum level: files whose manifest line has no checksum


@functools.lru_cache(maxsize=4096)
def header_overhead(seq_len: int, num_states: int, hidden_size: int, scales: bool = False) -> int:
    """Upper bound of the safetensors header size for one sample (JSON, padded to 8 bytes)."""
    entries = {
        "hidden_states": {
            "dtype": "BF16",
            "shape": [seq_len, num_states, hidden_size],
            "data_offsets": [0, 10**12],
        },
        "token_ids": {"dtype": "I64", "shape": [seq_len], "data_offsets": [10**12, 10**12]},
    }
    if scales:
        entries[FP8_SCALES_KEY] = {
            "dtype": "F32",
            "shape": [seq_len, num_states, 1],
            "data_offsets": [10**12] * 2,
        }
    return 8 + len(json.dumps(entries)) + 16


_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def sample_header(seq_len: int, num_states: int, hidden_size: int, dtype: str) -> tuple[bytes, int]:
    """(the first bytes, the total size) of the file our writer (:func:`eagle3ops.extract.sample_parts`, the
    SGLang hook) makes for one row: the 8-byte length and the space-padded JSON header. Byte-equal to a file's
    start means its header matches without parsing it (the planner checks 100k files that way)."""
    fp8 = dtype == FP8_DTYPE
    n_tok = 8 * seq_len
    header: dict = {"token_ids": {"dtype": "I64", "shape": [seq_len], "data_offsets": [0, n_tok]}}
    off = n_tok
    if fp8:
        n_sc = 4 * seq_len * num_states
        header[FP8_SCALES_KEY] = {
            "dtype": "F32",
            "shape": [seq_len, num_states, 1],
            "data_offsets": [off, off + n_sc],
        }
        off += n_sc
    n_hs = seq_len * num_states * hidden_size * DTYPE_SIZES[dtype]
    header["hidden_states"] = {
        "dtype": _ST_NAMES[dtype],
        "shape": [seq_len, num_states, hidden_size],
        "data_offsets": [off, off + n_hs],
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, 8 + len(text) + off + n_hs


def sample_nbytes(seq_len: int, num_states: int, hidden_size: int, dtype: str) -> int:
    """Bytes one sample takes on disk (tensor bytes + token ids + fp8 scales + header upper bound)."""
    fp8 = dtype == FP8_DTYPE
    return (
        seq_len * num_states * hidden_size * DTYPE_SIZES[dtype]
        + 8 * seq_len
        + (4 * seq_len * num_states if fp8 else 0)
        + header_overhead(seq_len, num_states, hidden_size, fp8)
    )


def load_sample(path: str | os.PathLike, dtype=None) -> dict:
    """``{"token_ids", "hidden_states"}`` of one file; fp8 files (``hidden_states_scales`` present) are
    dequantised as speculators' reader does (``hs_connectors.FP8Transfer``: ``fp8.to(dtype) * scale.to(dtype)``,
    ``dtype`` bfloat16 by default; pass torch.float32 for the exact reconstruction)."""
    import torch
    from safetensors.torch import load_file

    d = load_file(str(path))
    sc = d.pop(FP8_SCALES_KEY, None)
    if sc is not None:
        dt = dtype or torch.bfloat16
        d["hidden_states"] = d["hidden_states"].to(dt) * sc.to(dt)
    elif dtype is not None:
        d["hidden_states"] = d["hidden_states"].to(dtype)
    return d


def preflight_disk(
    path: str | os.PathLike, bytes_needed: int, *, margin_frac: float = 0.05, margin_bytes: int = 0
) -> dict:
    """Refuse when the filesystem holding ``path`` cannot take ``bytes_needed`` plus a margin."""
    p = Path(path)
    while not p.exists():
        p = p.parent
    usage = shutil.disk_usage(p)
    needed = int(bytes_needed * (1 + margin_frac)) + margin_bytes
    info = {"path": str(path), "free_bytes": usage.free, "bytes_needed": bytes_needed, "with_margin": needed}
    if bytes_needed > 0 and needed > usage.free:
        raise DiskSpaceError(
            f"not enough space on the filesystem of {path}: {_human(bytes_needed)} of hidden states still to "
            f"write ({_human(needed)} with the {margin_frac:.0%}"
            + (f" + {_human(margin_bytes)}" if margin_bytes else "")
            + f" margin), {_human(usage.free)} free. Free "
            f"{_human(needed - usage.free)} or point the data directory at a larger disk (the storage phase); "
            "nothing was written."
        )
    return info


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


human_bytes = _human
