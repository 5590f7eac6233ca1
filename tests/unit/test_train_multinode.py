"""Issue #21: training over several hosts - the torchrun command line of each node, the refusals, and a real
two-node c10d rendezvous with gloo on this machine.

Real: ``python -m torch.distributed.run`` (torchrun) twice, as node 0 and node 1 of 2, meeting at a c10d
rendezvous on 127.0.0.1 with the argv ``eagle3ops.train.torchrun_argv`` builds for the train phase; each
runs ``eagle3ops.ddp_probe`` (gloo all-reduce + one DDP step). STAND-IN: the two nodes are two process trees
on this machine (loopback), not two hosts; the trainer is the probe, because speculators 0.9.0 cannot train
over several nodes on CPU (``test_speculators_distributed_setup_needs_an_accelerator`` pins why).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
from eagle3ops import train
from proc_helpers import probe_records, run_together

REPO = Path(__file__).resolve().parents[2]


def _plan(tmp_path, device="gpu", nproc=8, **spec_kw) -> train.Plan:
    spec = train.TrainSpec(
        data_dir=str(tmp_path), verifier_path=str(tmp_path), run_dir=str(tmp_path / "run"), **spec_kw
    )
    return train.Plan(spec=spec, run_dir=tmp_path / "run", save_path=tmp_path / "run/checkpoints", config_text="",
                      config_sha256="x", values={}, device=device, nproc=nproc, token_freq={}, target_vocab=0)  # fmt: skip


def test_each_node_gets_nnodes_its_rank_and_the_rendezvous_of_the_first(tmp_path):
    p = _plan(tmp_path, nnodes=3, node_rank=2, rdzv_endpoint="10.0.0.1:29400", rdzv_id="run7", nic="ens5")
    cfg = str(tmp_path / "run" / train.CONFIG)
    assert train.build_command(p, "/venv/bin/python") == [
        "/venv/bin/python", "-m", "torch.distributed.run", "--nnodes=3", "--node-rank=2", "--nproc-per-node=8",
        "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=run7", "--rdzv-conf=is_host=0",
        "-m", train.SHIM_MODULE, "--config", cfg,
    ]  # fmt: skip
    env = train._env(p)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens5"
    # the default rendezvous id is the same on every node (from the run directory's path), not per host
    a = _plan(tmp_path, nnodes=2, node_rank=0, rdzv_endpoint="h:1")
    b = _plan(tmp_path, nnodes=2, node_rank=1, rdzv_endpoint="h:1")
    ida = [x for x in train.build_command(a, "py") if x.startswith("--rdzv-id=")]
    assert ida and ida == [x for x in train.build_command(b, "py") if x.startswith("--rdzv-id=")]
    # one host: as before
    assert train.build_command(_plan(tmp_path), "py")[3:5] == ["--standalone", "--nproc_per_node=8"]
    assert train.build_command(_plan(tmp_path, device="cpu", nproc=1), "py") == [
        "py", "-m", train.SHIM_MODULE, "--config", cfg,
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
    with pytest.raises(train.TrainError, match=needle):
        train.check_nodes(train.TrainSpec(data_dir="d", verifier_path="v", run_dir="r", **kw), device)


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
            train.torchrun_argv(
                sys.executable,
                ["-m", "eagle3ops.ddp_probe", "--out", str(out)],
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
