"""Issue #21: the train role over several hosts refuses to start half a job (through ansible-playbook).

Real: the train phase playbook, the role's guard, status probe, job decision and all-or-nothing gate (the
``eagle3ops_train`` module in check mode on every node, the CLI, the train plan reading the data).
STAND-INS: the two "hosts" are two inventory hosts with ``ansible_connection: local`` on this machine, each with its
own run directory (the data copy between real hosts is tests/hosts/test_train_multinode_nspawn.py's); the
training inputs are ``eagle3ops.train.fixtures``' (random hidden states; a verifier of only its config.json).

Proves: a node left out of the play (``--limit``) refuses the job on the others before anything is read; a node
whose data is missing stops every node at the gate, naming it and what is missing, and nothing is launched anywhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from eagle3ops.train.fixtures import make_data_dir, write_verifier_config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def cluster(tmp_path):
    verifier = write_verifier_config(tmp_path / "verifier")
    data = make_data_dir(tmp_path / "data", verifier, num_samples=8, min_len=8, max_len=16, real=False)
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "train_data_dir": str(data if name == "hostA" else tmp_path / "not-gathered"),
            "train_run_dir": str(tmp_path / f"run-{name}"),
        }
        for name in ("hostA", "hostB")
    }
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}))
    xv = {
        "train_hosts": ["hostA", "hostB"],
        "train_rdzv_host": "127.0.0.1",
        "train_data_sync": False,
        "train_verifier_path": str(verifier),
        "train_trainer": "ddp_probe",
        "train_device": "cpu",
        "train_executable": str(BIN / "eagle3ops"),
    }
    return inv, xv, tmp_path


def test_a_node_out_of_the_play_refuses_the_job(run_playbook, cluster):
    inv, xv, tmp = cluster
    r = run_playbook("playbooks/train.yml", inv, extravars=xv, limit="hostA")
    assert r.rc != 0 and r.host("hostA")["failed"] == 1, r.summary()
    assert "hostB of train_hosts (hostA, hostB)" in r.stdout and "left out by --limit" in r.stdout, (
        r.summary()
    )
    assert not (tmp / "run-hostA").exists()


def test_missing_data_on_one_node_stops_every_node_before_a_launch(run_playbook, cluster):
    inv, xv, tmp = cluster
    r = run_playbook("playbooks/train.yml", inv, extravars=xv)
    assert r.rc != 0, r.summary()
    gate = "Train | Check that every node can run the job before any node is touched"
    assert {h: bool(r.task_results(gate, host=h)) for h in ("hostA", "hostB")} == {
        "hostA": True,
        "hostB": True,
    }
    assert "no node starts the job while its inputs are missing - hostB:" in r.stdout, r.summary()
    assert f"{tmp}/not-gathered/hidden_states/extract_meta.json is missing" in r.stdout, r.summary()
    assert r.host("hostA")["failed"] + r.host("hostB")["failed"] >= 1, r.summary()
    assert not r.task_results("Train | Train the EAGLE-3 draft (idempotent, detached, resumable)"), (
        "a node launched"
    )
    assert not (tmp / "run-hostA" / "state.json").exists() and not (tmp / "run-hostB" / "state.json").exists()


def test_the_old_store_of_a_host_whose_rows_were_reassigned_is_not_gathered(run_playbook, cluster):
    """Issue 34: hostB's rows were re-assigned to hostA by the extract phase (eagle3ops_extract_reassign_from):
    a train_data_sources that names hostB is refused before anything is copied (its old store would bring rows
    hostA holds again); the default leaves it out."""
    inv, xv, tmp = cluster
    more = {"train_data_sync": "true", "train_data_dir": str(tmp / "gathered"),
            "eagle3ops_extract_reassign_from": ["hostB"]}  # fmt: skip
    r = run_playbook(
        "playbooks/train.yml", inv, extravars={**xv, **more, "train_data_sources": ["hostA", "hostB"]}
    )
    assert (
        r.rc != 0 and "train_data_sources names hostB, whose rows the extract phase re-assigned" in r.stdout
    ), r.summary()
    assert not (tmp / "gathered").exists() and not r.task_results(
        "Train | Copy every store's rows (each host's share of the hidden states)"
    )
