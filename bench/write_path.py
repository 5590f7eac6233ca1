"""Write-path micro-bench (issue #9, target 1, the part provable without a GPU): the extraction's real writer
(``eagle3ops.extract.SampleWriter`` -> ``HiddenStateStore.write_sample``: zero-copy safetensors parts, temp file,
fdatasync, rename, manifest) fed with ready CPU batches, so only the write path is timed.

Variants, interleaved (the box is shared), same bytes:
  per_file_dir_fsync   the default (the scheme measured on the H200): fsync per file + a directory fsync per file
  batch_dir_fsync      fsync per file, ONE directory fsync per batch before its manifest lines (opt-in:
                       SampleWriter(batch_dir_sync=True); slower on this project's VM disk)
  no_fsync             page cache only (crash-safe, not power-safe): the ceiling
Also the raw sequential write bandwidth of the same directory (one big file, fsync at the end), as
bench/extract_throughput.py measures it, so each variant is a fraction of the disk bound.

Usage: .venv/bin/python bench/write_path.py [--dir /data/tmp] [--files 96] [--mib 8] [--batch 8] [--reps 2]
Writes bench/results/write_path.json (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))


def raw_bandwidth(d: Path, nbytes: int) -> float:
    buf = os.urandom(64 << 20)
    p = d / "raw.bin"
    t0 = time.perf_counter()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = nbytes
    while left > 0:
        left -= os.write(fd, buf[: min(left, len(buf))])
    os.fsync(fd)
    os.close(fd)
    dt = time.perf_counter() - t0
    p.unlink()
    return nbytes / dt


def run_variant(d: Path, batches, fsync: bool, batch_dir_sync: bool, threads: int) -> dict:
    from eagle3ops.extract import SampleWriter, _Job
    from eagle3ops.store import HiddenStateStore

    if d.exists():
        shutil.rmtree(d)
    store = HiddenStateStore(d)
    store.dir.mkdir(parents=True)
    w = SampleWriter(store, fsync=fsync, threads=threads, batch_dir_sync=batch_dir_sync)
    t0 = time.perf_counter()
    w.start()
    for idx, toks, states in batches:
        w.submit(_Job(idx, toks, states, None))
    w.finish()
    store.close()
    dt = time.perf_counter() - t0
    nbytes = w.stats.bytes
    shutil.rmtree(d)
    return {
        "seconds": round(dt, 3),
        "bytes": nbytes,
        "bytes_per_s": round(nbytes / dt),
        "files": w.stats.written,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    ap.add_argument("--files", type=int, default=96)
    ap.add_argument("--mib", type=float, default=8.0, help="MiB per sample file")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    import torch

    hidden, states = 1024, 4
    t = max(1, int(args.mib * 2**20 / (hidden * states * 2)))
    block = torch.randn(args.batch, t, states, hidden).to(torch.bfloat16)
    tok = torch.arange(t, dtype=torch.int64)
    batches = []
    for b0 in range(0, args.files, args.batch):
        idx = list(range(b0, min(args.files, b0 + args.batch)))
        batches.append((idx, [tok] * len(idx), [block[k] for k in range(len(idx))]))
    variants = {
        "per_file_dir_fsync": (True, False),
        "batch_dir_fsync": (True, True),
        "no_fsync": (False, True),
    }
    root = Path(tempfile.mkdtemp(prefix="write-path-", dir=args.dir))
    result: dict = {
        "bench": "write_path",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "dir": str(root),
        "files": args.files,
        "bytes_per_file": t * states * hidden * 2 + 8 * t,
        "batch": args.batch,
        "threads": args.threads,
        "loadavg_start": os.getloadavg(),
        "runs": {k: [] for k in variants},
        "raw_bandwidth_bytes_per_s": [],
    }
    try:
        names = list(variants)
        for rep in range(args.reps):
            result["raw_bandwidth_bytes_per_s"].append(
                round(raw_bandwidth(root, args.files * result["bytes_per_file"]))
            )
            for name in names[rep % 3 :] + names[: rep % 3]:  # rotated: the disk's cache state carries over
                fsync, bds = variants[name]
                r = run_variant(root / name, batches, fsync, bds, args.threads)
                result["runs"][name].append(r)
                print(
                    f"{name}: {r['bytes_per_s'] / 1e6:.0f} MB/s ({r['seconds']} s)",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    raw = statistics.median(result["raw_bandwidth_bytes_per_s"])
    result["median_bytes_per_s"] = {
        k: round(statistics.median(x["bytes_per_s"] for x in v)) for k, v in result["runs"].items()
    }
    result["fraction_of_raw"] = {k: round(v / raw, 3) for k, v in result["median_bytes_per_s"].items()}
    m = result["median_bytes_per_s"]
    result["batch_over_per_file"] = round(m["batch_dir_fsync"] / m["per_file_dir_fsync"], 3)
    result["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "write_path.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("fraction_of_raw", "batch_over_per_file")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
