"""The crash-safe hidden-state store: one data directory's ``hidden_states/`` (names: :mod:`eagle3ops.store.layout`).

Guarantees:
- A file appears under its final name only complete: written to ``.hs_{i}.safetensors.<pid>.<thread>.tmp``,
  fsynced, then ``os.replace``d (atomic on POSIX), then the directory is fsynced (:mod:`eagle3ops.store.write`).
- The manifest is the source of truth for resume. A line is appended only after its file is renamed,
  so a manifest line always names a complete file. A torn last line (kill -9 mid-append) is ignored.
- Resume never loads tensors: remaining = all rows - manifest rows - (files not in the manifest whose
  safetensors *header* matches the expected shape; those are adopted into the manifest).
- Lengths (the seed's ``sample_lengths.json``) come from the manifest for free.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import durable
from eagle3ops.durable import fsync_dir
from eagle3ops.runlock import pid_alive
from eagle3ops.store import adopted as dump_rows
from eagle3ops.store.checksum import file_hashes, xxh3
from eagle3ops.store.errors import DiskSpaceError, StoreError
from eagle3ops.store.layout import (
    DAMAGED_DIR,
    HS_DIR,
    META_NAME,
    TEMP_RE,
    is_manifest,
    manifest_name,
    sample_name,
)
from eagle3ops.store.manifest import ManifestEntry, ManifestScan, parse_manifest_file, written_entry
from eagle3ops.store.meta import meta_decision
from eagle3ops.store.pool import check_pool
from eagle3ops.store.sample import (
    FP8_DTYPE,
    FP8_SCALES_KEY,
    ST_DTYPES,
    read_safetensors_header,
    sample_header,
    sample_nbytes,
)
from eagle3ops.store.write import atomic_write_bytes, atomic_write_many

VERIFY_LEVELS = ("size", "checksum")


def _write_meta(path: Path, meta: dict) -> None:
    durable.atomic_write_json(path, meta, mode=0o644)


def _in_flight(pid: int) -> bool:
    """Whether a temp file of process ``pid`` may still be being written (our own cannot: we clean first)."""
    return pid != os.getpid() and pid_alive(pid)


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
        return self.dir / sample_name(index)

    @property
    def meta_path(self) -> Path:
        return self.dir / META_NAME

    def manifest_path(self, rank: int | None = None) -> Path:
        return self.dir / manifest_name(self.rank if rank is None else rank)

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
            _write_meta(self.meta_path, meta)
            return None
        action, merged = meta_decision(old, meta, self.meta_path, on_model_change)
        if action == "discard":
            moved = self.discard()
            _write_meta(self.meta_path, meta)
            return moved
        if action == "update":
            _write_meta(self.meta_path, merged)
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
        listing a 100k-file directory once costs less than glob.glob walking it in Python: docs/performance.md,
        "Resume planning")."""
        scan = ManifestScan()
        names = self._listdir() if names is None else names
        for n in sorted(n for n in names if is_manifest(n)):
            parse_manifest_file(self.dir / n, scan)
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
        return written_entry(index, seq_len, nbytes, payload, checksum, self.rank, self.path(index))

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
            written_entry(index, seq_len, nbytes, payload, checksum, self.rank, self.path(index))
            for (index, payload, seq_len), nbytes in zip(samples, sizes, strict=True)
        ]

    def clean_temp_files(self) -> list[str]:
        """Remove temp files left by a killed writer (never a final-name file, never the temp file of a
        writer process that is still alive, e.g. another rank's)."""
        removed = []
        if self.dir.exists():
            for name in os.listdir(self.dir):
                m = TEMP_RE.match(name)
                if not m or (m.group(1) and _in_flight(int(m.group(1)))):
                    continue
                (self.dir / name).unlink(missing_ok=True)
                removed.append(name)
        return removed

    # ---------- resume ----------
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
        if ST_DTYPES.get(hs["dtype"]) != dtype:
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
        files = sorted(self.dir / n for n in self._listdir() if is_manifest(n))
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
        # rows the training loader found damaged, and adopted files (a dump's, where they lie: store.adopted)
        queued = dump_rows.read_queue(self.dir)
        damaged.update({i: r for i, r in queued.items() if i in done and i in wanted_set})
        taken = dump_rows.read_rows(self.dir)
        lost = dump_rows.check_rows({i: r for i, r in taken.items() if i in wanted_set} if verify else {})
        lost.update({i: r for i, r in queued.items() if i in taken and i not in done})
        duplicates = scan.duplicates()
        moved: list[dict] = []
        if repair and damaged:
            moved = self.quarantine(damaged)  # rewrites the manifests too (duplicates collapse)
        elif repair and duplicates:
            self.rewrite_manifests()
        if repair and lost:
            moved += dump_rows.drop_rows(self.dir, lost)
        if repair and queued:
            dump_rows.consume_queue(self.dir)
        done = (done - set(damaged)) | (set(taken) - set(lost) - done)
        damaged.update(lost)
        adopted: list[ManifestEntry] = []
        invalid: dict[int, str] = {}
        missing = wanted_set - done
        present = set(names) if missing else set()
        for i in sorted(missing):  # a file under its final name but not in a manifest: check its header
            if i in damaged or sample_name(i) not in present:
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
        h = file_hashes(path, {"h"}).get("h") if checksum and xxh3() is not None else None
        return ManifestEntry(index, seq_len, st.st_size, None, self.rank, h, st.st_ctime_ns)

    def lengths(self) -> dict[int, int]:
        """Index -> seq_len of every finished sample, from the manifests and the adoption record (rows an adopted
        dump holds where it lies; a native file wins over an adopted one); no sample file is opened."""
        out = {i: int(r["n"]) for i, r in dump_rows.read_rows(self.dir).items()}
        out.update({i: e.seq_len for i, e in self.scan_manifest().entries.items()})
        return out


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


def preflight_disk(
    path: str | os.PathLike,
    bytes_needed: int,
    *,
    margin_frac: float = 0.05,
    margin_bytes: int = 0,
    pool: dict | None = None,
) -> dict:
    """Refuse when the filesystem holding ``path`` cannot take ``bytes_needed`` plus a margin, or (``pool``: the
    PVE storage underneath, :mod:`.pool`) the storage its volume is carved from cannot."""
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
    info["pve_storage"] = check_pool(pool, bytes_needed, needed, _human)
    return info


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


human_bytes = _human
