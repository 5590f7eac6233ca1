"""Issue #16.3: every failure is one clear line (the path, what happened, what to do), exit code 2, never a
traceback, nothing half-written.

Real parts: small REAL file systems (tmpfs with ``size=``, one mounted read-only) and the kernel's own ENOSPC /
EROFS; the real CLI (``eagle3ops.cli.main``) in processes forked from the zygote (rel_common.py), or the
``eagle3ops`` entry point. Test-only: faulthook pauses one run at an ``os.replace`` while the test fills its
file system from outside, as another writer would. Each test fails on the main of 2026-12-01 (a traceback,
exit code 1, or exit 0 for a wrong path), as its docstring says.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from eagle3ops.store import HiddenStateStore
from rel_common import EXTRACT_ARGS, LENGTHS, fill_fs, finish, fresh_data, hs_files, leftovers, paused_run

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root; CI runs as root")


def _one_line_error(r, *needles: str) -> str:
    assert r.rc == 2, f"rc {r.rc}: {r.stdout[-1500:]}{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    res = r.json
    assert res["failed"] is True
    msg = res["msg"]
    for n in needles:
        assert n in msg, msg
    errors = [ln for ln in r.stderr.splitlines() if ": error: " in ln]
    assert len(errors) == 1 and "\n" not in msg, r.stderr[-2000:]
    return msg


@root_only
def test_full_disk_at_extract_meta_json_is_one_line(small_fs, zygote, tiny_model, prepared, figures):
    """main: ``OSError: [Errno 28] No space left on device`` traceback, exit code 1."""
    mnt = small_fs("8m")
    data = fresh_data(prepared, mnt / "data")
    fill_fs(mnt / "filler")
    r = zygote.run(["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS])
    msg = _one_line_error(r, str(data / "hidden_states" / "extract_meta.json"), "No space left on device")
    assert "ENOSPC" in msg and "free space" in msg and "re-run" in msg, msg
    assert r.json["path"] == str(data / "hidden_states" / "extract_meta.json")
    assert not (data / "hidden_states" / "extract_meta.json").exists()
    assert leftovers(data) == [], "a temp file of the meta survived"
    figures["faults_injected"] += 1


@root_only
def test_full_disk_at_a_manifest_append_is_one_line_and_leaves_no_torn_line(
    small_fs, zygote, tiny_model, prepared, reference, tmp_path, figures
):
    """The manifest's next line needs a new page of a tmpfs that another writer has just filled. main: a
    traceback (exit code 1) whose ENOSPC came from the manifest's flush at close, hiding the first one."""
    mnt = small_fs("72m")  # the need + 5% + the default 64 MiB margin pass the preflight
    data = fresh_data(prepared, mnt / "data")
    hs = data / "hidden_states"
    hs.mkdir()
    manifest = hs / "manifest-rank0.jsonl"
    manifest.write_bytes(b"\n" * 4095)  # blank lines (ignored): the next line crosses into a new page
    argv = ["extract", "--data", data, "--model", tiny_model, "--writer-threads", "1", *EXTRACT_ARGS]
    # the 1st sample's rename (the 1st is extract_meta.json)
    with paused_run(argv, tmp_path, "pause:replace:2", timeout=180) as (proc, go):
        fill_fs(mnt / "filler")
        _, out, err = finish(proc, go)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    res = json.loads(out.strip().splitlines()[-1])
    assert res["path"] == str(manifest) and res["errno"] == "ENOSPC", res
    assert str(manifest) in res["msg"] and "free space" in res["msg"], res["msg"]
    assert manifest.read_bytes() == b"\n" * 4095, "a torn manifest line was left"
    assert leftovers(data) == []
    # space back: the re-run adopts the renamed sample (complete, no manifest line) and finishes
    (mnt / "filler").unlink()
    r = zygote.run(argv)
    assert r.rc == 0, r.stderr[-3000:]
    assert r.json["done_before"] + r.json["written"] == len(LENGTHS)
    assert hs_files(data) == hs_files(reference["data"])
    entries = HiddenStateStore(data).scan_manifest().entries
    assert sorted(entries) == list(range(len(LENGTHS)))
    figures["faults_injected"] += 1
    figures["runs_resumed"] += 1


@root_only
def test_disk_margin_is_an_option(small_fs, zygote, tiny_model, prepared):
    """The preflight's fixed 64 MiB margin (main) is ``--disk-margin-mib``: a 16 MiB file system that the
    default refuses takes the run with 0; a negative value is refused by name."""
    data = fresh_data(prepared, small_fs("16m") / "data")
    argv = ["extract", "--data", data, "--model", tiny_model, "--check", "--json"]
    default = zygote.run(argv)
    assert default.rc == 0 and default.json["fits"] is False, default.stderr[-2000:]
    zero = zygote.run([*argv, "--disk-margin-mib", "0"])
    assert zero.rc == 0 and zero.json["fits"] is True, zero.stderr[-2000:]
    bad = zygote.run([*argv, "--disk-margin-mib", "-1"])
    assert bad.rc == 2 and "--disk-margin-mib -1.0 must be 0 or more" in bad.json["msg"]


@root_only
def test_read_only_data_directory_is_one_line(small_fs, zygote, tiny_model, prepared, figures):
    """main: ``OSError: [Errno 30] Read-only file system`` traceback, exit code 1."""
    mnt = small_fs("16m")
    data = fresh_data(prepared, mnt / "data")
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    r = zygote.run(["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS])
    _one_line_error(r, str(data), "Read-only file system", "EROFS", "remount it read-write")
    r = zygote.run(["extract-lengths", "--data", data, "--out", mnt / "lengths.json", "--json"])
    _one_line_error(r, str(mnt / "lengths.json"), "EROFS")
    figures["bad_inputs_refused"] += 2


def test_lengths_names_a_missing_data_dir_and_a_missing_out_folder(zygote, reference, tmp_path, figures):
    """main: ``extract-lengths --data /nonexistent`` printed "0 samples" with exit code 0; ``--out`` into a missing folder
    was a FileNotFoundError traceback naming a temp file."""
    missing = tmp_path / "nonexistent"
    msg = _one_line_error(
        zygote.run(["extract-lengths", "--data", missing, "--json"]), str(missing), "no such data"
    )
    assert "extract_data_dir" in msg
    out = tmp_path / "no-such-folder" / "lengths.json"
    msg = _one_line_error(
        zygote.run(["extract-lengths", "--data", reference["data"], "--out", out, "--json"]),
        str(out.parent),
        "does not exist",
        "mkdir -p",
    )
    assert not out.parent.exists()
    ok = zygote.run(
        ["extract-lengths", "--data", reference["data"], "--out", tmp_path / "lengths.json", "--json"]
    )
    assert ok.rc == 0 and ok.json["count"] == len(LENGTHS)
    assert json.loads((tmp_path / "lengths.json").read_text()) == {str(i): n for i, n in enumerate(LENGTHS)}
    _one_line_error(zygote.run(["extract-status", "--data", missing, "--json"]), str(missing))
    figures["bad_inputs_refused"] += 3


@pytest.mark.slow  # builds the demo target (shared with tests/unit/prepare/test_prepare.py in a full run)
def test_a_byte_that_is_not_utf8_is_named_and_skip_skips_it(zygote, demo, tmp_path, figures):
    """main: a ``UnicodeDecodeError`` traceback naming neither file nor line, with or without --on-error skip."""
    lines = demo["convs"].read_text().splitlines()[:6]
    bad = tmp_path / "latin1.jsonl"
    raw = [ln.encode() for ln in lines]
    raw[3] = raw[3].replace(b'"value": "', b'"value": "caf\xe9 ', 1)  # one Latin-1 byte in row 4
    assert b"\xe9" in raw[3]
    bad.write_bytes(b"\n".join(raw) + b"\n")
    out = tmp_path / "data"
    argv = ["prepare", "--model", demo["model"], "--input", bad, "--out", out, "--json"]
    msg = _one_line_error_multi(zygote.run(argv), f"{bad}:4: not valid UTF-8 (byte 0xe9 at column")
    assert "--on-error skip" in msg and "nothing was written" in msg, msg
    assert not out.exists()
    r = zygote.run([*argv, "--on-error", "skip"])
    assert r.rc == 0, r.stderr[-3000:]
    res = r.json
    assert len(res["skipped"]) == 1 and res["skipped"][0].startswith(f"{bad}:4: not valid UTF-8"), res[
        "skipped"
    ]
    assert res["num_rows"] > 0
    figures["bad_inputs_refused"] += 1


def _one_line_error_multi(r, *needles: str) -> str:
    """prepare lists every bad row under its one-line summary: the same checks, the message may span lines."""
    assert r.rc == 2, f"rc {r.rc}: {r.stdout[-1500:]}{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    msg = r.json["msg"]
    for n in needles:
        assert n in msg, msg
    return msg
