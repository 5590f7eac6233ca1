"""The SGLang backend over several capture servers (issue #34): several servers of one host (data parallel) and
several hosts each extracting its strided share into its own store, as the transformers backend's workers do.

STAND-IN: SGLang cannot run on this CPU-only machine. Each "server" is the loopback stand-in
(tests/fixtures/sglang_standin_server.py) running the REAL capture hook over a transformers model; each "host" is a
data directory of its own on this machine (tests/hosts/test_multihost_nspawn.py runs real hosts for the
transformers backend; the client, the hook, the store and the shard rules are the same code here). What is real:
the client, the routing of rows to servers and ranks, the hook's writes and manifests, the shard record.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from eagle3ops.sglang import hook as sglang_hook
from eagle3ops.sglang.client import (
    SGLangClientError,
    SGLangExtractConfig,
    routing,
    run_sglang_extraction,
)
from eagle3ops.store import HiddenStateStore
from sglang_inputs import sglang_cfg, transformers_reference
from tinymodels import build_prepared_dataset

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from sglang_standin import standin_server

LENGTHS = [5, 17, 33, 9, 12, 2, 21, 40, 7, 26, 3, 15, 11]
LAYERS = [2, 4, 5]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_target):
    """The transformers backend's store of every row, on one host: the bytes every other layout must give."""
    return transformers_reference(tmp_path_factory, tiny_target, LENGTHS)


def _server(tmp_path: Path, name: str, data_dir: Path, model, rank: int, *args):
    work = tmp_path / name
    work.mkdir(exist_ok=True)
    return standin_server(
        work, data_dir, model, LAYERS, *args, env={sglang_hook.ENV_MANIFEST_RANK: str(rank)}
    )


def _cfg(data_dir, model, urls, **kw):
    return sglang_cfg(data_dir, model, urls, **{"concurrency": 2, "confirm_timeout": 60, **kw})


def _stats(url) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/standin/stats", timeout=30) as r:
        return json.loads(r.read())


def test_routing_splits_rows_by_server_and_by_rank():
    one = routing(SGLangExtractConfig(data_dir="d", model_path="m", url=["a", "b"]), 7)
    assert one[0] == list(range(7)) and one[1] is None
    assert [one[2](i) for i in range(4)] == ["a", "b", "a", "b"]
    # host 2 of 3, two servers: ranks 2 and 3 of 5
    idx, ranks, server = routing(
        SGLangExtractConfig(data_dir="d", model_path="m", url=["x", "y"], world_size=5, first_rank=2), 12
    )
    assert ranks == [2, 3] and idx == [2, 3, 7, 8]
    assert [server(i) for i in idx] == ["x", "y", "x", "y"]
    with pytest.raises(SGLangClientError, match=r"ranks 4\.\.5, outside --world-size 5"):
        routing(
            SGLangExtractConfig(data_dir="d", model_path="m", url=["x", "y"], world_size=5, first_rank=4), 3
        )


def test_two_servers_of_one_host_share_its_rows(tmp_path, tiny_target, reference):
    """Data parallel on one host: every row once, split between both servers, each appending to its own manifest;
    the files are the transformers backend's bytes; a second run sends nothing."""
    data = build_prepared_dataset(tmp_path / "data", LENGTHS)
    with (
        _server(tmp_path, "s0", data, tiny_target, 0) as u0,
        _server(tmp_path, "s1", data, tiny_target, 1) as u1,
    ):
        res = run_sglang_extraction(_cfg(data, tiny_target, [u0, u1]))
        sent = (_stats(u0)["calls"], _stats(u1)["calls"])
        again = run_sglang_extraction(_cfg(data, tiny_target, [u0, u1]))
    assert res["written"] == len(LENGTHS) and res["failed"] == 0 and res["urls"] == [u0, u1]
    assert sent == (7, 6), "rows are split by index between the two servers"
    store, ref = HiddenStateStore(data), HiddenStateStore(reference)
    for i in range(len(LENGTHS)):
        assert store.path(i).read_bytes() == ref.path(i).read_bytes(), f"row {i}"
    manifests = sorted(p.name for p in store.dir.glob("manifest-rank*.jsonl"))
    assert manifests == ["manifest-rank0.jsonl", "manifest-rank1.jsonl"]
    assert sorted(store.scan_manifest().entries) == list(range(len(LENGTHS)))
    assert again["written"] == 0 and again["done_before"] == len(LENGTHS)


def test_two_hosts_each_extract_their_share_and_a_lost_host_resumes(tmp_path, tiny_target, reference):
    """Two hosts (two stores), one capture server each, world 2: host B's server is killed (-9) mid-run; host A
    finishes its share; B, brought back, finishes its own without touching A's rows. The union of the two stores is
    the one-host store byte for byte, no row is in both, each store records its rank, a re-run sends nothing."""
    a = build_prepared_dataset(tmp_path / "hostA" / "data", LENGTHS)
    b = build_prepared_dataset(tmp_path / "hostB" / "data", LENGTHS)
    cfg_a = _cfg(a, tiny_target, None, world_size=2, first_rank=0)
    cfg_b = _cfg(b, tiny_target, None, world_size=2, first_rank=1, retries=0, health_timeout=5)
    with _server(tmp_path, "a", a, tiny_target, 0) as ua:
        cfg_a.url = [ua]
        done_a = run_sglang_extraction(cfg_a)
        with _server(tmp_path, "b1", b, tiny_target, 1, "--batch-delay", "1.0", "--max-batch", "1") as ub:
            cfg_b.url = [ub]
            out: dict = {}
            t = threading.Thread(target=lambda: out.setdefault("r", _try(run_sglang_extraction, cfg_b)))
            t.start()
            store_b = HiddenStateStore(b)
            while len(store_b.scan_manifest().entries) < 2:  # bounded by the thread: it ends with the run
                assert t.is_alive(), out
                time.sleep(0.05)
            os.kill(ub.pid, signal.SIGKILL)  # the host's server dies mid-run
            t.join(300)
            assert not t.is_alive()
        partial = sorted(store_b.scan_manifest().entries)
        assert 2 <= len(partial) < 6, "host B stopped part way"
        with _server(tmp_path, "b2", b, tiny_target, 1) as ub2:  # the host is back
            cfg_b.url, cfg_b.retries, cfg_b.health_timeout = [ub2], 3, 180
            done_b = run_sglang_extraction(cfg_b)
            again = [run_sglang_extraction(c) for c in (cfg_a, cfg_b)]
    assert done_a["ranks"] == [0] and done_a["written"] == 7 and done_a["failed"] == 0
    assert (
        done_b["ranks"] == [1]
        and done_b["written"] == 6 - len(partial)
        and done_b["done_before"] == len(partial)
    )
    assert [r["written"] for r in again] == [0, 0]
    rows_a = set(HiddenStateStore(a).scan_manifest().entries)
    rows_b = set(HiddenStateStore(b).scan_manifest().entries)
    assert rows_a == set(range(0, 13, 2)) and rows_b == set(range(1, 13, 2)) and not rows_a & rows_b
    ref = HiddenStateStore(reference)
    for i in range(len(LENGTHS)):
        got = HiddenStateStore(a if i in rows_a else b).path(i)
        assert got.read_bytes() == ref.path(i).read_bytes(), f"row {i}"
    for d, rank in ((a, 0), (b, 1)):
        shard = json.loads((d / "hidden_states" / "shard.json").read_text())
        assert shard["world_size"] == 2 and shard["ranks"] == [rank]


def test_a_host_asked_for_other_ranks_is_refused(tmp_path, tiny_target):
    a = build_prepared_dataset(tmp_path / "data", LENGTHS)
    with _server(tmp_path, "a", a, tiny_target, 0) as ua:
        run_sglang_extraction(_cfg(a, tiny_target, [ua], world_size=2, first_rank=0, limit=2))
        with pytest.raises(Exception, match="shard"):
            run_sglang_extraction(_cfg(a, tiny_target, [ua], world_size=3, first_rank=0))


def _try(fn, *a):
    try:
        return fn(*a)
    except Exception as e:  # the killed server ends host B's run: its error is the result
        return {"error": str(e)}


def test_routing_sends_the_rows_a_host_takes_over_to_its_servers():
    """Issue 34, on request: rank 2 of 4 lost; this host (ranks 0 and 1) takes the lost rows its ranks own
    (shards.Reassignment: the lost rows 2, 6, 10, ... dealt over ranks 0, 1, 3) and sends each to its rank's server."""
    cfg = SGLangExtractConfig(
        data_dir="d", model_path="m", url=["x", "y"], world_size=4, first_rank=0, reassign_ranks=[2]
    )
    idx, ranks, server = routing(cfg, 16)
    assert ranks == [0, 1] and idx == [0, 1, 2, 4, 5, 6, 8, 9, 12, 13, 14]
    assert [server(i) for i in (2, 6, 14)] == ["x", "y", "x"] and server(5) == "y"


@pytest.mark.slow  # two stand-in capture servers and the one-host reference
def test_a_lost_hosts_rows_taken_over_through_the_capture_server(tmp_path, tiny_target, reference):
    """Issue 34, on request, through the real hook: host B (rank 1 of 2) finishes a few rows and is lost; host A's
    server takes over rank 1 with B's part readable - B's finished rows copied (not sent to a server), the rest
    captured by A's server into A's own manifest rank; A's store alone is the one-host store byte for byte."""
    a = build_prepared_dataset(tmp_path / "hostA" / "data", LENGTHS)
    b = build_prepared_dataset(tmp_path / "hostB" / "data", LENGTHS)
    with _server(tmp_path, "b", b, tiny_target, 1) as ub:
        run_sglang_extraction(_cfg(b, tiny_target, [ub], world_size=2, first_rank=1, limit=6))
    assert sorted(HiddenStateStore(b).scan_manifest().entries) == [1, 3, 5]
    take = {"world_size": 2, "first_rank": 0, "reassign_ranks": [1], "reassign_from_data": [str(b)]}
    with _server(tmp_path, "a", a, tiny_target, 0) as ua:
        done = run_sglang_extraction(_cfg(a, tiny_target, [ua], **take))
        sent = _stats(ua)["calls"]
        again = run_sglang_extraction(_cfg(a, tiny_target, [ua], **take))
    assert done["imported"] == 3 and done["written"] == len(LENGTHS) - 3 and done["failed"] == 0, done
    assert sent == len(LENGTHS) - 3, "the rows B finished were copied, not captured again"
    assert again["written"] == 0 and again.get("imported", 0) == 0
    store, ref = HiddenStateStore(a), HiddenStateStore(reference)
    assert sorted(store.scan_manifest().entries) == list(range(len(LENGTHS)))
    assert {e.rank for e in store.scan_manifest().entries.values()} == {0}
    for i in range(len(LENGTHS)):
        assert store.path(i).read_bytes() == ref.path(i).read_bytes(), f"row {i}"
    shard = json.loads((a / "hidden_states" / "shard.json").read_text())
    assert shard["reassigned"]["lost_ranks"] == [1]


def test_units_pair_with_the_servers():
    """Several servers of one host, each its own systemd unit (the sglang role's sglang_servers): the units pair
    with the URLs in order (each server's death is read from its own unit); one unit serves every URL; "" means
    attach; a count that pairs with nothing is refused before anything is started."""
    cfg = SGLangExtractConfig(data_dir="d", model_path="m", url=["a", "b"], server_unit=["u-0", "u-1"])
    assert cfg.units == ["u-0", "u-1"] and [cfg.unit_for(u) for u in ("a", "b")] == ["u-0", "u-1"]
    cfg.check_units()
    one = SGLangExtractConfig(data_dir="d", model_path="m", url=["a", "b"], server_unit="u")
    assert one.units == ["u"] and one.unit_for("b") == "u"
    assert SGLangExtractConfig(data_dir="d", model_path="m", server_unit=[""]).units == []
    bad = SGLangExtractConfig(data_dir="d", model_path="m", url=["a", "b", "c"], server_unit=["u-0", "u-1"])
    with pytest.raises(SGLangClientError, match=r"2 server units .* for 3 server URLs"):
        bad.check_units()
