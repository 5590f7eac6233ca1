"""Issue 32: a value a later phase of the run needs is refused by the first play, not at the end.

Real parts: the real site.yml on the embedded local default (``inventory/local``, localhost is the GPU host), run
by ``ansible-playbook`` in check mode from an empty directory with the work directory under it; the JSON callback's
result is read. Nothing is stood in for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = "Shared variables | Refuse an input the benchmark phase of this run needs"


def _site(tmp_path, *extra):
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(REPO / "inventory/local"),
           str(REPO / "site.yml"), "--check", "-e", f"eagle3ops_workdir={tmp_path / 'work'}", *extra]  # fmt: skip
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
    }
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
    return r.returncode, json.loads(r.stdout)


def _tasks(out):
    return [(p["play"]["name"], t["task"]["name"], t["hosts"].get("localhost", {})) for p in out["plays"]
            for t in p["tasks"]]  # fmt: skip


def test_a_full_run_without_held_out_prompts_stops_in_its_first_play(tmp_path):
    """Empty held-out prompts (the production example's benchmark_prompts default to them): a full run used to
    train for hours and fail in the benchmark phase. Now site.yml's preflight play (the first) fails, naming the
    variable, the phase and the ways out; no phase's play started and nothing was written."""
    rc, out = _site(tmp_path, "-e", "eagle3ops_heldout_prompts=")
    tasks = _tasks(out)
    failed = [(play, name, res) for play, name, res in tasks if res.get("failed")]
    assert rc == 2 and len(failed) == 1, [(p, n) for p, n, _ in tasks]
    play, name, res = failed[0]
    assert play.startswith("Shared variables") and CHECK in name, (play, name)
    assert len(out["plays"]) == 1, [p["play"]["name"] for p in out["plays"]]
    ran = [n for _, n, _ in tasks]
    assert all("Shared variables | Refuse" in n or "Validating arguments" in n for n in ran), ran
    msg = res["msg"]
    for needle in (
        "benchmark_prompts",
        "eagle3ops_heldout_prompts",
        "benchmark phase",
        "--skip-tags benchmark",
    ):
        assert needle in msg, msg
    assert "benchmark_target_path" not in msg, msg  # only what is missing is named
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_a_run_without_the_benchmark_phase_is_not_asked_for_its_inputs(tmp_path):
    """The same inventory with the benchmark phase left out (--skip-tags benchmark) or only another phase chosen
    (--tags services): the preflight play still runs (tagged always), its check is skipped, and the run goes on
    into the phase."""
    for extra in (["--tags", "services,benchmark", "--skip-tags", "benchmark"], ["--tags", "services"]):
        rc, out = _site(tmp_path, "-e", "eagle3ops_heldout_prompts=", "-e", "eagle3ops_model_path=", *extra)
        tasks = _tasks(out)
        checks = [res for _, n, res in tasks if CHECK in n]
        assert rc == 0 and checks and all(r.get("skipped") for r in checks), [(n, r) for _, n, r in tasks]
        assert not any(res.get("failed") for _, _, res in tasks)
        assert any(p.startswith("Services") for p, n, _ in tasks if "Services |" in n), [
            p for p, _, _ in tasks
        ]


def test_a_bad_value_of_a_late_phase_stops_a_full_run_before_the_first_phase(tmp_path):
    """train_epochs=-1 used to be refused when the train play began, after storage, prepare and extraction: the
    preflight play checks the bounds of every phase of the run."""
    rc, out = _site(tmp_path, "-e", "train_epochs=-1")
    failed = [(p, n, r) for p, n, r in _tasks(out) if r.get("failed")]
    assert rc == 2 and len(out["plays"]) == 1 and len(failed) == 1, [(p, n) for p, n, _ in _tasks(out)]
    assert failed[0][0].startswith("Shared variables") and "train_epochs" in failed[0][2]["msg"], failed
    # with --tags services the train phase is not in the run: its value is the train phase's business then
    rc, out = _site(tmp_path, "-e", "train_epochs=-1", "--tags", "services")
    assert rc == 0, [(p, n, r.get("msg")) for p, n, r in _tasks(out) if r.get("failed")]


def test_both_missing_inputs_are_named_at_once(tmp_path):
    rc, out = _site(tmp_path, "-e", "eagle3ops_heldout_prompts=", "-e", "benchmark_target_path=")
    msg = next(res["msg"] for _, n, res in _tasks(out) if res.get("failed"))
    assert rc == 2 and "benchmark_prompts" in msg and "benchmark_target_path" in msg, msg


def test_a_phase_playbook_run_alone_is_not_asked_for_the_benchmarks_inputs(tmp_path):
    """playbooks/prepare.yml run by itself (no tags: Ansible's run tags are 'all') has no benchmark play: the
    check is skipped there, as in every phase play but the benchmark's."""
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(REPO / "inventory/local"),
           str(REPO / "playbooks/prepare.yml"), "--check", "-e", f"eagle3ops_workdir={tmp_path / 'work'}",
           "-e", "eagle3ops_heldout_prompts="]  # fmt: skip
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
    }
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
    tasks = _tasks(json.loads(r.stdout))
    checks = [res for _, n, res in tasks if CHECK in n]
    assert checks and all(res.get("skipped") for res in checks), [
        (n, res) for _, n, res in tasks if CHECK in n
    ]
    assert not any(res.get("failed") for _, n, res in tasks if "Shared variables" in n)


def test_a_malformed_server_layout_stops_the_run_in_its_first_play(tmp_path):
    """eagle3ops_sglang_servers (several capture servers on one host) that is neither a count nor a list of GPU
    groups is refused by the first play, naming the variable and the host, before any phase (an extract-only run
    used to end with the client's "no server URL"); a good count and a good list pass that check."""
    check = "Shared variables | Refuse an eagle3ops_sglang_servers"
    for bad in ('"two"', "0", '"0"', "[]", "[[0, 1], []]", '["0,1"]'):  # JSON, as -e takes it
        rc, out = _site(tmp_path, "-e", f'{{"eagle3ops_sglang_servers": {bad}}}')
        failed = [(n, res) for _, n, res in _tasks(out) if res.get("failed")]
        assert rc == 2 and len(failed) == 1 and check in failed[0][0], (bad, [n for n, _ in failed])
        msg = failed[0][1]["msg"]
        assert "eagle3ops_sglang_servers" in msg and "on localhost" in msg and "GPU groups" in msg, msg
        assert len(out["plays"]) == 1, bad
    for good in ("2", "[[0, 1], [2, 3]]"):
        rc, out = _site(tmp_path, "--tags", "services", "-e", f'{{"eagle3ops_sglang_servers": {good}}}')
        checks = [res for _, n, res in _tasks(out) if check in n]
        assert checks and not any(r.get("failed") for r in checks), (good, checks)
