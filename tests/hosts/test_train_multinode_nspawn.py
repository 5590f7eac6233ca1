"""Issue #21 on real hosts: the train phase over two nspawn hosts - the rows of both stores gathered onto each
node with rsync (check mode first: the bytes and the time; a second copy changes nothing), one job on both, a
node that died restarts the job on *every* node (the survivor is stopped, not left waiting), from the newest
checkpoint, copied to the node that lacked it.

Real: two booted Debian hosts (systemd PID 1, sshd, systemd-run units), Ansible over ssh with the train phase
playbook (the role's status probe, job decision, all-or-nothing gate, stop, ``ansible.posix.synchronize`` run on
one host pushing to the other over ssh with host-key checking, the launch), the module, the CLI, torchrun's c10d
rendezvous on the first host with gloo over the hosts' network, ``systemctl kill --signal=KILL`` of a node's
whole trainer unit.
STAND-INS, said here: the trainer is ``eagle3ops.train.ddp_probe`` (``train_trainer: ddp_probe``: a linear model on
the same data, checkpoints and records), because speculators 0.9.0 cannot train over several CPU nodes
(tests/unit/train/test_train_multinode.py pins why). The two stores are one synthetic store
(``eagle3ops.train.fixtures.make_data_dir``, random hidden states) split by row parity into the layout a
two-host extraction writes (``manifest-rank{r}.jsonl``, ``shard.json``) - checked with ``eagle3ops extract-status`` over
both - instead of running the extraction (tests/hosts/test_multihost_nspawn.py does that on nspawn hosts). The
hosts run the controller's venv and this checkout's ``python/`` (tests/hosts/multihost.py); the verifier is its
``config.json`` alone (all the phase reads of it), bound read-only into both.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from store_helpers import hs_files

from hosts import multihost, nspawn

pytestmark = [pytest.mark.root, pytest.mark.nspawn, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ROWS = 12
STORE = "srv/e3/data"  # each host's own store (train_data_source_dir)
GATHERED = "srv/e3/train/data"  # train_data_dir (eagle3ops_workdir/train/data)
RUN = "srv/e3/train/run"
SUMMARY = "Train | Sum up the job over every training node"
SYNC_REPORT = "Train | Report what gathering the rows cost (check mode - what it would copy and how long at train_data_sync_rate_mbps)"
SYNC_TASKS = (
    "Train | Copy the dataset from the first store (rows, token frequencies, extraction metadata)",
    "Train | Copy every store's rows (each host's share of the hidden states)",
)
LAUNCH = "Train | Train the EAGLE-3 draft (idempotent, detached, resumable)"
WAITED = "Train | Read the finished run"  # after the watch of train_wait saw the job end on this node
GATE = "Train | Check that every node can run the job before any node is touched"
STOP = "Train | Stop this node's trainer of the old job (every node stops before any node starts)"
CKPT_COPY = "Train | Copy the newest checkpoint to every node (each rank resumes from its own save path)"


def _split(src: Path, dsts: list[Path]) -> None:
    """One store into len(dsts) stores as a sharded extraction leaves them: rank k holds rows k, k+W, ..."""
    world = len(dsts)
    lines = (src / "hidden_states/manifest-rank0.jsonl").read_text().splitlines()
    for k, dst in enumerate(dsts):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("hidden_states"))
        hs = dst / "hidden_states"
        hs.mkdir()
        shutil.copy2(src / "hidden_states/extract_meta.json", hs)
        mine = [json.loads(x) for x in lines if json.loads(x)["i"] % world == k]
        for rec in mine:
            shutil.copy2(src / f"hidden_states/hs_{rec['i']}.safetensors", hs)
        (hs / f"manifest-rank{k}.jsonl").write_text("".join(json.dumps({**r, "r": k}) + "\n" for r in mine))
        (hs / "shard.json").write_text(json.dumps({"world_size": world, "ranks": [k], "host": f"h{k}"}))


def _state(h) -> dict:
    return json.loads((h.merged / RUN / "state.json").read_text())


def _exit(h) -> dict | None:
    p = h.merged / RUN / "exit.json"
    return json.loads(p.read_text()) if p.exists() else None


def _result(r, task, h) -> dict:
    (res,) = [x for x in r.task_results(task, host=h.name) if x]
    return res


def _changed(r, task, h) -> bool:
    """Whether ``task`` changed something on ``h`` (False when it was skipped there)."""
    return any(x.get("changed") for x in r.task_results(task, host=h.name))


def _kill_trainer(h) -> None:
    """The node's trainer, torchrun's agent and its workers, at once (SIGKILL), as a crash of the node's job
    (``systemctl kill`` of the unit fails in the container: "Failed to send signal SIGKILL to auxiliary
    processes")."""
    pid = _state(h)["pid"]
    h.ssh(f"kill -KILL {pid} $(pgrep -P {pid})")


def test_two_nodes_gather_the_rows_and_restart_together_from_the_newest_checkpoint(
    make_host, run_playbook, tmp_path
):
    """One scenario, in order (the module docstring says what it proves). Over 120 lines on purpose: each step
    starts from the hosts, stores and checkpoints the one before left, and splitting it would hand that state
    between functions instead of reading as one run."""
    from eagle3ops.extract.status import status_many
    from eagle3ops.train import fixtures as train_fixtures

    verifier = train_fixtures.write_verifier_config(tmp_path / "verifier")  # ddp_probe loads no model
    whole = train_fixtures.make_data_dir(tmp_path / "whole", verifier, num_samples=ROWS, min_len=8, max_len=24,
                                         real=False)  # fmt: skip
    stores = [tmp_path / "store0", tmp_path / "store1"]
    _split(whole, stores)
    view = status_many(stores)
    assert view["complete"] and view["done_twice"] == 0, view  # the split is a valid two-host store pair

    ro = multihost.ro_binds({verifier: "/srv/verifier"})
    a = make_host(ro_binds=ro, groups=("gpu_hosts",), host_vars=multihost.HOST_VARS)
    b = make_host(ro_binds=ro, groups=("gpu_hosts",), host_vars=multihost.HOST_VARS)
    hosts = [a, b]
    multihost.link(hosts)
    multihost.name(hosts)
    multihost.trust(hosts)
    multihost.install_cli(hosts)
    for h, store in zip(hosts, stores, strict=True):
        shutil.copytree(store, h.merged / STORE)
    inv = tmp_path / "inventory.ini"
    inv.write_text(nspawn.inventory_ini(hosts))
    xv = {
        "eagle3ops_workdir": "/srv/e3",
        "train_data_source_dir": f"/{STORE}",
        "train_verifier_path": "/srv/verifier",
        "train_trainer": "ddp_probe",
        "train_device": "cpu",
        "train_epochs": 8,
        "train_nic": "host0",
        "train_executable": multihost.EXE,
        # 6 rows per rank and epoch, 1.5 s each: 9 s an epoch, 72 s a job - still running after the next play
        "train_env": {
            "PYTHONPATH": "/opt/e3/python",
            "OMP_NUM_THREADS": "1",
            "EAGLE3OPS_PROBE_STEP_S": "1.5",
        },
    }

    # check mode: what each node would copy, and how long it would take; nothing is copied or started
    r0 = run_playbook("playbooks/train.yml", inv, extravars=xv, check=True)
    assert r0.rc == 0, r0.summary()

    def size(paths):
        return sum(p.stat().st_size for p in paths)

    rows = [size(p for g in ("hs_*", "manifest-*") for p in (st / "hidden_states").glob(g)) for st in stores]
    dataset = size(p for p in stores[0].iterdir() if p.is_file())
    meta = (stores[0] / "hidden_states/extract_meta.json").stat().st_size
    # hostA is the first source: it links its own dataset and rows and receives hostB's rows; hostB receives
    # the dataset, the extraction metadata and hostA's rows, and links its own
    expected = {a.name: rows[1], b.name: dataset + meta + rows[0]}
    for h in hosts:
        msg = _result(r0, SYNC_REPORT, h)["msg"]
        assert "would copy" in msg and f"({expected[h.name]} bytes)" in msg and "s at 10000 Mbit/s" in msg, (
            msg
        )
        assert not (h.merged / GATHERED).exists() and not (h.merged / RUN).exists()

    # first run: the rows gathered on both nodes, one job launched on both. hostB's trainer is killed while it
    # starts (before it joins the rendezvous), so hostA's waits there for it: alive, and half a job
    killed: dict = {}

    def kill_b_when_launched():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            if (b.merged / RUN / "state.json").exists():
                killed.update(_state(b))
                _kill_trainer(b)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_b_when_launched, daemon=True)
    killer.start()
    r1 = run_playbook("playbooks/train.yml", inv, extravars=xv)
    killer.join(timeout=60)
    assert r1.rc == 0, r1.summary()
    assert killed, "hostB's trainer was never seen launched"
    job1 = _result(r1, LAUNCH, a)["job"]
    assert _result(r1, LAUNCH, b)["job"] == job1 and _result(r1, LAUNCH, a)["status"] == "launched"
    for h in hosts:  # what check mode predicted is what was copied
        msg = _result(r1, SYNC_REPORT, h)["msg"]
        assert msg.startswith("copied") and f"({expected[h.name]} bytes)" in msg and "Mbit/s" in msg, msg
    whole_hs = hs_files(whole)
    for h in hosts:
        assert hs_files(h.merged / GATHERED) == whole_hs  # every row on every node, byte for byte
        for name in ("token_freq.pt", "dataset_info.json", "hidden_states/extract_meta.json"):
            assert (h.merged / GATHERED / name).read_bytes() == (whole / name).read_bytes()
        assert not (h.merged / GATHERED / "hidden_states/shard.json").exists()
    own = (a.merged / STORE / "hidden_states/hs_0.safetensors").stat()
    assert (a.merged / GATHERED / "hidden_states/hs_0.safetensors").stat().st_ino == own.st_ino  # linked
    time.sleep(3)
    assert a.ssh(f"systemctl is-active {_state(a)['unit']}", check=False).stdout.strip() == "active"
    assert b.ssh(f"systemctl is-active {killed['unit']}", check=False).stdout.strip() != "active"

    # second run: hostA is running job 1, hostB is not: both start job 2 - hostA's trainer stopped first
    r2 = run_playbook("playbooks/train.yml", inv, extravars=xv)
    assert r2.rc == 0, r2.summary()
    ra, rb = _result(r2, LAUNCH, a), _result(r2, LAUNCH, b)
    gate = _result(r2, GATE, a)  # what hostA's node saw before anything was touched: job 1 running
    assert gate["other_job"] == {"previous_status": "running", "previous_job": job1, "job": ra["job"]}, gate
    assert _changed(r2, STOP, a) and not _changed(r2, STOP, b), r2.changed_tasks()
    assert ra["previous_status"] == rb["previous_status"] == "killed", (ra, rb)  # stopped before its relaunch
    job2 = ra["job"]
    assert rb["job"] == job2 != job1 and ra["status"] == rb["status"] == "relaunched"
    for task in SYNC_TASKS:  # the rows were all there: rsync found nothing to copy
        for h in hosts:
            assert r2.task_results(task, host=h.name) and not _changed(r2, task, h), (task, h.name)

    # third run while both run job 2: nothing to do on either
    r3 = run_playbook("playbooks/train.yml", inv, extravars=xv)
    assert r3.rc == 0, r3.summary()
    assert r3.host(a.name)["changed"] == 0 and r3.host(b.name)["changed"] == 0, r3.changed_tasks()
    assert "every node runs it" in json.dumps(_result(r3, SUMMARY, a)["msg"])
    for h in hosts:
        assert h.ssh(f"systemctl is-active {_state(h)['unit']}", check=False).stdout.strip() == "active", (
            f"job 2 ended on {h.name} before it could be interrupted: the box is too slow for this test's timing"
        )

    # a node dies mid-run, after a checkpoint: the next run starts job 3 on both, from the newest checkpoint
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any((h.merged / RUN / "checkpoints/0/training_state.json").exists()
                                                  for h in hosts):  # fmt: skip
        time.sleep(0.2)
    _kill_trainer(b)
    fast = {
        **xv["train_env"],
        "EAGLE3OPS_PROBE_STEP_S": "0",
    }  # the trainer's environment, not its configuration
    r4 = run_playbook("playbooks/train.yml", inv, extravars={**xv, "train_env": fast, "train_wait": True, "train_poll_interval": 1,
                                                            "train_wait_timeout": 300})  # fmt: skip
    assert r4.rc == 0, r4.summary()
    ra, rb = _result(r4, LAUNCH, a), _result(r4, LAUNCH, b)
    assert ra["job"] == rb["job"] not in (job1, job2) and ra["status"] == rb["status"] == "relaunched", (
        ra,
        rb,
    )
    assert [_result(r4, WAITED, h)["status"] for h in hosts] == [
        "finished"
    ] * 2  # waited for once both started
    copied = [h for h in hosts if _changed(r4, CKPT_COPY, h)]
    assert len(copied) == 1, "the newest checkpoint is copied to the node without it"
    exits = [_exit(h) for h in hosts]
    assert all(e["status"] == "finished" and e["job"] == ra["job"] and e["world_size"] == 2 for e in exits), (
        exits
    )
    assert exits[0]["start_epoch"] == exits[1]["start_epoch"] >= 1, exits  # resumed, both from the same epoch
    assert sorted(exits[0]["hosts"]) == sorted([a.name, b.name])

    # finished on both: nothing to do
    r5 = run_playbook("playbooks/train.yml", inv, extravars=xv)
    assert r5.rc == 0, r5.summary()
    assert r5.host(a.name)["changed"] == 0 and r5.host(b.name)["changed"] == 0, r5.changed_tasks()
