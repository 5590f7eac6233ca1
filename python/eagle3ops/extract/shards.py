"""Which rows a worker extracts: strided shards of the prepared rows by global rank, and the record of the ranks
a host's store covers when extraction spans several hosts (``hidden_states/shard.json``, docs/scale.md)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from eagle3ops.durable import atomic_write_json
from eagle3ops.extract.errors import ExtractError
from eagle3ops.store.layout import HS_DIR, SHARD_FILE


def rank_indices(num_rows: int, world_size: int, rank: int, limit: int | None = None) -> list[int]:
    """Disjoint strided shards: rank r takes rows r, r+W, r+2W, ... (balanced lengths after prepare's shuffle)."""
    n = num_rows if limit is None else min(limit, num_rows)
    if not 0 <= rank < world_size:
        raise ExtractError(f"rank {rank} is outside world size {world_size}")
    return list(range(rank, n, world_size))


def shard_indices(
    num_rows: int, world_size: int, ranks: Sequence[int], limit: int | None = None
) -> list[int]:
    """The rows of several ranks of ``world_size`` (a host's share when extraction spans several hosts), sorted."""
    out: list[int] = []
    for r in ranks:
        out.extend(rank_indices(num_rows, world_size, r, limit))
    return sorted(out)


def shard_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / HS_DIR / SHARD_FILE


def read_shard(data_dir: str | os.PathLike) -> dict | None:
    p = shard_path(data_dir)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ExtractError(
            f"{p}: unreadable shard record ({e}); restore it or remove it to start the record anew"
        ) from e


def check_shard(data_dir: str | os.PathLike, world_size: int, ranks: list[int], *, write: bool) -> dict:
    """The store of one host of a multi-host extraction records which global ranks it covers
    (``hidden_states/shard.json``); a later run with other ranks or another world size is refused, because
    the strided shards would move: rows another host already holds would be extracted here again, and rows
    of this store would be given to another host. Returns the record (written when ``write`` and new)."""
    import socket

    old = read_shard(data_dir)
    want = {"world_size": int(world_size), "ranks": [int(r) for r in ranks]}
    if old is not None:
        if old.get("world_size") != want["world_size"] or old.get("ranks") != want["ranks"]:
            raise ExtractError(
                f"{shard_path(data_dir)}: this store holds global ranks {old.get('ranks')} of world size "
                f"{old.get('world_size')} (host {old.get('host')}), but this run is ranks {want['ranks']} of "
                f"{want['world_size']}: the hosts sharing the rows (extract_shard_hosts) or their worker counts "
                "changed, which would extract rows another host already holds and leave some of these unused. "
                "Run with the inventory of the first run, or gather every host's store into one and extract "
                "that with one host (docs/scale.md, 'Changing the hosts'). Nothing was extracted."
            )
        return old
    rec = {**want, "host": socket.gethostname(), "created_at": round(time.time(), 3)}
    if write:
        shard_path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(shard_path(data_dir), rec)
    return rec
