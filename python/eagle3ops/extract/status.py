"""What a data directory's extraction stands at: one store (:func:`status`), or the stores of a multi-host
extraction seen together (:func:`status_many`). Reads only: manifests, headers, ``shard.json``."""

from __future__ import annotations

import os
from collections.abc import Sequence

from eagle3ops.extract.errors import ExtractError
from eagle3ops.extract.session import (
    damaged_report,
    load_seq_lens,
)
from eagle3ops.extract.shards import read_shard, shard_indices
from eagle3ops.store import (
    HiddenStateStore,
)


def status(data_dir: str | os.PathLike) -> dict:
    """Progress of a data directory from the manifests, with the cheap check of every finished file against the
    disk (size + header, no tensors loaded): damaged or missing files do not count as done."""
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
    return {
        "data_dir": str(data_dir),
        "rows": len(seq_lens),
        "done": len(good),
        "remaining": len(seq_lens) - len([i for i in good if i < len(seq_lens)]),
        "tokens_done": sum(e.seq_len for e in good.values()),
        "tokens_total": sum(seq_lens),
        "bytes": sum(e.nbytes for e in good.values()),
        "damaged": len(damaged),
        "damaged_files": damaged_report(store, damaged),
        "duplicate_manifest_lines": sum(n - 1 for n in scan.duplicates().values()),
        "torn_manifest_lines": scan.torn_lines,
        "meta": meta,
    }


def status_many(data_dirs: Sequence[str | os.PathLike]) -> dict:
    """One view over the stores of a multi-host extraction (each host's own data directory, reachable here
    through a shared mount or after copying them): per store, the global ranks it covers (its
    ``hidden_states/shard.json``), its rows done and missing; overall, the rows done in some store, the rows no
    store has yet, rows held by more than one store (done twice), and rows no store's ranks cover."""
    stores = []
    fingerprints = set()
    rows = None
    owner: dict[int, list[int]] = {}  # row -> indices of the stores holding it
    covered: set[int] = set()
    for k, d in enumerate(data_dirs):
        st = status(d)
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
        shard = read_shard(d)
        store = HiddenStateStore(d)
        good = {i for i in store.scan_manifest().entries if str(i) not in st["damaged_files"]}
        expected = (
            set(shard_indices(st["rows"], shard["world_size"], shard["ranks"])) if shard else set(range(rows))
        )
        covered |= expected
        for i in good:
            owner.setdefault(i, []).append(k)
        missing = sorted(expected - good)
        stores.append(
            {
                "data_dir": str(d),
                "host": (shard or {}).get("host"),
                "world_size": (shard or {}).get("world_size"),
                "ranks": (shard or {}).get("ranks"),
                "expected": len(expected),
                "done": len(good & expected),
                "missing": len(missing),
                "missing_rows": missing[:50],
                "outside_ranks": len(good - expected),
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
        "world_sizes": sorted(worlds),
        "complete": len(done) == rows and not twice,
    }
