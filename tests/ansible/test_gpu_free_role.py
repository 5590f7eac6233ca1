"""The gpu_free role through ansible-playbook (ansible-runner) on localhost.

1. The local CPU default for real: this host has no NVIDIA driver, so with ``gpu_free_gpu_required:
   false`` the role skips cleanly (changed=0, also on a second run and in check mode), and with
   ``true`` it fails saying what to do.
2. The module's option mapping, check mode, diff and idempotence: the role is pointed
   (``gpu_free_executable``) at a STAND-IN ``eagle3ops`` launcher that runs the real CLI and the
   real ``eagle3ops.gpu_free`` logic with NVML replaced by ``tests/unit/nvml_standin.StandInNVML`` (no GPU here)
   and ``/dev`` by a temp dir. The holders are real ``sleep`` processes, stopped with real signals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_helpers import alive

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = "playbooks/gpu_free.yml"


def _wait_exec(p: subprocess.Popen) -> None:
    """Until bash has exec'd ``sleep`` (60 s: a guard only, it is at once)."""
    deadline = time.monotonic() + 60
    while not Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"sleep"):
        assert time.monotonic() < deadline, f"bash (PID {p.pid}) never exec'd sleep"
        time.sleep(0.01)


@pytest.fixture
def inventory(tmp_path):
    """localhost, with the runtime phase's output preset as inventory/local does (runtime_eagle3ops_bin: this
    venv's eagle3ops); without it the phase would look in the runtime phase's venv (eagle3ops_bin's default)."""
    inv = tmp_path / "hosts.ini"
    exe = Path(sys.executable).with_name("eagle3ops")
    inv.write_text(
        f"[gpu_hosts]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable} "
        f"runtime_eagle3ops_bin={exe}\n"
    )
    return inv


def _result(r, task):
    """The one module result of ``task`` (runner_on_start events carry no result)."""
    (res,) = [x for x in r.task_results(task) if x]
    return res


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this host has an NVIDIA driver")
def test_cpu_default_skips_cleanly_and_required_fails_clearly(run_playbook, inventory):
    for check in (False, False, True):
        r = run_playbook(PLAYBOOK, inventory, check=check)
        s = r.host("localhost")
        assert r.rc == 0 and s["failed"] == 0 and s["changed"] == 0, r.summary()
        skipped = [e["event_data"]["task"] for e in r.events if e.get("event") == "runner_on_skipped"]
        # the phase's own: only the wait (the shared role's benchmark-inputs check is skipped outside the
        # benchmark play and site.yml's preflight)
        shared = [t for t in skipped if t.startswith("Shared variables | ")]
        assert shared == [
            "Shared variables | Refuse an input the benchmark phase of this run needs (before anything runs)"
        ]
        assert s["skipped"] == 1 + len(shared), r.summary()
        assert [t for t in skipped if t not in shared] == [
            "GPU free | Wait until every selected GPU's memory is free"
        ]
        report = _result(r, "GPU free | Report the GPUs' memory (or why the check was skipped)")
        assert "no usable NVIDIA driver" in report["msg"] and "gpu_required is false" in report["msg"]
    r = run_playbook(PLAYBOOK, inventory, extravars={"gpu_free_gpu_required": True})
    assert r.rc != 0 and r.host("localhost")["failed"] == 1
    assert "gpu_free_gpu_required: false" in r.stdout, r.summary()


@pytest.fixture
def standin(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").write_text("")
    config = tmp_path / "nvml.json"
    exe = tmp_path / "eagle3ops"
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    import nvml_standin

    nvml_standin.write_launcher(
        exe, python=sys.executable, paths=[REPO / "python", REPO / "tests" / "unit"], config=config, dev=dev
    )
    procs = []

    def holder(env):
        p = subprocess.Popen(["bash", "-c", f"exec sleep 300 3<{dev}/nvidia0"], env={**os.environ, **env})
        procs.append(p)
        _wait_exec(p)
        return p

    yield exe, config, holder
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_check_mode_diff_stop_and_second_run_unchanged(run_playbook, inventory, standin):
    exe, config, holder = standin
    mine = holder({"EAGLE3OPS_RUN_ID": "extract-1"})
    config.write_text(json.dumps([{"procs": {str(mine.pid): 40960}}, {}]))
    xv = {
        "gpu_free_executable": str(exe),
        "gpu_free_gpu_required": True,
        "gpu_free_stop_run_ids": ["extract-1"],
        "gpu_free_timeout": 10,
        "gpu_free_stop_grace": 2,
    }
    task = "GPU free | Wait until every selected GPU's memory is free"

    r = run_playbook(PLAYBOOK, inventory, extravars=xv, check=True, diff=True)
    assert r.rc == 0 and r.host("localhost")["changed"] == 1, r.summary()
    res = _result(r, task)
    assert [w["pid"] for w in res["would_stop"]] == [mine.pid]
    assert f"PID {mine.pid} GPU 0" in res["diff"]["before"]
    assert alive(mine.pid), "check mode must stop nothing"

    r = run_playbook(PLAYBOOK, inventory, extravars=xv)
    assert r.rc == 0 and r.host("localhost")["changed"] == 1, r.summary()
    res = _result(r, task)
    assert res["free"] is True and res["stopped"][0]["allowed_by"] == "run_id:extract-1"
    assert mine.wait(timeout=5) < 0
    assert res["gpus"][0]["used_mib"] == 0 and res["initial"][0]["used_mib"] == 40960

    r = run_playbook(PLAYBOOK, inventory, extravars=xv)
    assert r.rc == 0 and r.host("localhost")["changed"] == 0, r.summary()


def test_foreign_holder_fails_the_role_with_the_list(run_playbook, inventory, standin):
    exe, config, holder = standin
    other = holder({"EAGLE3OPS_RUN_ID": "someone-else"})
    config.write_text(json.dumps([{"procs": {str(other.pid): 1234}}]))
    xv = {
        "gpu_free_executable": str(exe),
        "gpu_free_gpu_required": True,
        "gpu_free_stop_run_ids": ["extract-1"],
        "gpu_free_stop_cmdline_patterns": ["^python3? .*speculators"],
        "gpu_free_timeout": 0.5,
    }
    r = run_playbook(PLAYBOOK, inventory, extravars=xv)
    assert r.rc != 0 and r.host("localhost")["failed"] == 1
    res = _result(r, "GPU free | Wait until every selected GPU's memory is free")
    assert f"PID {other.pid}" in res["msg"] and "GPU 0: 1234 MiB" in res["msg"]
    assert [h["pid"] for h in res["holders"]] == [other.pid]
    assert alive(other.pid)


def test_two_hosts_one_combined_verdict_naming_the_host_and_gpu(run_playbook, tmp_path):
    """gpu_free over the inventory: each host checked, then one report; a GPU held on one host fails every host
    and the plays after it (the train phase) do not start anywhere. STAND-IN, as above: per host an ``eagle3ops``
    launcher with NVML replaced by ``nvml_standin.StandInNVML`` (its own GPUs) and ``/dev`` by a temp dir; the
    two hosts are two inventory hosts with ``ansible_connection: local``. The holder is a real ``sleep``."""
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    import nvml_standin

    hosts = {}
    for name in ("hostA", "hostB"):
        d = tmp_path / name
        (d / "dev").mkdir(parents=True)
        for i in (0, 1):
            (d / "dev" / f"nvidia{i}").write_text("")
        nvml_standin.write_launcher(d / "eagle3ops", python=sys.executable, paths=[REPO / "python", REPO / "tests" / "unit"],
                                    config=d / "nvml.json", dev=d / "dev")  # fmt: skip
        (d / "nvml.json").write_text(json.dumps([{}, {}]))
        hosts[name] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                       "gpu_free_executable": str(d / "eagle3ops")}  # fmt: skip
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}))
    play = tmp_path / "then_train.yml"
    play.write_text(
        f"- name: GPU free\n  ansible.builtin.import_playbook: {REPO}/{PLAYBOOK}\n"
        "- name: Stands for the train phase\n  hosts: gpu_hosts\n  gather_facts: false\n  tasks:\n"
        "    - name: Train would start here\n      ansible.builtin.debug:\n        msg: started\n"
    )
    xv = {"gpu_free_gpu_required": True, "gpu_free_timeout": 0.5}
    summary = "GPU free | Sum up the GPUs of every host (fails naming each host and GPU that is not free)"
    holder = subprocess.Popen(["bash", "-c", f"exec sleep 300 3<{tmp_path}/hostB/dev/nvidia1"])
    try:
        _wait_exec(holder)
        (tmp_path / "hostB/nvml.json").write_text(json.dumps([{}, {"procs": {str(holder.pid): 1234}}]))
        r = run_playbook(play, inv, extravars=xv)
        assert r.rc != 0, r.summary()
        (res,) = [x for x in r.task_results(summary) if x]
        text = json.dumps(res["msg"])
        assert f"hostB: GPU 1 NOT FREE (1234.0 MiB used): held by PID {holder.pid}" in text, text
        assert "hostA: 2 GPU(s) free" in text and "not free on hostB" in text, text
        assert not r.task_results("Train would start here"), "a later play ran although hostB's GPU is held"
        assert alive(holder.pid)  # not allow-listed: named, never signalled
    finally:
        holder.kill()
        holder.wait()
    r = run_playbook(play, inv, extravars=xv)
    assert r.rc == 0, r.summary()
    assert r.host("hostA")["changed"] == 0 and r.host("hostB")["changed"] == 0, r.changed_tasks()
    (res,) = [x for x in r.task_results(summary) if x]
    assert res["msg"][-1] == "every host: 2 host(s) checked", res["msg"]
    assert len([x for x in r.task_results("Train would start here") if x]) == 2
