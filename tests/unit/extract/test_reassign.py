"""Issue #34: a lost host's rows re-assigned to the surviving hosts on request (docs/scale.md, "A host that stays
lost").

The plan (who extracts which row) is pure arithmetic: checked over many random worlds for the exactly-once
property. The store's record and refusals: ``hidden_states/shard.json`` through ``check_shard`` and the CLI.
The local multi-"host" runs: each host is a data directory of its own on this machine, each extraction a real
``eagle3ops extract`` run (its CLI in the test's process, one worker each, so torch is imported once; the tiny
CPU target of tests/unit/conftest.py); the union of the survivors' stores is compared byte for byte with a
one-host extraction, and ``eagle3ops extract-status`` over every store says complete, nothing twice, the lost
host's part kept out.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from eagle3ops.cli import main as cli_main
from eagle3ops.extract import shards
from eagle3ops.extract.errors import ExtractError
from eagle3ops.store import HiddenStateStore
from sglang_inputs import transformers_reference
from tinymodels import build_prepared_dataset

LENGTHS = [5, 17, 33, 9, 12, 2, 21, 40, 7, 26, 3, 15, 11, 6]


# ---------------------------------------------------------------------------------------------------- the plan
def test_every_row_exactly_once_over_many_random_plans():
    rnd = random.Random(34)
    for _ in range(3000):
        world = rnd.randint(2, 12)
        lost = rnd.sample(range(world), rnd.randint(1, world - 1))
        n = rnd.randint(0, 120)
        limit = rnd.choice([None, rnd.randint(0, 130)])
        plan = shards.Reassignment.of(world, lost)
        rows = {r: plan.rank_rows(n, r, limit) for r in range(world)}
        flat = [i for rs in rows.values() for i in rs]
        upto = n if limit is None else min(n, limit)
        assert sorted(flat) == list(range(upto)), (world, lost, n, limit)  # every row, none twice
        for r in range(world):
            own = shards.rank_indices(n, world, r, limit)
            if r in lost:
                assert rows[r] == []
            else:  # a survivor keeps its own rows (what it finished stays done) and takes some lost ones
                assert set(own) <= set(rows[r])
            assert all(plan.owner(i) == r for i in rows[r])
        taken = [len(plan.taken_rows(n, r, limit)) for r in plan.survivors]
        assert max(taken) - min(taken) <= 1, "the lost rows are dealt evenly"
        # a row's new owner depends neither on the number of rows nor on --limit: more rows add, never move
        for r in plan.survivors:
            assert [i for i in plan.rank_rows(n + 7, r) if i < upto] == rows[r]


def test_the_plan_of_a_small_world_by_hand():
    # world 4, rank 1 lost: its rows 1, 5, 9, 13 go to ranks 0, 2, 3, 0
    plan = shards.Reassignment.of(4, [1])
    assert plan.survivors == [0, 2, 3]
    assert [plan.owner(i) for i in (1, 5, 9, 13)] == [0, 2, 3, 0]
    assert plan.rank_rows(14, 0) == [0, 1, 4, 8, 12, 13]
    assert shards.rows_of_ranks(14, 4, [2, 3], None, plan) == [2, 3, 5, 6, 7, 9, 10, 11]
    assert shards.Reassignment.of(4, []) is None


@pytest.mark.parametrize(
    ("lost", "match"),
    [
        ([0, 1, 2], r"every rank of world size 3"),
        ([3], r"rank\(s\) \[3\] outside world size 3"),
        ([-1], "outside"),
    ],
)
def test_a_plan_without_survivors_or_outside_the_world_is_refused(lost, match):
    with pytest.raises(ExtractError, match=match):
        shards.Reassignment.of(3, lost)


# ---------------------------------------------------------------------------------------------------- the record
def test_the_record_keeps_the_reassignment_and_refuses_another(tmp_path):
    d = tmp_path / "data"
    shards.check_shard(d, 3, [0], write=True)
    plan = shards.Reassignment.of(3, [1])
    assert shards.check_shard(d, 3, [0], write=False, reassign=plan)["reassigned"]["lost_ranks"] == [1]
    assert "reassigned" not in shards.read_shard(d), "check mode writes nothing"
    rec = shards.check_shard(d, 3, [0], write=True, reassign=plan)
    assert rec["reassigned"]["lost_ranks"] == [1] and shards.read_shard(d)["reassigned"][
        "survivor_ranks"
    ] == [0, 2]
    assert shards.check_shard(d, 3, [0], write=True, reassign=plan) == rec  # the same request: nothing new
    assert shards.read_shard(d) == rec
    with pytest.raises(ExtractError, match=r"took over the rows of lost rank\(s\) \[1\].*re-assigns none"):
        shards.check_shard(d, 3, [0], write=True)
    with pytest.raises(ExtractError, match=r"re-assigns rank\(s\) \[1, 2\]"):
        shards.check_shard(d, 3, [0], write=True, reassign=shards.Reassignment.of(3, [1, 2]))
    with pytest.raises(ExtractError, match=r"include re-assigned rank\(s\) \[0\]"):
        shards.check_shard(tmp_path / "lost", 3, [0], write=True, reassign=shards.Reassignment.of(3, [0]))
    assert not (tmp_path / "lost").exists()


# ---------------------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_target):
    return transformers_reference(tmp_path_factory, tiny_target, LENGTHS)


def _run(capsys, data, model, *args, check=True) -> tuple[int, dict, str]:
    """``eagle3ops extract`` in this process (one worker: no child process; torch is imported once for the file)."""
    capsys.readouterr()
    rc = cli_main(
        ["extract", "--data", str(data), "--model", str(model), "--max-batch-size", "1", "--json", "--no-progress",
         *args]
    )  # fmt: skip
    cap = capsys.readouterr()
    lines = [ln for ln in cap.out.splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {}
    if check:
        assert rc == 0, (cap.out, cap.err)
    return rc, out, cap.err


def _json(capsys, argv) -> tuple[int, dict]:
    rc = cli_main(argv)
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _rows(d) -> set[int]:
    return set(HiddenStateStore(d).scan_manifest().entries)


def _same_as_reference(stores, reference):
    ref = HiddenStateStore(reference)
    held = {}
    for d in stores:
        for i in _rows(d):
            assert i not in held, f"row {i} in {held.get(i)} and {d}"
            held[i] = d
    assert sorted(held) == list(range(len(LENGTHS)))
    for i, d in held.items():
        assert HiddenStateStore(d).path(i).read_bytes() == ref.path(i).read_bytes(), f"row {i} ({d})"


@pytest.mark.slow  # real extractions for several "hosts" and the one-host reference
def test_three_hosts_one_lost_with_its_part_readable(tmp_path, tiny_target, reference, capsys):
    """Hosts A, B, C (ranks 0, 1, 2 of 3). B finishes 3 of its 5 rows and is lost; A and C are asked to take over
    rank 1, and B's part is readable here: the rows B finished are copied (checked), not extracted again, the rest
    extracted by A and C into their own stores; check mode predicts it; the union is the one-host store byte for
    byte; extract-status over the three stores: complete, B's part kept out; a second run changes nothing."""
    a, b, c = (build_prepared_dataset(tmp_path / h / "data", LENGTHS) for h in "abc")
    share = {
        h: ["--world-size", "3", "--first-rank", str(r), "--workers", "1"]
        for h, r in zip("abc", range(3), strict=True)
    }
    _run(capsys, a, tiny_target, *share["a"])
    _run(
        capsys, b, tiny_target, *share["b"], "--limit", "10"
    )  # B: rows 1, 4, 7 of its 1, 4, 7, 10, 13; then lost
    assert _rows(b) == {1, 4, 7}
    take = ["--reassign-ranks", "1", "--reassign-from-data", str(b)]
    # A takes B's rows 1, 7, 13; C takes 4, 10
    _, plan_a, _ = _run(capsys, a, tiny_target, *share["a"], *take, "--check")
    assert plan_a["importable"] == 2 and plan_a["to_extract"] == 1 and plan_a["changed"] is True, plan_a
    assert plan_a["total"] == 5 + 3 and plan_a["reassigned"] == {"lost_ranks": [1], "survivor_ranks": [0, 2]}
    _, ra, _ = _run(capsys, a, tiny_target, *share["a"], *take)
    _, rc_, _ = _run(capsys, c, tiny_target, *share["c"], *take)
    assert (ra["imported"], ra["written"], ra["changed"]) == (2, 1, True), ra
    assert (rc_["imported"], rc_["written"]) == (1, 4 + 1), rc_
    assert _rows(a) == {0, 3, 6, 9, 12, 1, 7, 13} and _rows(c) == {2, 5, 8, 11, 4, 10}
    assert _rows(b) == {1, 4, 7}, "the lost part is only read"
    _same_as_reference([a, c], reference)
    # the copied rows have manifest lines of the rank that took them (no manifest name shared between the stores)
    assert json.loads((a / "hidden_states" / "manifest-rank0.jsonl").read_text().splitlines()[-1])["r"] == 0
    assert sorted(p.name for p in (c / "hidden_states").glob("manifest-rank*")) == ["manifest-rank2.jsonl"]
    rc, st = _json(capsys, ["extract-status", "--data", str(a), "--data", str(b), "--data", str(c), "--json"])
    assert rc == 0 and st["complete"] and st["done_twice"] == 0 and st["not_covered"] == 0, st
    assert st["kept_out"] == [str(b)] and [s["kept_out"] for s in st["stores"]] == [False, True, False]
    again = [_run(capsys, d, tiny_target, *share[h], *take)[1] for d, h in ((a, "a"), (c, "c"))]
    assert [(r["written"], r.get("imported", 0), r["changed"]) for r in again] == [(0, 0, False)] * 2


@pytest.mark.slow  # real extractions for several "hosts" and the one-host reference
def test_two_hosts_one_lost_unreadable_and_the_refusals(tmp_path, tiny_target, reference, capsys):
    """Hosts A, B (ranks 0, 1 of 2). B extracts a few rows and is lost for good (its part cannot be read): A, asked
    to take over rank 1, extracts all of B's share into its own store. Refused before any work, exit 2: B itself
    with the re-assignment, A without it once it took B's rows (B would extract them again), every rank
    re-assigned, a rank outside the world, a lost part that is not a lost rank's, no --first-rank."""
    a, b = (build_prepared_dataset(tmp_path / h / "data", LENGTHS) for h in "ab")
    sa = ["--world-size", "2", "--first-rank", "0", "--workers", "1"]
    sb = ["--world-size", "2", "--first-rank", "1", "--workers", "1"]
    _run(capsys, b, tiny_target, *sb, "--limit", "4")
    assert _rows(b) == {1, 3}
    base = ["extract", "--model", str(tiny_target), "--json"]
    refusals = [
        ([*base, "--data", str(b), *sb, "--reassign-ranks", "1"], r"include re-assigned rank\(s\) \[1\]"),
        ([*base, "--data", str(a), *sa, "--reassign-ranks", "0", "1"], "every rank of world size 2"),
        ([*base, "--data", str(a), *sa, "--reassign-ranks", "2"], "outside world size 2"),
        ([*base, "--data", str(a), "--reassign-ranks", "1"], "need --world-size and --first-rank"),
        ([*base, "--data", str(a), *sa, "--reassign-from-data", str(b)], "needs --reassign-ranks"),
        ([*base, "--data", str(a), *sa, "--reassign-ranks", "1", "--reassign-from-data", str(tmp_path)],
         "no hidden_states/ there"),
    ]  # fmt: skip
    for argv in refusals:
        rc, res = _json(capsys, argv[0])
        assert rc == 2 and res["failed"] and re.search(argv[1], res["msg"]), (argv, res)
    assert not (a / "hidden_states").exists(), "nothing was written by a refused run"
    assert _rows(b) == {1, 3}
    _, ra, _ = _run(capsys, a, tiny_target, *sa, "--reassign-ranks", "1")
    assert ra["written"] == len(LENGTHS) and ra.get("imported", 0) == 0
    _same_as_reference([a], reference)
    rc, res = _json(capsys, [*base, "--data", str(a), *sa])
    assert (
        rc == 2
        and "took over the rows of lost rank(s) [1]" in res["msg"]
        and "extracted again by their lost host" in res["msg"]
    )
    # a part that holds the survivor's own rank is not a lost part
    a2 = build_prepared_dataset(tmp_path / "a2" / "data", LENGTHS)
    rc, res = _json(
        capsys, [*base, "--data", str(a2), *sa, "--reassign-ranks", "1", "--reassign-from-data", str(a)]
    )
    assert rc == 2 and "not re-assigned ranks of this world" in res["msg"], res
    rc, st = _json(capsys, ["extract-status", "--data", str(a), "--data", str(b), "--json"])
    assert st["complete"] and st["kept_out"] == [str(b)] and st["done_twice"] == 0, st
