"""Issue 32: damage found before it is trained on. A 16-byte flip inside a hidden-state file keeps its size and
header, so the cheap check every phase makes (``status``, an extract re-run, train's plan) passes it; only
``eagle3ops extract-verify --level checksum`` found it. The train phase now compares every file's content with the
checksum its writer recorded before it launches a trainer, once per file (``hidden_states/verified.jsonl``,
keyed by inode, size, mtime and ctime: :mod:`eagle3ops.store.verified`), and refuses a damaged file by name.

Real parts: stores written by the real :class:`HiddenStateStore` (``eagle3ops.train.fixtures.make_data_dir``,
synthetic tensors), the real train state machine (``ensure_run``) and CLI, real bytes flipped on disk.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from eagle3ops.cli import main as cli_main
from eagle3ops.store import HiddenStateStore, verify_content
from eagle3ops.store.layout import VERIFIED_NAME
from eagle3ops.train import inputs as train_inputs
from eagle3ops.train import run as train_run
from eagle3ops.train import spec as train_spec
from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier
from train_cli import train_argv

ROWS = 8


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    base = tmp_path_factory.mktemp("content_check")
    verifier = make_tiny_verifier(base / "verifier")
    return verifier, make_data_dir(base / "data", verifier, num_samples=ROWS, real=False)


@pytest.fixture
def store(made, tmp_path):
    """A copy of the small store of this module (new inodes: nothing verified yet)."""
    verifier, data = made
    return verifier, Path(shutil.copytree(data, tmp_path / "data"))


def _flip(path: Path, n: int = 16) -> None:
    """Invert ``n`` bytes inside the tensor data (64 bytes before the end): same size, same header."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, n, size - 64)
        os.pwrite(fd, bytes(b ^ 0xFF for b in old), size - 64)
    finally:
        os.close(fd)
    assert path.stat().st_size == size


def _rows(data: Path) -> dict:
    return HiddenStateStore(data).scan_manifest().rows()


def _spec(verifier, data: Path, run: Path, **kw) -> train_spec.TrainSpec:
    return train_spec.TrainSpec(
        data_dir=str(data), verifier_path=str(verifier), run_dir=str(run), device="cpu", **kw
    )


def test_a_16_byte_flip_passes_the_cheap_check_and_is_refused_before_training(store, tmp_path, capsys):
    verifier, data = store
    damaged = data / "hidden_states" / "hs_3.safetensors"
    _flip(damaged)
    meta = json.loads((data / "hidden_states" / "extract_meta.json").read_text())
    assert meta["num_states"] and meta["hidden_size"] and meta["dtype"]  # so the cheap check does run
    # what every run checked before: size + header, and status - all pass the flipped file
    assert train_inputs.check_samples(str(data), meta, "raise")["samples_with_states"] == ROWS
    assert cli_main(["extract-status", "--data", str(data), "--json"]) == 0
    st = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert st["done"] == ROWS and st["remaining"] == 0
    # the train phase refuses before any trainer starts, naming the file and what to do
    run = tmp_path / "run"
    with pytest.raises(train_spec.TrainError) as e:
        train_run.ensure_run(_spec(verifier, data, run))
    msg = str(e.value)
    assert f"row 3: {damaged}" in msg and "content checksum differs" in msg and "--move-aside" in msg, msg
    assert list(e.value.details["damaged_files"]) == ["3"]
    assert not (run / train_spec.STATE).exists() and not (run / train_spec.PIDFILE).exists()
    # through the CLI: exit 2, one line, the file named
    argv = train_argv(data, verifier, run, "--device", "cpu")
    assert cli_main([*argv, "--json"]) == 2
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["failed"] and str(damaged) in res["msg"], res
    # the other seven were verified and recorded; the damaged one was not
    record = {json.loads(x)["i"] for x in (data / "hidden_states" / VERIFIED_NAME).read_text().splitlines()}
    assert record == set(range(ROWS)) - {3}
    # and eagle3ops extract-verify --level checksum names the same file
    assert cli_main(["extract-verify", "--data", str(data), "--level", "checksum", "--json"]) == 2
    assert list(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["damaged"]) == ["3"]


def test_an_untouched_store_is_read_once_and_a_rerun_reads_nothing(store):
    _, data = store
    hs = data / "hidden_states"
    total = sum(r["b"] for r in _rows(data).values())
    said: list[str] = []
    # check mode reads nothing and says what a launch would read
    pred = train_inputs.check_content(data, check=True, log=said.append)
    assert (pred["to_verify"], pred["bytes_to_verify"], pred["bytes_read"]) == (ROWS, total, 0)
    assert not (hs / VERIFIED_NAME).exists()
    first = train_inputs.check_content(data, check=False, log=said.append)
    assert (first["verified"], first["bytes_read"], first["already_verified"]) == (ROWS, total, 0)
    assert any("match their checksums" in s for s in said), said
    # a second run: every file vouched for by the record, not one byte read
    read: list[int] = []
    again = verify_content(hs, _rows(data).values(), on_bytes=read.append)
    assert (again["already_verified"], again["verified"], again["bytes_read"], read) == (ROWS, 0, 0, [])
    assert train_inputs.check_content(data, check=False, log=said.append)["bytes_read"] == 0
    # a file replaced (re-extracted: a new inode, the same bytes) is read again, and only it
    p = hs / "hs_5.safetensors"
    tmp = hs / ".hs_5.copy"
    shutil.copyfile(p, tmp)
    os.replace(tmp, p)
    third = verify_content(hs, _rows(data).values(), on_bytes=read.append)
    assert (third["verified"], third["already_verified"], third["bytes_read"]) == (
        1,
        ROWS - 1,
        p.stat().st_size,
    )
    assert sum(read) == p.stat().st_size
    # a flip after the verification changes the file's ctime/mtime: found
    _flip(hs / "hs_0.safetensors")
    fourth = verify_content(hs, _rows(data).values())
    assert list(fourth["damaged"]) == [0] and fourth["already_verified"] == ROWS - 1


def test_check_mode_predicts_the_read_and_size_skips_it(store, tmp_path):
    verifier, data = store
    r = train_run.ensure_run(_spec(verifier, data, tmp_path / "run"), check=True)
    assert r["would"] == "launch" and r["content_check"]["to_verify"] == ROWS
    assert r["content_check"]["bytes_read"] == 0 and not (data / "hidden_states" / VERIFIED_NAME).exists()
    r = train_run.ensure_run(_spec(verifier, data, tmp_path / "run", verify="size"), check=True)
    assert "content_check" not in r


def test_train_verify_is_a_step_of_its_own_that_a_poll_can_follow(store, capsys):
    """Users' pain 2: the first content check of a large store ran inside the launch task, silent in the play for
    45-104 min at 4.6 TB. ``eagle3ops train-verify`` is that check as a step of its own (the role runs it detached
    and polls ``--check --job-file``): a poll made while it runs sees the files verified so far (the record is
    written a file at a time), the job file says when the job has ended, a damaged file is refused by name with
    exit 2, and the launch afterwards reads nothing again."""
    from eagle3ops.progress import async_job_finished

    _, data = store
    hs = HiddenStateStore(data).dir
    seen = []

    def poll_while_reading(_n):
        seen.append(train_inputs.content_status(data, check=True)["progress"]["done"])

    verify_content(hs, list(_rows(data).values())[:4], on_bytes=poll_while_reading)
    assert seen[0] == 0 and max(seen) == 3 and sorted(seen) == seen  # the 4th file is being read: 3 recorded
    job = data.parent / "job.json"
    job.write_text(json.dumps({"started": 1, "finished": 0, "ansible_job_id": "j1"}))
    assert cli_main(["train-verify", "--data", str(data), "--check", "--job-file", str(job), "--json"]) == 0
    polled = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert polled["job_finished"] is False and polled["changed"] is False
    assert (polled["progress"]["done"], polled["progress"]["total"], polled["to_verify"]) == (
        4,
        ROWS,
        ROWS - 4,
    )
    assert polled["progress"]["line"].startswith(f"train content check: 4/{ROWS} files (50%), ")
    _flip(HiddenStateStore(data).path(6))
    assert cli_main(["train-verify", "--data", str(data), "--json"]) == 2
    refused = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert str(HiddenStateStore(data).path(6)) in refused["msg"] and "row 6" in refused["msg"]
    assert "6" in refused["damaged_files"] and len(refused["damaged_files"]) == 1
    job.write_text(json.dumps({"rc": 2, "failed": True}))  # what the async wrapper leaves when the job ended
    assert async_job_finished(job) and not async_job_finished(data.parent / "no-such-job")
    # the good files the refused run read are recorded: only the damaged one is left to read
    assert train_inputs.content_status(data, check=True)["to_verify"] == 1


def test_the_polled_rate_is_the_newest_run_of_record_lines(tmp_path):
    """The files/s a poll reports comes from the record's own times, not the poller's clock, and only from the
    newest run of lines (a gap over RUN_GAP_S ends a run): an old check's lines do not slow today's rate."""
    hs = tmp_path / "hs"
    hs.mkdir()
    t0 = 1_000_000.0
    times = [t0, t0 + 1, t0 + 2, t0 + 5000, t0 + 5001, t0 + 5003]
    (hs / VERIFIED_NAME).write_text(
        "".join(json.dumps({"i": i, "k": [i, 1, 1, 1], "t": t}) + "\n" for i, t in enumerate(times))
        + '{"i": 9, "k": [9'  # a torn last line
    )
    assert verify_content(hs, [], check=True)["files_per_s"] == pytest.approx(2 / 3)
    (hs / VERIFIED_NAME).write_text(json.dumps({"i": 0, "k": [0, 1, 1, 1], "t": t0}) + "\n")
    assert verify_content(hs, [], check=True)["files_per_s"] is None  # one line: not measured yet
