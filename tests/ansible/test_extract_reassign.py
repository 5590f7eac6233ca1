"""Issue #34: a lost host's rows re-assigned, on request, to the surviving hosts through the extract phase
(``extract_reassign_from``; docs/scale.md, "A host that stays lost").

Real: the phase playbook (playbooks/extract.yml) through ansible-runner, the shared preflight check, the extract
role's share and re-assignment maths, the module, the CLI, the stores, a real tiny target on CPU; hostB is really
unreachable (ssh to a port nobody listens on: what a powered-off host looks like to Ansible).
STAND-IN: the "hosts" are inventory hosts with ``ansible_connection: local`` on this machine, each with its own
data directory, and hostB's data directory being readable on hostA stands for its disk mounted on a survivor.

Proves: bad requests refused before any work (rc 2, the variable and host named, nothing written); check mode
predicts the copy and the extraction and writes nothing; hostA takes over hostB's share - the rows hostB finished
copied from its part, the rest extracted - so every row is in exactly one store of the survivors and the union is
a one-host run byte for byte; the summary names hostB, re-assigned; a second run changed=0; hostB back: it
extracts nothing, its old part is named as kept out of the gather and left as it was, changed=0;
`eagle3ops extract-status` over both stores: complete, hostB's part kept out; the same inventory without
the request is refused by hostA's store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import run_cache

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "tests"))
from runner import cpu_extract_vars, run_playbook
from store_helpers import hs_files, manifest_rows
from tinymodels import build_prepared_dataset

pytestmark = [pytest.mark.slow]

LENGTHS = [5, 17, 33, 9, 12, 2, 21, 7, 14, 3, 26, 11]
WAIT = "Extract | Collect the extraction's result (a host lost meanwhile drops out; the others go on)"
PLAN = "Extract | Extract target hidden states for every prepared row"
SUMMARY = "Extract | Sum up the extraction over every host that shares the rows"
KEPT_OUT = "Extract | Keep this host's old part out - its rows were re-assigned to the other hosts (extract_reassign_from)"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _inventory(tmp: Path, a: Path, b: Path, *, b_reachable: bool) -> Path:
    def host(data: Path) -> dict:
        return {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "extract_data_dir": str(data),
            "extract_workers": "1",  # known for a host that is down: its ranks are the ones re-assigned
            "extract_executable": str(BIN / "eagle3ops"),
        }

    hb = host(b)
    if not b_reachable:  # powered off: nothing answers on its ssh port
        hb.update(ansible_connection="ssh", ansible_host="127.0.0.1", ansible_port=9, ansible_user="root")
    inv = tmp / f"inventory-{'up' if b_reachable else 'down'}.json"
    inv.write_text(
        json.dumps({"all": {"children": {"gpu_hosts": {"hosts": {"hostA": host(a), "hostB": hb}}}}})
    )
    return inv


def test_a_lost_hosts_rows_go_to_the_survivor_on_request(tmp_path, tmp_path_factory):
    model = run_cache.tiny_target(tmp_path_factory)
    prepared = build_prepared_dataset(tmp_path / "prepared", LENGTHS)
    a, b, ref = (tmp_path / h / "data" for h in ("hostA", "hostB", "ref"))
    for d in (a, b, ref):
        d.parent.mkdir(parents=True)
        subprocess.run(["cp", "-r", str(prepared), str(d)], check=True)
    env = {**os.environ, **ENV}
    cli = [str(BIN / "eagle3ops"), "extract", "--model", str(model), "--device", "cpu", "--max-batch-tokens", "1",
           "--writer-threads", "1", "--json", "--no-progress"]  # fmt: skip
    # hostB (rank 1 of 2) finished rows 1, 3, 5 of its 1, 3, ..., 11, then it was powered off
    part = subprocess.run([*cli, "--data", str(b), "--world-size", "2", "--first-rank", "1", "--workers", "1",
                           "--limit", "6"], env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert part.returncode == 0, part.stderr[-3000:]
    assert manifest_rows(b) == [1, 3, 5]
    b_before = hs_files(b)
    xv = cpu_extract_vars(model)
    down = _inventory(tmp_path, a, b, b_reachable=False)

    def play(name, inv, check=False, **more):
        return run_playbook(REPO / "playbooks" / "extract.yml", inv, extravars={**xv, **more}, envvars=ENV,
                            private_data_dir=tmp_path / name, check=check)  # fmt: skip

    # refused before any work, naming the variable and the host
    for name, more, words in [
        ("bad-host", {"extract_reassign_from": ["hostZ"]}, "extract_reassign_from names hostZ, not among"),
        ("bad-all", {"extract_reassign_from": ["hostA", "hostB"]}, "names every host that shares the rows"),
        ("bad-data", {"extract_reassign_from": ["hostB"], "extract_reassign_data": {"hostA": str(a)}},
         "extract_reassign_data names hostA, not re-assigned"),
    ]:  # fmt: skip
        r = play(name, down, **more)
        assert r.rc == 2 and any(words in f for f in r.failures()), (name, r.failures(), r.summary())
        assert not (a / "hidden_states").exists(), f"{name}: hostA wrote before the refusal"

    take = {"extract_reassign_from": ["hostB"], "extract_reassign_data": {"hostB": str(b)}}
    # check mode: hostA would extract its 6 rows and 3 of hostB's, and copy the 3 hostB finished; nothing written
    r = play("check", down, check=True, **take)
    (pred,) = r.task_results(PLAN, host="hostA")
    assert pred["to_extract"] == 9 and pred["importable"] == 3 and pred["changed"] is True, pred
    assert r.host("hostA")["changed"] >= 1 and not (a / "hidden_states").exists(), r.summary()

    # the real run: hostB unreachable, hostA takes over its share
    r = play("run", down, **take)
    assert r.host("hostA")["failed"] == 0 and r.host("hostB")["unreachable"] >= 1, r.summary()
    (res,) = r.task_results(WAIT, host="hostA")
    assert (res["written"], res["imported"], res["total"]) == (9, 3, 12), res
    (summary,) = r.task_results(SUMMARY)
    text = json.dumps(summary["msg"])
    assert "hostB: share RE-ASSIGNED to hostA" in text and f"{b}/hidden_states is kept out" in text, text
    assert "all hosts: 12/12 rows done" in text and "copied 3 finished rows" in text, text
    assert manifest_rows(a) == list(range(12)) and hs_files(b) == b_before, "hostB's part is only read"

    r = play("again", down, **take)
    assert r.host("hostA")["changed"] == 0 and r.host("hostA")["failed"] == 0, r.changed_tasks("hostA")

    # hostB is back: it extracts nothing, its old part is named and left as it is; nothing changes anywhere
    up = _inventory(tmp_path, a, b, b_reachable=True)
    r = play("back", up, **take)
    assert r.rc == 0, r.summary()
    assert r.host("hostA")["changed"] == 0 and r.host("hostB")["changed"] == 0, r.changed_tasks()
    (kept,) = r.task_results(KEPT_OUT, host="hostB")
    assert f"its old part {b}/hidden_states is kept as it is" in kept["msg"], kept
    assert hs_files(b) == b_before and manifest_rows(b) == [1, 3, 5]

    # the same bytes as one host's run of every row
    one = subprocess.run([*cli, "--data", str(ref)], env=env, capture_output=True, text=True, check=False)
    assert one.returncode == 0, one.stderr[-3000:]
    assert hs_files(a) == hs_files(ref)

    st = subprocess.run([str(BIN / "eagle3ops"), "extract-status", "--data", str(a), "--data", str(b), "--json"],
                        env=env, capture_output=True, text=True, check=False)  # fmt: skip
    view = json.loads(st.stdout.strip().splitlines()[-1])
    assert view["complete"] and view["done_twice"] == 0 and view["kept_out"] == [str(b)], view

    # dropping the request later is refused by hostA's store (hostB would extract its rows again)
    r = play("dropped", up)
    assert r.rc == 2 and any("took over the rows of lost rank(s) [1]" in f for f in r.failures()), r.summary()
    assert manifest_rows(b) == [1, 3, 5]
