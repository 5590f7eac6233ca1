"""Training's loader with the check on first read (train ``verify: overlapped``) against the unchecked loader, CPU.

The question: does checking every file on its first read cost the loader less than 5 % of its samples per second?
Goal: checked / unchecked >= 0.95, as the median of >= 5 pairs, with the spread of the pairs.

speculators 0.9.0's own offline loader (``ArrowDataset`` in a torch ``DataLoader`` with ``--workers`` workers, the
shim's :class:`eagle3ops.store.reader.StoreReader` underneath: :func:`adopt_dump.loader_pass`) reads every row of
two stores of ``--rows`` rows (96-160 tokens, hidden 256, 3 aux + last, bf16; STAND-IN random states):

* ``native``: the store's own ``hs_{i}.safetensors`` files, checked against their manifest's xxh3-64;
* ``adopted``: the same samples as SpecForge-layout ``torch.save`` zips adopted in place without the content pass
  (``adopt_checksum: false``), checked against each zip's own crc32s.

Each checked pass starts with no ``verified.jsonl`` (every file is read and checked). A pair is one unchecked and
one checked pass back to back; the order alternates from pair to pair (a drifting load favours neither side); the
page cache is warm (the store is read once first): what is measured is the check's CPU cost, not the disk's.
The machine's load average is recorded per pass. Two ratios per pair: samples per wall second (what training
sees, noisy on a shared machine) and samples per CPU second of the loader's process and workers (``getrusage``:
the check's own cost, less sensitive to the other jobs).

Usage: .venv/bin/python bench/check_on_read.py [--pairs 7] [--rows 400] [--workers 1]
Raw JSON: bench/results/check_on_read_<date>_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))


def adopted_copy(data: Path, base: Path) -> Path:
    """``data``'s rows as a dump of ``.ckpt`` zips, adopted (metadata only) by a copy of ``data`` without states."""
    import torch
    from eagle3ops.store.adopt import commit, survey
    from safetensors.torch import load_file

    dump, out = base / "dump", base / "adopted_data"
    shutil.copytree(data, out, ignore=shutil.ignore_patterns("hidden_states"))
    (dump / "rows_0-2000").mkdir(parents=True)
    hs_dir = data / "hidden_states"
    n = sum(1 for x in os.listdir(hs_dir) if x.endswith(".safetensors"))
    for i in range(n):
        d = load_file(hs_dir / f"hs_{i}.safetensors")
        hs, t = d["hidden_states"], d["hidden_states"].shape[0]
        torch.save({"input_ids": d["token_ids"], "loss_mask": torch.ones_like(d["token_ids"]),
                    "aux_hidden_state": hs[:, :3].reshape(1, t, -1).clone(), "hidden_state": hs[:, 3][None].clone()},
                   dump / "rows_0-2000" / f"data_{i}.ckpt")  # fmt: skip
    (dump / "eagle3ops-dump.json").write_text(
        json.dumps({"layer_ids": [2, 4, 5], "layer_convention": "input", "last_state": "pre-norm"})
    )
    meta = json.loads((hs_dir / "extract_meta.json").read_text())
    (out / "hidden_states").mkdir()
    shutil.copy(hs_dir / "extract_meta.json", out / "hidden_states" / "extract_meta.json")
    res = commit(survey(out, dump, run_layer_ids=[2, 4, 5], hidden_size=meta["hidden_size"]))
    assert res["adopted"] == n, res
    return out


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the loader's workers, joined at the pass's end)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def spread(ratios: list[float]) -> dict:
    q = statistics.quantiles(ratios, n=4)
    return {"per_pair": ratios, "median": round(statistics.median(ratios), 3), "min": min(ratios),
            "max": max(ratios), "iqr": [round(q[0], 3), round(q[-1], 3)]}  # fmt: skip


def pairs(data: Path, n: int, workers: int) -> dict:
    """``n`` pairs; per pass, samples per wall second and per CPU second (the loader's process and workers: the
    check's cost with less of the other jobs' noise than wall time has on a shared machine)."""
    from adopt_dump import loader_pass

    loader_pass(data, False, workers)  # the page cache warm, the imports done
    record = data / "hidden_states" / "adopted.jsonl"
    rows = len(record.read_text().splitlines()) if record.exists() else None
    runs: dict[bool, list] = {False: [], True: []}
    loads = []
    for k in range(n):
        for check in (False, True) if k % 2 == 0 else (True, False):
            c0 = cpu_seconds()
            wall_rate = loader_pass(data, check, workers)
            cpu = cpu_seconds() - c0
            runs[check].append((wall_rate, cpu))
            loads.append(round(os.getloadavg()[0], 2))
    wall = [round(c[0] / p[0], 3) for p, c in zip(runs[False], runs[True], strict=True)]
    cpu = [round(p[1] / c[1], 3) for p, c in zip(runs[False], runs[True], strict=True)]
    return {"unchecked_samples_s": [round(r[0], 1) for r in runs[False]],
            "checked_samples_s": [round(r[0], 1) for r in runs[True]],
            "unchecked_cpu_s": [round(r[1], 3) for r in runs[False]], "checked_cpu_s": [round(r[1], 3) for r in runs[True]],
            "ratio_wall": spread(wall), "ratio_cpu": spread(cpu), "adopted_rows": rows,
            "loadavg_per_pass": loads}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--stores", default="native,adopted")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = ap.parse_args()
    import adopt_dump
    import hs_connectors.transfer as transfer
    from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier
    from speculators.train import data as spec_data

    adopt_dump.ORIG[:] = [transfer.FileTransfer.get_cached, spec_data.ArrowDataset._get_raw_data]
    base = Path(tempfile.mkdtemp(prefix="check_on_read_", dir=os.environ.get("BENCH_TMP")))
    out = {"bench": "check_on_read", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_start": os.getloadavg()},
           "rows": a.rows, "hidden_size": 256, "workers": a.workers, "goal_ratio": 0.95}  # fmt: skip
    try:
        ver = make_tiny_verifier(base / "ver", hidden_size=256, num_layers=8)
        native = make_data_dir(base / "native", ver, num_samples=a.rows, min_len=96, max_len=160, real=False)
        stores = {"native": native}
        if "adopted" in a.stores:
            stores["adopted"] = adopted_copy(native, base)
        for name in a.stores.split(","):
            out[name] = pairs(stores[name], a.pairs, a.workers)
            print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out["host"]["loadavg_end"] = os.getloadavg()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, f"check_on_read_{time.strftime('%Y-%m-%d')}_cpu.json").write_text(
        json.dumps(out, indent=2) + "\n"
    )
    print(
        json.dumps(
            {k: [out[k]["ratio_wall"]["median"], out[k]["ratio_cpu"]["median"]] for k in a.stores.split(",")}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
