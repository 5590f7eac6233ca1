"""Write-path micro-bench (issue #9, target 1, the part provable without a GPU): the extraction's real writer
(``eagle3ops.extract.SampleWriter`` -> ``HiddenStateStore.write_sample`` -> ``store.atomic_write_bytes``:
zero-copy safetensors parts, temp file, fsync, rename, directory fsync, manifest) fed with ready CPU batches, so
only the write path is timed.

Variants (``--variants``; every one but no_fsync keeps the guarantee: a file's bytes and its rename are durable
before its manifest line), set through the module options of eagle3ops.store (env vars for a real run):
  default          fsync per file + a directory fsync per file, one file in flight per thread (the extraction's
                   default until batch_sync won on the H200 box, 2026-11-30; still the baseline here)
  fdatasync        fdatasync instead of fsync for the data file           EAGLE3OPS_FDATASYNC=1
  fallocate        fallocate(2) the final size before writing             EAGLE3OPS_PREALLOCATE=1
  writeback        8 MiB chunks (--writeback-mib), sync_file_range(WRITE) after each  EAGLE3OPS_WRITEBACK_MIB=8
  writeback_wait   same + wait for the previous chunk's writeback         ... + EAGLE3OPS_WRITEBACK_WAIT=1
  writeback_all    writeback + fallocate + fdatasync
  batch_dir_fsync  fsync per file, ONE directory fsync per batch (SampleWriter(batch_dir_sync=True); an earlier
                   session measured it 0.72x the default on this project's VM disk; not run unless named)
  batch_sync       a batch's files all written and their writeback started before the first fsync, one
                   directory fsync per batch                              EAGLE3OPS_BATCH_SYNC=1
  no_fsync         page cache only (crash-safe, not power-safe): the ceiling
Each configuration (file size x writer threads) is run ``--reps`` times; within a rep all variants run
back to back in an order rotated every rep (ABC.., BC..A, ...: the disk's cache state carries over), after a
raw-bandwidth probe of the same directory (``threads`` parallel streams of one big file each, one fsync at the
end, as bench/extract_throughput.py's disk bound), with the previous run's files deleted and ``os.sync()``ed
outside the timing. Reported per variant: median MB/s and spread (min-max), fraction of the median raw probe,
and the median/min/max of the per-rep ratio to ``default`` (paired: same rep, adjacent in time).

Usage: .venv/bin/python bench/write_path.py [--dir /data/tmp] [--mib 33,8] [--threads 2,4] [--run-mib 1024 | --files N]
       [--reps 5] [--variants default,fdatasync,...] [--writeback-mib 8] [--out DIR] [--suffix S | --name FILE]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

_OFF = {
    "WRITEBACK_CHUNK": 0,
    "WRITEBACK_WAIT": False,
    "PREALLOCATE": False,
    "DATASYNC": False,
    "BATCH_SYNC": False,
}
# name -> (fsync, batch_dir_sync, store module options)
VARIANTS: dict[str, tuple[bool, bool, dict]] = {
    "default": (True, False, {}),
    "fdatasync": (True, False, {"DATASYNC": True}),
    "fallocate": (True, False, {"PREALLOCATE": True}),
    "writeback": (True, False, {"WRITEBACK_CHUNK": 8 << 20}),
    "writeback_wait": (True, False, {"WRITEBACK_CHUNK": 8 << 20, "WRITEBACK_WAIT": True}),
    "writeback_all": (True, False, {"WRITEBACK_CHUNK": 8 << 20, "PREALLOCATE": True, "DATASYNC": True}),
    "batch_dir_fsync": (True, True, {}),
    "batch_sync": (True, False, {"BATCH_SYNC": True}),
    "no_fsync": (False, False, {}),
    # the same with the content checksum (xxh3-64 of each file over the bytes in memory, issue 16; on by default
    # in a real run since then: ExtractConfig.checksum)
    "batch_sync_checksum": (True, False, {"BATCH_SYNC": True}),
    "default_checksum": (True, False, {}),
    "no_fsync_checksum": (False, False, {}),
}
CHECKSUM_VARIANTS = {"batch_sync_checksum", "default_checksum", "no_fsync_checksum"}
WRITEBACK_MIB = 8  # --writeback-mib
DEFAULT_VARIANTS = "default,fdatasync,fallocate,writeback,writeback_wait,writeback_all,batch_sync,no_fsync"


def _settle(path: Path | None = None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
    os.sync()  # the deletions' and earlier writes' writeback must not land in the next timed run


def _stream(p: Path, nbytes: int, buf: bytes) -> None:
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[: min(left, len(buf))])
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_bandwidth(d: Path, nbytes: int, streams: int) -> float:
    """``streams`` files written in parallel, one fsync each at the end (bench/extract_throughput.py's bound)."""
    buf = os.urandom(64 << 20)
    paths = [d / f"raw{i}.bin" for i in range(streams)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(streams) as ex:
        list(ex.map(lambda p: _stream(p, nbytes // streams, buf), paths))
    dt = time.perf_counter() - t0
    for p in paths:
        p.unlink()
    _settle()
    return nbytes / dt


def run_variant(d: Path, batches, variant: str, threads: int) -> dict:
    from eagle3ops import store as store_mod
    from eagle3ops.extract.writer import SampleWriter, WriterJob
    from eagle3ops.store import HiddenStateStore

    fsync, batch_dir_sync, opts = VARIANTS[variant]
    if "WRITEBACK_CHUNK" in opts:
        opts = {**opts, "WRITEBACK_CHUNK": WRITEBACK_MIB << 20}
    _settle(d)
    for k, v in {**_OFF, **opts}.items():
        setattr(store_mod, k, v)
    try:
        store = HiddenStateStore(d)
        store.dir.mkdir(parents=True)
        w = SampleWriter(
            store,
            fsync=fsync,
            threads=threads,
            batch_dir_sync=batch_dir_sync,
            checksum=variant in CHECKSUM_VARIANTS,
        )
        t0 = time.perf_counter()
        w.start()
        for idx, toks, states in batches:
            w.submit(WriterJob(idx, toks, states, None))
        w.finish()
        store.close()
        dt = time.perf_counter() - t0
    finally:
        for k, v in _OFF.items():
            setattr(store_mod, k, v)
    _settle(d)
    return {"seconds": round(dt, 3), "bytes_per_s": round(w.stats.bytes / dt), "files": w.stats.written}


def make_batches(mib: float, files: int, batch: int):
    import torch

    hidden, states = 1024, 4  # [T, 4, 1024] bf16: 8 KiB a token, + 8 B of token id
    t = max(1, int(mib * 2**20 / (hidden * states * 2)))
    block = torch.randn(batch, t, states, hidden).to(torch.bfloat16)
    tok = torch.arange(t, dtype=torch.int64)
    out = []
    for b0 in range(0, files, batch):
        idx = list(range(b0, min(files, b0 + batch)))
        out.append((idx, [tok] * len(idx), [block[k] for k in range(len(idx))]))
    return out, t * states * hidden * 2 + 8 * t


def hash_probe(mib: int = 64, reps: int = 3) -> dict:
    """One core's speed of the manifest checksum (xxh3-64, what the writer uses) and of zlib.crc32 (the older
    one) over a random in-memory buffer: MB/s, best of ``reps``."""
    import zlib

    fns = [("crc32", zlib.crc32)]
    try:
        import xxhash

        fns.insert(0, ("xxh3_64", lambda b: xxhash.xxh3_64(b).intdigest()))
    except ImportError:  # the store then records crc32 (store.content_hash)
        pass
    buf = os.urandom(mib << 20)
    out = {}
    for name, fn in fns:
        best = min(_timed(fn, buf) for _ in range(reps))
        out[f"{name}_MB_per_s"] = round(len(buf) / best / 1e6)
    return out


def _timed(fn, buf) -> float:
    t0 = time.perf_counter()
    fn(buf)
    return time.perf_counter() - t0


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    ap.add_argument("--mib", default="33,8", help="MiB per sample file, comma-separated")
    ap.add_argument("--threads", default="2,4", help="writer threads, comma-separated")
    ap.add_argument("--run-mib", type=float, default=1024, help="MiB written per timed run (sets files/run)")
    ap.add_argument("--files", type=int, default=None, help="files per timed run (overrides --run-mib)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of: {','.join(VARIANTS)}")
    ap.add_argument("--writeback-mib", type=int, default=8, help="chunk of the writeback* variants")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument(
        "--name", help="result file name under --out (default write_path_<date>_<card>[_<suffix>].json)"
    )
    ap.add_argument("--suffix", help="what tells this run apart in the default name (e.g. variants_wb2)")
    return ap


def main() -> int:
    ap = parser()
    args = ap.parse_args()
    global WRITEBACK_MIB
    WRITEBACK_MIB = args.writeback_mib
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    mibs = [float(x) for x in args.mib.split(",") if x]
    threads = _ints(args.threads)

    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="write-path-", dir=args.dir))
    configs = []
    for mib in mibs:
        files = args.files or max(args.batch, round(args.run_mib / mib))
        batches, per_file = make_batches(mib, files, args.batch)
        for th in threads:
            configs.append(
                {
                    "key": f"{mib:g}MiB_x{th}",
                    "mib": mib,
                    "threads": th,
                    "files": files,
                    "bytes_per_file": per_file,
                    "batches": batches,
                }
            )
    result: dict = {
        "bench": "write_path",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "dir": str(root),
        "batch": args.batch,
        "writeback_mib": args.writeback_mib,
        "reps": args.reps,
        "variants": names,
        "loadavg_start": os.getloadavg(),
        "hash_probe": hash_probe(),
        "configs": {},
    }
    for c in configs:
        result["configs"][c["key"]] = {
            **{k: c[k] for k in ("mib", "threads", "files", "bytes_per_file")},
            "raw_bytes_per_s": [],
            "runs": {v: [] for v in names},
        }
    try:
        for rep in range(args.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for c in configs:
                rc = result["configs"][c["key"]]
                nbytes = c["files"] * c["bytes_per_file"]
                rc["raw_bytes_per_s"].append(round(raw_bandwidth(root, nbytes, c["threads"])))
                line = [f"rep {rep} {c['key']}: raw {rc['raw_bytes_per_s'][-1] / 1e6:.0f}"]
                for v in order:
                    r = run_variant(root / v, c["batches"], v, c["threads"])
                    rc["runs"][v].append(r)
                    line.append(f"{v} {r['bytes_per_s'] / 1e6:.0f}")
                print(", ".join(line) + " MB/s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = []
    for key, rc in result["configs"].items():
        raw = statistics.median(rc["raw_bytes_per_s"])
        base = [r["bytes_per_s"] for r in rc["runs"].get("default", [])]
        summary = {}
        for v, runs in rc["runs"].items():
            bw = [r["bytes_per_s"] for r in runs]
            s = {
                "median_MBps": round(statistics.median(bw) / 1e6),
                "min_MBps": round(min(bw) / 1e6),
                "max_MBps": round(max(bw) / 1e6),
                "fraction_of_raw": round(statistics.median(bw) / raw, 3),
            }
            if base and len(base) == len(bw):
                ratios = [a / b for a, b in zip(bw, base, strict=True)]
                s["ratio_to_default"] = {
                    "median": round(statistics.median(ratios), 3),
                    "min": round(min(ratios), 3),
                    "max": round(max(ratios), 3),
                    "wins": sum(r > 1 for r in ratios),
                }
            summary[v] = s
            rd = s.get("ratio_to_default", {})
            table.append(
                f"| {key} | {v} | {s['median_MBps']} | {s['min_MBps']}-{s['max_MBps']} | {s['fraction_of_raw']} "
                f"| {rd.get('median', '')} | {rd.get('min', '')}-{rd.get('max', '')} "
                f"| {rd.get('wins', '')}/{len(bw)} |"
            )
        rc["raw_median_MBps"] = round(raw / 1e6)
        rc["summary"] = summary
    result["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / (args.name or result_name("write_path", args.suffix))).write_text(
        json.dumps(result, indent=2) + "\n"
    )
    print(
        "| config | variant | median MB/s | min-max | of raw | ratio to default (median) | ratio min-max | wins |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(table))
    print(json.dumps({k: rc["raw_median_MBps"] for k, rc in result["configs"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
