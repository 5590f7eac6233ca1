"""What training reads for one row, whatever holds it: a native ``hs_{i}.safetensors`` or an adopted dump's file
where it lies (converted on read: :func:`eagle3ops.store.dump.load_sample`), optionally checked on first read.

``check_on_read`` (the train phase's ``verify: overlapped``): a file not yet in ``verified.jsonl`` under its current
key is read once into memory, its xxh3-64 (or crc32) compared with the one its manifest holds (an adopted file: the
adoption record's xxh3, or a zip's own crc32s), and the tensors are made on those same bytes (no copy: the check
costs the hash, docs/performance.md); matches are appended to the record in batches (one ``write`` each, so several
loader workers can append; at a worker's exit the rest), a mismatch raises :class:`DamagedSample` after queueing the row for
re-extraction (:func:`eagle3ops.store.adopted.queue`). The up-front check (:func:`eagle3ops.store.verify_content`)
and this one share the record: a file verified by either is not hashed again by the other.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import struct
import time
from pathlib import Path

from eagle3ops.store import adopted, dump
from eagle3ops.store.checksum import content_hash, crc32
from eagle3ops.store.layout import VERIFIED_NAME
from eagle3ops.store.manifest import ManifestScan, parse_manifest_file

_READERS: list[StoreReader] = []


@atexit.register
def flush_all() -> None:
    """Every reader's verified lines not yet appended (a loader worker's last ones, at its exit)."""
    for r in _READERS:
        with contextlib.suppress(OSError):
            r.flush()


class DamagedSample(RuntimeError):
    def __init__(self, index: int, path: str, reason: str):
        super().__init__(f"row {index}: {path}: {reason}")
        self.index, self.path, self.reason = index, path, reason


class StoreReader:
    """Reads rows of one ``hidden_states/`` folder (cheap to build: it reads the adoption record; the checksums
    and the verified record are read on the first checked read, in the worker that does it)."""

    def __init__(self, hs_dir: str | os.PathLike, *, check_on_read: bool = False):
        self.dir = Path(hs_dir)
        self.adopted = adopted.read_rows(self.dir)
        meta = adopted.read_dump_meta(self.dir) or {}
        self.keys = meta.get("keys") or dict(dump.DEFAULT_KEYS)
        self.num_aux = len(meta.get("layer_ids") or [])
        self.check_on_read = check_on_read
        self._sums: dict[int, dict] | None = None
        self._record: dict[int, list[int]] | None = None
        self.checked = self.skipped = 0
        self._lines: list[str] = []
        self._flushed = time.time()
        _READERS.append(self)

    def path(self, index: int) -> str:
        row = self.adopted.get(index)
        return row["p"] if row else str(self.dir / f"hs_{index}.safetensors")

    def get(self, index: int) -> dict | None:
        """``{"token_ids", "hidden_states", ...}`` of row ``index``, None when nothing holds it."""
        index = int(index)  # speculators' sampler hands numpy integers
        row = self.adopted.get(index)
        path = self.path(index)
        if row is None and not os.path.exists(path):
            return None
        data = self._checked_bytes(index, path, row) if self.check_on_read else None
        if row is None:
            if data is None:
                from safetensors.torch import load_file

                return load_file(path)
            return tensors_of(data)
        if data is not None and path.endswith(dump.ST_SUFFIX):
            return tensors_of(data)  # an adopted safetensors sample is in the store's own format
        return dump.load_sample(path, self.keys, self.num_aux, data)

    # ---------- the check on first read ----------
    def _checked_bytes(self, index: int, path: str, row: dict | None) -> bytes | None:
        """The file's bytes when it was read to be checked (and matched), None when the record vouches for it or
        nothing records a checksum for it."""
        if self._sums is None:
            self._load()
        st = os.stat(path)
        key = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        if self._record.get(index) == key:
            return None
        want = adopted.checksums(row) if row is not None else dict(self._sums.get(index, {}))
        if not want:
            return None
        data = bytearray(st.st_size)  # writable: the tensors are made on these bytes, not a copy
        with open(path, "rb", buffering=0) as f:
            if f.readinto(data) != st.st_size:
                data = bytearray(f.read())  # changed while read: the check below sees it
        if row is not None:  # an adopted file: a zip checks itself, a safetensors sample by its recorded xxh3
            rec, why = dump.content_check(path, data)
            got = want if why is None and all(rec.get(k) == v for k, v in want.items()) else {}
        else:
            kind, value = content_hash(data)
            got = {kind: value}
            if kind not in want and "c" in want:  # an older crc32 line, or no xxhash here
                got = {"c": crc32(data)}
            if kind not in want and "c" not in want:
                return data  # recorded with xxh3 where xxhash is missing now: nothing to compare with
        if not got or any(want.get(k) != v for k, v in got.items()):
            reason = (
                "content checksum differs from the one recorded when it was written (bytes changed on disk)"
            )
            self.skipped += 1
            adopted.queue(self.dir, index, path, reason)
            raise DamagedSample(index, path, reason)
        self.checked += 1
        self._record[index] = key
        now = time.time()
        self._lines.append(
            json.dumps({"i": index, "k": key, "t": round(now, 3)}, separators=(",", ":")) + "\n"
        )
        if len(self._lines) >= 64 or now - self._flushed > 1.0:
            self.flush()
        return data

    def flush(self) -> None:
        """Append the files verified since the last flush to the record (one ``write``: several workers' lines
        never interleave). Lines lost to a killed worker only mean those files are hashed again next time."""
        if not self._lines:
            return
        text, self._lines, self._flushed = "".join(self._lines), [], time.time()
        fd = os.open(self.dir / VERIFIED_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def _load(self) -> None:
        from eagle3ops.store.verified import read_record

        scan = ManifestScan()
        for name in sorted(os.listdir(self.dir)):
            if name.startswith("manifest-rank") and name.endswith(".jsonl"):
                parse_manifest_file(self.dir / name, scan)
        self._sums = {
            i: {k: r[k] for k in ("h", "c") if r.get(k) is not None} for i, r in scan.rows().items()
        }
        self._record = read_record(self.dir)[0]


TORCH_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "I64": "int64",
    "F8_E4M3": "float8_e4m3fn",
}


def tensors_of(data: bytearray) -> dict:
    """The tensors of a safetensors file held in ``data``, made on its bytes (no copy)."""
    import torch

    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(bytes(data[8 : 8 + n]))
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dtype = getattr(torch, TORCH_DTYPES[t["dtype"]])
        a, b = t["data_offsets"]
        count = (b - a) // dtype.itemsize
        out[name] = torch.frombuffer(data, dtype=dtype, count=count, offset=8 + n + a).view(t["shape"])
    return out
