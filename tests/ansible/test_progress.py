"""Issue #32: a long phase says how far it is at every poll, under Ansible.

Real: the extract phase's playbook (playbooks/extract.yml) through ansible-runner on this machine, the module,
the CLI, a real tiny DeepseekV3 target on CPU, the project's callback (callback_plugins/eagle3ops_progress.py,
enabled in ansible.cfg), the run's log. Test-only: faulthook pauses the extraction at its 4th rename (the
metadata and 2 rows done: ``E3_FAULT=pause:replace:4``, through an ``extract_executable`` wrapper) and lets it go on once the role's
watch has reported it running (an ansible-runner event, not a timer), so the test sees a poll of a run in
progress however slow the machine is. Fails on the main of 2026-12-03: the extraction was polled by Ansible's own
``async``/``poll``, whose lines say only ``ASYNC POLL ... finished=False``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import run_cache

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
from extract_local import extract_vars, run_extract_local
from tinymodels import build_prepared_dataset

pytestmark = [pytest.mark.slow]

LENGTHS = [5, 17, 33, 9, 12, 2, 21, 7]
WATCH = "Extract | Watch the extraction (each poll - rows done, rows/s, ETA and the run's log)"
COLLECT = "Extract | Collect the extraction's result (a host lost meanwhile drops out; the others go on)"


def test_each_poll_of_the_extraction_says_rows_rate_eta_and_log(tmp_path, tmp_path_factory):
    model = run_cache.tiny_target(tmp_path_factory)
    data = build_prepared_dataset(tmp_path / "data", LENGTHS)
    go = tmp_path / "go"
    exe = tmp_path / "eagle3ops-paused"
    exe.write_text(
        "#!/bin/sh\n"
        f'export PYTHONPATH="{REPO / "tests/reliability/faulthook"}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'E3_FAULT=pause:replace:4 E3_FAULT_GO="{go}"\n'
        f'exec "{BIN / "eagle3ops"}" "$@"\n'
    )
    exe.chmod(0o755)
    seen: list[dict] = []

    def release_once_a_poll_saw_it_running(ev):
        d = ev.get("event_data") or {}
        if d.get("task") == WATCH and ev.get("event") == "runner_retry":
            seen.append(d.get("res") or {})
            # 300 polls: a guard only (the run never got to its pause), the assertions below then fail
            if (seen[-1].get("progress") or {}).get("done", 0) >= 2 or len(seen) > 300:
                go.touch()

    xv = extract_vars(
        model,
        data,
        extract_writer_threads=1,
        extract_max_batch_tokens=1,  # one row per batch: the pause comes after exactly 2 rows
        extract_async_timeout=900,  # the watch's retries: a guard only
        extract_executable=str(exe),
    )
    try:
        r = run_extract_local(xv, tmp_path / "runner", on_event=release_once_a_poll_saw_it_running)
    finally:
        go.touch()  # never leave the paused run waiting
    assert r.rc == 0, r.summary()
    (res,) = r.task_results(COLLECT)
    assert res["written"] == len(LENGTHS), res
    # one change, reported once: by the collected result (starting the job and watching it change nothing)
    assert r.changed_tasks() == [f"localhost: {COLLECT}"], r.changed_tasks()

    # the polls while it ran: each carries the progress (done/total, rate, ETA, log) and says so on one line;
    # Ansible printed that line under the task's retry line (the project's callback)
    running = [s for s in seen if s.get("running")]  # the extraction held the data directory at that poll
    log = tmp_path / "data.extract.log"
    for s in running:
        p = s["progress"]
        assert p["total"] == len(LENGTHS) and 0 <= p["done"] <= len(LENGTHS) and p["log"] == str(log), p
        assert p["line"].startswith(f"extract: {p['done']}/{len(LENGTHS)} rows (") and p["line"].endswith(
            f"; log: {log}"
        ), p["line"]
        assert s["job_finished"] is False and s["msg"] == p["line"]
        assert f"[localhost] {p['line']}" in r.stdout, r.stdout[-3000:]
    # a poll before the run took the data directory, or after it let it go, says that instead
    for s in seen:
        if s.get("progress") and not s.get("running"):
            assert re.fullmatch(
                rf"extract: \d+/{len(LENGTHS)} rows; (the run is starting|every row is done, the job is ending) "
                r"\(no run holds the data directory now\)",
                s["progress"]["line"],
            ), s
    # at the pause (2 rows done) the rate is measured from the two rows' file times, and the ETA follows
    at_pause = [s["progress"] for s in running if s["progress"]["done"] == 2]
    assert at_pause, f"no poll saw the run at its pause: {running}"
    for p in at_pause:
        assert p["rate_per_s"] > 0 and p["eta_s"] > 0, p
        assert re.fullmatch(
            rf"extract: 2/{len(LENGTHS)} rows \(25%\), [\d.e+-]+ rows/s, ETA \d+:\d\d:\d\d; "
            rf"PID \d+ since \S+; log: {re.escape(str(log))}",
            p["line"],
        ), p["line"]

    # the run's log: its start, the progress lines and its end
    text = log.read_text()
    assert re.search(r"extract \(PID \d+\) started: .*extract --data", text), text
    assert re.search(rf"extract \(PID \d+\): {len(LENGTHS)}/{len(LENGTHS)} rows, [\d.e+-]+ rows/s", text), (
        text
    )
    assert re.search(r"extract \(PID \d+\) ended$", text, flags=re.M), text
    assert not (data / "hidden_states" / "data.extract.log").exists()  # beside the store, not in it

    # the second run has nothing to do: no watch at all
    again = run_extract_local({**xv, "extract_executable": str(BIN / "eagle3ops")}, tmp_path / "runner2")
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.summary()
    assert not [e for e in again.events if (e.get("event_data") or {}).get("task") == WATCH
                and e.get("event") == "runner_on_ok"]  # fmt: skip


def test_the_callback_prints_a_results_progress_line_only():
    """The callback's reading of a result (in a process of its own: importing Ansible here would patch
    sys.intern under the torch this test worker imports)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from eagle3ops_progress import progress_line as p; "
        "print(json.dumps([p({'progress': {'line': 'extract: 1/2 rows'}}), p({'progress': 'train: 3 steps'}), "
        "p({'msg': 'no progress here'}), p({'progress': {}}), "
        "p({'stdout_lines': ['x', json.dumps({'progress': {'line': 'from a command'}})]}), "
        "p({'stdout_lines': ['not json']})]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "callback_plugins")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == ["extract: 1/2 rows", "train: 3 steps", None, None, "from a command", None]


def test_a_poll_with_progress_prints_as_progress_not_as_a_failure(tmp_path):
    """The project's screen output (callback_plugins/eagle3ops_screen.py, ansible.cfg's stdout_callback): a task
    polling a run whose result carries ``progress`` prints one line per poll with it, and no "FAILED" or "retries
    left" (Ansible's default printed ``FAILED - RETRYING: ... (717 retries left)`` there). A real ansible-playbook;
    the polled command stands for eagle3ops train-status (a counter in a file, no timer)."""
    counter = tmp_path / "polls"
    play = tmp_path / "poll.yml"
    poll = tmp_path / "poll.sh"
    poll.write_text(
        f"n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}\n"
        """printf '{"n": %d, "progress": {"line": "train: step %d/3, 2.0 steps/s, ETA 0:00:0%d"}}\\n' """
        "$n $n $((3 - n))\n"
    )
    script = f"sh {poll}"
    watch = {"name": "Watch the run", "ansible.builtin.shell": script, "register": "watch", "changed_when": False,
             "until": "(watch.stdout | from_json).n >= 3", "retries": 5, "delay": 0}  # fmt: skip
    play.write_text(
        json.dumps([{"name": "Poll", "hosts": "localhost", "gather_facts": False, "tasks": [watch]}])
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play), "-e",
                        f"ansible_python_interpreter={sys.executable}"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    for n in (1, 2):
        assert f"[localhost] train: step {n}/3, 2.0 steps/s, ETA 0:00:0{3 - n}" in r.stdout, r.stdout
    assert "FAILED" not in r.stdout and "retries left" not in r.stdout, r.stdout
