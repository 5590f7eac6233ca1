"""Issue #16.2: the extract phase re-run while an interrupted playbook's extraction is still running waits for it
and plans again, instead of starting a second one.

Real: the phase playbook (playbooks/extract.yml) through ansible-runner on this machine (inventory/local, the
module, the CLI, the lock); the still-running extraction is a real ``eagle3ops extract`` process (what a Ctrl-C'd
playbook leaves behind: its async job keeps running). Test-only: faulthook pauses that process at a rename
(``E3_FAULT=pause:replace:4``) and lets it go on once the role's plan task has ended, so it is provably
running while the role plans. Fails on the main of 2026-12-01: the role started a second extraction that
wrote every row again (no lock, no wait task).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
from extract_local import extract_vars, run_extract_local
from store_helpers import manifest_rows
from tinymodels import build_prepared_dataset, build_tiny_target

LENGTHS = [5, 17, 33, 9, 12, 2, 21, 7]
PLAN_TASK = "Extract | Work out what is left to extract (reads the manifests only)"
WAIT_TASK = "Extract | Wait for the extraction already running on this data directory, then plan again"
EXTRACT_TASK = "Extract | Extract target hidden states for every prepared row"


def test_rerun_waits_for_the_running_extraction_and_does_only_what_is_left(tmp_path):
    model = build_tiny_target(tmp_path / "model")
    data = build_prepared_dataset(tmp_path / "data", LENGTHS)
    go = tmp_path / "go"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO / "tests" / "reliability" / "faulthook"), os.environ.get("PYTHONPATH")) if p
        ),
        "E3_FAULT": "pause:replace:4",
        "E3_FAULT_GO": str(go),
    }
    argv = [str(BIN / "eagle3ops"), "extract", "--data", str(data), "--model", str(model), "--device", "cpu"]
    running = subprocess.Popen(
        [*argv, "--writer-threads", "1", "--max-batch-size", "1", "--json", "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600  # torch + the model load, on a loaded 2-core box
        while not Path(f"{go}.paused").exists():
            assert running.poll() is None, running.communicate()
            assert time.monotonic() < deadline, "the running extraction never reached its pause"
            time.sleep(0.05)
        # let it go on once the role's plan has seen it running (the role then waits for it); a fixed 15 s timer
        # released it too early when the playbook started slowly on a loaded machine

        def release_after_the_plan(ev):
            data = ev.get("event_data") or {}
            if data.get("task") == PLAN_TASK and ev.get("event") in ("runner_on_ok", "runner_on_failed"):
                go.touch()

        xv = extract_vars(model, data, extract_executable=str(BIN / "eagle3ops"))
        r = run_extract_local(xv, tmp_path / "runner", on_event=release_after_the_plan)
        out, err = running.communicate(timeout=300)
    finally:
        go.touch()
        if running.poll() is None:
            running.kill()  # our own child
            running.communicate()
    assert r.rc == 0, r.summary()
    assert running.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["written"] == len(LENGTHS)
    (plan,) = r.task_results(PLAN_TASK)
    assert plan["running"] is True and plan["holder"]["pid"] == running.pid, plan
    (replan,) = r.task_results(WAIT_TASK)  # waited on the lock (the holder is a zombie until we reap it)
    assert replan["to_extract"] == 0 and replan["running"] is False, replan
    kinds = [e.get("event") for e in r.events if (e.get("event_data") or {}).get("task") == EXTRACT_TASK]
    assert "runner_on_skipped" in kinds and "runner_on_ok" not in kinds, (
        f"a second extraction started: {kinds}"
    )
    assert r.stats["localhost"]["changed"] == 0, r.summary()
    assert manifest_rows(data) == list(range(len(LENGTHS))), "rows written twice"
