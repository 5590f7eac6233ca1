"""The record of rows whose hidden states live in an adopted dump, where they lie (:mod:`eagle3ops.store.adopt`
makes it), and the re-extraction queue the training loader fills.

``hidden_states/adopted.jsonl``: one line per row, ``{"i": row, "n": seq_len, "b": size, "p": path, "m": mtime_ns,
"t": ctime_ns[, "h": xxh3-64]}``, rewritten whole (atomically) by each adoption; ``hidden_states/adopted_dump.json``:
the dump's declaration (:class:`eagle3ops.store.dump.DumpSpec`). A row here is done for the resume plan and read by
training through the same loader as a native one (:mod:`eagle3ops.store.reader`), converted on read.

``hidden_states/requeue.jsonl``: rows the training loader found damaged (a checksum that differs on first read),
one JSON line each, appended by the loader's workers; the next extraction plan moves them aside (native) or drops
them from this record (adopted), and extracts them again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from eagle3ops.durable import atomic_write_json, atomic_write_text
from eagle3ops.store.layout import DAMAGED_DIR

RECORD = "adopted.jsonl"
DUMP_META = "adopted_dump.json"
REQUEUE = "requeue.jsonl"


def read_rows(hs_dir: str | os.PathLike) -> dict[int, dict]:
    """Row -> its record line (empty without a record)."""
    try:
        text = Path(hs_dir, RECORD).read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.strip():
            d = json.loads(line)
            out[int(d["i"])] = d
    return out


def read_dump_meta(hs_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads(Path(hs_dir, DUMP_META).read_text())
    except OSError:
        return None


def write_record(hs_dir: str | os.PathLike, rows: dict[int, dict], dump_meta: dict | None) -> bool:
    """Replace the record (and the dump's declaration) atomically; False when both were already so."""
    d = Path(hs_dir)
    text = "".join(json.dumps(rows[i], sort_keys=True, separators=(",", ":")) + "\n" for i in sorted(rows))
    old = d / RECORD
    same = old.exists() and old.read_text() == text and (dump_meta is None or read_dump_meta(d) == dump_meta)
    if same:
        return False
    d.mkdir(parents=True, exist_ok=True)
    if dump_meta is not None:
        atomic_write_json(d / DUMP_META, dump_meta, mode=0o644)
    atomic_write_text(d / RECORD, text)
    return True


def checksums(row: dict) -> dict:
    """What a content check compares an adopted file with: its recorded xxh3 (``h``, a safetensors sample), or
    ``{"z": 1}`` for a ``torch.save`` zip, recorded or not (the zip holds its members' crc32s: an adoption
    without the content pass still leaves every such file checkable on its first read); empty for a safetensors
    sample adopted without its hash."""
    want = {k: row[k] for k in ("h", "z") if row.get(k) is not None}
    if not want and not str(row.get("p", "")).endswith(".safetensors"):
        want = {"z": 1}
    return want


def check_rows(rows: dict[int, dict]) -> dict[int, str]:
    """The cheap check of adopted files (one ``stat`` each): row -> why, for a file gone, of another size, or
    written since it was adopted (its mtime)."""
    damaged = {}
    for i, r in rows.items():
        try:
            st = os.stat(r["p"])
        except OSError as e:
            damaged[i] = f"{r['p']}: {e.strerror} (adopted, now gone)"
            continue
        if st.st_size != r["b"]:
            damaged[i] = f"{r['p']}: {st.st_size} bytes, {r['b']} when it was adopted"
        elif st.st_mtime_ns != r["m"]:
            damaged[i] = f"{r['p']}: written since it was adopted (mtime)"
    return damaged


def drop_rows(hs_dir: str | os.PathLike, damaged: dict[int, str]) -> list[dict]:
    """Drop ``damaged`` rows from the record (their files stay where they are: the dump is the user's) and log
    each in ``damaged/damaged.jsonl``; extraction then redoes them. Returns one log record per dropped row."""
    rows = read_rows(hs_dir)
    gone = {i: r for i, r in damaged.items() if i in rows}
    if not gone:
        return []
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    records = [
        {"index": i, "file": rows[i]["p"], "reason": r, "moved_to": None, "adopted": True, "time": now}
        for i, r in sorted(gone.items())
    ]
    ddir = Path(hs_dir, DAMAGED_DIR)
    ddir.mkdir(exist_ok=True)
    with open(ddir / "damaged.jsonl", "a") as f:
        f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    write_record(hs_dir, {i: r for i, r in rows.items() if i not in gone}, None)
    return records


def queue(hs_dir: str | os.PathLike, index: int, file: str, reason: str) -> None:
    """Append one row to the re-extraction queue (one ``write`` of one short line with O_APPEND: lines from
    several loader workers never interleave)."""
    line = json.dumps({"i": index, "file": file, "reason": reason, "time": round(time.time(), 3)}) + "\n"
    fd = os.open(Path(hs_dir, REQUEUE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_queue(hs_dir: str | os.PathLike) -> dict[int, str]:
    """Row -> why, of every row the loader queued (a torn last line is ignored)."""
    try:
        text = Path(hs_dir, REQUEUE).read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        try:
            d = json.loads(line)
            out[int(d["i"])] = f"found damaged while training: {d['reason']}"
        except (ValueError, KeyError, TypeError):
            continue
    return out


def consume_queue(hs_dir: str | os.PathLike) -> None:
    """Move the queue into ``damaged/`` once the plan has acted on it (kept, never deleted)."""
    src = Path(hs_dir, REQUEUE)
    if src.exists():
        ddir = Path(hs_dir, DAMAGED_DIR)
        ddir.mkdir(exist_ok=True)
        os.replace(src, ddir / f"requeue-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl")
