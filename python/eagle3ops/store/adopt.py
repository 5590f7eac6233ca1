"""Adopt a hidden-state dump in place: the store takes another tool's per-sample files where they lie, without
copying a byte (docs/data-format.md, "Adopting an existing dump").

:func:`survey` reads and refuses: the dump's declaration (:func:`eagle3ops.store.dump.read_spec`), its files'
metadata (length, shapes, token ids; with ``checksum`` every byte, against the zip's own crc32s), the rows they match
by content (an xxh3-64 of the token ids against every prepared row's), and every bad input before anything is
written. :func:`commit` writes the record (:mod:`eagle3ops.store.adopted`). Damaged, truncated, duplicated,
unmatched and wrong-shaped files are listed, never adopted: extraction redoes their rows, as it does the rows the
dump lacks (the resume plan counts adopted rows done).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops.store import adopted, dump
from eagle3ops.store.dump import AdoptError, DumpSpec
from eagle3ops.store.hidden_states import HiddenStateStore
from eagle3ops.store.layout import HS_DIR


@dataclass
class Survey:
    spec: DumpSpec
    store_dir: Path
    files: int = 0
    rows: dict[int, dict] = field(default_factory=dict)  # row -> record line to write
    damaged: dict[str, str] = field(default_factory=dict)  # file -> why (unreadable, truncated, bit flips)
    wrong_shape: dict[str, str] = field(default_factory=dict)
    duplicates: dict[str, str] = field(default_factory=dict)  # file -> the file it repeats
    unmatched: list[str] = field(default_factory=list)  # token ids of no prepared row
    native: int = 0  # files whose row the store already holds natively (the native file wins)
    bytes_read: int = 0
    seconds: float = 0.0

    def result(self, changed: bool) -> dict:
        return {
            "dump": self.spec.path,
            "declared_by": self.spec.declared_by,
            "files": self.files,
            "adopted": len(self.rows),
            "damaged": self.damaged,
            "wrong_shape": self.wrong_shape,
            "duplicates": self.duplicates,
            "unmatched": self.unmatched,
            "already_in_store": self.native,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
            "changed": changed,
        }


def check_paths(data_dir: str | os.PathLike, dump_dir: str | os.PathLike) -> tuple[Path, Path]:
    """The dump must exist, be a folder, and be neither the store's own output nor hold it (or lie in it)."""
    d = Path(dump_dir)
    if not d.is_dir():
        raise AdoptError(f"adopt: the dump {d} {'is not a directory' if d.exists() else 'does not exist'}")
    rd, rs = d.resolve(), (Path(data_dir) / HS_DIR).resolve()
    if rd == rs or rs in rd.parents or rd in rs.parents:
        raise AdoptError(
            f"adopt: the dump {d} is the store's own output {rs} (or holds it, or lies in it); a store adopts "
            "another tool's files, its own are resumed by the extract phase as they are"
        )
    return d, rs


def survey(
    data_dir: str | os.PathLike,
    dump_dir: str | os.PathLike,
    *,
    run_layer_ids: list[int],
    hidden_size: int,
    checksum: bool = False,
    spec_kw: dict | None = None,
) -> Survey:
    """Everything an adoption decides, reading only; every refusal (:class:`AdoptError`) comes from here."""
    t0 = time.monotonic()
    d, store_dir = check_paths(data_dir, dump_dir)
    spec = dump.read_spec(d, **(spec_kw or {}))
    if spec.layer_ids != list(run_layer_ids) or spec.last_state != "pre-norm":
        raise AdoptError(
            f"adopt: the dump {d} holds aux layers {spec.layer_ids} (input convention; declared "
            f"{spec.declared_ids} {spec.convention}, by {spec.declared_by}) and a {spec.last_state} last state; "
            f"this run's states are layers {list(run_layer_ids)} and a pre-norm last state. Mixing them silently "
            "costs acceptance: extract with the dump's layer ids, or extract everything anew"
        )
    files = dump.list_files(d)
    if not files:
        raise AdoptError(
            f"adopt: the dump {d} holds no sample (*.pt, *.ckpt or *.safetensors, in rows_* folders)"
        )
    probes = [dump.probe(f, spec) for f in files]
    dump.refuse_legacy(probes)
    dump.refuse_keys(probes, spec)
    _refuse_mixed(probes, spec, hidden_size)
    s = Survey(spec, store_dir, files=len(files))
    hashes = row_token_hashes(data_dir)
    native = HiddenStateStore(data_dir).scan_manifest().indices()
    old = {r["p"]: r for r in adopted.read_rows(store_dir).values()}
    taken: dict[int, str] = {}
    for p in probes:
        if p.error:
            s.damaged[p.path] = p.error
            continue
        if p.shape_error:
            s.wrong_shape[p.path] = p.shape_error
            continue
        rows = hashes.get(p.tokens, [])
        if not rows:
            s.unmatched.append(p.path)
            continue
        free = [i for i in rows if i not in taken and i not in native]
        if not free:
            if all(i in native for i in rows):
                s.native += 1
            else:
                s.duplicates[p.path] = taken[rows[-1]]
            continue
        line = {"i": free[0], "n": p.seq_len, "b": p.size, "p": p.path, "m": p.mtime_ns, "t": p.ctime_ns}
        prev = old.get(p.path)
        if checksum and prev and all(prev[k] == line[k] for k in ("b", "m", "t")):
            line.update(
                {k: prev[k] for k in ("h", "z") if k in prev}
            )  # unchanged since it was read: not again
        taken[free[0]] = p.path
        s.rows[free[0]] = line
    if checksum:
        _check_content(s)
    s.seconds = time.monotonic() - t0
    return s


def _check_content(s: Survey) -> None:
    """Read every adopted file not read before (a torch.save zip's members against their own crc32s, ``z``; a
    safetensors sample's xxh3 recorded, ``h``), several
    at a time: the hashes release the GIL, so reads and hashing of different files overlap. A damaged file's row
    is left for extraction."""
    from concurrent.futures import ThreadPoolExecutor

    todo = [line for line in s.rows.values() if "h" not in line and "z" not in line]
    with ThreadPoolExecutor(max_workers=4) as pool:  # waits on the disk overlap another file's crc32s
        results = list(pool.map(lambda line: dump.content_check(line["p"]), todo))
    for line, (rec, why) in zip(todo, results, strict=True):
        s.bytes_read += line["b"]
        if why:
            s.damaged[line["p"]] = why
            del s.rows[line["i"]]
        else:
            line.update(rec)


def _refuse_mixed(probes: list, spec: DumpSpec, hidden_size: int) -> None:
    """Files of several state layouts (number of states, hidden size, dtype), or another hidden size than the
    run's, are refused naming two files (one dump, one target: these cannot be damage of single files)."""
    kinds: dict[tuple, str] = {}
    for p in probes:
        if not p.error and not p.shape_error:
            kinds.setdefault((p.num_states, p.hidden_size, p.dtype), p.path)
    if len(kinds) > 1:
        (k1, f1), (k2, f2) = list(kinds.items())[:2]
        raise AdoptError(
            f"adopt: the dump mixes layouts: {f1} holds {k1[0]} states of {k1[1]} {k1[2]}, {f2} holds {k2[0]} "
            f"of {k2[1]} {k2[2]} (mixed layer ids or hidden sizes); adopt one extraction's files at a time"
        )
    for (n, h, _dt), f in kinds.items():
        if h != hidden_size or n != len(spec.layer_ids) + 1:
            raise AdoptError(
                f"adopt: {f} holds {n} states of hidden size {h}; this run's target has hidden size "
                f"{hidden_size} and {len(spec.layer_ids) + 1} states ({spec.layer_ids} + the last)"
            )


def commit(s: Survey) -> dict:
    """Write the record of a survey (a second adoption of an unchanged dump writes nothing). A record of another
    dump is refused: one store adopts one dump."""
    meta = adopted.read_dump_meta(s.store_dir)
    if meta and meta.get("path") != s.spec.path and adopted.read_rows(s.store_dir):
        raise AdoptError(
            f"adopt: {s.store_dir} already adopted {meta.get('path')}; adopting {s.spec.path} as well is not "
            "supported (extract the rest instead)"
        )
    changed = adopted.write_record(s.store_dir, s.rows, s.spec.record())
    return s.result(changed)


def row_token_hashes(data_dir: str | os.PathLike) -> dict[int, list[int]]:
    """xxh3-64 of every prepared row's ``input_ids`` (as int64 bytes) -> the rows with those tokens, read from the
    Arrow files ``datasets.save_to_disk`` wrote (memory-mapped)."""
    import numpy as np
    import pyarrow as pa

    data = Path(data_dir)
    try:
        state = json.loads((data / "state.json").read_text())
        files = [data / f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError) as e:
        raise AdoptError(
            f"adopt: {data_dir} holds no prepared dataset ({e}); run the prepare phase first"
        ) from None
    out: dict[int, list[int]] = {}
    row = 0
    for f in files:
        with pa.memory_map(str(f)) as src:
            col = pa.ipc.open_stream(src).read_all().column("input_ids").combine_chunks()
        offsets = np.asarray(col.offsets)
        values = np.asarray(col.values).astype(np.int64, copy=False)
        for j in range(len(col)):
            out.setdefault(dump.token_hash(values[offsets[j] : offsets[j + 1]].tobytes()), []).append(row)
            row += 1
    return out
