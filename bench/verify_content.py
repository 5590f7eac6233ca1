"""What the train phase's content check costs (issue 32): ``eagle3ops.store.verify_content`` on a store written by
the real :class:`HiddenStateStore` (manifest lines with the writer's xxh3-64 and ctime), standard library only
(no torch: the tensor bytes are random bytes behind a real sample header, which is all the check reads).

Measured, each ``--reps`` times (median reported):
  cold_first_s     the first verification, every file evicted from the page cache first (posix_fadvise
                   DONTNEED on our own files only: nothing else on the machine is touched), so the disk's read rate
                   and the hashing both count: what a first training run pays
  warm_first_s     the same with the files in the page cache: the hashing (one core) alone
  rerun_s          a second verification with nothing changed: the record vouches for every file (a stat each,
                   no byte read), on ``--rerun-files`` hard links of one small sample (the per-file cost at scale)
The extrapolation to ``--extrapolate-tb`` (4.6 TB, the production store) uses the measured cold rate and the
per-file re-run cost with files of ``--hidden`` (7168: 7.3 MB per 128-token row).

Usage: .venv/bin/python bench/verify_content.py [--files 48] [--hidden 7168] [--reps 3] [--rerun-files 20000]
       [--dir DIR (default: a temp dir on /tmp's file system)] [--name FILE (default verify_content_<date>_<card>.json)]
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

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

SEQ_LEN, NUM_STATES = 128, 4


def build(root: Path, files: int, hidden: int) -> int:
    """``files`` samples of ``hidden`` written and fsynced by the real store; their total bytes."""
    from eagle3ops.store import HiddenStateStore, sample_header

    store = HiddenStateStore(root)
    head, total = sample_header(SEQ_LEN, NUM_STATES, hidden, "bfloat16")
    entries = []
    for i in range(files):
        entries.append(store.write_sample(i, head + os.urandom(total - len(head)), SEQ_LEN, fsync=True))
    store.append_manifest(entries, fsync=True)
    store.close()
    return total * files


def evict(hs_dir: Path) -> None:
    for p in hs_dir.glob("hs_*.safetensors"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(hs_dir: Path) -> None:
    for p in hs_dir.glob("hs_*.safetensors"):
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass


def one_pass(root: Path) -> tuple[float, dict]:
    from eagle3ops.store import HiddenStateStore, verify_content

    store = HiddenStateStore(root)
    rows = store.scan_manifest().rows()
    t0 = time.perf_counter()
    res = verify_content(store.dir, rows.values())
    return time.perf_counter() - t0, res


def build_rerun(root: Path, files: int) -> None:
    """``files`` hard links of one small sample (hidden 64), listed in the manifest, then verified once."""
    import dataclasses

    from eagle3ops.store import HiddenStateStore, sample_header

    store = HiddenStateStore(root)
    head, total = sample_header(SEQ_LEN, NUM_STATES, 64, "bfloat16")
    proto = store.write_sample(0, head + os.urandom(total - len(head)), SEQ_LEN, fsync=False)
    for i in range(1, files):
        os.link(store.path(0), store.path(i))
    store.append_manifest([dataclasses.replace(proto, index=i) for i in range(files)])
    store.close()
    _, res = one_pass(root)
    assert res["verified"] + res["already_verified"] == files and not res["damaged"], res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rerun-files", type=int, default=20_000)
    ap.add_argument("--extrapolate-tb", type=float, default=4.6)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    from eagle3ops.store import sample_header
    from eagle3ops.store.layout import VERIFIED_NAME
    from eagle3ops.store.verified import read_record

    result = {
        "bench": "verify_content",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "files": args.files,
        "hidden": args.hidden,
    }
    times: dict[str, list[float]] = {"cold_first": [], "warm_first": [], "rerun": []}
    with tempfile.TemporaryDirectory(prefix="verify-content-", dir=args.dir) as tmp:
        root = Path(tmp) / "data"
        nbytes = build(root, args.files, args.hidden)
        result["bytes"] = nbytes
        result["filesystem_dir"] = tmp
        hs = root / "hidden_states"
        for _ in range(args.reps):
            for label, prepare in (("cold_first", evict), ("warm_first", warm)):
                (hs / VERIFIED_NAME).unlink(missing_ok=True)
                prepare(hs)
                secs, res = one_pass(root)
                assert res["verified"] == args.files and res["bytes_read"] == nbytes, res
                times[label].append(secs)
        small = Path(tmp) / "rerun"
        build_rerun(small, args.rerun_files)
        assert len(read_record(small / "hidden_states")[0]) == args.rerun_files
        for _ in range(args.reps):
            secs, res = one_pass(small)
            assert res["already_verified"] == args.rerun_files and res["bytes_read"] == 0, res
            times["rerun"].append(secs)
        shutil.rmtree(small)
    med = {k: statistics.median(v) for k, v in times.items()}
    per_file = sample_header(SEQ_LEN, NUM_STATES, args.hidden, "bfloat16")[1]
    cold_rate, warm_rate = nbytes / med["cold_first"], nbytes / med["warm_first"]
    rerun_us = med["rerun"] / args.rerun_files * 1e6
    big = args.extrapolate_tb * 1e12
    result.update(
        {
            "all": {k: [round(x, 4) for x in v] for k, v in times.items()},
            "cold_first_s": round(med["cold_first"], 3),
            "warm_first_s": round(med["warm_first"], 3),
            "cold_read_and_hash_MB_s": round(cold_rate / 1e6, 1),
            "warm_hash_MB_s": round(warm_rate / 1e6, 1),
            "rerun_files": args.rerun_files,
            "rerun_s": round(med["rerun"], 3),
            "rerun_us_per_file": round(rerun_us, 2),
            "extrapolated": {
                "store_TB": args.extrapolate_tb,
                "bytes_per_file": per_file,
                "files": int(big / per_file),
                "first_verification_min_at_cold_rate": round(big / cold_rate / 60, 1),
                "first_verification_min_at_warm_rate": round(big / warm_rate / 60, 1),
                "rerun_s": round(big / per_file * rerun_us / 1e6, 1),
            },
            "loadavg_end": os.getloadavg(),
        }
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or result_name("verify_content")
    (out / name).write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps({k: result[k] for k in ("cold_read_and_hash_MB_s", "warm_hash_MB_s", "rerun_us_per_file")})
    )
    print(json.dumps(result["extrapolated"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
