"""Which rows a worker extracts: strided shards of the prepared rows by global rank, and the record of the ranks
a host's store covers when extraction spans several hosts (``hidden_states/shard.json``, docs/scale.md)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Reassignment:
    """The rows of lost ranks handed to the surviving ranks, on request (docs/scale.md, "A host that stays
    lost"): the lost ranks' rows, in row order, are dealt round-robin over the surviving ranks in rank order, so
    the ``j``-th lost row goes to survivor ``j mod S``. Pure arithmetic on (world size, lost ranks): every
    survivor works out the same plan on its own host, a row's new owner depends neither on the number of rows
    nor on ``--limit``, and each row still belongs to exactly one rank."""

    world_size: int
    lost: tuple[int, ...]

    @classmethod
    def of(cls, world_size: int, lost_ranks: Sequence[int] | None) -> Reassignment | None:
        """The plan, or None for no lost rank; refused (:class:`ExtractError`) for a rank outside the world, or
        every rank lost (nobody would be left to take the rows)."""
        if not lost_ranks:
            return None
        world = int(world_size)
        lost = tuple(sorted({int(r) for r in lost_ranks}))
        bad = [r for r in lost if not 0 <= r < world]
        if bad:
            raise ExtractError(
                f"--reassign-ranks {list(lost)}: rank(s) {bad} outside world size {world} (global ranks 0.."
                f"{world - 1}); name the ranks of the lost host(s) of this world"
            )
        if len(lost) == world:
            raise ExtractError(
                f"--reassign-ranks {list(lost)}: that is every rank of world size {world}; nothing would be left "
                "to take the rows. Re-assign only the ranks of hosts that are lost; the others resume"
            )
        return cls(world, lost)

    @property
    def survivors(self) -> list[int]:
        lost = set(self.lost)
        return [r for r in range(self.world_size) if r not in lost]

    def owner(self, row: int) -> int:
        """The global rank that extracts ``row`` under this plan."""
        r = row % self.world_size
        if r not in self.lost:
            return r
        # the position of ``row`` among the lost ranks' rows, in row order
        pos = (row // self.world_size) * len(self.lost) + sum(1 for x in self.lost if x < r)
        surv = self.survivors
        return surv[pos % len(surv)]

    def taken_rows(self, num_rows: int, rank: int, limit: int | None = None) -> list[int]:
        """The lost ranks' rows that surviving ``rank`` takes over (none for a lost rank), sorted."""
        if rank in self.lost:
            return []
        surv = self.survivors
        if rank not in surv:
            raise ExtractError(f"rank {rank} is outside world size {self.world_size}")
        lost_rows = shard_indices(num_rows, self.world_size, self.lost, limit)
        return lost_rows[surv.index(rank) :: len(surv)]

    def rank_rows(self, num_rows: int, rank: int, limit: int | None = None) -> list[int]:
        """Every row ``rank`` extracts under this plan: its own strided rows and the ones it takes over, sorted;
        none for a lost rank."""
        if rank in self.lost:
            return []
        return sorted(
            rank_indices(num_rows, self.world_size, rank, limit) + self.taken_rows(num_rows, rank, limit)
        )

    def record(self) -> dict:
        return {"lost_ranks": list(self.lost), "survivor_ranks": self.survivors}


def rows_of_ranks(
    num_rows: int,
    world_size: int,
    ranks: Sequence[int],
    limit: int | None = None,
    reassign: Reassignment | None = None,
) -> list[int]:
    """The rows ``ranks`` extract (a host's share; with ``reassign`` their own rows and the ones they take over),
    sorted."""
    if reassign is None:
        return shard_indices(num_rows, world_size, ranks, limit)
    out: list[int] = []
    for r in ranks:
        out.extend(reassign.rank_rows(num_rows, r, limit))
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


def check_shard(
    data_dir: str | os.PathLike,
    world_size: int,
    ranks: list[int],
    *,
    write: bool,
    reassign: Reassignment | None = None,
) -> dict:
    """The store of one host of a multi-host extraction records which global ranks it covers
    (``hidden_states/shard.json``); a later run with other ranks or another world size is refused, because
    the strided shards would move: rows another host already holds would be extracted here again, and rows
    of this store would be given to another host. With ``reassign`` the record also keeps which lost ranks' rows
    this store takes over (``reassigned``); once kept, a run with other lost ranks or none is refused too (the
    rows it took would move, or the lost host would extract them again). Returns the record (written when
    ``write`` and new or newly re-assigned)."""
    import socket

    old = read_shard(data_dir)
    want = {"world_size": int(world_size), "ranks": [int(r) for r in ranks]}
    if reassign is not None:
        mine = set(want["ranks"]) & set(reassign.lost)
        if mine:
            raise ExtractError(
                f"{data_dir}: this host's ranks {want['ranks']} include re-assigned rank(s) {sorted(mine)} "
                f"(--reassign-ranks {list(reassign.lost)}): a host whose share is re-assigned extracts nothing; "
                "its store is kept as it is, out of the gather (docs/scale.md, 'A host that stays lost'). "
                "Nothing was extracted."
            )
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
        had = (old.get("reassigned") or {}).get("lost_ranks")
        now = list(reassign.lost) if reassign else None
        if had and had != now:
            raise ExtractError(
                f"{shard_path(data_dir)}: this store took over the rows of lost rank(s) {had} "
                f"(re-assigned at {(old.get('reassigned') or {}).get('at')}), but this run "
                + (f"re-assigns rank(s) {now}" if now else "re-assigns none")
                + ": the rows it took would "
                + (
                    "move to other ranks and be extracted twice"
                    if now
                    else "be extracted again by their lost host"
                )
                + ". Run with the same re-assignment (extract_reassign_from, --reassign-ranks "
                f"{' '.join(map(str, had))}); after a further loss gather the stores into one and finish it with one "
                "host (docs/scale.md, 'Changing the hosts'). Nothing was extracted."
            )
        if had or reassign is None:
            return old
        rec = {**old, "reassigned": {**reassign.record(), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
    else:
        rec = {**want, "host": socket.gethostname(), "created_at": round(time.time(), 3)}
        if reassign is not None:
            rec["reassigned"] = {**reassign.record(), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if write:
        shard_path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(shard_path(data_dir), rec)
    return rec
