"""A real CUDA out-of-memory error in an extraction batch, on the GPU (users' pain 9): the run splits the batch,
goes on, writes every row, and says what fits.

tests/unit/extract/test_oom.py proves the logic with a stand-in error on the CPU; this runs the allocator's own
failure. A random-init Llama (hidden 2048, 16 layers, bf16; ``--tiny`` for a CPU smoke run of the script),
``--rows`` rows of ``--seq-len`` tokens:

1. reference: extraction with batches of 8 rows (``max_batch_tokens`` 8 x seq-len), no memory cap; its peak
   allocated GPU memory is measured;
2. capped: ``torch.cuda.set_per_process_memory_fraction`` holds the process to ``--headroom`` x that peak, and
   the same rows are extracted with every row in one planned batch. The larger batches fail in the allocator;
   the run must split them, write every row, and report ``oom_splits`` and the ``max_batch_tokens_used``.

Checks: every row written in both runs; at least one split; every file equal to the reference's (the batches
that finally run have the reference's shape, so the kernels are the same) or, if not byte-equal, the largest
difference reported. Times of both runs are recorded (the failed forwards are the cost of the cap).

Usage (GPU box): PYTHONPATH=python python3 bench/extract_oom_gpu.py --out "$OUT"
Writes OUT/extract_oom_gpu.json; exit 0 when every check held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def _run(data, model, device, **kw) -> dict:
    from eagle3ops.extract.session import ExtractConfig
    from eagle3ops.extract.transformers_backend import run_extraction

    t0 = time.perf_counter()
    r = run_extraction(
        ExtractConfig(data_dir=str(data), model_path=str(model), device=device, progress=False, **kw)
    )
    keep = ("written", "tokens", "oom_splits", "max_batch_tokens_used", "batches", "warnings")
    return {**{k: r.get(k) for k in keep}, "wall_s": round(time.perf_counter() - t0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument(
        "--headroom", type=float, default=1.3, help="the cap, as a multiple of the reference's peak"
    )
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from eagle3ops.store import HiddenStateStore
    from fp8_gpu import random_target  # the same random Llama and rows as the fp8 bench
    from safetensors.torch import load_file

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    hidden, layers, seq = (64, 8, 32) if args.tiny else (2048, 16, args.seq_len)
    rows = min(args.rows, 16) if args.tiny else args.rows
    res: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}
    res.update(rows=rows, seq_len=seq, hidden=hidden, layers=layers, headroom=args.headroom)
    with tempfile.TemporaryDirectory(prefix="oom-gpu-", dir="/var/tmp") as tmp:
        t = Path(tmp)
        ds = random_target(t / "model", rows, seq, args.tiny)
        for name in ("reference", "capped"):
            ds.save_to_disk(str(t / name))
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        res["reference"] = _run(
            t / "reference", t / "model", device, max_batch_tokens=8 * seq, max_batch_size=8
        )
        if cuda:
            peak = torch.cuda.max_memory_allocated()
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.empty_cache()
            frac = min(1.0, args.headroom * peak / total)
            torch.cuda.set_per_process_memory_fraction(frac)
            res["reference_peak_bytes"], res["cap_fraction"], res["cap_bytes"] = peak, frac, int(frac * total)
        res["capped"] = _run(
            t / "capped", t / "model", device, max_batch_tokens=rows * seq, max_batch_size=rows
        )
        a, b = HiddenStateStore(t / "reference"), HiddenStateStore(t / "capped")
        same, worst = 0, 0.0
        for i in range(rows):
            if a.path(i).read_bytes() == b.path(i).read_bytes():
                same += 1
                continue
            x = load_file(str(a.path(i)))["hidden_states"].float()
            y = load_file(str(b.path(i)))["hidden_states"].float()
            worst = max(worst, float((x - y).abs().max() / x.abs().max()))
        res["files_byte_equal"], res["largest_relative_difference"] = same, worst
    res["checks"] = {
        "all_written": res["reference"]["written"] == rows and res["capped"]["written"] == rows,
        "split": (res["capped"]["oom_splits"] or 0) >= 1 if cuda else True,
        "states_match": same == rows or worst < 1e-2,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / result_name("extract_oom_gpu")).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0 if all(res["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
