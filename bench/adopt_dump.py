"""Adopting a hidden-state dump in place, and the training loader with checks on first read (CPU only).

Three measurements, raw JSON to ``--out``:

1. ``small``: ``--files`` small SpecForge-layout ``.ckpt`` files (``torch.save`` dicts, T tokens, hidden 64, 3 aux +
   last, bf16) matched to an Arrow dataset of as many rows; ``survey`` + ``commit`` of
   :mod:`eagle3ops.store.adopt` without content checksums (metadata only), warm page cache. Goal: 20,000 files
   <= 60 s on the 2-core machine.
2. ``large``: ``--large-files`` files of ``--large-mib`` MiB each; every file's pages are dropped from the page
   cache (``posix_fadvise(DONTNEED)``) before each pass, then ``cat FILES > /dev/null`` and the adoption with
   content checksums (every byte: each zip member against its crc32) are timed alternately. Goal: cat seconds / adopt seconds
   >= 0.8 ("at the disk's read speed").
3. ``loader`` (+ ``reader``): speculators 0.9.0's own offline loader (``ArrowDataset`` + ``CollateFn`` in a torch ``DataLoader``,
   ``--workers`` workers) over a native store of ``--loader-rows`` rows, through the shim's reader with and
   without ``check_on_read`` (each checked pass starts with an empty ``verified.jsonl``: every file is hashed),
   alternately, ``--reps`` times. Goal: checked / unchecked samples per second >= 0.95. ``reader``: the same store
   read by :class:`eagle3ops.store.reader.StoreReader` alone in this process, the check's own cost per sample.

STAND-IN: the dumps' tensors are random (adoption reads metadata and bytes, never values).

Usage: .venv/bin/python bench/adopt_dump.py [--files 20000] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
SIDE = {"layer_ids": [2, 4, 5], "layer_convention": "input", "last_state": "pre-norm"}


def make_prepared(data: Path, token_rows: list) -> None:
    from datasets import Dataset

    ds = Dataset.from_dict(
        {
            "input_ids": token_rows,
            "loss_mask": [[1] * len(t) for t in token_rows],
            "seq_len": [len(t) for t in token_rows],
        }
    )
    ds.with_format("torch").save_to_disk(str(data))


def make_dump(dump: Path, n: int, t: int, h: int, seed: int) -> list:
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = []
    hs = torch.randn((t, 4, h), generator=g).to(torch.bfloat16)  # one tensor's bytes, many files
    for i in range(n):
        folder = dump / f"rows_{i // 2000 * 2000}-{i // 2000 * 2000 + 2000}"
        folder.mkdir(parents=True, exist_ok=True)
        ids = torch.randint(3, 30000, (t,), generator=g)
        torch.save(
            {"input_ids": ids, "loss_mask": torch.ones_like(ids),
             "aux_hidden_state": hs[:, :3].reshape(1, t, -1), "hidden_state": hs[:, 3][None].clone()},
            folder / f"data_{i}.ckpt",
        )  # fmt: skip
        rows.append(ids.tolist())
    (dump / "eagle3ops-dump.json").write_text(json.dumps(SIDE))
    return rows


def drop_cache(files: list[str]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def adopt_once(data: Path, dump: Path, h: int, checksum: bool) -> dict:
    from eagle3ops.store.adopt import commit, survey

    shutil.rmtree(data / "hidden_states", ignore_errors=True)
    t0 = time.perf_counter()
    s = survey(data, dump, run_layer_ids=[2, 4, 5], hidden_size=h, checksum=checksum)
    res = commit(s)
    return {"seconds": time.perf_counter() - t0, "adopted": res["adopted"], "bytes_read": res["bytes_read"]}


def bench_small(base: Path, n: int, t: int) -> dict:
    dump, data = base / "small_dump", base / "small_data"
    t0 = time.perf_counter()
    make_prepared(data, make_dump(dump, n, t, 64, 1))
    made = time.perf_counter() - t0
    from eagle3ops.store import dump as dump_mod

    files = dump_mod.list_files(dump)
    adopt_once(data, dump, 64, False)  # warm: page cache and imports
    run = adopt_once(data, dump, 64, False)
    return {"files": n, "tokens_per_file": t, "bytes": sum(os.path.getsize(f) for f in files),
            "make_seconds": round(made, 1), "adopt_no_checksum_s": round(run["seconds"], 3),
            "adopted": run["adopted"], "goal_s": 60}  # fmt: skip


def bench_large(base: Path, n: int, mib: int, reps: int) -> dict:
    dump, data = base / "large_dump", base / "large_data"
    t = 2048
    h = max(64, (mib << 20) // (t * 4 * 2))
    make_prepared(data, make_dump(dump, n, t, h, 2))
    from eagle3ops.store import dump as dump_mod

    files = dump_mod.list_files(dump)
    total = sum(os.path.getsize(f) for f in files)
    cat, adopt = [], []
    for _ in range(reps):
        drop_cache(files)
        t0 = time.perf_counter()
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
        cat.append(time.perf_counter() - t0)
        drop_cache(files)
        adopt.append(adopt_once(data, dump, h, True)["seconds"])
    c, a = statistics.median(cat), statistics.median(adopt)
    pairs = [
        round(x / y, 3) for x, y in zip(cat, adopt, strict=True)
    ]  # each rep's cat and adoption, back to back
    return {"files": n, "bytes": total, "hidden_size": h, "cat_s": cat, "adopt_checksum_s": adopt,
            "cat_mb_s": round(total / c / 1e6, 1), "adopt_mb_s": round(total / a / 1e6, 1),
            "ratio_cat_over_adopt": round(c / a, 3), "ratio_per_rep": pairs, "goal_ratio": 0.8}  # fmt: skip


def loader_pass(data: Path, check: bool, workers: int) -> float:
    import hs_connectors.transfer as transfer
    from eagle3ops.store.layout import VERIFIED_NAME
    from eagle3ops.train import speculators_shim
    from speculators.train import data as spec_data
    from torch.utils.data import DataLoader

    transfer.FileTransfer.get_cached = ORIG[0]
    spec_data.ArrowDataset._get_raw_data = ORIG[1]
    speculators_shim.install_store_reader(check_on_read=check)
    (data / "hidden_states" / VERIFIED_NAME).unlink(missing_ok=True)
    ds = spec_data.ArrowDataset(max_len=8192, datapath=str(data), on_missing="raise")
    dl = DataLoader(ds, batch_size=1, num_workers=workers, collate_fn=lambda b: b)
    t0 = time.perf_counter()
    n = sum(1 for b in dl for x in b if isinstance(x, dict))
    dt = time.perf_counter() - t0
    assert n == len(ds), (n, len(ds))
    return n / dt


ORIG: list = []


def bench_loader(base: Path, rows: int, workers: int, reps: int) -> dict:
    import hs_connectors.transfer as transfer
    from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier
    from speculators.train import data as spec_data

    ORIG[:] = [transfer.FileTransfer.get_cached, spec_data.ArrowDataset._get_raw_data]
    ver = make_tiny_verifier(base / "ver", hidden_size=256, num_layers=8)
    data = make_data_dir(base / "loader_data", ver, num_samples=rows, min_len=96, max_len=160, real=False)
    loader_pass(data, False, workers)  # warm the page cache
    plain, checked = [], []
    for _ in range(reps):
        plain.append(loader_pass(data, False, workers))
        checked.append(loader_pass(data, True, workers))
    p, c = statistics.median(plain), statistics.median(checked)
    return {"rows": rows, "hidden_size": 256, "workers": workers, "unchecked_samples_s": plain,
            "checked_samples_s": checked, "ratio_checked_over_unchecked": round(c / p, 3), "goal_ratio": 0.95}  # fmt: skip


def bench_reader(base: Path, reps: int) -> dict:
    """The check's own cost per sample: eagle3ops.store.reader.StoreReader.get over the loader's store in this
    process (no worker, no IPC: less noise than the loader), unchecked and checked alternately."""
    from eagle3ops.store.layout import VERIFIED_NAME
    from eagle3ops.store.reader import StoreReader

    hs = base / "loader_data" / "hidden_states"
    rows = sum(1 for n in os.listdir(hs) if n.endswith(".safetensors"))
    plain, checked = [], []
    for _ in range(reps):
        for check, out in ((False, plain), (True, checked)):
            (hs / VERIFIED_NAME).unlink(missing_ok=True)
            r = StoreReader(hs, check_on_read=check)
            t0 = time.perf_counter()
            for i in range(rows):
                r.get(i)
            r.flush()
            out.append(rows / (time.perf_counter() - t0))
    p, c = statistics.median(plain), statistics.median(checked)
    return {"rows": rows, "unchecked_samples_s": plain, "checked_samples_s": checked,
            "ratio_checked_over_unchecked": round(c / p, 3)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--large-files", type=int, default=24)
    ap.add_argument("--large-mib", type=int, default=16)
    ap.add_argument("--loader-rows", type=int, default=400)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--name", help="result file name (default adopt_dump_<date>_<card>.json)")
    ap.add_argument("--parts", default="small,large,loader", help="which of small, large, loader to run")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="adopt_bench_", dir=os.environ.get("BENCH_TMP")))
    try:
        out = {
            "bench": "adopt_dump",
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()},
            "small": bench_small(base, a.files, a.tokens) if "small" in a.parts else None,
            "large": bench_large(base, a.large_files, a.large_mib, a.reps) if "large" in a.parts else None,
            "loader": bench_loader(base, a.loader_rows, a.workers, a.reps),
            "reader": bench_reader(base, 2 * a.reps),
        }
        out["host"]["loadavg_end"] = os.getloadavg()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, a.name or result_name("adopt_dump")).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
