"""What the SGLang hook's finite check costs the forward stream on a real GPU, and whether a cheaper form agrees.

The hook (python/eagle3ops/sglang/hook.py, ``_queue_batch``) builds one block [tokens, K+1, H] of the batch's
states on the compute stream, then reduces one "all finite" flag a token beside it, also on the compute stream:
that reduction is GPU time the forward pass waits for. This script measures it with CUDA events, at the shapes
that matter, for each way of writing the flag, against the block build the hook already does:

  isfinite_all   ``torch.isfinite(block).flatten(1).all(dim=1)`` (the hook's first form: a bool temporary of the
                 block's size, then a reduction)
  aminmax        ``eagle3ops.sglang.hook_copy.rows_finite``, what the hook runs since 2026-12-07:
                 ``torch.aminmax(block.flatten(1), dim=1)``, then both ends finite (one read, no temporary:
                 NaN propagates through min/max, +Inf shows in the max, -Inf in the min)
  block_build    the two copies that build the block (the hook's own cost before the check, for scale)

Every form is first checked to give the same flags as ``isfinite_all`` on a block with NaN, +Inf and -Inf planted
in known rows (and in no others): a form that disagrees is reported and never timed.

Usage (GPU machine): PYTHONPATH=python python3 bench/hook_finite_gpu.py --out "$OUT"
Writes OUT/hook_finite_gpu.json. ``--tiny`` runs small shapes (CPU or GPU) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

# name, hidden, aux layers (the shapes of the project's targets: SmolLM2-135M, an 8B-class model, Kimi-K2.5)
SHAPES = [("smollm2-135m", 576, 3), ("8b-class", 4096, 3), ("kimi-k2.5", 7168, 3)]


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tiny", action="store_true")
    return ap.parse_args()


def isfinite_all(block):
    import torch

    return torch.isfinite(block).flatten(1).all(dim=1)


def aminmax(block):
    from eagle3ops.sglang.hook_copy import rows_finite  # what the hook runs now

    return rows_finite(block)


FORMS = {"isfinite_all": isfinite_all, "aminmax": aminmax}


def _agrees(form, device: str, dtype) -> tuple[bool, str]:
    """The form's flags equal isfinite_all's on a block with non-finite values planted in known rows."""
    import torch

    block = torch.randn((64, 4, 96), device=device).to(dtype)
    planted = {3: float("nan"), 17: float("inf"), 40: float("-inf")}
    for row, v in planted.items():
        block[row, row % 4, row] = v
    block[50, 0, 0], block[50, 3, 95] = float("inf"), float("-inf")  # both ends in one row
    want = isfinite_all(block)
    got = form(block)
    bad_rows = sorted(set(planted) | {50})
    expected = torch.ones(64, dtype=torch.bool, device=device)
    expected[bad_rows] = False
    ok = torch.equal(got, want) and torch.equal(want, expected)
    return ok, "" if ok else f"flags differ: got false at {torch.nonzero(~got).flatten().tolist()}"


def _time(fn, reps: int, device: str) -> list[float]:
    """Milliseconds of each of ``reps`` calls (CUDA events on the current stream; wall clock on CPU)."""
    import torch

    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def _summary(ms: list[float]) -> dict:
    return {
        "median_ms": round(statistics.median(ms), 4),
        "min_ms": round(min(ms), 4),
        "max_ms": round(max(ms), 4),
    }


def main() -> int:
    args = _parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    shapes, tokens = SHAPES, args.tokens
    if args.tiny:
        shapes, tokens, args.reps = [("tiny", 64, 3)], [256], 3
    agree = {name: _agrees(f, device, dtype) for name, f in FORMS.items()}
    rows = []
    for name, h, k in shapes:
        for n in tokens:
            aux = torch.randn((n, k * h), device=device).to(dtype)
            last = torch.randn((n, h), device=device).to(dtype)
            block = torch.empty((n, k + 1, h), dtype=dtype, device=device)

            def build(aux=aux, last=last, block=block, n=n, k=k, h=h):
                block[:, :k].copy_(aux.view(n, k, h))
                block[:, k].copy_(last)

            build()
            row = {"shape": name, "hidden": h, "aux_layers": k, "tokens": n, "block_bytes": block.numel() * 2}
            row["block_build"] = _summary(_time(build, args.reps, device))
            # interleaved: each form's reps alternate with the others', so a drift in the clock hits all alike
            times = {f: [] for f in FORMS if agree[f][0]}
            for _ in range(args.reps):
                for f in times:
                    times[f] += _time(lambda f=f, block=block: FORMS[f](block), 1, device)
            for f, ms in times.items():
                row[f] = _summary(ms)
                row[f]["per_1k_tokens_ms"] = round(statistics.median(ms) / n * 1000, 4)
                row[f]["vs_block_build"] = round(statistics.median(ms) / row["block_build"]["median_ms"], 3)
            rows.append(row)
            del aux, last, block
    res = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": "bfloat16",
        "reps": args.reps,
        "forms_agree": {f: {"ok": ok, "why": why} for f, (ok, why) in agree.items()},
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / result_name("hook_finite_gpu")).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0 if all(ok for ok, _ in agree.values()) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    sys.exit(main())
