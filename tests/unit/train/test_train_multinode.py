"""Issue #21: training over several hosts - the torchrun command line of each node, the refusals, a real
two-node c10d rendezvous with gloo on this machine, and a node's run across jobs (a node of another job is
stopped and joins the new one; nodes holding different checkpoints refuse to train).

Real: ``python -m torch.distributed.run`` (torchrun) twice, as node 0 and node 1 of 2, meeting at a c10d
rendezvous on 127.0.0.1 with the argv ``eagle3ops.train.planning.torchrun_argv`` builds for the train phase; each
runs ``eagle3ops.train.ddp_probe`` (gloo all-reduce + one DDP step). STAND-IN: the two nodes are two process trees
on this machine (loopback), not two hosts; the trainer is the probe, because speculators 0.9.0 cannot train
over several nodes on CPU (``test_speculators_distributed_setup_needs_an_accelerator`` pins why). The training
inputs are ``eagle3ops.train.fixtures``' (test_train.py's ``inputs``: a tiny verifier, random hidden states).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eagle3ops.train import launch as train_launch
from eagle3ops.train import planning as train_planning
from eagle3ops.train import run as train_run
from eagle3ops.train import spec as train_spec
from proc_helpers import alive, probe_records, run_together
from test_train import inputs  # noqa: F401 - the module-scoped training inputs fixture

REPO = Path(__file__).resolve().parents[3]


def _plan(tmp_path, device="gpu", nproc=8, **spec_kw) -> train_planning.Plan:
    spec = train_spec.TrainSpec(
        data_dir=str(tmp_path), verifier_path=str(tmp_path), run_dir=str(tmp_path / "run"), **spec_kw
    )
    return train_planning.Plan(spec=spec, run_dir=tmp_path / "run", save_path=tmp_path / "run/checkpoints", config_text="",
                      config_sha256="x", values={}, device=device, nproc=nproc, token_freq={}, target_vocab=0)  # fmt: skip


def test_each_node_gets_nnodes_its_rank_and_the_rendezvous_of_the_first(tmp_path):
    p = _plan(tmp_path, nnodes=3, node_rank=2, rdzv_endpoint="10.0.0.1:29400", rdzv_id="run7", nic="ens5")
    cfg = str(tmp_path / "run" / train_spec.CONFIG)
    assert train_launch.build_command(p, "/venv/bin/python") == [
        "/venv/bin/python", "-m", "torch.distributed.run", "--nnodes=3", "--node-rank=2", "--nproc-per-node=8",
        "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=run7", "--rdzv-conf=is_host=0",
        "-m", train_spec.SHIM_MODULE, "--config", cfg,
    ]  # fmt: skip
    env = train_launch._env(p)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens5"
    # the default rendezvous id is the same on every node (from the run directory's path), not per host
    a = _plan(tmp_path, nnodes=2, node_rank=0, rdzv_endpoint="h:1")
    b = _plan(tmp_path, nnodes=2, node_rank=1, rdzv_endpoint="h:1")
    ida = [x for x in train_launch.build_command(a, "py") if x.startswith("--rdzv-id=")]
    assert ida and ida == [x for x in train_launch.build_command(b, "py") if x.startswith("--rdzv-id=")]
    # one host: as before
    assert train_launch.build_command(_plan(tmp_path), "py")[3:5] == ["--standalone", "--nproc_per_node=8"]
    assert train_launch.build_command(_plan(tmp_path, device="cpu", nproc=1), "py") == [
        "py", "-m", train_spec.SHIM_MODULE, "--config", cfg,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "device", "needle"),
    [
        ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "gpu", "node_rank 2 is outside nnodes 2"),
        ({"nnodes": 2, "node_rank": 1}, "gpu", "needs rdzv_endpoint HOST:PORT"),
        ({"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "h"}, "gpu", "needs rdzv_endpoint HOST:PORT"),
        ({"nnodes": 2, "node_rank": 0, "rdzv_endpoint": "h:1"}, "cpu", "set_device_index"),
    ],
)
def test_multinode_refusals_name_what_to_set(tmp_path, kw, device, needle):
    with pytest.raises(train_spec.TrainError, match=needle):
        train_planning.check_nodes(
            train_spec.TrainSpec(data_dir="d", verifier_path="v", run_dir="r", **kw), device
        )


def test_the_ddp_probe_trainer_runs_over_cpu_nodes_through_the_same_launcher(tmp_path):
    kw = {"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "h:1", "trainer": "ddp_probe"}
    train_planning.check_nodes(
        train_spec.TrainSpec(data_dir="d", verifier_path="v", run_dir="r", **kw), "cpu"
    )  # no refusal
    argv = train_launch.build_command(_plan(tmp_path, device="cpu", nproc=1, **kw), "py")
    assert argv[argv.index("--rdzv-conf=is_host=0") + 1 :] == [
        "-m", "eagle3ops.train.ddp_probe", "--config", str(tmp_path / "run" / train_spec.CONFIG),
    ]  # fmt: skip
    with pytest.raises(train_spec.TrainError, match="trainer must be one of"):
        train_planning.plan(
            train_spec.TrainSpec(data_dir="d", verifier_path="v", run_dir="r", trainer="other")
        )


def _kill_ours(pids, *markers: str) -> None:
    """SIGKILL those of ``pids`` still running whose command line has one of ``markers`` (this test's own
    processes: a PID that ended earlier may belong to another process by now; pid_max can be 32768)."""
    for pid in pids:
        argv = " ".join(train_launch.cmdline(pid) or [])
        if alive(pid) and any(m in argv for m in markers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_stopped_trainer_takes_the_workers_of_its_own_sessions_along(tmp_path):
    """torchrun's workers run in sessions of their own: an agent that ignores SIGTERM is killed after the grace
    with every descendant, not only its process group (real processes: a parent ignoring SIGTERM and a child
    in a new session, both with the trainer's command line)."""
    cfg = tmp_path / train_spec.CONFIG
    cfg.write_text("")
    script = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "c = subprocess.Popen(sys.argv[1:], start_new_session=True); print(c.pid, flush=True); time.sleep(300)"
    )
    worker = [
        sys.executable,
        "-c",
        "import time; time.sleep(300)",
        train_spec.SHIM_MODULE,
        "--config",
        str(cfg),
    ]
    agent = subprocess.Popen(
        [sys.executable, "-c", script, *worker], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = int(agent.stdout.readline())
    try:
        state = {"pid": agent.pid, "launcher": "setsid"}
        assert train_launch.is_our_trainer(agent.pid, cfg) and alive(child)
        assert train_launch.stop_run(tmp_path, state, grace_s=1)
        agent.wait(timeout=60)
        deadline = time.monotonic() + 60  # a guard: the stop SIGKILLs it; gone once the kernel has done that
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the worker in its own session outlived the stop"
    finally:
        _kill_ours([agent.pid, child], str(cfg))


def test_descendants_of_a_scan_with_a_reused_pid_end(tmp_path):
    """/proc is read one process at a time: a PID reused meanwhile can make two processes each other's parent in
    the scan. The walk must end (it looped, growing its list, before) and list each process once."""
    for pid, ppid in ((10, 1), (11, 10), (12, 11), (10_000, 12)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (py thon) S {ppid} {pid} {pid} 0 -1\n")
    # 11's parent read after 12 took its place
    (tmp_path / "11" / "stat").write_text("11 (x) S 12 11 11 0 -1\n")
    assert sorted(train_launch.descendants(10, tmp_path)) == []  # 11 no longer a child of 10 in this scan
    assert sorted(train_launch.descendants(11, tmp_path)) == [12, 10_000]
    assert sorted(train_launch.descendants(12, tmp_path)) == [11, 10_000]


WORKER = r"""
import json, multiprocessing as mp, os, signal, sys, time


def loader():
    time.sleep(300)


if __name__ == "__main__":
    record = os.path.join(os.path.dirname(sys.argv[-1]), "stopped.json")
    child = mp.get_context("spawn").Process(target=loader, daemon=True)  # as speculators' DataLoader starts them
    child.start()

    def on_term(signum, frame):
        time.sleep(1.0)  # a checkpoint save takes a while: is the loader still there when it ends?
        with open(record, "w") as f:
            json.dump({"loader_alive_at_save": child.is_alive(), "loader_exitcode": child.exitcode}, f)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(os.path.dirname(sys.argv[-1]), "ready"), "w") as f:
        f.write(str(child.pid))
    time.sleep(300)
"""


def test_a_stop_lets_the_ranks_save_while_their_loader_workers_still_run(tmp_path):
    """The stop signals the training processes, not their sessions: the rank's interrupt save must find its
    loader workers alive (on the H200 box a stop through torchrun's own killpg killed them first, and
    speculators' interrupt checkpoint failed with "DataLoader worker ... is killed by signal: Terminated").
    Real: torchrun (``python -m torch.distributed.run --standalone``), a rank in its own session, a loader worker
    started by multiprocessing's spawn context (as speculators' DataLoader does). STAND-IN: the rank is a script
    (``--no-python``) with the shim's name and the run's config on its command line, whose SIGTERM handler
    takes 1 s, as a save does, and records whether its loader worker still lives."""
    cfg = tmp_path / train_spec.CONFIG
    cfg.write_text("")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    argv = [sys.executable, "-m", train_launch.TORCHRUN, "--standalone", "--nproc_per_node=1", "--no-python",
            sys.executable, str(worker), train_spec.SHIM_MODULE, "--config", str(cfg)]  # fmt: skip
    # a file, not a pipe: the rank and its loader keep a pipe open after torchrun ends
    err = tmp_path / "torchrun.err"
    with err.open("wb") as f:
        agent = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=f)
    loader, ranks = 0, []
    try:
        for _ in range(600):
            if (tmp_path / "ready").exists() or agent.poll() is not None:
                break
            time.sleep(0.1)
        assert (tmp_path / "ready").exists(), err.read_text()[-2000:] if agent.poll() else "slow"
        loader = int((tmp_path / "ready").read_text())
        ranks = train_launch.trainer_ranks(agent.pid, cfg)
        assert len(ranks) == 1 and agent.pid not in ranks and loader not in ranks
        assert train_launch.stop_run(tmp_path, {"pid": agent.pid, "launcher": "setsid"}, grace_s=30)
        assert json.loads((tmp_path / "stopped.json").read_text()) == {
            "loader_alive_at_save": True,
            "loader_exitcode": None,
        }
        agent.wait(timeout=60)
        deadline = time.monotonic() + 60  # a guard, as above
        while alive(loader) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(loader) and not alive(ranks[0])
    finally:
        # once reaped, the agent's PID may be another process's
        tree = train_launch.descendants(agent.pid) if agent.poll() is None else []
        _kill_ours([agent.pid, *tree, *ranks, loader], str(tmp_path), "multiprocessing")


def test_the_shim_writes_every_node_its_exit_record(tmp_path, monkeypatch):
    """Each node's first process (LOCAL_RANK 0) writes its node's exit.json, not only global rank 0's node: a
    finished job must not look killed on the other nodes."""
    from eagle3ops.train import speculators_shim

    path = tmp_path / "exit.json"
    monkeypatch.setenv(speculators_shim.ENV_EXIT, str(path))
    monkeypatch.setenv("RANK", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    speculators_shim.write_exit("finished", rc=0)
    assert not path.exists()
    monkeypatch.setenv("LOCAL_RANK", "0")
    speculators_shim.write_exit("finished", rc=0)
    assert json.loads(path.read_text())["status"] == "finished"


@pytest.mark.slow  # importing speculators (~5 s quiet, 30 s at load 6)
def test_speculators_distributed_setup_needs_an_accelerator(monkeypatch):
    """What stops speculators 0.9.0 from training over several CPU nodes (the CPU refusal above says it)."""
    import torch

    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present: the CPU limitation cannot show here")
    from speculators.train.distributed import maybe_setup_distributed

    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(RuntimeError, match="accelerator"):
        maybe_setup_distributed()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # four torch processes (two agents, two workers): ~15 s quiet, 45 s at load 6
def test_two_nodes_meet_at_the_c10d_rendezvous_and_all_reduce_with_gloo(tmp_path):
    out = tmp_path / "probe"
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "python"), os.environ.get("PYTHONPATH")) if p),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    run_together(
        [
            train_planning.torchrun_argv(
                sys.executable,
                ["-m", "eagle3ops.train.ddp_probe", "--out", str(out)],
                nproc=1,
                nnodes=2,
                node_rank=r,
                rdzv_endpoint=f"127.0.0.1:{port}",
                rdzv_id="e3t-probe",
            )
            for r in (0, 1)
        ],
        env=env,
    )
    recs = probe_records(out)
    assert [(d["rank"], d["world_size"], d["backend"]) for d in recs] == [(0, 2, "gloo"), (1, 2, "gloo")]
    assert all(d["all_reduce_sum"] == 1.0 for d in recs)  # 0 + 1: a real collective over both nodes
    assert recs[0]["grad"] == recs[1]["grad"]  # DDP averaged the two ranks' different gradients
    assert recs[0]["master"] == recs[1]["master"]


@pytest.mark.slow  # five launches of torchrun (agents + workers): ~40 s quiet, minutes at load 8
def test_a_node_of_another_job_is_stopped_and_joins_the_new_one(inputs, tmp_path):  # noqa: F811
    """Two nodes as two run directories on this machine (STAND-IN for two hosts, loopback), trained by
    ``eagle3ops.train.ddp_probe`` through ``train.ensure_run``: node 0 alone waits at the rendezvous (half a job);
    asked to run another job it stops that trainer first and joins the new one with node 1; finished nodes
    of job 2 are left alone; asked for job 3 while only one node holds the checkpoints, both refuse to train,
    naming both save paths (the train role copies the newest checkpoint before such a restart)."""
    verifier, data = inputs
    port = _free_port()
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}

    def node(rank, job):
        return train_spec.TrainSpec(
            data_dir=str(data), verifier_path=str(verifier), run_dir=str(tmp_path / f"node{rank}"),
            trainer="ddp_probe", device="cpu", nnodes=2, node_rank=rank, rdzv_endpoint=f"127.0.0.1:{port}",
            rdzv_id=job, epochs=2, launcher="setsid", env=env,
        )  # fmt: skip

    first = train_run.ensure_run(node(0, "job-1"))
    try:
        time.sleep(2)
        assert first["status"] == "launched" and first["job"] == "job-1" and alive(first["pid"])
        chk = train_run.ensure_run(node(0, "job-2"), check=True)
        assert chk["would"] == "relaunch" and alive(first["pid"]), chk
        assert chk["other_job"] == {"previous_status": "running", "previous_job": "job-1", "job": "job-2"}
        moved = train_run.ensure_run(node(0, "job-2"))
        assert not alive(first["pid"]) and moved["status"] == "relaunched" and moved["attempt"] == 2
        assert moved["other_job"]["previous_status"] == "running"
        joined = train_run.ensure_run(node(1, "job-2"), wait=True, timeout=240, poll_s=0.5)
        assert joined["status"] == "finished", joined
        done0 = train_run.ensure_run(node(0, "job-2"), wait=True, timeout=240, poll_s=0.5)
        assert done0["status"] == "finished" and done0["changed"] is False, done0
    finally:
        for r in (0, 1):
            train_run.stop(str(tmp_path / f"node{r}"), grace_s=5)
    exits = [json.loads((tmp_path / f"node{r}" / train_spec.EXIT).read_text()) for r in (0, 1)]
    assert [(e["job"], e["world_size"], e["start_epoch"]) for e in exits] == [("job-2", 2, 0)] * 2, exits
    for r in (0, 1):  # finished, the same job: nothing to do
        assert train_run.ensure_run(node(r, "job-2"))["changed"] is False

    # only the node of global rank 0 wrote checkpoints: a job 3 on both would start in different epochs
    saved = [r for r in (0, 1) if (tmp_path / f"node{r}" / "checkpoints" / "1").is_dir()]
    assert len(saved) == 1, saved
    for r in (0, 1):
        assert train_run.ensure_run(node(r, "job-3"))["other_job"]["previous_status"] == "finished"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not all(
        (train_run.read_exit(tmp_path / f"node{r}") or {}).get("job") == "job-3" for r in (0, 1)
    ):
        time.sleep(0.5)
    for r in (0, 1):
        ex = train_run.read_exit(tmp_path / f"node{r}")
        assert ex["status"] == "failed" and "hold different checkpoints" in ex["error"], ex
        assert (
            f"node{saved[0]}/checkpoints" in ex["error"] and f"node{1 - saved[0]}/checkpoints" in ex["error"]
        )
