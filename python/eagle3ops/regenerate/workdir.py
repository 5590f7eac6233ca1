"""The work directory ``OUT.regenerate/``: ``meta`` (what the output is made from) and the append-only ``done.log``
(one CRC-checked line per finished conversation), the atomic writes of OUT and OUT.failures, the fingerprint."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import jsonl
from eagle3ops.durable import fsync_dir, read_json_object
from eagle3ops.regenerate.config import (
    DONE_NAME,
    FAILURES_SUFFIX,
    META_NAME,
    REGENERATE_FORMAT,
    WORK_SUFFIX,
)


# ---------------------------------------------------------------------------------------------------
# the work directory: meta + append-only done.log
# ---------------------------------------------------------------------------------------------------
def paths_for(out: str | os.PathLike) -> tuple[Path, Path, Path, Path, Path]:
    """(OUT, OUT.failures, work dir, meta, done.log)."""
    o = Path(out).absolute()
    work = o.with_name(o.name + WORK_SUFFIX)
    return o, o.with_name(o.name + FAILURES_SUFFIX), work, work / META_NAME, work / DONE_NAME


def done_line(obj: dict) -> bytes:
    body = jsonl.dumps(obj, compact=True, default=str).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


@dataclass
class DoneLog:
    """What ``done.log`` holds: index -> the parsed line; ``good_end``: the byte length of its complete lines
    (the unreadable ones included); ``unreadable``: the line numbers of complete lines that do not check out
    (CRC, JSON), before the last one: their conversations are redone, the lines set aside (:func:`set_aside`)."""

    entries: dict[int, dict]
    good_end: int
    size: int
    torn: bool
    duplicates: int = 0
    unreadable: list[int] = field(default_factory=list)


def read_done(path: Path) -> DoneLog:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return DoneLog({}, 0, 0, False)
    entries: dict[int, dict] = {}
    pos = good = 0
    dup = 0
    unreadable: list[int] = []
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, 1):
        last = lineno == len(lines)  # no newline after it: the torn tail (or b"")
        ok = False
        if not last and len(raw) > 9 and raw[8:9] == b" ":
            try:
                crc = int(raw[:8], 16)
                if zlib.crc32(raw[9:]) == crc:
                    d = json.loads(raw[9:])
                    ok = (
                        isinstance(d, dict)
                        and isinstance(d.get("i"), int)
                        and isinstance(d.get("record"), dict)
                    )
            except ValueError:
                ok = False
        if not ok:
            if last or lineno == len(lines) - 1:  # the last line, complete or not: a torn append
                break
            # not a kill's doing (that only tears the last line): a disk or a hand; its conversation is redone
            unreadable.append(lineno)
        elif d["i"] in entries:
            dup += 1  # only a second run without the lock could write one; the first line wins
        else:
            entries[d["i"]] = d
        pos += len(raw) + 1
        good = pos
    return DoneLog(entries, good, len(data), good != len(data), dup, unreadable)


def set_aside(done_path: Path, done: DoneLog) -> Path:
    """Move ``done``'s unreadable lines from ``done_path`` to ``done_path.unreadable`` (appended: nothing is
    dropped) and cut a torn tail; ``done_path`` is rewritten atomically. Call under the run lock."""
    aside = done_path.with_name(done_path.name + ".unreadable")
    lines = done_path.read_bytes()[: done.good_end].split(b"\n")[:-1]
    bad = set(done.unreadable)
    with open(aside, "ab") as f:
        for n in sorted(bad):
            f.write(lines[n - 1] + b"\n")
        f.flush()
        os.fsync(f.fileno())
    atomic_write(done_path, (ln + b"\n" for n, ln in enumerate(lines, 1) if n not in bad))
    return aside


read_meta = read_json_object  # OUT.regenerate/meta.json; None: missing or unreadable (a fresh start)


def atomic_write(path: Path, chunks, check: Callable[[Path], None] | None = None) -> str:
    """Write the byte chunks to ``path`` atomically (temp, fsync, rename, directory fsync); returns sha256.
    ``check(temp)`` runs before the rename; what it raises leaves ``path`` as it was."""
    h = hashlib.sha256()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                h.update(c)
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return h.hexdigest()


def clean_temps(*dirs_names: tuple[Path, str]) -> None:
    for d, name in dirs_names:
        if not d.is_dir():
            continue
        for p in d.glob(f".{name}.*.tmp"):
            pid = p.name[len(name) + 2 :].split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and Path(f"/proc/{pid}").exists():
                continue
            p.unlink(missing_ok=True)


def model_identity(model: str) -> dict:
    """The target: its path or served name, plus (a local directory) a hash of its small files (config,
    tokenizer, chat template) and the names and sizes of its weight files (not their bytes: terabytes)."""
    p = Path(model)
    ident: dict = {"model": model}
    if p.is_dir():
        h = hashlib.sha256()
        for f in sorted(p.iterdir()):
            if not f.is_file():
                continue
            size = f.stat().st_size
            h.update(f.name.encode() + b"\0" + str(size).encode() + b"\0")
            if size < 64 << 20 and not f.name.endswith((".safetensors", ".bin", ".pt", ".gguf")):
                h.update(f.read_bytes())
        ident["files"] = h.hexdigest()
    return ident


def fingerprint_of(sources, ident: dict, settings: dict) -> str:
    doc = {
        "format": REGENERATE_FORMAT,
        "inputs": [s.sha256 for s in sources],
        "model": ident,
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def what_changed(meta: dict, sources, ident: dict, settings: dict) -> list[str]:
    out = []
    old_inputs = meta.get("inputs") or []
    new_inputs = [{"path": str(s.path), "sha256": s.sha256} for s in sources]
    if old_inputs != new_inputs:
        old = {d["path"]: d["sha256"] for d in old_inputs}
        names = [d["path"] for d in new_inputs if old.get(d["path"]) != d["sha256"]]
        names += [p for p in old if p not in {d["path"] for d in new_inputs}]
        out.append(f"inputs ({', '.join(names[:3]) or 'their order'})")
    if meta.get("model") != ident:
        was = (meta.get("model") or {}).get("model")
        out.append(f"model ({was} -> {ident['model']})" if was != ident["model"] else f"model files ({was})")
    for k, v in settings.items():
        if (meta.get("settings") or {}).get(k) != v:
            out.append(f"{k} {(meta.get('settings') or {}).get(k)!r} -> {v!r}")
    return out or ["format"]


def indices_sha(indices: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, indices)).encode()).hexdigest()
