"""site.yml on the embedded local default, for real, through ansible-runner (the user's `make run`):
demo → prepare → extract → train (speculators 0.9.0 on CPU, `--on-missing raise`) ; a second run reports
changed=0; --check on the finished work dir predicts no change; and speculators' own loader reads every row the
pipeline produced (none dropped for a token-id mismatch or a missing file). --check on a fresh work dir writes
nothing: tests/reliability/test_check_mode.py, whose check run of every phase (these phases among them) takes the
same variables (``small_local_default``), so one site.yml run carries both claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hosts"))
from runner import run_playbook, small_local_default

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "inventory" / "local"
TAGS = "runtime,prepare,extract,gpu_free,train"
NOTHING_TO_EXTRACT = "Extract | Report that every row was already extracted"
CONTENT_CHECKED = "Train | Collect the content check's result (a damaged file is refused here, by name)"


def _vars(workdir: Path) -> dict:
    return small_local_default(workdir)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    work = tmp_path_factory.mktemp("site-local") / "work"
    first = run_playbook(REPO / "site.yml", INVENTORY, extravars=_vars(work), tags=TAGS)
    return work, first


def _files(root: Path) -> dict[str, int]:
    """mtime of every file except lock files (the train phase takes its run dir's lock on every run)."""
    return {
        str(p.relative_to(root)): p.stat().st_mtime_ns
        for p in root.rglob("*")
        if p.is_file() and not p.name.endswith(".lock")
    }


@pytest.mark.slow  # its setup is the whole first site.yml run (minutes); the marks also start this module first (tests/conftest.py)
def test_first_run_builds_everything(pipeline):
    work, first = pipeline
    s = first.host("localhost")
    assert first.rc == 0 and s["failed"] == 0, first.summary()
    assert s["changed"] == 5, first.changed_tasks()  # demo, prepare, extract, train's content check, train
    demo = json.loads((work / "demo" / "demo.json").read_text())  # built with the role's demo variables
    assert (
        demo["params"]["num_conversations"] == 20
        and demo["params"]["train_steps"] == demo["train_steps"] == 30
    )
    (res,) = [
        r
        for r in first.task_results(
            "Extract | Collect the extraction's result (a host lost meanwhile drops out; the others go on)"
        )
        if r.get("written")
    ]
    rows = json.loads((work / "data" / "prepare_meta.json").read_text())["num_rows"]
    assert res["written"] == res["total"] == rows > 0
    assert res["layer_ids"] == [2, 4, 5]
    # issue 32: the report says what happened (a skipped task registered under the result's name made it say
    # "nothing to extract: 0 of N rows already in the manifests" after extracting all N)
    (said,) = [r["msg"] for r in first.task_results("Extract | Report what extraction did") if r.get("msg")]
    assert f"extracted {rows} of {rows} rows" in said and "0 were already in the manifests" in said, said
    assert not [r for r in first.task_results(NOTHING_TO_EXTRACT) if r.get("msg")]
    st = json.loads(
        subprocess.run(
            [sys.executable, "-m", "eagle3ops", "extract-status", "--data", str(work / "data"), "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert st["done"] == st["rows"] == rows and st["remaining"] == 0
    # the real consumer trained on it: speculators ran to the end with the layer ids extract recorded
    (tr,) = [
        r
        for r in first.task_results("Train | Train the EAGLE-3 draft (idempotent, detached, resumable)")
        if r
    ]
    assert tr["changed"] is True and tr.get("status") == "launched", tr  # detached; train_wait watches it
    (done,) = [r for r in first.task_results("Train | Read the finished run") if r]
    assert done.get("status") == "finished" and done["changed"] is False, done
    assert tr.get("layer_ids") == done.get("layer_ids") == [2, 4, 5], (tr, done)
    # the content check ran as a detached step of its own, polled, and recorded every file; the launch then read
    # none of them again (it sat silent inside the launch task for the whole first check: users' pain 2)
    (cc,) = [r for r in first.task_results(CONTENT_CHECKED) if r.get("stdout")]
    checked = json.loads(cc["stdout_lines"][-1])
    assert cc["changed"] and checked["verified"] == checked["progress"]["total"] == rows, checked
    assert checked["progress"]["line"].startswith(f"train content check: {rows}/{rows} files (100%)"), checked
    assert tr["content_check"]["verified"] == 0 and tr["content_check"]["already_verified"] == rows, tr


@pytest.mark.slow  # a whole site.yml run (~35 s alone); the marks also start this module first (tests/conftest.py)
def test_second_run_changes_nothing(pipeline):
    work, _ = pipeline
    before = _files(work)
    second = run_playbook(REPO / "site.yml", INVENTORY, extravars=_vars(work), tags=TAGS)
    s = second.host("localhost")
    assert second.rc == 0 and s["failed"] == 0, second.summary()
    assert s["changed"] == 0, second.changed_tasks()
    assert _files(work) == before  # not a byte rewritten
    assert not [r for r in second.task_results(CONTENT_CHECKED) if r.get("stdout")]  # nothing left to verify
    rows = json.loads((work / "data" / "prepare_meta.json").read_text())["num_rows"]
    (said,) = [r["msg"] for r in second.task_results(NOTHING_TO_EXTRACT) if r.get("msg")]
    assert f"nothing to extract: {rows} of {rows} rows already in the manifests" in said, said


@pytest.mark.slow  # a whole site.yml --check (~65 s alone); the marks also start this module first (tests/conftest.py)
def test_check_mode_on_a_finished_workdir_predicts_no_change(pipeline):
    work, _ = pipeline
    r = run_playbook(REPO / "site.yml", INVENTORY, extravars=_vars(work), tags=TAGS, check=True)
    assert r.rc == 0 and r.host("localhost")["changed"] == 0, r.changed_tasks()
    rows = json.loads((work / "data" / "prepare_meta.json").read_text())["num_rows"]
    (said,) = [x["msg"] for x in r.task_results("Extract | Report what extraction did") if x.get("msg")]
    assert f"check mode: would extract 0 of {rows} rows" in said and f"{rows} already done" in said, said


@pytest.mark.slow
def test_speculators_trains_on_every_row(pipeline, tmp_path):
    """The real consumer: `speculators train` (0.9.0, CPU through our shim, --on-missing raise) on the data the
    pipeline wrote; every train and val row is loaded (none dropped for a token-id mismatch or a missing file)."""
    work, _ = pipeline
    data = work / "data"
    script = tmp_path / "consume.py"
    script.write_text(
        "import json, sys\n"
        "from eagle3ops.train.speculators_shim import apply_cpu_shim\n"
        "apply_cpu_shim()\n"
        "import torch\n"
        "from speculators.train.data import ArrowDataset\n"
        "from speculators.train.recovery import SampleUnavailable\n"
        "data, n = sys.argv[1], 0\n"
        "for split in ('train', 'val'):\n"
        "    ds = ArrowDataset(max_len=512, datapath=data, on_missing='raise', train_ratio=0.9, split=split)\n"
        "    for i in range(len(ds)):\n"
        "        item = ds[i]\n"
        "        assert not isinstance(item, SampleUnavailable), (split, i, item)\n"
        "        assert item['hidden_states'].shape[1] == 3 * 64 and torch.isfinite(item['hidden_states']).all()\n"
        "        n += 1\n"
        "print(json.dumps({'rows_loaded': n}))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, str(script), str(data)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((data / "prepare_meta.json").read_text())["num_rows"]
    assert json.loads(out.stdout.strip().splitlines()[-1])["rows_loaded"] == rows
