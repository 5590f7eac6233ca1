"""Issue #21 on real hosts: two systemd-nspawn hosts share the extraction, one is powered off mid-run and comes
back, the re-run completes; then torchrun on both meets at a c10d rendezvous on the first and all-reduces.

Real: two booted Debian hosts (systemd PID 1, sshd), Ansible over ssh with the extract phase playbook (the
role's share maths from hostvars, the module, the CLI, each host's own store on its own disk), a real tiny
DeepseekV3 target on CPU, a host killed (SIGKILL to its PID 1: it and every process on it die at once, as in a power
loss) in the middle of its extraction and booted again (its extraction is held at its 5th ``os.replace`` by the
test-only fault hook, tests/reliability/faulthook, so that the kill lands mid-run on any box), torchrun (the argv of ``eagle3ops.train.planning.torchrun_argv``) on both hosts
with gloo over their network.
STAND-INS, said here: the hosts run the controller's venv (torch, transformers) and this checkout's
``python/`` bound read-only at the same paths (the runtime phase would install them; tests/hosts/
test_runtime_remote.py proves that part); the model is bound read-only into both (a copy per host in a
cluster). The hosts reach each other through this machine: the harness gives each its own veth /30, the
test routes 10.213.0.0/16 via the controller in each guest and turns on forwarding on those two veth
interfaces only (removed with them). The trainer on the torchrun nodes is ``eagle3ops.train.ddp_probe``:
speculators 0.9.0 cannot train over several CPU nodes (tests/unit/train/test_train_multinode.py pins why).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from proc_helpers import probe_records, run_together
from store_helpers import hs_files, manifest_rows

from hosts import multihost, nspawn
from hosts.runner import cpu_extract_vars

pytestmark = [pytest.mark.root, pytest.mark.nspawn, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
LENGTHS = [5, 17, 33, 9, 12, 2, 21, 7, 14, 3, 26, 11, 8, 19, 4, 15]
HOST_VARS = {"extract_workers": 1, **multihost.HOST_VARS}
SUMMARY = "Extract | Sum up the extraction over every host that shares the rows"


def _b_powered_off_mid_run(make_host, run_playbook, tmp_path) -> SimpleNamespace:
    """Both tests' start: two hosts, each with the prepared rows on its own disk and the tiny target bound
    read-only; the extract phase on both, hostB's extraction held at its 5th os.replace (extract_meta.json and 3
    rows renamed, 2+ in its manifest: the power-off lands mid-run however fast the box is; a 2-core CI box once saw
    hostB finish all 8 rows between the first manifest line and the kill) and powered off there (SIGKILL to its
    PID 1); hostA finishes. The hosts, inventory, extra vars, stores and that first run."""
    from tinymodels import build_prepared_dataset, build_tiny_target

    model = build_tiny_target(tmp_path / "model")
    prepared = build_prepared_dataset(tmp_path / "prepared", LENGTHS)
    ro = multihost.ro_binds({model: "/srv/model"})
    a = make_host(ro_binds=ro, groups=("gpu_hosts",), host_vars=HOST_VARS)
    b = make_host(ro_binds=ro, groups=("gpu_hosts",), host_vars=HOST_VARS)
    hosts = [a, b]
    multihost.link(hosts)
    multihost.install_cli(hosts)
    for name in ("sitecustomize.py", "faults.py"):
        b.put(f"/opt/e3/faulthook/{name}", (REPO / "tests/reliability/faulthook" / name).read_text())
    multihost.install_cli([b], pythonpath=("/opt/e3/faulthook",),
                          env={"E3_FAULT": "pause:replace:5", "E3_FAULT_GO": "/opt/e3/go"})  # fmt: skip
    for h in hosts:
        shutil.copytree(prepared, h.merged / "srv/e3/data")  # each host's own disk
    inv = tmp_path / "inventory.ini"
    inv.write_text(nspawn.inventory_ini(hosts))
    xv = {
        **cpu_extract_vars("/srv/model"),
        "extract_data_dir": "/srv/e3/data",
        "extract_executable": multihost.EXE,
    }
    store_a, store_b = a.merged / "srv/e3/data", b.merged / "srv/e3/data"

    def b_paused_mid_run():
        paused = (b.merged / "opt/e3/go.paused").exists()
        return (
            paused and (store_b / "hidden_states").is_dir() and len(manifest_rows(store_b, torn_ok=True)) >= 1
        )

    killer = multihost.power_off_when(b, b_paused_mid_run)
    r1 = run_playbook("playbooks/extract.yml", inv, extravars=xv)
    killer.join(timeout=60)
    assert b.pid == 0, f"{b.name} was never seen extracting: {r1.summary()}"
    assert r1.host(a.name)["failed"] == 0 and r1.host(a.name)["unreachable"] == 0, r1.summary()
    return SimpleNamespace(a=a, b=b, hosts=hosts, inv=inv, xv=xv, model=model, prepared=prepared,
                           store_a=store_a, store_b=store_b, r1=r1)  # fmt: skip


def test_two_hosts_share_extraction_survive_a_host_loss_and_meet_for_torchrun(
    make_host, run_playbook, tmp_path
):
    c = _b_powered_off_mid_run(make_host, run_playbook, tmp_path)
    a, b, hosts, inv, xv, model, prepared = c.a, c.b, c.hosts, c.inv, c.xv, c.model, c.prepared
    store_a, store_b, r1 = c.store_a, c.store_b, c.r1
    assert r1.host(b.name)["failed"] + r1.host(b.name)["unreachable"] >= 1, r1.summary()
    (summary,) = r1.task_results(SUMMARY)
    assert f"missing on {b.name}" in json.dumps(summary["msg"]), summary

    b.start()  # the host comes back with its disk; the re-run goes on with its rows
    multihost.link(hosts)
    multihost.install_cli([b])  # without the pause
    died_with = manifest_rows(store_b, torn_ok=True)
    assert 0 < len(died_with) < 8, died_with  # it died with rows left
    r2 = run_playbook("playbooks/extract.yml", inv, extravars=xv)
    assert r2.rc == 0, r2.summary()
    assert r2.host(a.name)["changed"] == 0, r2.changed_tasks(a.name)
    (summary,) = r2.task_results(SUMMARY)
    assert "all hosts: 16/16 rows done" in json.dumps(summary["msg"]), summary

    store_a = a.merged / "srv/e3/data"
    rows_a, rows_b = manifest_rows(store_a), manifest_rows(store_b, torn_ok=True)  # b lost mid-append
    assert sorted(rows_a + rows_b) == list(range(len(LENGTHS))), (rows_a, rows_b)  # each row once
    assert rows_a and all(i % 2 == 0 for i in rows_a) and all(i % 2 == 1 for i in rows_b)

    ref = multihost.one_host_reference(prepared, model, tmp_path / "ref")
    union, reference = {**hs_files(store_a), **hs_files(store_b)}, hs_files(ref)
    assert sorted(union) == sorted(reference)
    assert [n for n in reference if union[n] != reference[n]] == [], "differs from one host's run"

    # training's launcher across the hosts: torchrun on each, rendezvous on the first, gloo over host0. torchrun
    # hands the workers the first node's hostname as MASTER_ADDR: every node must resolve it (DNS in a cluster)
    multihost.name(hosts)
    from eagle3ops.train.planning import torchrun_argv

    argvs = []
    for rank, h in enumerate(hosts):
        argv = torchrun_argv(
            f"{multihost.VENV}/bin/python", ["-m", "eagle3ops.train.ddp_probe", "--out", "/srv/probe"], nproc=1, nnodes=2,
            node_rank=rank, rdzv_endpoint=f"{a.ip}:29400", rdzv_id="e3t-nspawn",
        )  # fmt: skip
        cmd = "PYTHONPATH=/opt/e3/python OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=host0 " + shlex.join(argv)
        argvs.append(["ssh", "-F", str(h.ssh_config), "-o", "BatchMode=yes", h.name, cmd])
    run_together(argvs)  # our own ssh clients; the nodes run on the hosts
    # c10d hands out the global ranks in order of arrival: one process per host, ranks 0 and 1
    recs = probe_records(*(h.merged / "srv/probe" for h in hosts))
    assert [(d["rank"], d["world_size"]) for d in recs] == [(0, 2), (1, 2)], recs
    assert sorted(d["host"] for d in recs) == sorted([a.name, b.name]), recs
    assert all(d["all_reduce_sum"] == 1.0 for d in recs) and recs[0]["grad"] == recs[1]["grad"]


def test_a_powered_off_hosts_rows_reassigned_to_the_survivor_on_request(make_host, run_playbook, tmp_path):
    """Issue 34, on request: hostB powered off mid-extraction (SIGKILL to its PID 1) and not brought back; the
    phase re-run with ``extract_reassign_from: [hostB]`` while it is down: hostA extracts hostB's whole share too
    (its disk cannot be read), so hostA's store alone is one host's run byte for byte; again: changed=0; hostB
    back: it extracts nothing, its old part is named as kept out and left as it was, changed=0 on both."""
    c = _b_powered_off_mid_run(make_host, run_playbook, tmp_path)
    a, b, hosts, inv, xv, model, prepared = c.a, c.b, c.hosts, c.inv, c.xv, c.model, c.prepared
    store_a, store_b = c.store_a, c.store_b

    take = {**xv, "extract_reassign_from": [b.name]}
    r2 = run_playbook("playbooks/extract.yml", inv, extravars=take)  # hostB still powered off
    assert r2.host(a.name)["failed"] == 0 and r2.host(b.name)["unreachable"] >= 1, r2.summary()
    (summary,) = r2.task_results(SUMMARY)
    text = json.dumps(summary["msg"])
    assert f"{b.name}: share RE-ASSIGNED to {a.name}" in text and "all hosts: 16/16 rows done" in text, text
    assert manifest_rows(store_a) == list(range(len(LENGTHS)))
    r3 = run_playbook("playbooks/extract.yml", inv, extravars=take)
    assert r3.host(a.name)["changed"] == 0 and r3.host(a.name)["failed"] == 0, r3.changed_tasks(a.name)

    b.start()  # hostB is back with its disk: it extracts nothing, its old part is kept out as it is
    multihost.link(hosts)
    multihost.install_cli([b])
    died_with = manifest_rows(store_b, torn_ok=True)  # its disk is readable here again (its overlay)
    assert 0 < len(died_with) < 8, died_with
    b_files = hs_files(store_b)
    r4 = run_playbook("playbooks/extract.yml", inv, extravars=take)
    assert r4.rc == 0, r4.summary()
    assert r4.host(a.name)["changed"] == 0 and r4.host(b.name)["changed"] == 0, r4.changed_tasks()
    kept = r4.task_results(
        "Extract | Keep this host's old part out - its rows were re-assigned to the other hosts "
        "(extract_reassign_from)",
        host=b.name,
    )
    assert kept and "its old part /srv/e3/data/hidden_states is kept as it is" in kept[0]["msg"], kept
    assert hs_files(store_b) == b_files, "hostB's part is left as it was"

    ref = multihost.one_host_reference(prepared, model, tmp_path / "ref")
    assert hs_files(store_a) == hs_files(ref), "hostA's store differs from one host's run"
