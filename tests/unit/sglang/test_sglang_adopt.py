"""Adopting an existing dump through the SGLang backend (``eagle3ops extract-sglang --adopt-from``): the same
adoption as the transformers backend's (eagle3ops.extract.adoption), before any row is sent.

Real: the CLI, the store, the adoption (a SpecForge-layout dump of real ``torch.save`` files, one of them cut short
on disk), the client and the hook. STAND-IN: the server is tests/fixtures' loopback stand-in of a patched SGLang
server running the real hook over a transformers model (SGLang cannot run on this CPU-only machine); the dump's
states are the transformers backend's states of the same rows (its producer, SGLang on GPUs, cannot run here).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from eagle3ops.cli import main as cli_main
from eagle3ops.store import HiddenStateStore, reader
from eagle3ops.store import adopted as adopted_record
from safetensors.torch import load_file
from sglang_inputs import transformers_reference
from tinymodels import build_prepared_dataset

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from sglang_standin import standin_server

LENGTHS = [5, 17, 33, 9, 12, 2, 21, 40, 7, 26, 3, 15]
LAYERS = [2, 4, 5]
DUMPED = 8  # rows 0..7 in the dump, row 3's file cut short
SIDE = {"layer_ids": LAYERS, "layer_convention": "input", "last_state": "pre-norm"}


def _dump(reference: Path, dump: Path) -> Path:
    """Rows 0..DUMPED-1 of ``reference`` as SpecForge's offline files (names in reverse row order); row 3's cut
    short. Returns the truncated file."""
    (dump / "rows_0-2000").mkdir(parents=True)
    for i in range(DUMPED):
        d = load_file(reference / "hidden_states" / f"hs_{i}.safetensors")
        hs, t = d["hidden_states"], d["hidden_states"].shape[0]
        torch.save(
            {"input_ids": d["token_ids"], "aux_hidden_state": hs[:, :-1].reshape(1, t, -1).clone(),
             "hidden_state": hs[:, -1][None].clone()},
            dump / "rows_0-2000" / f"data_{DUMPED - 1 - i}.ckpt",
        )  # fmt: skip
    (dump / "eagle3ops-dump.json").write_text(json.dumps(SIDE))
    short = dump / "rows_0-2000" / f"data_{DUMPED - 1 - 3}.ckpt"
    os.truncate(short, short.stat().st_size // 2)
    return short


def _cli(capsys, *argv) -> tuple[int, dict, str]:
    rc = cli_main(["extract-sglang", *argv, "--no-progress", "--json"])
    cap = capsys.readouterr()
    out = cap.out.strip().splitlines()
    return rc, json.loads(out[-1]) if out else {}, cap.err


def test_a_dump_is_adopted_and_only_the_rest_is_sent(tmp_path, tmp_path_factory, tiny_target, capsys):
    reference = transformers_reference(tmp_path_factory, tiny_target, LENGTHS)
    data = build_prepared_dataset(tmp_path / "data", LENGTHS)
    dump = tmp_path / "dump"
    short = _dump(reference, dump)
    common = ["--data", str(data), "--model", str(tiny_target), "--layer-ids", *map(str, LAYERS)]
    common += ["--adopt-from", str(dump)]

    rc, plan, err = _cli(capsys, *common, "--url", "http://127.0.0.1:9", "--check")  # no server contacted
    assert rc == 0, err
    assert plan["dump_rows"] == DUMPED - 1 and plan["to_extract"] == len(LENGTHS) - (DUMPED - 1)
    assert plan["changed"] is True and list(plan["dump"]["damaged"]) == [str(short)]
    assert not (data / "hidden_states" / "extract_meta.json").exists()  # check mode wrote nothing

    with standin_server(tmp_path, data, tiny_target, LAYERS) as url:
        rc, res, err = _cli(capsys, *common, "--url", url)
        assert rc == 0, err
        assert res["dump"]["adopted"] == DUMPED - 1 and list(res["dump"]["damaged"]) == [str(short)]
        assert res["written"] == res["requests"] == len(LENGTHS) - (DUMPED - 1), res
        rc, again, err = _cli(capsys, *common, "--url", url)
        assert rc == 0 and again["written"] == again["requests"] == 0 and again["changed"] is False, again

    hs = data / "hidden_states"
    rows = adopted_record.read_rows(hs)
    native = HiddenStateStore(data).scan_manifest().indices()
    assert set(rows) == set(range(DUMPED)) - {3}  # matched by token ids: names run in reverse row order
    assert rows[0]["p"].endswith(f"data_{DUMPED - 1}.ckpt") and native.isdisjoint(rows)
    assert native | set(rows) == set(range(len(LENGTHS)))  # each row once, the truncated one's re-extracted
    got = reader.StoreReader(hs, check_on_read=True)
    for i in range(len(LENGTHS)):
        want = load_file(reference / "hidden_states" / f"hs_{i}.safetensors")
        x = got.get(i)
        assert torch.equal(x["token_ids"], want["token_ids"]) and torch.equal(
            x["hidden_states"], want["hidden_states"]
        ), i
    assert not list(dump.rglob("*.safetensors")), "nothing was written into the dump"


def test_a_bad_dump_is_refused_before_any_row_is_sent(tmp_path, tiny_target, capsys):
    """Refused (exit 2, the path named) before the store is touched: the server URL is a closed port, so any
    attempt to reach it would fail with another message."""
    data = build_prepared_dataset(tmp_path / "data", LENGTHS)
    (data / "hidden_states").mkdir()
    empty = tmp_path / "empty"
    (empty / "rows_0-2000").mkdir(parents=True)
    (empty / "eagle3ops-dump.json").write_text(json.dumps(SIDE))
    post = tmp_path / "post"
    (post / "rows_0-2000").mkdir(parents=True)
    (post / "eagle3ops-dump.json").write_text(json.dumps({**SIDE, "last_state": "post-norm"}))
    common = ["--data", str(data), "--model", str(tiny_target), "--layer-ids", *map(str, LAYERS)]
    common += ["--url", "http://127.0.0.1:9"]
    cases = [
        ([str(tmp_path / "nowhere")], f"{tmp_path / 'nowhere'} does not exist"),
        ([str(empty)], f"{empty} holds no sample"),
        ([str(post)], "a post-norm last state; this run's states are layers [2, 4, 5] and a pre-norm"),
        ([str(data / "hidden_states")], "the store's own output"),
    ]
    for extra, words in cases:
        for check in ([], ["--check"]):
            rc, _, err = _cli(capsys, *common, "--adopt-from", *extra, *check)
            assert rc == 2 and words in err and "Traceback" not in err, (extra, check, err)
            assert os.listdir(data / "hidden_states") == [], (extra, check)  # nothing written
    rc, _, err = _cli(capsys, *common, "--adopt-from", str(empty), "--world-size", "2", "--first-rank", "0")
    assert rc == 2 and "multi-host extraction is not supported" in err, err
