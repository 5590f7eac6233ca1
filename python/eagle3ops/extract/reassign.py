"""Re-assignment of a lost host's rows, on request (docs/scale.md, "A host that stays lost"): which rows a
surviving rank takes over is :class:`eagle3ops.extract.shards.Reassignment` (pure arithmetic); this module takes
over what the lost host had *finished* when its store part can still be read here (``--reassign-from-data DIR``:
its disk mounted on a survivor, a shared file system, a copy): each survivor copies the finished files of the rows
it takes over into its own store, checked against the lost part's manifest line (size, content checksum,
safetensors header), with a manifest line of its own rank - so nothing the lost host finished is extracted again,
and the lost part itself is only read (it stays as it was, out of the gather).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from eagle3ops.extract.errors import ExtractError
from eagle3ops.extract.shards import Reassignment, read_shard
from eagle3ops.store import HiddenStateStore, content_hash

# the meta keys a lost part must share with this store for its files to be this extraction's rows
_SAME = (
    "format",
    "layer_ids",
    "num_states",
    "hidden_size",
    "dtype",
    "dataset_fingerprint",
    "model_fingerprint",
)


def check_sources(
    sources: Sequence[str | os.PathLike], world_size: int, reassign: Reassignment | None
) -> list[dict]:
    """The lost parts given with ``--reassign-from-data``: each must be a data directory whose
    ``hidden_states/shard.json`` holds only re-assigned ranks of this world. Returns their shard records (with
    ``data_dir``); refuses (:class:`ExtractError`, before any work) anything else."""
    if not sources:
        return []
    if reassign is None:
        raise ExtractError(
            f"--reassign-from-data {' '.join(map(str, sources))} needs --reassign-ranks (the lost ranks whose "
            "finished rows it holds)"
        )
    out = []
    for d in sources:
        if not (Path(d) / "hidden_states").is_dir():
            raise ExtractError(
                f"--reassign-from-data {d}: no hidden_states/ there; give the lost host's data directory as it is "
                "readable on this host (its disk mounted, a shared path or a copy), or leave it out to extract "
                "its rows again. Nothing was extracted."
            )
        rec = read_shard(d)
        if rec is None:
            raise ExtractError(
                f"--reassign-from-data {d}: no hidden_states/shard.json, so which ranks it holds is unknown; it "
                "is not a part of a multi-host extraction. Nothing was extracted."
            )
        ranks = [int(r) for r in rec.get("ranks") or []]
        if rec.get("world_size") != world_size or not set(ranks) <= set(reassign.lost):
            raise ExtractError(
                f"--reassign-from-data {d}: that part holds ranks {ranks} of world size {rec.get('world_size')} "
                f"(host {rec.get('host')}), not re-assigned ranks of this world ({list(reassign.lost)} of "
                f"{world_size}): give only the data directories of the lost hosts. Nothing was extracted."
            )
        out.append({**rec, "data_dir": str(d)})
    return out


def _finished(src: dict) -> dict[int, dict]:
    """Row -> manifest line of every row the lost part recorded (its last line wins, as everywhere)."""
    return HiddenStateStore(src["data_dir"]).scan_manifest().rows()


def importable(
    data_dir: str | os.PathLike, sources: list[dict], taken: dict[int, list[int]]
) -> dict[int, tuple[dict, dict]]:
    """Row -> (source record, its manifest line) for the rows this host takes over (``taken``: rank -> rows) that
    are not done here yet and that a lost part recorded as finished. Reads manifests only."""
    done = HiddenStateStore(data_dir).scan_manifest().indices()
    want = {i for rows in taken.values() for i in rows} - done
    out: dict[int, tuple[dict, dict]] = {}
    for src in sources:
        for i, line in _finished(src).items():
            if i in want and i not in out:
                out[i] = (src, line)
    return out


def import_taken_rows(
    data_dir: str | os.PathLike,
    sources: list[dict],
    taken: dict[int, list[int]],
    seq_lens: Sequence[int],
    *,
    fsync: bool = True,
) -> dict:
    """Copy into this store the finished files of the rows its ranks take over (``taken``: rank -> rows), from the
    lost parts ``sources`` (:func:`check_sources`). A file is copied when its bytes match its manifest line (size,
    and content checksum where the line has one) and its header is the row's; the copy gets a manifest line of the
    taking rank. A file that fails is left where it is and its row extracted here. Returns the counts."""
    res = {
        "imported": 0,
        "import_bytes": 0,
        "import_rejected": {},
        "import_sources": [s["data_dir"] for s in sources],
    }
    if not sources:
        return res
    mine = HiddenStateStore(data_dir)
    meta = mine.read_meta() or {}
    for src in sources:
        theirs = HiddenStateStore(src["data_dir"]).read_meta() or {}
        diff = [k for k in _SAME if theirs.get(k) != meta.get(k)]
        if diff:
            raise ExtractError(
                f"--reassign-from-data {src['data_dir']}: its extract_meta.json differs from this store's in "
                f"{', '.join(diff)} ({', '.join(f'{k}: {theirs.get(k)!r} there, {meta.get(k)!r} here' for k in diff)}): "
                "its files are not rows of this extraction. Nothing was copied."
            )
    rank_of = {i: r for r, rows in taken.items() for i in rows}
    todo = importable(data_dir, sources, taken)
    by_rank: dict[int, list[int]] = {}
    for i in sorted(todo):
        by_rank.setdefault(rank_of[i], []).append(i)
    num_states, hidden, dtype = meta.get("num_states"), meta.get("hidden_size"), meta.get("dtype")
    for rank, rows in sorted(by_rank.items()):
        store = HiddenStateStore(data_dir, rank=rank)
        try:
            for start in range(0, len(rows), 64):
                batch = []
                for i in rows[start : start + 64]:
                    src, line = todo[i]
                    why = _check_source_file(src, line, seq_lens[i], num_states, hidden, dtype)
                    if isinstance(why, str):
                        res["import_rejected"][str(i)] = f"{HiddenStateStore(src['data_dir']).path(i)}: {why}"
                        continue
                    batch.append((i, why, seq_lens[i]))
                if not batch:
                    continue
                entries = store.write_samples(batch, fsync=fsync)
                store.append_manifest(entries, fsync=fsync)
                res["imported"] += len(entries)
                res["import_bytes"] += sum(e.nbytes for e in entries)
        finally:
            store.close()
    return res


def _check_source_file(src: dict, line: dict, seq_len: int, num_states, hidden, dtype) -> bytes | str:
    """The file's bytes when they are the row its manifest line recorded, else the reason they are not."""
    store = HiddenStateStore(src["data_dir"])
    path = store.path(int(line["i"]))
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if len(data) != int(line["b"]):
        return f"size {len(data)} != {line['b']} recorded"
    kind, value = content_hash(data)
    other = "c" if kind == "h" else "h"
    if line.get(kind) is not None and line[kind] != value:
        return "content checksum differs from its manifest line"
    if line.get(kind) is None and line.get(other) is not None:
        from eagle3ops.store import file_hashes

        if file_hashes(path, {other})[other] != line[other]:
            return "content checksum differs from its manifest line"
    why = store.validate_header(int(line["i"]), seq_len, num_states, hidden, dtype)
    return why if why else data
