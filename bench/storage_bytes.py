"""Bytes per token on disk and the fp8 option's accuracy cost (issue #9, target 4), CPU only.

On the demo target's real data (``make run`` leaves it in work/: the prepared Arrow set work/data, the target
work/demo/model), in one run:

  1. the bf16 store ``make run`` extracted (work/data/hidden_states): logical bytes (st_size) and allocated bytes
     (st_blocks: filesystem block rounding) per token, vs raw tensor bytes (hidden_states + token_ids, from each
     file's header); goal <= 1.01x;
  2. a fresh extraction of the same rows three ways with the real ``eagle3ops.extract.transformers_backend.run_extraction``:
     float32 (the reference: the CPU compute dtype), bfloat16 (the default) and float8_e4m3fn (the fp8 option);
     bytes per token of each, and the relative error ||x - ref|| / ||ref|| of bf16 and fp8 states per state slot
     (3 aux layers + pre-norm last), fp8 reconstructed the way speculators' loader does (hs_connectors
     FP8Transfer: ``fp8.to(bf16) * scale.to(bf16)``) and exactly (float32);
  3. the same byte ratio at the Kimi-K2.5 shape (hidden 7168, 3 aux + last, a 2048-token sample) from the real
     serialiser (zeros; sizes do not depend on values).

Usage: .venv/bin/python bench/storage_bytes.py [--data work/data] [--model work/demo/model] [--limit N]
Writes bench/results/storage_bytes_<date>_<card>.json (or --out DIR) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

ITEM = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I64": 8}


def store_bytes(data_dir: Path) -> dict:
    """Logical, allocated and raw tensor bytes of every listed sample of a store."""
    from eagle3ops.store import HiddenStateStore, read_safetensors_header

    store = HiddenStateStore(data_dir)
    entries = store.scan_manifest().entries
    logical = allocated = raw = tokens = 0
    for i, e in entries.items():
        p = store.path(i)
        st = p.stat()
        logical += st.st_size
        allocated += st.st_blocks * 512
        h = read_safetensors_header(p)
        for k, v in h.items():
            if k == "__metadata__":
                continue
            n = 1
            for d in v["shape"]:
                n *= d
            raw += n * ITEM[v["dtype"]]
        tokens += e.seq_len
    return {
        "samples": len(entries),
        "tokens": tokens,
        "dtype": (store.read_meta() or {}).get("dtype"),
        "raw_tensor_bytes": raw,
        "logical_bytes": logical,
        "allocated_bytes": allocated,
        "raw_bytes_per_token": round(raw / tokens, 2),
        "logical_bytes_per_token": round(logical / tokens, 2),
        "allocated_bytes_per_token": round(allocated / tokens, 2),
        "logical_over_raw": round(logical / raw, 4),
        "allocated_over_raw": round(allocated / raw, 4),
    }


def extract_copy(src: Path, model: Path, dst: Path, dtype: str, limit: int | None) -> dict:
    from eagle3ops.extract.session import ExtractConfig
    from eagle3ops.extract.transformers_backend import run_extraction

    dst.mkdir(parents=True)
    for f in src.iterdir():  # the prepared Arrow set only, not its hidden states
        if f.is_file():
            shutil.copy2(f, dst / f.name)
    t0 = time.perf_counter()
    r = run_extraction(
        ExtractConfig(
            data_dir=str(dst), model_path=str(model), dtype=dtype, device="cpu", limit=limit, progress=False
        )
    )
    return {"seconds": round(time.perf_counter() - t0, 2), "written": r["written"], "bytes": r["bytes"]}


def rel_errors(ref_dir: Path, other_dir: Path, dtype) -> dict:
    """Aggregate ||x - ref|| / ||ref|| per state slot and overall, plus the worst single sample."""
    import torch
    from eagle3ops.store import HiddenStateStore, load_sample

    ref, oth = HiddenStateStore(ref_dir), HiddenStateStore(other_dir)
    num = den = None
    worst = 0.0
    for i in sorted(ref.scan_manifest().indices()):
        a = load_sample(ref.path(i), torch.float32)["hidden_states"]
        b = load_sample(oth.path(i), dtype)["hidden_states"].float()
        d = ((b - a) ** 2).sum(dim=(0, 2))
        r = (a**2).sum(dim=(0, 2))
        num = d if num is None else num + d
        den = r if den is None else den + r
        worst = max(worst, float((d.sum() / r.sum()).sqrt()))
    per = (num / den).sqrt().tolist()
    return {
        "per_state": [round(x, 5) for x in per],
        "overall": round(float((num.sum() / den.sum()).sqrt()), 5),
        "worst_sample": round(worst, 5),
    }


def kimi_shape_ratio() -> dict:
    import torch
    from eagle3ops.store import quantize_fp8, sample_parts

    t, k, h = 2048, 4, 7168
    tok = torch.zeros(t, dtype=torch.int64)
    bf = torch.zeros(t, k, h, dtype=torch.bfloat16)
    nb = sum(len(p) for p in sample_parts(tok, bf))
    q, s = quantize_fp8(bf)  # sizes do not depend on the values
    n8 = sum(len(p) for p in sample_parts(tok, q, s))
    raw_bf = t * k * h * 2 + 8 * t
    return {
        "shape": [t, k, h],
        "bf16_bytes_per_token": round(nb / t, 2),
        "bf16_over_raw": round(nb / raw_bf, 5),
        "fp8_bytes_per_token": round(n8 / t, 2),
        "fp8_over_bf16": round(n8 / nb, 4),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO / "work" / "data"))
    ap.add_argument("--model", default=str(REPO / "work" / "demo" / "model"))
    ap.add_argument("--limit", type=int, default=None, help="only the first N rows for the fresh extractions")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    data, model = Path(args.data), Path(args.model)
    if not (data / "hidden_states").is_dir() or not model.is_dir():
        raise SystemExit(f"{data}/hidden_states or {model} missing: run `make run` (prepare + extract) first")
    result = {
        "bench": "storage_bytes",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "make_run_store": store_bytes(data),
    }
    with tempfile.TemporaryDirectory(prefix="storage-bench-") as tmp:
        runs = {}
        for dt in ("float32", "bfloat16", "float8_e4m3fn"):
            runs[dt] = extract_copy(data, model, Path(tmp) / dt, dt, args.limit)
            runs[dt].update(store_bytes(Path(tmp) / dt))
            print(f"{dt}: {runs[dt]['logical_bytes_per_token']} B/token on disk", file=sys.stderr)
        result["fresh"] = runs
        bf, f8 = runs["bfloat16"], runs["float8_e4m3fn"]
        result["fp8_over_bf16_logical"] = round(f8["logical_bytes"] / bf["logical_bytes"], 4)
        result["fp8_over_bf16_allocated"] = round(f8["allocated_bytes"] / bf["allocated_bytes"], 4)
        ref = Path(tmp) / "float32"
        result["rel_error_vs_float32"] = {
            "bfloat16": rel_errors(ref, Path(tmp) / "bfloat16", torch.float32),
            "fp8_as_speculators_reads_it_bf16": rel_errors(ref, Path(tmp) / "float8_e4m3fn", torch.bfloat16),
            "fp8_exact_float32": rel_errors(ref, Path(tmp) / "float8_e4m3fn", torch.float32),
        }
    result["kimi_shape"] = kimi_shape_ratio()
    result["goal_bytes_le_1_01_raw"] = result["make_run_store"]["logical_over_raw"] <= 1.01
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / result_name("storage_bytes")).write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                "make_run_logical_over_raw": result["make_run_store"]["logical_over_raw"],
                "make_run_allocated_over_raw": result["make_run_store"]["allocated_over_raw"],
                "fp8_over_bf16_logical": result["fp8_over_bf16_logical"],
                "kimi_fp8_over_bf16": result["kimi_shape"]["fp8_over_bf16"],
                "rel_error": {k: v["overall"] for k, v in result["rel_error_vs_float32"].items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
