"""The run-dir state machine end to end, fast: every transition of ``eagle3ops.train.run.ensure_run``.

Real: the launcher (setsid + PID file, detached), liveness by PID + command line, locking, the config
comparison, restart_on_change (stop + checkpoints moved aside), wait/timeout, stop.
STAND-IN: the trainer. ``python`` is a script running ``fake_trainer.py`` with the shim's argv; it behaves
as the file ``behaviour`` in the run dir says (``sleep``, ``finish``, ``fail``) and writes the shim's
metric and exit records. Real speculators runs are in test_train_run.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from eagle3ops.train import launch as train_launch
from eagle3ops.train import run as train_run
from eagle3ops.train import spec as train_spec
from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier

FAKE = r"""
import json, os, sys, time
run = os.path.dirname(os.environ["EAGLE3OPS_EXIT"])
mode = open(os.path.join(run, "behaviour")).read().strip()
with open(os.environ["EAGLE3OPS_METRICS"], "a") as f:
    f.write(json.dumps({"kind": "train", "time": time.time(), "step": 0,
                        "data": {"train": {"loss": 1.0}, "global_step": 0, "epoch": 0}}) + "\n")
if mode == "sleep":
    time.sleep(900)  # until the test stops it (the test's own limit)
elif mode == "finish":
    time.sleep(0.5)
    with open(os.environ["EAGLE3OPS_METRICS"], "a") as f:
        f.write(json.dumps({"kind": "val", "time": time.time(), "step": 1,
                            "data": {"val": {"loss_epoch": 0.5, "cond_acc_0_epoch": 0.75}, "epoch": 0}}) + "\n")
status = "failed" if mode == "fail" else "finished"
with open(os.environ["EAGLE3OPS_EXIT"], "w") as f:
    json.dump({"status": status, "rc": 1 if mode == "fail" else 0, "error": "boom" if mode == "fail" else None}, f)
sys.exit(1 if mode == "fail" else 0)
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("train_states")
    verifier = make_tiny_verifier(base / "verifier")
    data = make_data_dir(base / "data", verifier, num_samples=8, real=False)
    fake = base / "fake_trainer.py"
    fake.write_text(FAKE)
    py = base / "fakepy"
    py.write_text(f'#!/bin/sh\nexec python3 {fake} "$@"\n')
    py.chmod(0o755)
    return verifier, data, py


def _spec(inputs, run: Path, **kw) -> train_spec.TrainSpec:
    verifier, data, py = inputs
    return train_spec.TrainSpec(
        data_dir=str(data),
        verifier_path=str(verifier),
        run_dir=str(run),
        python=str(py),
        launcher="setsid",
        **kw,
    )


def _behave(run: Path, mode: str) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "behaviour").write_text(mode)


def _wait_dead(pid: int, run: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while train_launch.is_our_trainer(pid, run / train_spec.CONFIG):
        assert time.monotonic() < deadline, f"PID {pid} still running"
        time.sleep(0.05)


def test_transitions(inputs, tmp_path):
    run = tmp_path / "run"
    _behave(run, "sleep")
    r = train_run.ensure_run(_spec(inputs, run, epochs=2))
    assert r["changed"] and r["status"] == "launched" and r["attempt"] == 1 and r["launcher"] == "setsid"
    pid = r["pid"]
    assert train_launch.is_our_trainer(pid, run / train_spec.CONFIG)
    assert int((run / train_spec.PIDFILE).read_text()) == pid

    # running -> nothing to do
    r = train_run.ensure_run(_spec(inputs, run, epochs=2))
    assert not r["changed"] and r["status"] == "running" and r["pid"] == pid

    # wait with a timeout on a run that does not end: a clear failure, the run keeps going
    with pytest.raises(train_spec.TrainError, match=r"still running after 1 s .*keeps going"):
        train_run.ensure_run(_spec(inputs, run, epochs=2), wait=True, timeout=1, poll_s=0.2)
    assert train_launch.is_our_trainer(pid, run / train_spec.CONFIG)

    # config changed while running -> refused, nothing touched
    (run / "checkpoints" / "0").mkdir(parents=True)
    with pytest.raises(
        train_spec.TrainError, match=r"configuration changed while run .* exists \(status running\)"
    ) as e:
        train_run.ensure_run(_spec(inputs, run, epochs=3))
    assert "+    epochs: 3" in e.value.details["config_diff"]
    assert train_launch.is_our_trainer(pid, run / train_spec.CONFIG)

    # ... unless restart_on_change: old trainer stopped, checkpoints moved aside, fresh launch
    _behave(run, "fail")
    r = train_run.ensure_run(_spec(inputs, run, epochs=3, restart_on_change=True))
    assert r["changed"] and r["restarted"]["previous_status"] == "running"
    assert not train_launch.is_our_trainer(pid, run / train_spec.CONFIG)
    moved = Path(r["restarted"]["old_checkpoints"])
    assert (moved / "0").is_dir() and not (run / "checkpoints" / "0").exists()
    assert r["attempt"] == 2 and r["resume_from"] is None
    _wait_dead(r["pid"], run)

    # failed -> relaunch, and the failure is reported
    _behave(run, "finish")
    r = train_run.ensure_run(_spec(inputs, run, epochs=3), wait=True, timeout=60, poll_s=0.1)
    assert r["changed"] and r["before"]["status"] == "failed" and r["previous_exit"]["error"] == "boom"
    assert r["status"] == "finished" and r["attempt"] == 3
    assert r["metrics"]["val_loss"] == 0.5 and r["metrics"]["val_cond_acc"] == [0.75]

    # finished -> nothing to do (check mode agrees)
    assert not train_run.ensure_run(_spec(inputs, run, epochs=3), check=True)["changed"]
    r = train_run.ensure_run(_spec(inputs, run, epochs=3))
    assert not r["changed"] and r["status"] == "finished" and r["attempt"] == 3


def test_wait_reports_a_failed_run_with_its_log(inputs, tmp_path):
    run = tmp_path / "run"
    _behave(run, "fail")
    with pytest.raises(
        train_spec.TrainError, match=r"ended failed: boom.*resumes from the last checkpoint"
    ) as e:
        train_run.ensure_run(_spec(inputs, run), wait=True, timeout=60, poll_s=0.1)
    assert e.value.details["status"] == "failed"
    assert json.loads((run / train_spec.STATE).read_text())["attempt"] == 1


def test_stop(inputs, tmp_path):
    run = tmp_path / "run"
    _behave(run, "sleep")
    r = train_run.ensure_run(_spec(inputs, run))
    assert train_run.stop(str(run), check=True) == {
        "changed": True,
        "status": "running",
        "would": "stop",
        "pid": r["pid"],
    }
    assert train_launch.is_our_trainer(r["pid"], run / train_spec.CONFIG)
    s = train_run.stop(str(run), grace_s=10)
    assert s["changed"] and s["stopped_pid"] == r["pid"] and s["status"] == "killed"
    assert not train_launch.is_our_trainer(r["pid"], run / train_spec.CONFIG)
    assert train_run.stop(str(run))["changed"] is False


def test_new_token_frequencies_are_a_changed_configuration_not_a_silent_resume(inputs, tmp_path):
    """A run resumed over a rewritten token_freq.pt would build other d2t/t2d maps under a draft trained with the
    old ones: training looks fine, serving accepts ~nothing (users' pain 14). The rendered config names the file's
    sha256 and the maps' directory keyed by it, so the changed file is a changed configuration: refused, with the
    diff, and the finished run and its maps are left as they are."""
    import torch

    verifier, _, py = inputs
    data = make_data_dir(tmp_path / "data", verifier, num_samples=8, real=False)
    mine = (verifier, data, py)
    run = tmp_path / "run"
    _behave(run, "finish")
    r = train_run.ensure_run(_spec(mine, run, epochs=1), wait=True, timeout=60, poll_s=0.1)
    assert r["status"] == "finished", r
    config_before = (run / train_spec.CONFIG).read_text()
    again = train_run.ensure_run(_spec(mine, run, epochs=1), check=True)
    assert not again["changed"]  # the same inputs: nothing to do

    freq = torch.load(data / "token_freq.pt")
    top = max(freq, key=freq.get)
    freq[top] += 1000  # the same tokens, other counts (a re-prepared dataset)
    torch.save(freq, data / "token_freq.pt")
    with pytest.raises(train_spec.TrainError, match=r"configuration changed") as e:
        train_run.ensure_run(_spec(mine, run, epochs=1), check=True)
    diff = e.value.details["config_diff"]
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert any("token frequencies" in line and "sha256" in line for line in changed), diff
    assert any("d2t" in line for line in changed) and any("t2d" in line for line in changed), diff
    assert (run / train_spec.CONFIG).read_text() == config_before
