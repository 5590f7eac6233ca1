"""A minimal DDP job to prove a multi-node launch (torchrun rendezvous + collective) without the trainer.

``python -m torch.distributed.run --nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT
-m eagle3ops.ddp_probe --out DIR`` (what ``eagle3ops.train.torchrun_argv`` builds): every process joins the
process group (gloo on CPU, NCCL on GPUs), runs one all-reduce of its rank and one DDP step of a tiny
linear model on its own rank's data, and writes ``DIR/rank{RANK}.json`` with what it saw: the world size,
its global and local rank, the host, the all-reduce sum (must be 0 + 1 + ... + W-1) and the averaged
gradient (equal on every rank after DDP's all-reduce). Nothing else is written.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle3ops.ddp_probe")
    ap.add_argument("--out", required=True, help="directory for rank{RANK}.json")
    ap.add_argument("--backend", default="auto", help="auto (nccl on GPUs, gloo on CPU), gloo or nccl")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and args.backend != "gloo"
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    t0 = time.time()
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    joined = time.time() - t0
    x = torch.tensor([float(rank)], device=device)
    dist.all_reduce(x)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(rec) + "\n")
    os.replace(tmp, out / f"rank{rank}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
