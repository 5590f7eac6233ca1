"""Real speculators 0.9.0 training on CPU through the Ansible module and the CLI (a few steps).

What is real: ansible-playbook + the eagle3ops_train module + ``eagle3ops train`` + the detached setsid
trainer + speculators' trainer, checkpointer and resume; SIGKILL of the whole trainer process group.
STAND-IN: the verifier and the data directory come from ``eagle3ops.train.fixtures`` (a tiny random
DeepseekV3ForCausalLM; hidden states from its real forward pass, written through HiddenStateStore) rather
than from the demo/prepare/extract phases.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eagle3ops import checkpoints as train_checkpoints
from eagle3ops.train import launch as train_launch
from eagle3ops.train import metrics as train_metrics
from eagle3ops.train import run as train_run
from eagle3ops.train import spec as train_spec
from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier
from train_cli import train_argv

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _env():
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "ANSIBLE_NOCOLOR": "1",
    }


def playbook(vars_file: Path, *extra: str) -> tuple[int, str]:
    r = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(ROOT / "inventory" / "local"),
            str(ROOT / "playbooks" / "train.yml"),
            "-e",
            f"@{vars_file}",
            *extra,
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return r.returncode, r.stdout + r.stderr


def changed_count(out: str) -> int:
    m = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", out)
    assert m, out[-3000:]
    return int(m.group(1))


def cli(*args: str) -> tuple[int, dict]:
    r = subprocess.run(
        [str(BIN / "eagle3ops"), *args, "--json"], env=_env(), capture_output=True, text=True, timeout=900
    )
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])


def assert_watch_polls(out: str, run_dir) -> None:
    """Every poll line of the watch names the step, steps/s, ETA and the log (issue #32)."""
    polls = re.findall(
        rf"^  \[localhost\] (train: .*; log: {re.escape(str(run_dir / 'train.log'))})$", out, re.M
    )
    # the trainer imports torch for seconds before its first step: it is polled while it runs
    assert polls, out[-3000:]
    for line in polls:
        assert re.fullmatch(
            r"train: \d+(/\d+ steps \(\d+%\)| steps \(of a total not known yet\)), ([\d.e+-]+ steps/s|steps/s not "
            r"measured yet), ETA (\d+:\d\d:\d\d|\?); running(; epoch \d+ of 4)?(; total from max_steps|; total ~\d+ steps/epoch x 4 epochs)?; "
            r"log: .*",
            line,
        ), line


def assert_resume_checked(run_dir: Path, resumed: dict, out: str) -> None:
    """The run finished, and its resume compared the restored optimizer state with the checkpoint's file, tensor
    by tensor (users' pain 15): the exit record, the trainer's log and the role's report line say so."""
    ended = json.loads((run_dir / train_spec.EXIT).read_text())
    check = ended["resume_check"]
    assert ended["status"] == "finished" and check["equal"] is True and check["epoch"] == resumed["epoch"]
    assert check["tensors"] > check["parameters"] > 0
    assert check["file"] == str(run_dir / "checkpoints" / str(resumed["epoch"]) / "optimizer_state_dict.pt")
    assert f"optimizer state equals {check['file']}" in (run_dir / train_run.LOG).read_text()
    said = f"resumed from epoch {resumed['epoch']}, the optimizer state restored equal to {check['file']}"
    assert said in " ".join(out.split())  # the report line, folded by the YAML callback


def test_module_trains_is_idempotent_resumes_after_sigkill_and_refuses_config_changes(tmp_path_factory):
    base = tmp_path_factory.mktemp("train_run")
    verifier = make_tiny_verifier(base / "verifier")
    data = make_data_dir(base / "data", verifier, num_samples=24, real=True)
    run_dir = base / "run"
    save = run_dir / "checkpoints"
    v = {
        "train_data_dir": str(data),
        "train_verifier_path": str(verifier),
        "train_run_dir": str(run_dir),
        "train_epochs": 4,
        "train_total_seq_len": 384,
        "train_draft_vocab_size": 64,
        "train_wait": False,
        "train_poll_interval": 1,
    }
    vars_file = base / "vars.json"
    vars_file.write_text(json.dumps(v))

    # 1. launch, detached (wait: false returns at once)
    rc, out = playbook(vars_file)
    assert rc == 0, out[-3000:]
    assert changed_count(out) == 2  # the content check recorded every file (its own step), the launch
    assert "Train | Collect the content check's result" in out
    state = json.loads((run_dir / train_spec.STATE).read_text())
    pid = state["pid"]
    assert state["attempt"] == 1 and state["launcher"] == "setsid"
    assert train_launch.is_our_trainer(pid, run_dir / train_spec.CONFIG), (
        "the trainer is not running after wait: false"
    )
    assert os.getpgid(pid) == pid  # its own session / process group

    # 2. SIGKILL the trainer mid-run: after the first checkpoint, before the end
    deadline = time.monotonic() + 300
    while not (save / "0" / "training_state.json").exists():
        assert train_launch.is_our_trainer(pid, run_dir / train_spec.CONFIG), train_run.log_tail(run_dir)
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.1)
    os.killpg(pid, signal.SIGKILL)
    while train_launch.is_our_trainer(pid, run_dir / train_spec.CONFIG):
        time.sleep(0.05)
    assert not (run_dir / train_spec.EXIT).exists(), "the run finished before it could be killed"
    steps_before_kill = train_metrics.read_metrics(run_dir)["attempts"][0]["last_global_step"]
    st = train_run.status(str(run_dir))
    assert st["status"] == "killed" and st["resume_from"]["epoch"] >= 0

    # 3. re-running the phase relaunches and resumes from the checkpoint (wait: true watches it until done, each
    # poll printing the step, steps/s, ETA and the log: issue #32)
    v["train_wait"] = True
    vars_file.write_text(json.dumps(v))
    rc, out = playbook(vars_file, "--diff")
    assert rc == 0, out[-3000:]
    assert changed_count(out) == 1
    # the relaunch's diff: killed -> running
    assert '"status": "killed"' in out and '"status": "running"' in out
    assert f"run {run_dir}: finished" in out  # the report, once the watch saw it end
    assert_watch_polls(out, run_dir)
    state = json.loads((run_dir / train_spec.STATE).read_text())
    assert state["attempt"] == 2
    resumed = state["resume_from"]
    assert resumed and resumed["global_step"] > 0
    m = train_metrics.read_metrics(run_dir)
    _first, second = m["attempts"]
    # the step counter continues where the checkpoint left it; it does not start over at 0
    assert second["first_global_step"] == resumed["global_step"]
    assert 0 < second["first_global_step"] <= steps_before_kill + 1
    assert second["last_global_step"] > second["first_global_step"]
    assert_resume_checked(run_dir, resumed, out)
    assert train_checkpoints.epoch_dirs(save)[-1] == 3  # all 4 epochs done
    assert json.loads((save / "3" / "training_state.json").read_text())["epoch"] == 3
    assert m["val_loss"] is not None and len(m["val_cond_acc"]) == 3  # one accuracy per TTT step
    assert "val accuracy per position" in out

    # 4. a second run of the phase changes nothing, even with a file's record out of date (its times changed):
    # the content check runs only before a launch, as it did inside the launch task
    os.utime(next((data / "hidden_states").glob("hs_*.safetensors")))
    rc, out = playbook(vars_file)
    assert rc == 0, out[-3000:]
    assert changed_count(out) == 0
    assert json.loads((run_dir / train_spec.STATE).read_text())["attempt"] == 2

    # 5. a changed configuration fails clearly (with the diff), and nothing is started
    rc, res = cli(
        *train_argv(data, verifier, run_dir),
        "--epochs",
        "5",
        "--total-seq-len",
        "384",
        "--draft-vocab-size",
        "64",
    )
    assert rc == 2 and res["failed"]
    assert "configuration changed" in res["msg"] and "restart_on_change" in res["msg"]
    assert "-    epochs: 4" in res["config_diff"] and "+    epochs: 5" in res["config_diff"]
    assert json.loads((run_dir / train_spec.STATE).read_text())["attempt"] == 2
    # ... unless restart_on_change (check mode: predicted, still nothing started)
    res = train_run.ensure_run(
        train_spec.TrainSpec(
            data_dir=str(data),
            verifier_path=str(verifier),
            run_dir=str(run_dir),
            epochs=5,
            total_seq_len=384,
            draft_vocab_size=64,
            restart_on_change=True,
        ),
        check=True,
    )
    assert res["changed"] and res["would"] == "launch" and res["restarted"]["previous_status"] == "finished"
    assert json.loads((run_dir / train_spec.STATE).read_text())["attempt"] == 2
