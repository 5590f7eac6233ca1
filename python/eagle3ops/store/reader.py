"""What training reads for one row, whatever holds it: a native ``hs_{i}.safetensors`` or an adopted dump's file
where it lies (converted on read: :func:`eagle3ops.store.dump.load_sample`), optionally checked on first read.

``check_on_read`` (the train phase's ``verify: overlapped``): a file not yet in ``verified.jsonl`` under its current
key is read once into memory, its xxh3-64 (or crc32) compared with the one its manifest (or the adoption record)
holds, and the tensors are made from those same bytes; a match is appended to the record (one ``write`` of one
line, so several loader workers can append), a mismatch raises :class:`DamagedSample` after queueing the row for
re-extraction (:func:`eagle3ops.store.adopted.queue`). The up-front check (:func:`eagle3ops.store.verify_content`)
and this one share the record: a file verified by either is not hashed again by the other.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from eagle3ops.store import adopted, dump
from eagle3ops.store.checksum import content_hash, crc32
from eagle3ops.store.layout import VERIFIED_NAME
from eagle3ops.store.manifest import ManifestScan, parse_manifest_file


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

    def path(self, index: int) -> str:
        row = self.adopted.get(index)
        return row["p"] if row else str(self.dir / f"hs_{index}.safetensors")

    def get(self, index: int) -> dict | None:
        """``{"token_ids", "hidden_states", ...}`` of row ``index``, None when nothing holds it."""
        row = self.adopted.get(index)
        path = self.path(index)
        if row is None and not os.path.exists(path):
            return None
        data = self._checked_bytes(index, path, row) if self.check_on_read else None
        if row is None:
            if data is None:
                from safetensors.torch import load_file

                return load_file(path)
            from safetensors.torch import load

            return load(data)
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
        if row is not None:
            want = {k: row[k] for k in ("h", "z") if row.get(k) is not None}
        else:
            want = dict(self._sums.get(index, {}))
        if not want:
            return None
        with open(path, "rb") as f:
            data = f.read()
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
        line = json.dumps({"i": index, "k": key, "t": round(time.time(), 3)}, separators=(",", ":")) + "\n"
        fd = os.open(self.dir / VERIFIED_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        return data

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
