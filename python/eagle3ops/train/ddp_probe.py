"""A minimal DDP job to prove a multi-node launch (torchrun rendezvous + collective) without speculators.

Two ways to run it, both under the torchrun argv ``eagle3ops.train.planning.torchrun_argv`` builds:

``-m eagle3ops.train.ddp_probe --out DIR`` (a one-shot check): every process joins the process group (gloo on CPU,
NCCL on GPUs), runs one all-reduce of its rank and one DDP step of a tiny linear model on its own rank's data,
and writes ``DIR/rank{RANK}.json`` with what it saw: the world size, its global and local rank, the host, the
all-reduce sum (must be 0 + 1 + ... + W-1) and the averaged gradient (equal on every rank after DDP's
all-reduce). Nothing else is written.

``-m eagle3ops.train.ddp_probe --config RUN/config.yaml`` (the ``train`` phase with ``trainer: ddp_probe``): the same
run directory, data, checkpoints and records as the speculators trainer, with a linear model in its place. It
is what trains over several CPU hosts (speculators 0.9.0 cannot: docs/scale.md), and a quick check of a
cluster's launch, data and restart before a long run:

- reads ``data.data_path``, ``trainer.save_path``, ``trainer.epochs`` and ``optimizer.lr`` of the rendered
  speculators config;
- each epoch, rank ``r`` of ``W`` reads its rows ``r, r+W, ...`` of the hidden-state store (every row with a
  manifest line) - so every node must hold the data it trains on - and takes one DDP step per row (a rank with
  one row fewer repeats its first, so every rank takes as many steps); ``EAGLE3OPS_PROBE_STEP_S`` seconds of
  sleep after each step make a run long enough to interrupt in tests;
- resumes like speculators: every rank looks for the newest complete checkpoint in *its own* ``save_path``
  (``eagle3ops.checkpoints.checkpoint_problem``), loads the model and optimizer from there, and starts at the next
  epoch; the ranks compare where they start, and a job whose nodes hold different checkpoints fails at once,
  naming the hosts (speculators would train on with ranks in different epochs);
- rank 0 writes a checkpoint per epoch in speculators' layout (``save_path/EPOCH/model.safetensors``,
  ``optimizer_state_dict.pt``, ``scheduler_state_dict.pt``, ``training_state.json``), and the metric records
  (``$EAGLE3OPS_METRICS``, one ``train`` line per step); each node's first process writes a ``probe`` line with
  the job it joined, and its node's exit record (``$EAGLE3OPS_EXIT``: ``finished``, ``failed`` or, after
  SIGTERM, ``interrupted``) with the epoch it started from and every rank's host.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
import traceback
from pathlib import Path

from eagle3ops.durable import atomic_write_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle3ops.train.ddp_probe")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", help="one-shot check: directory for rank{RANK}.json")
    mode.add_argument("--config", help="train as the train phase's trainer, from this rendered config")
    ap.add_argument("--backend", default="auto", help="auto (nccl on GPUs, gloo on CPU), gloo or nccl")
    args = ap.parse_args(argv)
    if args.config:
        return train(args.config, args.backend)
    return probe(args.out, args.backend)


def _join(backend: str):
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and backend != "gloo"
    backend = backend if backend != "auto" else ("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    t0 = time.time()
    dist.init_process_group(backend)
    return backend, device, local_rank, time.time() - t0


def _ddp(model, device, local_rank):
    import torch

    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank] if device.type == "cuda" else None
    )


def probe(out_dir: str, backend: str) -> int:
    import torch
    import torch.distributed as dist

    backend, device, local_rank, joined = _join(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.tensor([float(rank)], device=device)
    dist.all_reduce(x)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(device)
    ddp = _ddp(model, device, local_rank)
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    inp = torch.randn(8, 4, generator=g).to(device)
    ddp(inp).pow(2).mean().backward()
    grad = model.weight.grad.detach().cpu().flatten().tolist()
    rec = {
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world,
        "backend": backend,
        "host": socket.gethostname(),
        "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        "all_reduce_sum": x.item(),
        "grad": grad,
        "join_seconds": round(joined, 3),
    }
    dist.barrier()
    dist.destroy_process_group()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"rank{rank}.json", json.dumps(rec) + "\n")
    return 0


# ------------------------------------------------------------------ the train phase's stand-in trainer


def _newest_complete(save: Path) -> int | None:
    from eagle3ops.checkpoints import checkpoint_problem, epoch_dirs

    for epoch in reversed(epoch_dirs(save)):
        if checkpoint_problem(save / str(epoch)) is None:
            return epoch
    return None


def _save(save: Path, epoch: int, model, opt, global_step: int) -> None:
    import torch
    from safetensors.torch import save_file

    d = save / str(epoch)
    d.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, d / "model.safetensors"
    )
    torch.save(opt.state_dict(), d / "optimizer_state_dict.pt")
    torch.save({}, d / "scheduler_state_dict.pt")
    # last, as speculators: its presence marks the checkpoint complete (eagle3ops.train.checkpoint_problem)
    (d / "training_state.json").write_text(
        json.dumps({"epoch": epoch, "local_step": 0, "global_step": global_step})
    )


def _append(path: str | None, rec: dict) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")


def train(config: str, backend: str) -> int:
    import yaml

    from eagle3ops.train.speculators_shim import ENV_METRICS, write_exit

    started = time.time()
    stop: dict[str, int] = {}
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.setdefault("signal", signum))
    try:
        cfg = yaml.safe_load(Path(config).read_text())["train"]
        result = _train(cfg, backend, stop, os.environ.get(ENV_METRICS))
    except BaseException as e:
        write_exit(
            "failed",
            rc=1,
            error=f"{type(e).__name__}: {e}",
            traceback=traceback.format_exc()[-4000:],
            job=os.environ.get("TORCHELASTIC_RUN_ID"),
        )
        raise
    if result.pop("interrupted"):
        write_exit(
            "interrupted",
            rc=143,
            signal=str(stop["signal"]),
            seconds=round(time.time() - started, 3),
            **result,
        )
        return 143
    write_exit("finished", rc=0, seconds=round(time.time() - started, 3), **result)
    return 0


def _train(cfg: dict, backend: str, stop: dict, metrics: str | None) -> dict:
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    from eagle3ops.store import HiddenStateStore, load_sample

    backend, device, local_rank, joined = _join(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    host = socket.gethostname()
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    store = HiddenStateStore(cfg["data"]["data_path"])
    rows = sorted(store.scan_manifest().rows())
    if not rows:
        raise RuntimeError(f"{store.dir}: no rows with hidden states on {host}")
    save = Path(cfg["trainer"]["save_path"])
    epochs = int(cfg["trainer"]["epochs"])
    step_s = float(os.environ.get("EAGLE3OPS_PROBE_STEP_S") or 0)

    newest = _newest_complete(save)
    start = 0 if newest is None else newest + 1
    starts: list = [None] * world
    dist.all_gather_object(starts, {"rank": rank, "host": host, "start": start, "save_path": str(save)})
    if len({s["start"] for s in starts}) > 1:
        raise RuntimeError(
            "the nodes hold different checkpoints, so their ranks would start in different epochs: "
            + ", ".join(
                f"rank {s['rank']} on {s['host']}: epoch {s['start']} ({s['save_path']})" for s in starts
            )
            + ". Give every node the newest checkpoint (the train role copies it before a restart) or one shared "
            "save path."
        )
    if local_rank == 0:
        _append(metrics, {"kind": "probe", "time": round(time.time(), 3),
                          "data": {"job": job, "rank": rank, "world_size": world, "host": host,
                                   "join_seconds": round(joined, 3), "start_epoch": start}})  # fmt: skip

    hidden = load_sample(store.path(rows[0]))["hidden_states"].shape[-1]
    torch.manual_seed(0)
    model = torch.nn.Linear(hidden, 1).to(device)
    global_step = 0
    if newest is not None:  # every rank from its own save path, as speculators loads its optimizer state
        ckpt = save / str(newest)
        model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
        global_step = json.loads((ckpt / "training_state.json").read_text())["global_step"]
    ddp = _ddp(model, device, local_rank)
    opt = torch.optim.SGD(ddp.parameters(), lr=float(cfg["optimizer"]["lr"]))
    if newest is not None:
        opt.load_state_dict(torch.load(save / str(newest) / "optimizer_state_dict.pt", weights_only=True))
    mine = rows[rank::world]
    steps = -(-len(rows) // world)  # as many steps on every rank (DDP needs each all-reduce on all of them)
    mine = mine + mine[:1] * (steps - len(mine))
    out = {"interrupted": False, "job": job, "world_size": world, "rank": rank, "start_epoch": start,
           "hosts": sorted({s["host"] for s in starts}), "rows_per_rank": steps}  # fmt: skip
    for epoch in range(start, epochs):
        for i in mine:
            x = load_sample(store.path(i), dtype=torch.float32)["hidden_states"].mean(dim=(0, 1)).to(device)
            opt.zero_grad()
            loss = ddp(x).pow(2).mean()
            loss.backward()
            opt.step()
            global_step += 1
            if rank == 0:
                _append(metrics, {"kind": "train", "time": round(time.time(), 3), "step": global_step,
                                  "data": {"train": {"loss": loss.item()}, "global_step": global_step,
                                           "epoch": epoch}})  # fmt: skip
            time.sleep(step_s)
            flag = torch.tensor([1.0 if stop else 0.0], device=device)
            dist.all_reduce(flag)  # every rank stops at the same step, as the job is one
            if flag.item():
                dist.destroy_process_group()
                return {**out, "interrupted": True, "epoch": epoch, "global_step": global_step}
        if rank == 0:
            _save(save, epoch, model, opt, global_step)
        dist.barrier()
    dist.destroy_process_group()
    return {**out, "epoch": epochs - 1, "global_step": global_step}


if __name__ == "__main__":
    raise SystemExit(main())
