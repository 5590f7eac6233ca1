"""What the multi-host paths cost between two nspawn hosts on this machine (issue #21, docs/scale.md).

    sudo .venv/bin/python bench/multihost_nspawn.py [--mib 512] [--files 2000] [--out FILE (default bench/results/multihost_nspawn_<date>_cpu.json)]

Boots two throwaway hosts of the test harness (tests/hosts/nspawn.py, tests/hosts/multihost.py: the controller's
venv bound in, the hosts routed to each other through this machine over their veth pairs) and measures, from
host A to host B:

- **rsync rate** the train role's data copy gets: rsync over ssh run on A pushing to B (what
  ``ansible.posix.synchronize`` with ``delegate_to`` runs), one large file (``--mib``) and many hidden-state-sized
  files (``--files`` x 128 KiB, like a store's ``hs_*.safetensors``); wall time of the rsync command on A.
- **rendezvous time**: torch's c10d rendezvous (``next_rendezvous()`` of the handler torchrun uses, host A serving
  the store, both started together), then the gloo process group of ``eagle3ops.train.ddp_probe`` under the train
  phase's torchrun argv (launch to both ranks done, and the probe's own ``init_process_group`` time).

STAND-IN, said here: both hosts share this machine's 2 CPU cores and memory; their "network" is two veth pairs
and the kernel's forwarding, and ssh's encryption runs on the same cores - a floor for what rsync over ssh
costs per byte, not a data-centre link. Numbers say what the software adds, not what a 25/100 GbE fabric gives.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "python"), str(REPO / "tests" / "unit")]

from hosts import multihost, nspawn

RDZV = r"""
import json, sys, time
t0 = time.time()
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
host, rank = sys.argv[1], int(sys.argv[2])
p = RendezvousParameters(backend="c10d", endpoint=f"{host}:29411", run_id="bench", min_nodes=2, max_nodes=2,
                         is_host=rank == 0)
t1 = time.time()
info = get_rendezvous_handler(p).next_rendezvous()
t2 = time.time()
print(json.dumps({"node": rank, "import_s": round(t1 - t0, 3), "rendezvous_s": round(t2 - t1, 3),
                  "group_rank": info.rank, "done_at": t2}))
"""


def _timed(h, command: str) -> float:
    t = time.monotonic()
    h.ssh(command, timeout=1800)
    return round(time.monotonic() - t, 3)


def _on(h, command: str) -> list[str]:
    return ["ssh", "-F", str(h.ssh_config), "-o", "BatchMode=yes", h.name, command]


def _together(argvs: list[list[str]]) -> list[str]:
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for a in argvs]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("\n".join(o[-3000:] for o in outs))
    return outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="size of the one large file")
    ap.add_argument("--files", type=int, default=2000, help="number of 128 KiB files")
    ap.add_argument(
        "--out", default=str(REPO / "bench/results" / result_name("multihost_nspawn", card="cpu"))
    )
    args = ap.parse_args()
    reason = nspawn.unavailable_reason()
    if reason:
        raise SystemExit(f"nspawn hosts unavailable: {reason}")
    base = Path(tempfile.mkdtemp(prefix="e3-bench-", dir="/var/tmp"))
    factory = nspawn.HostFactory(base, nspawn.make_ssh_key(base / "ssh"), nspawn.ensure_rootfs())
    res: dict = {
        "mib": args.mib,
        "files": args.files,
        "load_before": Path("/proc/loadavg").read_text().split()[:3],
    }
    try:
        a, b = (factory.create(ro_binds=multihost.ro_binds()) for _ in range(2))
        hosts = [a, b]
        multihost.link(hosts)
        multihost.name(hosts)
        multihost.trust(hosts)
        a.ssh(f"mkdir -p /srv/big /srv/small && head -c {args.mib}M /dev/urandom > /srv/big/blob")
        a.ssh(
            f"for i in $(seq {args.files}); do head -c 131072 /dev/urandom > /srv/small/hs_$i.safetensors; done"
        )
        rsync = f"rsync -a --stats -e 'ssh -o BatchMode=yes' {{src}} root@{b.ip}:{{dst}}"
        for name, src, size in (("large_file", "/srv/big/", args.mib << 20), ("small_files", "/srv/small/",
                                                                            args.files << 17)):  # fmt: skip
            s = _timed(a, rsync.format(src=src, dst=src))
            again = _timed(
                a, rsync.format(src=src, dst=src)
            )  # nothing left to copy: the cost of a no-op re-run
            res[name] = {"bytes": size, "seconds": s, "MB_per_s": round(size / s / 1e6, 1),
                         "Mbit_per_s": round(size * 8 / s / 1e6), "noop_rerun_seconds": again}  # fmt: skip
        py = f"{multihost.VENV}/bin/python"
        outs = _together([_on(h, f"{py} -c {shlex.quote(RDZV)} {a.ip} {r}") for r, h in enumerate(hosts)])
        res["c10d_rendezvous"] = [json.loads(o.strip().splitlines()[-1]) for o in outs]
        from eagle3ops.train.planning import torchrun_argv

        argvs = []
        for rank, h in enumerate(hosts):
            argv = torchrun_argv(py, ["-m", "eagle3ops.train.ddp_probe", "--out", "/srv/probe"], nproc=1, nnodes=2,
                                 node_rank=rank, rdzv_endpoint=f"{a.ip}:29400", rdzv_id="bench")  # fmt: skip
            cmd = "PYTHONPATH=/opt/e3/python OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=host0 " + shlex.join(argv)
            argvs.append(_on(h, cmd))
        t = time.monotonic()
        _together(argvs)
        res["torchrun_launch_to_done_s"] = round(time.monotonic() - t, 3)
        recs = [h.merged / "srv/probe" / f"rank{r}.json" for h in hosts for r in (0, 1)]
        res["ddp_probe"] = [json.loads(f.read_text()) for f in recs if f.exists()]
    finally:
        factory.cleanup()
    res["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
