"""bench/sglang_live.py's reading of ansible-playbook's output (lane demo decides from it whether the sglang and
extract phases changed anything, and takes the patch and extraction results from it): parsed from a REAL
ansible-playbook -v run on this machine (connection local), started with the harness's own environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))
import sglang_live as L

PLAY = """
- name: Harness parse
  hosts: all
  gather_facts: false
  tasks:
    - name: Changed one
      ansible.builtin.command: echo 'a => {b}'
    - name: Ok one
      ansible.builtin.debug:
        msg: "ok: [x] => {}"
    - name: Skipped one
      ansible.builtin.debug:
        msg: never
      when: false
    - name: Loop
      ansible.builtin.command: "echo {{ item }}"
      changed_when: item == 2
      loop: [1, 2]
    - name: Fails, ignored
      ansible.builtin.command: "false"
      ignore_errors: true
"""


def test_playbook_output_of_a_real_run_is_parsed(tmp_path):
    pb = tmp_path / "play.yml"
    pb.write_text(PLAY)
    r = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-v", "-i", "localhost,", "-c", "local", str(pb),
         "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, env=L.playbook_env(tmp_path), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    parsed = L.parse_playbook_output(r.stdout)

    # ansible's own counting: an ignored failure is ok (and changed: `command` says so), not failed
    assert parsed["stats"] == {
        "localhost": {"ok": 4, "changed": 3, "unreachable": 0, "failed": 0, "skipped": 1, "rescued": 0,
                      "ignored": 1},
    }  # fmt: skip
    changed = L.task_result(parsed, "Changed one")
    assert changed["status"] == "changed" and changed["stdout"] == "a => {b}"
    assert L.task_result(parsed, "Ok one") == {"status": "ok", "msg": "ok: [x] => {}"}
    assert L.task_result(parsed, "Skipped one") is None  # skipped: never ran
    assert L.task_result(parsed, "No such task") is None
    loop = [t for t in parsed["tasks"] if t["task"] == "Loop"]
    assert [(t["status"], t["result"]["item"], t["result"]["stdout"]) for t in loop] == [
        ("ok", 1, "1"), ("changed", 2, "2"),  # one line per item
    ]  # fmt: skip
    failed = L.task_result(parsed, "Fails, ignored")
    assert failed["status"] == "fatal" and failed["rc"] == 1
    assert [t["task"] for t in parsed["tasks"] if t["status"] == "changed"] == ["Changed one", "Loop"]


def test_a_role_task_is_found_by_its_name_without_the_role_prefix():
    out = "\n".join([
        "TASK [sglang : SGLang | Capture patch in deepseek_v2.py] ***********",
        'changed: [gpu-box] => {"changed": true, "patch_state": "applied"}',
        "",
        "PLAY RECAP *********",
        "gpu-box                    : ok=9    changed=1    unreachable=0    failed=0    skipped=3    rescued=0    ignored=0",
    ])  # fmt: skip
    parsed = L.parse_playbook_output(out)
    assert L.task_result(parsed, "SGLang | Capture patch in deepseek_v2.py") == {
        "status": "changed", "changed": True, "patch_state": "applied",
    }  # fmt: skip
    assert parsed["stats"]["gpu-box"]["changed"] == 1 and parsed["stats"]["gpu-box"]["skipped"] == 3


def test_lane_smol_playbook_waits_for_lane_demo_to_restore_the_shared_install(tmp_path, monkeypatch):
    """Both lanes share one SGLang install; lane demo patches it while capturing and the serve phase refuses a
    patched file, so lane smol's playbook waits until lane demo's result.json says the patch was looked at again
    (after its restore) or lane demo ended; never longer than the timeout. The wait runs on an injected clock
    (tests/clock.py): its seconds are its own 2-s polls, so the bounds below hold on a loaded machine too."""
    import json

    from clock import VirtualClock

    monkeypatch.setattr(L, "W", tmp_path)
    (tmp_path / "demo").mkdir()
    res = tmp_path / "demo" / "result.json"
    res.write_text(json.dumps({"patch_apply": {"state": "applied"}}))
    L.DEMO_QUIET.clear()
    try:
        clock = VirtualClock()
        monkeypatch.setattr(L, "time", clock)
        clock.at(2.5, lambda: res.write_text(json.dumps({"patch_status_after": {"state": "pristine"}})))
        got = L.demo_capture_over(timeout=60)
        # restored 2.5 s in: seen at the next poll (4 s), long before the timeout
        assert got == {"s": 4.0, "demo_ended": False} and clock.elapsed == 4.0, got

        res.write_text("{}")  # lane demo still capturing: bounded by the timeout
        clock = VirtualClock()
        monkeypatch.setattr(L, "time", clock)
        got = L.demo_capture_over(timeout=1)
        assert got == {"s": 2.0, "demo_ended": False}, got  # one poll, then the timeout

        L.DEMO_QUIET.set()  # lane demo ended (or is not run): no wait
        clock = VirtualClock()
        monkeypatch.setattr(L, "time", clock)
        assert L.demo_capture_over(timeout=60) == {"s": 0.0, "demo_ended": True} and clock.sleeps == []
    finally:
        L.DEMO_QUIET.clear()
