"""Issue #16.2: one run per data directory (and per training run directory); workers die with their parent.

Real parts: the ``eagle3ops`` entry point run as a user runs it (plain subprocesses) or the real CLI in a process
forked from the zygote (rel_common.py), the real kernel flock, real SIGKILLs. Test-only: faulthook pauses a run
at its Nth ``os.replace`` (``E3_FAULT=pause:replace:N``) so that it is provably still running, inside its lock,
while the second run starts; nothing in eagle3ops knows about it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eagle3ops.store import HiddenStateStore
from proc_helpers import alive
from rel_common import EAGLE3OPS, ENV, EXTRACT_ARGS, LENGTHS, finish, fresh_data, hs_files, start_paused
from store_helpers import manifest_rows


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()  # our own child, by its Popen handle
    proc.communicate()


def test_second_extract_on_one_directory_fails_naming_the_first_and_writes_nothing(
    zygote, tiny_model, prepared, reference, tmp_path
):
    """Fails on the main of 2026-12-01: the second run wrote every row too (rc 0), duplicate manifest lines."""
    data = fresh_data(prepared, tmp_path / "data")
    # one writer thread: while it waits at its rename, the first run writes nothing else
    argv = ["extract", "--data", data, "--model", tiny_model, "--writer-threads", "1", *EXTRACT_ARGS]
    first, go = start_paused(argv, tmp_path, "pause:replace:4")  # 2 samples renamed, the 3rd waits
    try:
        # check mode takes no lock and reports the run in progress
        plan = zygote.run(["extract", "--data", data, "--model", tiny_model, "--check", "--json"])
        assert plan.rc == 0, plan.stderr[-3000:]
        assert plan.json["running"] is True and plan.json["holder"]["pid"] == first.pid, plan.json
        before = hs_files(data)
        second = zygote.run(argv)
        assert second.rc == 2, second.stdout[-2000:] + second.stderr[-3000:]
        assert "Traceback" not in second.stderr, second.stderr[-3000:]
        msg = second.json["msg"]
        assert f"{data} is in use by extract PID {first.pid}" in msg, msg
        assert "eagle3ops extract --data" in msg and str(data) in msg, msg  # the holder's command line
        assert "since 20" in msg and "kill" in msg, msg  # since when, and what to do
        assert second.json["holder"]["pid"] == first.pid
        assert hs_files(data) == before, "the refused run wrote samples"
    finally:
        rc, out, err = finish(first, go)
    assert rc == 0, out[-2000:] + err[-3000:]
    res = json.loads(out.strip().splitlines()[-1])
    assert res["written"] == len(LENGTHS) and res["stale_lock"] is None
    # one manifest line per row: nothing was done twice
    assert manifest_rows(data) == list(range(len(LENGTHS)))
    assert hs_files(data) == hs_files(reference["data"])


def test_a_killed_runs_lock_is_taken_over_and_reported(zygote, tiny_model, prepared, reference, tmp_path):
    """Fails on the main of 2026-12-01: no lock, so nothing says a run died holding the directory."""
    data = fresh_data(prepared, tmp_path / "data")
    argv = ["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS]
    dead = zygote.run(argv, fault="compute:3")  # SIGKILLs itself inside its run
    assert dead.killed
    lock = tmp_path / ".data.lock"
    assert json.loads(lock.read_text())["pid"] == dead.pid  # the record a kill -9 leaves behind
    r = zygote.run(argv)
    assert r.rc == 0, r.stderr[-3000:]
    stale = r.json["stale_lock"]
    assert stale["pid"] == dead.pid and stale["what"] == "extract", stale
    assert f"taking over the stale lock {lock} of extract PID {dead.pid}" in r.stderr, r.stderr[-2000:]
    assert hs_files(data) == hs_files(reference["data"])
    assert lock.read_text() == "", "a clean end leaves no holder record"
    # and a third run finds nothing stale
    assert zygote.run(argv).json["stale_lock"] is None


def test_workers_die_with_their_parent(tiny_model, prepared, tmp_path):
    """``extract --workers 2``; the parent is SIGKILLed while both workers are mid-run: the workers are gone within
    seconds and no file appears afterwards. Fails on the main of 2026-12-01 (the workers kept running and
    writing)."""
    data = fresh_data(prepared, tmp_path / "data")
    argv = ["extract", "--data", data, "--model", tiny_model, "--device", "cpu", "--workers", "2"]
    argv += ["--max-batch-size", "1", "--no-progress", "--json"]
    # a worker's 2nd rename (its 2nd sample: mid-run); the parent's only rename is extract_meta.json, which it
    # writes before it starts the workers (the store is checked and pinned once, under the run lock)
    parent, go = start_paused(argv, tmp_path, "pause:replace:2", timeout=180)  # the first worker to get there
    workers: list[int] = []
    try:
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        workers = [int(c) for c in children]
        assert len(workers) == 2, workers
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        # a guard only: the paused worker would wait for its GO file for ever; PR_SET_PDEATHSIG ends it (a
        # torch process takes a while to unmap on a loaded machine)
        deadline = time.monotonic() + 60
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(w) for w in workers), f"workers {workers} outlived their parent"
        files = sorted(p.name for p in (data / "hidden_states").iterdir())
        go.touch()  # a worker still alive would go on writing now
        time.sleep(1.5)
        assert sorted(p.name for p in (data / "hidden_states").iterdir()) == files
    finally:
        for w in workers:  # first: a surviving worker keeps the parent's stderr pipe open
            if alive(w):
                os.kill(w, signal.SIGKILL)  # a worker of this test's own extract run, by PID
        _kill(parent)
    # the samples that were written are whole: a re-run resumes from them
    store = HiddenStateStore(data)
    for i, e in store.scan_manifest().entries.items():
        assert store.path(i).stat().st_size == e.nbytes


@pytest.mark.slow  # builds the demo target (shared with tests/unit/prepare/test_prepare.py in a full run)
def test_second_prepare_on_one_directory_fails_naming_the_first(zygote, demo, tmp_path):
    """Fails on the main of 2026-12-01: both prepares ran side by side (the second one's rc was 0)."""
    out = tmp_path / "data"
    argv = [
        "prepare",
        "--model",
        demo["model"],
        "--input",
        demo["convs"],
        "--out",
        out,
        "--max-samples",
        "16",
    ]
    first, go = start_paused([*argv, "--json"], tmp_path, "pause:replace:1")  # the swap into place waits
    try:
        check = zygote.run([*argv, "--check", "--json"])
        assert check.rc == 0 and check.json["running"] is True, check.stdout[-2000:] + check.stderr[-2000:]
        second = zygote.run([*argv, "--json"])
        assert second.rc == 2, second.stdout[-2000:] + second.stderr[-3000:]
        msg = second.json["msg"]
        assert f"{out} is in use by prepare PID {first.pid}" in msg and "eagle3ops prepare" in msg, msg
        assert "Traceback" not in second.stderr
    finally:
        rc, o, e = finish(first, go)
    assert rc == 0, o[-2000:] + e[-3000:]
    # after it: the same prepare is up to date
    again = zygote.run([*argv, "--json"])
    assert again.rc == 0 and again.json["changed"] is False, again.stderr[-2000:]


def test_second_train_on_one_run_dir_fails_naming_the_first(zygote, tmp_path_factory, tmp_path):
    """Two ``eagle3ops train`` deciding on one run directory at once: the second fails at once naming the first's
    PID and command line. Fails on the main of 2026-12-01 ("another eagle3ops train is deciding ...; retry",
    no PID). The first is paused inside its decision (before it launches anything) and killed there.
    Inputs: eagle3ops.train.fixtures (STAND-IN for demo/prepare/extract: a tiny random verifier and random
    hidden states through the real store)."""
    from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier

    base = tmp_path_factory.mktemp("lock-train")
    verifier = make_tiny_verifier(base / "verifier")
    data = make_data_dir(base / "data", verifier, num_samples=6, real=False)
    run = tmp_path / "run"
    argv = ["train", "--data", data, "--verifier", verifier, "--run-dir", run, "--device", "cpu"]
    argv += ["--launcher", "setsid", "--no-gpu-free-check", "--max-steps", "1", "--json"]
    first, _ = start_paused(argv, tmp_path, "pause:replace:1")
    try:
        second = zygote.run(argv)
        assert second.rc == 2, second.stdout[-2000:] + second.stderr[-3000:]
        res = second.json
        assert f"{run} is in use by train PID {first.pid}" in res["msg"], res["msg"]
        assert "eagle3ops train --data" in res["msg"], res["msg"]
        assert "Traceback" not in second.stderr
        assert not (run / "train.pid").exists(), "the refused run launched a trainer"
    finally:
        _kill(first)  # killed inside its decision: it never launches a trainer


def test_train_refuses_while_extract_holds_its_data_dir(tmp_path_factory, tmp_path):
    """A data directory still being written (here: a real process holding its lock, STAND-IN for a running
    extract) is not trained on: exit 2 naming that process."""
    from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier

    base = tmp_path_factory.mktemp("lock-train-data")
    verifier = make_tiny_verifier(base / "verifier")
    data = make_data_dir(base / "data", verifier, num_samples=6, real=False)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from eagle3ops.runlock import RunLock\n"
            "with RunLock(sys.argv[1], what='extract'):\n    print('held', flush=True); time.sleep(60)",
            str(data),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = [
            "train",
            "--data",
            data,
            "--verifier",
            verifier,
            "--run-dir",
            tmp_path / "run",
            "--device",
            "cpu",
        ]
        r = subprocess.run(
            [EAGLE3OPS, *map(str, argv), "--no-gpu-free-check", "--json"],
            env={**os.environ, **ENV},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
        msg = json.loads(r.stdout.strip().splitlines()[-1])["msg"]
        assert f"{data} is being written by extract PID {holder.pid}" in msg and "partial" in msg, msg
        assert not (tmp_path / "run" / "train.pid").exists()
    finally:
        _kill(holder)
