"""Adopting an existing hidden-state dump in place (``eagle3ops store adopt``, the extract option ``adopt_from``),
and the loader's check on first read (train ``verify: overlapped``).

Real parts: a prepared Arrow dataset and a tiny DeepseekV3 verifier (``eagle3ops.train.fixtures``), a dump of real
``torch.save`` files in the SpecForge offline layout (``rows_*/data_*.ckpt``, keys ``input_ids``,
``aux_hidden_state`` [1, T, 3H], ``hidden_state`` [1, T, H]) plus ``.pt`` files and our own safetensors samples,
damaged on disk for real (truncated, one bit flipped inside a tensor, duplicated, wrong-shaped, of no row); the real
CLI, the real transformers extraction of the rest on CPU, and speculators 0.9.0's own offline loader
(``ArrowDataset``) reading every row. STAND-IN: the dump's states are the fixture's random tensors (the dump's
producer, a patched SGLang on GPUs, cannot run here); no trainer step runs (the loader is what reads the files).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from eagle3ops.cli import main as cli_main
from eagle3ops.store import HiddenStateStore, reader
from eagle3ops.store import adopted as adopted_record
from eagle3ops.store.layout import VERIFIED_NAME
from eagle3ops.train import inputs as train_inputs
from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier
from eagle3ops.train.speculators_shim import install_store_reader
from safetensors.torch import load_file

ROWS = 320
DUMPED = 300  # rows 0..299 in the dump: 200 .ckpt, 80 .pt, 20 safetensors samples
H = 64
SIDE = {"layer_ids": [1, 3, 4], "layer_convention": "output", "last_state": "pre-norm"}  # = inputs [2, 4, 5]


def _save_specforge(path: Path, tokens, hs, aux_states: int = 3) -> None:
    t = hs.shape[0]
    torch.save(
        {
            "input_ids": tokens,
            "loss_mask": torch.ones_like(tokens),
            "aux_hidden_state": hs[:, :aux_states].reshape(1, t, -1).clone(),
            "hidden_state": hs[:, 3][None].clone(),
        },
        path,
    )


def _flip_inside_tensor(path: Path, member_suffix: str = "data/2") -> None:
    """Flip one bit in the middle of a tensor's bytes (the zip member keeps its size; its crc32 no longer matches)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        pos = info.header_offset + 30 + n + m + info.compress_size // 2
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A prepared dataset of ROWS rows with no hidden states, their states apart (``src``), and a dump of rows
    0..DUMPED-1 in three layouts, names in no row order, with five bad files among them."""
    base = tmp_path_factory.mktemp("adopt")
    verifier = make_tiny_verifier(base / "verifier")
    data = make_data_dir(base / "data", verifier, num_samples=ROWS, min_len=8, max_len=24, real=False)
    src = base / "src"
    os.rename(data / "hidden_states", src)
    dump = base / "dump"
    for g in ("rows_0-2000", "rows_2000-4000", "rows_4000-6000"):
        (dump / g).mkdir(parents=True)
    for i in range(DUMPED):
        d = load_file(src / f"hs_{i}.safetensors")
        if i < 200:
            _save_specforge(dump / "rows_0-2000" / f"data_{199 - i}.ckpt", d["token_ids"], d["hidden_states"])
        elif i < 280:
            _save_specforge(
                dump / "rows_2000-4000" / f"data_{3000 + i}.pt", d["token_ids"], d["hidden_states"]
            )
        else:
            shutil.copy(src / f"hs_{i}.safetensors", dump / "rows_4000-6000" / f"hs_{5000 + i}.safetensors")
    (dump / "eagle3ops-dump.json").write_text(json.dumps(SIDE))
    bad = {
        "truncated": dump / "rows_0-2000" / "data_194.ckpt",  # row 5
        "flipped": dump / "rows_0-2000" / "data_193.ckpt",  # row 6
        "duplicate": dump / "rows_0-2000" / "zz_copy_of_row_7.ckpt",
        "wrong_shape": dump / "rows_0-2000" / "data_191.ckpt",  # row 8: a last state one token short
        "unmatched": dump / "rows_0-2000" / "data_9999.ckpt",
    }
    size = bad["truncated"].stat().st_size
    os.truncate(bad["truncated"], size // 2)
    _flip_inside_tensor(bad["flipped"])
    shutil.copy(dump / "rows_0-2000" / "data_192.ckpt", bad["duplicate"])
    d8 = load_file(src / "hs_8.safetensors")
    t8 = d8["hidden_states"].shape[0]
    torch.save({"input_ids": d8["token_ids"], "aux_hidden_state": d8["hidden_states"][:, :3].reshape(1, t8, -1),
                "hidden_state": d8["hidden_states"][:-1, 3][None].clone()}, bad["wrong_shape"])  # fmt: skip
    d9 = load_file(src / "hs_9.safetensors")
    _save_specforge(bad["unmatched"], torch.randint(3, 500, (12,)), d9["hidden_states"][:12])
    return verifier, data, src, dump, bad


@pytest.fixture
def loader(monkeypatch):
    """speculators' loader through the shim's reader, put back as it was after the test."""
    import hs_connectors.transfer as transfer
    from speculators.train import data as spec_data

    monkeypatch.setattr(transfer.FileTransfer, "get_cached", transfer.FileTransfer.get_cached)
    monkeypatch.setattr(spec_data.ArrowDataset, "_get_raw_data", spec_data.ArrowDataset._get_raw_data)
    install_store_reader(check_on_read=True)
    return spec_data


def _cli(capsys, *argv) -> tuple[int, dict]:
    rc = cli_main([*argv, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1]) if out else {}


def _copy_data(made, tmp_path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(made[1], data)
    return data


def test_adopted_dump_and_extracted_rest_hold_every_row_once(made, tmp_path, capsys, loader):
    verifier, _, src, dump, bad = made
    data = _copy_data(made, tmp_path)
    common = ["--data", str(data), "--model", str(verifier), "--layer-ids", "2", "4", "5"]
    rc, plan = _cli(capsys, "store", "adopt", *common, "--adopt-from", str(dump), "--check")
    # check mode reads metadata only (a plan of terabytes must not read them): the bit flip is found by the run
    assert rc == 0 and plan["adopted"] == DUMPED - 2 and plan["changed"] is True and plan["bytes_read"] == 0
    assert not (data / "hidden_states").exists()  # check mode wrote nothing
    rc, res = _cli(capsys, "store", "adopt", *common, "--adopt-from", str(dump))
    assert rc == 0, res
    assert res["files"] == DUMPED + 2 and res["adopted"] == DUMPED - 3
    assert set(res["damaged"]) == {str(bad["truncated"]), str(bad["flipped"])}
    assert "crc32" in res["damaged"][str(bad["flipped"])]
    assert set(res["wrong_shape"]) == {str(bad["wrong_shape"])}
    assert list(res["duplicates"]) == [str(bad["duplicate"])]
    assert res["unmatched"] == [str(bad["unmatched"])]
    rows = adopted_record.read_rows(data / "hidden_states")
    assert set(rows) == set(range(DUMPED)) - {5, 6, 8}
    # matched by content, not by name: row 0 is the last-named .ckpt; nothing was copied into the store
    assert rows[0]["p"].endswith("rows_0-2000/data_199.ckpt")
    assert not list((data / "hidden_states").glob("hs_*"))
    assert _cli(capsys, "store", "adopt", *common, "--adopt-from", str(dump))[1]["changed"] is False

    rc, ext = _cli(capsys, "extract", *common, "--device", "cpu")
    assert rc == 0, ext
    assert ext["done_before"] == DUMPED - 3 and ext["written"] == ROWS - (DUMPED - 3)
    scan = HiddenStateStore(data).scan_manifest()
    native = scan.indices()
    assert scan.lines == len(native) and native.isdisjoint(rows)  # each row once, in one place
    assert native | set(rows) == set(range(ROWS))
    rc, st = _cli(capsys, "extract-status", "--data", str(data))
    assert rc == 0 and st["done"] == ROWS and st["adopted_from_dump"] == DUMPED - 3 and st["remaining"] == 0
    meta = json.loads((data / "hidden_states" / "extract_meta.json").read_text())
    assert train_inputs.check_samples(str(data), meta, "raise")["samples_with_states"] == ROWS

    # speculators' own offline loader, through the shim's reader
    ds = loader.ArrowDataset(max_len=4096, datapath=str(data), on_missing="raise")
    for i in range(ROWS):
        x = ds[i]
        assert isinstance(x, dict), (i, x)
        if i in rows:  # converted on read, bit for bit
            want = load_file(src / f"hs_{i}.safetensors")["hidden_states"]
            assert torch.equal(x["hidden_states"], want[:, :-1].flatten(1))
            assert torch.equal(x["verifier_last_hidden_states"], want[:, -1])
    reader.flush_all()  # what a loader worker does at its exit
    verified = (data / "hidden_states" / VERIFIED_NAME).read_text().splitlines()
    assert len(verified) == ROWS  # every file checked on its first read

    # the up-front check (train verify: checksum) reads adopted files where they lie too: bytes changed under
    # an unchanged size and mtime pass the cheap check and are refused by name
    p = Path(rows[0]["p"])
    st, before = p.stat(), p.read_bytes()
    _flip_inside_tensor(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        assert train_inputs.check_samples(str(data), meta, "raise")["samples_with_states"] == ROWS
        with pytest.raises(train_inputs.TrainError, match=str(p)):
            train_inputs.check_content(data, check=False, log=lambda _m: None)
    finally:  # the module's dump, as the other tests expect it
        p.write_bytes(before)


def test_bad_dumps_are_refused_before_any_work(made, tmp_path, capsys):
    verifier, _, src, dump, _ = made
    data = _copy_data(made, tmp_path)
    common = ["store", "adopt", "--data", str(data), "--model", str(verifier), "--layer-ids", "2", "4", "5"]
    empty = tmp_path / "empty"
    (empty / "rows_0-2000").mkdir(parents=True)
    (empty / "eagle3ops-dump.json").write_text(json.dumps(SIDE))
    mixed = tmp_path / "mixed"
    (mixed / "rows_0-2000").mkdir(parents=True)
    (mixed / "eagle3ops-dump.json").write_text(json.dumps(SIDE))
    d = load_file(src / "hs_0.safetensors")
    _save_specforge(mixed / "rows_0-2000" / "a.ckpt", d["token_ids"], d["hidden_states"])
    _save_specforge(mixed / "rows_0-2000" / "b.ckpt", d["token_ids"], d["hidden_states"][..., :32])
    layers = (
        tmp_path / "layers"
    )  # whole samples of two aux layers beside three: another extraction's layer ids
    shutil.copytree(mixed, layers)
    _save_specforge(layers / "rows_0-2000" / "b.ckpt", d["token_ids"], d["hidden_states"], aux_states=2)
    other = tmp_path / "other"  # every sample of two aux layers where three are declared
    shutil.copytree(layers, other)
    (other / "rows_0-2000" / "a.ckpt").unlink()
    keyed = tmp_path / "keyed"  # another tool's key names, not declared
    (keyed / "rows_0-2000").mkdir(parents=True)
    (keyed / "eagle3ops-dump.json").write_text(json.dumps(SIDE))
    t = d["hidden_states"].shape[0]
    torch.save({"ids": d["token_ids"], "aux": d["hidden_states"][:, :3].reshape(1, t, -1).clone(),
                "last": d["hidden_states"][:, 3][None].clone(), "step": 7}, keyed / "rows_0-2000" / "a.pt")  # fmt: skip
    undeclared = tmp_path / "undeclared"
    shutil.copytree(mixed, undeclared)
    (undeclared / "eagle3ops-dump.json").unlink()
    (data / "hidden_states").mkdir()
    cases = [
        (["--adopt-from", str(tmp_path / "nowhere")], "does not exist"),
        (["--adopt-from", str(empty)], "holds no sample"),
        (["--adopt-from", str(data / "hidden_states")], "the store's own output"),
        (["--adopt-from", str(dump), "--adopt-last-state", "post-norm"], "make them agree"),
        (
            ["--adopt-from", str(undeclared), "--adopt-layer-ids", "1", "3", "4"],
            "last state is declared None",
        ),
        (["--adopt-from", str(undeclared)], "aux layer ids are not declared"),
        (
            [
                "--adopt-from",
                str(undeclared),
                "--adopt-layer-ids",
                "2",
                "4",
                "5",
                "--adopt-last-state",
                "post-norm",
            ],
            "a post-norm last state; this run's states are layers [2, 4, 5] and a pre-norm",
        ),
        (
            [
                "--adopt-from",
                str(undeclared),
                "--adopt-layer-ids",
                "1",
                "3",
                "4",
                "--adopt-last-state",
                "pre-norm",
            ],
            "holds aux layers [1, 3, 4] (input convention",
        ),
        (["--adopt-from", str(mixed)], "mixes layouts"),
        (
            ["--adopt-from", str(keyed)],
            f"{keyed / 'rows_0-2000/a.pt'} holds {{aux: tensor, ids: tensor, last: tensor, step: int}}, not a "
            "tensor under each of the dump's key names input_ids='input_ids', aux='aux_hidden_state'",
        ),
        (
            ["--adopt-from", str(layers)],
            "holds 4 states of 64 bfloat16, " + str(layers / "rows_0-2000/b.ckpt"),
        ),
        (
            ["--adopt-from", str(other)],
            f"{other / 'rows_0-2000/b.ckpt'} holds 3 states of hidden size 64; this",
        ),
    ]
    for extra, words in cases:
        rc = cli_main([*common, *extra])
        err = capsys.readouterr().err
        assert rc == 2 and words in err, (extra, err)
        assert os.listdir(data / "hidden_states") == [], extra  # nothing written
    # the extract phase's adoption (either way it runs) refuses the same way, before the store is touched
    for argv in (["extract", "--device", "cpu"], ["extract", "--check"]):
        rc = cli_main([*argv, *common[2:], "--adopt-from", str(tmp_path / "nowhere")])
        err = capsys.readouterr().err
        assert rc == 2 and f"the dump {tmp_path / 'nowhere'} does not exist" in err, (argv, err)
        assert os.listdir(data / "hidden_states") == [], argv
    # the keys declared, the same file is adopted
    rc = cli_main(
        [
            *common,
            "--adopt-from",
            str(keyed),
            "--adopt-keys",
            "input_ids=ids",
            "--adopt-keys",
            "aux=aux",
            "--adopt-keys",
            "last=last",
        ]
    )
    assert rc == 0 and set(adopted_record.read_rows(data / "hidden_states")) == {0}, capsys.readouterr().err


def test_legacy_torch_save_files_are_refused_by_name_and_adopted_once_converted(made, tmp_path, capsys):
    """Real files of torch.save's legacy (non-zip) format, pickle protocols 2 and 4, beside a zip one: the
    adoption refuses the dump (exit 2) naming the first, how many, and how to convert, before writing anything;
    converted in place by the command the message gives, all three are adopted."""
    verifier, _, src, _, _ = made
    data = _copy_data(made, tmp_path)
    dump = tmp_path / "legacy"
    (dump / "rows_0-2000").mkdir(parents=True)
    (dump / "eagle3ops-dump.json").write_text(json.dumps(SIDE))
    files = [dump / "rows_0-2000" / n for n in ("a.ckpt", "b.pt", "c.pt")]
    kws = [
        {},
        {"_use_new_zipfile_serialization": False},
        {"_use_new_zipfile_serialization": False, "pickle_protocol": 4},
    ]
    for i, (f, kw) in enumerate(zip(files, kws, strict=True)):
        d = load_file(src / f"hs_{i}.safetensors")
        hs = d["hidden_states"]
        t = hs.shape[0]
        obj = {"input_ids": d["token_ids"], "aux_hidden_state": hs[:, :3].reshape(1, t, -1).clone(),
               "hidden_state": hs[:, 3][None].clone()}  # fmt: skip
        torch.save(obj, f, **kw)
    assert files[0].read_bytes()[:2] == b"PK" and files[1].read_bytes()[:2] == b"\x80\x02"
    common = ["store", "adopt", "--data", str(data), "--model", str(verifier), "--layer-ids", "2", "4", "5"]
    rc = cli_main([*common, "--adopt-from", str(dump)])
    err = capsys.readouterr().err
    assert rc == 2 and f"{files[1]} is a torch.save file of the legacy format" in err, err
    assert "as are 1 more of the dump's 3 files" in err and "torch.load(f, weights_only=True)" in err
    assert not (data / "hidden_states" / adopted_record.RECORD).exists()  # nothing written
    # the conversion the message names (torch.save's default format is the zip); weights_only=True cannot read
    # a legacy file of pickle protocol 4 (its frames), which the message says
    assert "needs weights_only=False" in err
    torch.save(torch.load(files[1], weights_only=True), files[1])
    torch.save(torch.load(files[2], weights_only=False), files[2])
    rc, res = _cli(capsys, *common, "--adopt-from", str(dump))
    assert rc == 0 and res["adopted"] == 3, res
    assert set(adopted_record.read_rows(data / "hidden_states")) == {0, 1, 2}


def test_a_file_damaged_after_extraction_is_skipped_queued_and_redone(made, tmp_path, loader):
    """verify: overlapped: the loader's first read finds a flipped byte, skips the row (speculators'
    SampleUnavailable), queues it; the next extract plan moves it aside and extracts it again."""
    verifier = made[0]
    data = make_data_dir(tmp_path / "data", verifier, num_samples=12, min_len=8, max_len=16, real=False)
    store = HiddenStateStore(data)
    path = store.path(3)
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0x01
    path.write_bytes(bytes(raw))
    from speculators.train.recovery import SampleUnavailable

    ds = loader.ArrowDataset(max_len=4096, datapath=str(data), on_missing="raise")
    got = [ds[np.int64(i)] for i in range(12)]  # speculators' sampler hands numpy integers
    assert [i for i, x in enumerate(got) if isinstance(x, SampleUnavailable)] == [3]
    assert list(adopted_record.read_queue(store.dir)) == [3]
    meta = json.loads(store.meta_path.read_text())
    plan = store.plan([r["n"] for _, r in sorted(store.scan_manifest().rows().items())],
                      num_states=meta["num_states"], hidden_size=meta["hidden_size"], dtype=meta["dtype"])  # fmt: skip
    assert plan.remaining == [3] and "found damaged while training" in plan.damaged[3]
    assert (store.dir / "damaged" / "hs_3.safetensors").exists()
    assert not (store.dir / adopted_record.REQUEUE).exists()  # acted on, kept under damaged/


def test_status_lengths_and_checks_count_adopted_rows_adopted_without_the_content_pass(
    made, tmp_path, capsys
):
    """An adoption of metadata only (``adopt_checksum: false``, what a 4.6 TB dump wants before training with
    ``verify: overlapped``): ``extract-lengths``, the multi-store status and both content checks see its rows
    (done, with their lengths; a ``torch.save`` zip checkable by its own crc32s though no checksum was recorded),
    and the file whose bit was flipped after writing is found on its first read."""
    from eagle3ops.extract.status import status_many
    from eagle3ops.store.adopt import commit, survey
    from eagle3ops.store.verified import verify_content

    _, _, src, dump, bad = made
    data = _copy_data(made, tmp_path)
    commit(survey(data, dump, run_layer_ids=[2, 4, 5], hidden_size=H))
    rows = adopted_record.read_rows(data / "hidden_states")
    assert set(rows) == set(range(DUMPED)) - {5, 8}  # the flipped row 6 passes the metadata check
    assert not any("z" in r or "h" in r for r in rows.values() if r["p"].endswith((".ckpt", ".pt")))

    rc, lens = _cli(capsys, "extract-lengths", "--data", str(data))
    want = {i: len(load_file(src / f"hs_{i}.safetensors")["token_ids"]) for i in rows}
    assert rc == 0 and lens["count"] == len(rows) == DUMPED - 2
    assert lens["lengths"] == {str(i): n for i, n in sorted(want.items())}

    empty = tmp_path / "empty"
    shutil.copytree(made[1], empty)  # the same prepared rows, nothing extracted or adopted
    many = status_many([data, empty])
    assert [s["done"] for s in many["stores"]] == [DUMPED - 2, 0]
    assert (
        many["done"] == DUMPED - 2
        and many["missing"] == ROWS - (DUMPED - 2)
        and 6 in set(range(ROWS)) - set(many["missing_rows"])
    )

    hs = data / "hidden_states"
    r = reader.StoreReader(hs, check_on_read=True)
    got = r.get(0)
    assert torch.equal(got["hidden_states"], load_file(src / "hs_0.safetensors")["hidden_states"])
    with pytest.raises(reader.DamagedSample, match="content checksum differs"):
        r.get(6)
    r.flush()
    assert list(adopted_record.read_queue(hs)) == [6]
    res = verify_content(hs, rows.values(), check=True)
    # row 0 was checked on its read; the other 277 zips check themselves (the flipped one among them); the 20
    # safetensors samples adopted without the content pass have no checksum to compare with
    assert res["already_verified"] == 1 and res["to_verify"] == 277 and res["unchecked"] == 20
    assert str(bad["flipped"]) == rows[6]["p"]

    # the next extraction's plan drops the queued adopted row from the record (its file stays: the dump is the
    # user's), logs it under damaged/ and extracts it; the other adopted rows stay done
    from eagle3ops.extract.session import load_seq_lens

    plan = HiddenStateStore(data).plan(load_seq_lens(data), num_states=4, hidden_size=H, dtype="bfloat16")
    assert 6 in plan.remaining and 6 in plan.damaged and plan.done == DUMPED - 3
    assert set(adopted_record.read_rows(hs)) == set(rows) - {6} and bad["flipped"].exists()
    logged = [json.loads(x) for x in (hs / "damaged" / "damaged.jsonl").read_text().splitlines()]
    assert [(r["index"], r["file"], r["adopted"]) for r in logged] == [(6, str(bad["flipped"]), True)]
    assert adopted_record.read_queue(hs) == {}


@pytest.mark.slow
def test_speculators_trains_on_an_adopted_and_extracted_store(made, tmp_path, capsys):
    """The train phase's real trainer (speculators 0.9.0 on CPU through the shim, 2 steps, ``verify: overlapped``)
    on a store whose rows are partly a dump's files where they lie and partly extracted: it finishes, and its loader
    checked the files it read on their first read (the record it wrote), skipping none."""
    verifier, _, _, dump, _ = made
    data = _copy_data(made, tmp_path)
    common = ["--data", str(data), "--model", str(verifier), "--layer-ids", "2", "4", "5"]
    assert (
        _cli(capsys, "extract", *common, "--device", "cpu", "--adopt-from", str(dump))[1]["dump"]["adopted"]
        == DUMPED - 3
    )
    run_dir = tmp_path / "run"
    argv = [
        "train",
        "--data",
        str(data),
        "--verifier",
        str(verifier),
        "--run-dir",
        str(run_dir),
        "--epochs",
        "1",
    ]
    argv += [
        "--max-steps",
        "2",
        "--total-seq-len",
        "256",
        "--verify",
        "overlapped",
        "--wait",
        "--timeout",
        "600",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "eagle3ops", *argv, "--json"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert json.loads((run_dir / "exit.json").read_text())["status"] == "finished"
    assert (
        (data / "hidden_states" / VERIFIED_NAME).read_text().splitlines()
    )  # written by the trainer's loader
    assert not (data / "hidden_states" / adopted_record.REQUEUE).exists()
