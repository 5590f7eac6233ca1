"""Issue #21: the share arithmetic of a multi-host extraction, the store's shard record, and the status view over
several stores.

Real: the store and its writer (real safetensors files, manifests), ``extract --plan`` through the CLI with a
real tiny target directory, ``shard.json``, ``eagle3ops extract-status`` with several ``--data``. STAND-IN: the hidden
states' values are random tensors of the right shapes (the planner and status never read values; the real
extraction over hosts is tests/ansible/test_extract_multihost.py).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from eagle3ops.cli import main as cli_main
from eagle3ops.extract import session as ex_session
from eagle3ops.extract import shards as ex_shards
from eagle3ops.extract import writer as ex_writer
from eagle3ops.store import HiddenStateStore
from tinymodels import build_prepared_dataset

LENGTHS = [5, 9, 3, 12, 7, 4, 6, 8, 2, 10]
LAYERS = [2, 4, 5]
K1, H = len(LAYERS) + 1, 64


def test_shares_are_disjoint_and_cover_every_row():
    # hosts with 1, 2 and 3 workers: ranks [0], [1, 2], [3, 4, 5] of 6
    shares = [ex_shards.shard_indices(100, 6, rs, None) for rs in ([0], [1, 2], [3, 4, 5])]
    flat = [i for s in shares for i in s]
    assert sorted(flat) == list(range(100)) and len(flat) == len(set(flat))
    assert shares[0] == list(range(0, 100, 6))
    assert ex_shards.shard_indices(10, 3, [1, 2], limit=5) == [1, 2, 4]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return build_prepared_dataset(tmp_path_factory.mktemp("mh-prep") / "data", LENGTHS)


def _store(prepared, model, dest, rows, world=None, ranks=None):
    shutil.copytree(prepared, dest)
    cfg = ex_session.ExtractConfig(
        data_dir=str(dest), model_path=str(model), layer_ids=LAYERS, progress=False
    )
    store = HiddenStateStore(dest, rank=(ranks or [0])[0])
    store.ensure_meta(ex_session.build_meta(cfg, ex_session.model_facts(model), LAYERS, len(LENGTHS)))
    g = torch.Generator().manual_seed(7)
    parts = {i: ex_writer.sample_parts(torch.arange(LENGTHS[i]), torch.randn(LENGTHS[i], K1, H, generator=g).bfloat16())
             for i in rows}  # fmt: skip
    store.append_manifest([store.write_sample(i, parts[i], LENGTHS[i], fsync=False) for i in rows])
    store.close()
    if world:
        ex_shards.check_shard(dest, world, ranks, write=True)
    return dest


def _json(capsys, argv) -> tuple[int, dict]:
    rc = cli_main(argv)
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_plan_of_a_share_and_the_refusal_of_another_world(prepared, tiny_target, tmp_path, capsys):
    b = _store(prepared, tiny_target, tmp_path / "b", [1, 2], world=3, ranks=[1, 2])
    common = ["extract", "--data", str(b), "--model", str(tiny_target), "--layer-ids", *map(str, LAYERS)]
    rc, plan = _json(
        capsys, [*common, "--world-size", "3", "--first-rank", "1", "--workers", "2", "--check", "--json"]
    )
    assert rc == 0
    # ranks 1 and 2 of 3 own rows 1, 2, 4, 5, 7, 8; rows 1 and 2 are done
    assert plan["total"] == 6 and plan["done_before"] == 2 and plan["to_extract"] == 4, plan
    assert plan["ranks"] == [1, 2] and plan["world_size"] == 3
    rc, res = _json(
        capsys, [*common, "--world-size", "2", "--first-rank", "1", "--workers", "1", "--check", "--json"]
    )
    assert (
        rc == 2
        and "holds global ranks [1, 2] of world size 3" in res["msg"]
        and "ranks [1] of 2" in res["msg"]
    )
    rc, res = _json(
        capsys, [*common, "--world-size", "3", "--first-rank", "2", "--workers", "2", "--check", "--json"]
    )
    assert rc == 2 and "outside world size 3" in res["msg"], res
    assert json.loads((b / "hidden_states" / "shard.json").read_text())["ranks"] == [1, 2]  # untouched


def test_status_over_several_stores(prepared, tiny_target, tmp_path, capsys):
    a = _store(prepared, tiny_target, tmp_path / "a", [0, 3, 6, 9], world=3, ranks=[0])
    b = _store(prepared, tiny_target, tmp_path / "b", [1, 2, 4, 5, 8], world=3, ranks=[1, 2])
    rc, view = _json(capsys, ["extract-status", "--data", str(a), "--data", str(b), "--json"])
    assert rc == 0
    assert (view["rows"], view["done"], view["missing"], view["missing_rows"]) == (10, 9, 1, [7])
    assert view["complete"] is False and view["done_twice"] == 0 and view["not_covered"] == 0
    assert [(s["ranks"], s["expected"], s["done"], s["missing_rows"]) for s in view["stores"]] == [
        ([0], 4, 4, []), ([1, 2], 6, 5, [7]),
    ]  # fmt: skip
    # a one-host store beside them: every row it holds is done twice
    one = _store(prepared, tiny_target, tmp_path / "one", list(range(10)))
    rc, view = _json(
        capsys, ["extract-status", "--data", str(a), "--data", str(b), "--data", str(one), "--json"]
    )
    assert rc == 0 and view["done_twice"] == 9 and view["complete"] is False


def test_status_refuses_stores_of_different_datasets(prepared, tiny_target, tmp_path, capsys):
    a = _store(prepared, tiny_target, tmp_path / "a", [0], world=2, ranks=[0])
    other = build_prepared_dataset(tmp_path / "other-prep", [4] * len(LENGTHS), seed=5)
    b = _store(other, tiny_target, tmp_path / "b", [1], world=2, ranks=[1])
    rc, res = _json(capsys, ["extract-status", "--data", str(a), "--data", str(b), "--json"])
    assert rc == 2 and "different prepared datasets" in res["msg"], res
