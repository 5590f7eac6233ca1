"""Content verification with a verified-once record: every hidden-state file's bytes are compared, once, with the
content checksum its writer recorded in the manifest (``h`` xxh3-64, ``c`` crc32), and the file is then
remembered in ``hidden_states/verified.jsonl`` by what any change to it would change: inode, size, mtime and
ctime (nanoseconds). A later check re-reads only the files whose record is missing or differs, so an unchanged
store costs one ``stat`` a file.

Why: the cheap check every phase runs (size and safetensors header: :meth:`HiddenStateStore.check_files`) cannot
see bytes changed inside the tensor data; a 16-byte flip in a file passed ``status`` and a re-run, and only
``eagle3ops extract-verify --level checksum`` found it (issue 32). The train phase runs this before it launches a
trainer, so damaged states are refused, naming the file, before anything trains on them.

What the record trusts: a write, a truncate, a rename over the file, a copy (storage migration, backup restore)
all change the inode or ctime, and no system call sets ctime back; a file whose key is unchanged has the bytes
that were verified. Corruption below the file system (a disk returning other bytes for an unchanged inode) is
found by the first verification of each file, not by later ones: ``eagle3ops extract-verify --level checksum`` re-reads
everything whatever the record says.

The record is append-only JSON lines ``{"i": index, "k": [ino, size, mtime_ns, ctime_ns], "t": time}`` (the
last line of an index wins; a torn last line is ignored; ``t``, when the file was found intact, gives a poller the
rate: :func:`newest_run_rate`), written a file at a time so a poll sees how far a check is; it is rewritten compactly
when it holds more than twice as many lines as indices. Cost: docs/performance.md, "Content verification before training".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from eagle3ops.durable import atomic_write_text
from eagle3ops.store import adopted
from eagle3ops.store.checksum import file_hashes
from eagle3ops.store.dump import content_check
from eagle3ops.store.layout import VERIFIED_NAME

CHANGED = "content checksum differs from the manifest's (bytes changed on disk since they were written)"


def _key(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def read_record(hs_dir: str | os.PathLike, stamps: list | None = None) -> tuple[dict[int, list[int]], int]:
    """({index: key} of the files verified, lines read) from ``hs_dir/verified.jsonl`` (empty when absent);
    ``stamps``, when given, gets every line's time (``t``) in file order."""
    record: dict[int, list[int]] = {}
    lines = 0
    try:
        text = Path(hs_dir, VERIFIED_NAME).read_text()
    except OSError:
        return record, 0
    for line in text.splitlines():
        try:
            d = json.loads(line)
            record[int(d["i"])] = [int(x) for x in d["k"]]
            lines += 1
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line (killed mid-append)
        if stamps is not None and isinstance(d.get("t"), (int, float)):
            stamps.append(float(d["t"]))
    return record, lines


# a check writes a record line every file (seconds apart at most, even for 10 GB files on a slow disk): a gap
# longer than this between two lines is a pause between two checks
RUN_GAP_S = 600.0


def newest_run_rate(stamps: list[float]) -> float | None:
    """Files per second of the newest run of record lines (no gap over RUN_GAP_S between two of them): the rate
    of the check running now, or of the last one; None with fewer than two lines or no time between them."""
    run = stamps[-1:]
    for t in reversed(stamps[:-1]):
        if run[-1] - t > RUN_GAP_S:
            break
        run.append(t)
    span = (max(run) - min(run)) if len(run) > 1 else 0.0
    return (len(run) - 1) / span if span > 0 else None


def verify_content(
    hs_dir: str | os.PathLike,
    rows: Iterable[dict],
    *,
    check: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> dict:
    """Compare every listed file (``rows``: manifest lines as dicts, :meth:`ManifestScan.rows`) not verified since
    its last change with its manifest checksum, and record the ones that match.

    Returns ``damaged`` (index -> reason), ``verified`` (files read and found intact now), ``already_verified``
    (files the record vouches for: not read), ``bytes_read``, ``unchecked`` (files without a manifest checksum,
    e.g. adopted ones: nothing to compare with; their header was checked by the cheap check) and ``missing``
    (listed, not on disk: the cheap check reports those). ``check``: read nothing, write nothing; ``to_verify``
    and ``bytes_to_verify`` say what a real run would read."""
    d = Path(hs_dir)
    stamps: list[float] = []
    record, lines = read_record(d, stamps)
    damaged: dict[int, str] = {}
    out = {"verified": 0, "already_verified": 0, "bytes_already_verified": 0, "bytes_read": 0, "unchecked": 0}
    out["missing"] = 0
    out["files_per_s"] = newest_run_rate(stamps)  # of the record as read now: a poll's rate
    todo = []
    rows_path: dict[int, str | Path] = {}
    for r in rows:
        i = r["i"]
        try:
            st = os.stat(r.get("p") or d / f"hs_{i}.safetensors")  # ``p``: an adopted file, where it lies
        except FileNotFoundError:
            out["missing"] += 1
            continue
        key = _key(st)
        if record.get(i) == key:
            out["already_verified"] += 1
            out["bytes_already_verified"] += key[1]
            continue
        want = {k: r[k] for k in ("h", "c") if r.get(k) is not None}
        if r.get("p"):  # an adopted file: its xxh3, or a zip that checks itself (z)
            want = adopted.checksums(r)
        if not want:
            out["unchecked"] += 1
            continue
        todo.append((i, key, want))
        rows_path[i] = r.get("p") or d / f"hs_{i}.safetensors"
    out["to_verify"] = len(todo)
    out["bytes_to_verify"] = sum(key[1] for _, key, _ in todo)
    if check or not todo:
        return {**out, "damaged": damaged}
    fresh: dict[int, list[int]] = {}
    with open(d / VERIFIED_NAME, "a") as fh:
        for i, key, want in todo:
            path = rows_path[i]
            try:
                if "z" in want:  # an adopted torch.save file: its members against their own crc32s
                    got = want if content_check(str(path))[1] is None else {}
                    if on_bytes is not None:
                        on_bytes(key[1])
                else:
                    got = file_hashes(path, set(want), on_bytes=on_bytes)
                st = os.stat(path)
            except OSError as err:
                damaged[i] = f"cannot be read ({err.strerror})"
                continue
            out["bytes_read"] += key[1]
            if got != want:
                damaged[i] = CHANGED
                continue
            if _key(st) != key:  # changed while it was read: verified next time
                continue
            fresh[i] = key
            out["verified"] += 1
            fh.write(json.dumps({"i": i, "k": key, "t": round(time.time(), 3)}, separators=(",", ":")) + "\n")
            fh.flush()  # a poll (progress) sees each file as it is verified
    record.update(fresh)
    if lines + len(fresh) > 2 * max(len(record), 1):
        atomic_write_text(
            d / VERIFIED_NAME,
            "".join(
                json.dumps({"i": i, "k": k}, separators=(",", ":")) + "\n" for i, k in sorted(record.items())
            ),
        )
    return {**out, "damaged": damaged}
