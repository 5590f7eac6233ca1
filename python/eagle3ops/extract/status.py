"""What a data directory's extraction stands at: one store (:func:`status`), or the stores of a multi-host
extraction seen together (:func:`status_many`). Reads only: manifests, headers, ``shard.json``."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.extract.errors import ExtractError
from eagle3ops.extract.session import (
    damaged_report,
    load_seq_lens,
)
from eagle3ops.extract.shards import Reassignment, read_shard, rows_of_ranks
from eagle3ops.store import (
    HiddenStateStore,
    adopted,
)


def status(data_dir: str | os.PathLike) -> dict:
    """Progress of a data directory from the manifests, with the cheap check of every finished file against the
    disk (size + header, no tensors loaded): damaged or missing files do not count as done; rows an adopted dump
    holds where they lie count as done (one stat each)."""
    return status_of(data_dir, _held(data_dir))


def status_of(data_dir: str | os.PathLike, held: _Held) -> dict:
    good, dump, lost, damaged, seq_lens = held.good, held.dump, held.lost, held.damaged, held.seq_lens
    return {
        "data_dir": str(data_dir),
        "rows": len(seq_lens),
        "done": len(good) + len(dump),
        "remaining": len(seq_lens) - len([i for i in set(good) | set(dump) if i < len(seq_lens)]),
        "tokens_done": sum(e.seq_len for e in good.values()) + sum(r["n"] for r in dump.values()),
        "tokens_total": sum(seq_lens),
        "bytes": sum(e.nbytes for e in good.values()) + sum(r["b"] for r in dump.values()),
        "adopted_from_dump": len(dump),
        "adopted_damaged": {str(i): r for i, r in sorted(lost.items())},
        "damaged": len(damaged),
        "damaged_files": damaged_report(held.store, damaged),
        "duplicate_manifest_lines": sum(n - 1 for n in held.scan.duplicates().values()),
        "torn_manifest_lines": held.scan.torn_lines,
        "meta": held.meta,
    }


@dataclass
class _Held:
    """What one store holds: ``good`` native entries, ``dump`` rows an adopted dump holds (not also native),
    ``lost`` adopted files gone or changed, ``damaged`` native files."""

    store: HiddenStateStore
    meta: dict | None
    seq_lens: list
    scan: object
    good: dict
    dump: dict
    lost: dict
    damaged: dict

    def rows(self) -> set[int]:
        return set(self.good) | set(self.dump)


def _held(data_dir: str | os.PathLike) -> _Held:
    store = HiddenStateStore(data_dir)
    meta = store.read_meta()
    seq_lens = load_seq_lens(data_dir)
    scan = store.scan_manifest()
    done = scan.entries
    damaged: dict[int, str] = {}
    if meta and all(meta.get(k) for k in ("num_states", "hidden_size", "dtype")):
        lens = {i: (seq_lens[i] if i < len(seq_lens) else e.seq_len) for i, e in done.items()}
        damaged, _ = store.check_files(
            scan.rows().values(),
            lens,
            num_states=meta["num_states"],
            hidden_size=meta["hidden_size"],
            dtype=meta["dtype"],
        )
    good = {i: e for i, e in done.items() if i not in damaged}
    # rows an adopted dump holds where it lies (eagle3ops.store.adopt), one stat each
    taken = adopted.read_rows(store.dir)
    lost = adopted.check_rows(taken)
    dump = {i: r for i, r in taken.items() if i not in lost and i not in good}
    return _Held(store, meta, seq_lens, scan, good, dump, lost, damaged)


def status_many(data_dirs: Sequence[str | os.PathLike]) -> dict:
    """One view over the stores of a multi-host extraction (each host's own data directory, reachable here
    through a shared mount or after copying them): per store, the global ranks it covers (its
    ``hidden_states/shard.json``), its rows done and missing; overall, the rows done in some store, the rows no
    store has yet, rows held by more than one store (done twice), and rows no store's ranks cover.

    A store whose ranks another store's record names as re-assigned (a lost host's old part, docs/scale.md "A host
    that stays lost") is listed as ``kept_out`` and counts for nothing: its rows are the survivors' now."""
    shards = {str(d): read_shard(d) for d in data_dirs}
    lost_by_world: dict[int, set[int]] = {}
    for rec in shards.values():
        if rec and rec.get("reassigned"):
            lost_by_world.setdefault(rec["world_size"], set()).update(rec["reassigned"]["lost_ranks"])
    stores = []
    fingerprints = set()
    rows = None
    owner: dict[int, list[int]] = {}  # row -> indices of the stores holding it
    covered: set[int] = set()
    for k, d in enumerate(data_dirs):
        held = _held(d)
        st = status_of(d, held)
        meta = st.get("meta") or {}
        if meta.get("dataset_fingerprint"):
            fingerprints.add(meta["dataset_fingerprint"])
        if rows is None:
            rows = st["rows"]
        elif st["rows"] != rows:
            raise ExtractError(
                f"{d} holds a dataset of {st['rows']} rows but {data_dirs[0]} one of {rows}: these stores are "
                "not shares of one extraction; pass the data directories of one prepared dataset"
            )
        shard = shards[str(d)]
        good = held.rows()  # native files intact, and rows an adopted dump holds where they lie
        kept_out = bool(
            shard
            and shard.get("ranks")
            and set(shard["ranks"]) <= lost_by_world.get(shard["world_size"], set())
        )
        if kept_out:
            expected: set[int] = set()
        elif shard:
            reassign = Reassignment.of(shard["world_size"], (shard.get("reassigned") or {}).get("lost_ranks"))
            expected = set(rows_of_ranks(st["rows"], shard["world_size"], shard["ranks"], None, reassign))
        else:
            expected = set(range(rows))
        covered |= expected
        if not kept_out:
            for i in good:
                owner.setdefault(i, []).append(k)
        missing = sorted(expected - good)
        stores.append(
            {
                "data_dir": str(d),
                "host": (shard or {}).get("host"),
                "world_size": (shard or {}).get("world_size"),
                "ranks": (shard or {}).get("ranks"),
                "reassigned": (shard or {}).get("reassigned"),
                "kept_out": kept_out,
                "expected": len(expected),
                "done": len(good & expected),
                "held": len(good),
                "missing": len(missing),
                "missing_rows": missing[:50],
                "outside_ranks": 0 if kept_out else len(good - expected),
                "damaged": st["damaged"],
                "tokens_done": st["tokens_done"],
                "bytes": st["bytes"],
            }
        )
    if len(fingerprints) > 1:
        raise ExtractError(
            f"the stores {', '.join(map(str, data_dirs))} were extracted from different prepared datasets "
            f"(dataset fingerprints {sorted(fingerprints)}); pass the stores of one extraction"
        )
    worlds = {s["world_size"] for s in stores if s["world_size"]}
    rows = rows or 0
    done = {i for i in owner if i < rows}
    twice = sorted(i for i, ks in owner.items() if len(ks) > 1)
    return {
        "stores": stores,
        "rows": rows,
        "done": len(done),
        "missing": rows - len(done),
        "missing_rows": sorted(set(range(rows)) - done)[:50],
        "done_twice": len(twice),
        "done_twice_rows": twice[:50],
        "not_covered": len(set(range(rows)) - covered),
        "kept_out": [s["data_dir"] for s in stores if s["kept_out"]],
        "world_sizes": sorted(worlds),
        "complete": len(done) == rows and not twice,
    }


def run_log_path(data_dir: str | os.PathLike) -> Path:
    """Where an extraction of ``data_dir`` keeps its log: ``PARENT/NAME.extract.log``, beside the directory (as
    its run lock is), not in ``hidden_states/``, which a multi-host training gathers byte for byte."""
    d = Path(data_dir).resolve()
    return d.parent / f"{d.name}.extract.log"


@contextlib.contextmanager
def run_log(data_dir: str | os.PathLike, what: str):
    """Append this run's messages (its stderr: the summary, warnings, errors) to :func:`run_log_path` while it
    runs, framed by a start and an end line; yields the path (None when the log cannot be written: the run goes
    on without it)."""
    path = run_log_path(data_dir)
    try:
        f = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in the finally below
    except OSError:
        yield None
        return
    stamp = lambda: time.strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    try:  # a full disk fails here first: the run goes on (and fails, if it must, naming its own file)
        f.write(f"{stamp()} {what} (PID {os.getpid()}) started: {' '.join(sys.argv)}\n")
    except OSError:
        with contextlib.suppress(OSError):
            f.close()
        yield None
        return
    old = sys.stderr
    sys.stderr = _Tee(old, f)
    outcome = "ended"
    try:
        yield path
    except BaseException as e:
        outcome = f"failed: {type(e).__name__}: {e}"
        raise
    finally:
        sys.stderr = old
        with contextlib.suppress(OSError):
            f.write(f"{stamp()} {what} (PID {os.getpid()}) {outcome}\n")
            f.close()


class _Tee:
    """stderr that also goes to the run's log (a failed write to the log never fails the run)."""

    def __init__(self, stream, log):
        self._stream, self._log = stream, log

    def write(self, text):
        with contextlib.suppress(OSError, ValueError):
            self._log.write(text)
        return self._stream.write(text)

    def flush(self):
        with contextlib.suppress(OSError, ValueError):
            self._log.flush()
        self._stream.flush()

    def __getattr__(self, name):  # isatty, fileno, encoding: the real stream's
        return getattr(self._stream, name)


def note_running(res: dict, data_dir: str | os.PathLike, running: dict | None) -> None:
    """Add to a check-mode plan ``res`` (its ``total`` and ``to_extract``) the run that holds ``data_dir``
    (``running``: its holder record, or None): ``running``, ``holder`` and, while one runs, its ``progress``
    (:func:`run_progress`: what an Ansible poll of the running extraction shows, roles/extract)."""
    res.update(running=running is not None, holder=running)
    if running:
        res["progress"] = run_progress(data_dir, res["total"] - res["to_extract"], res["total"], running)


def run_progress(data_dir: str | os.PathLike, done: int, total: int, holder: dict | None) -> dict:
    """How far the extraction that holds ``data_dir`` is (:func:`eagle3ops.progress.describe`): ``done`` of this
    host's ``total`` rows, the rate from the file times the manifests recorded since the run started (the
    holder's record), the ETA, and its log. Reads the manifests only."""
    from eagle3ops.progress import describe, rate_per_second

    started = float((holder or {}).get("started") or 0)
    stamps = []
    if holder:
        rows = HiddenStateStore(data_dir).scan_manifest().rows().values()
        stamps = [d["t"] / 1e9 for d in rows if d.get("t") and d["t"] / 1e9 >= started]
    extra = f"PID {holder.get('pid')} since {holder.get('started_at')}" if holder else "no run holds it now"
    log = run_log_path(data_dir)
    return describe(
        "extract",
        done,
        total,
        "rows",
        rate_per_second(stamps),
        str(log) if log.exists() else None,
        extra=extra,
    )
