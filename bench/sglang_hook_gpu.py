"""The SGLang dump hook on a real GPU: async pinned copies are correct, and what they cost the forward thread.

SGLang itself is not installed on the lent machine, so the hook is driven exactly as the patched
``deepseek_v2.py`` drives it (``capture_last(fb)(residual)`` then ``on_forward(model, fb, aux)``) with
stand-in ForwardBatch objects (tests/fixtures/sglang_standin.py) over CUDA tensors shaped like Kimi-K2.5's
(H = 7168, K = 3 aux layers, bf16), several requests of different lengths per batch.

Checks and measures:
  - correctness: every file's ``hidden_states`` equals the CUDA tensors that were handed in, although the
    source buffers are overwritten right after each ``on_forward`` returns (as SGLang reuses its buffers) —
    the stream ordering / record_stream / event logic must make that safe;
  - forward-thread cost: seconds spent inside the two hook calls per batch, vs a synchronous ``.cpu()``;
  - writer throughput (GB/s) to the local disk, the queue wait of the forward thread.

Usage (GPU machine, no internet): PYTHONPATH=python python3 bench/sglang_hook_gpu.py --out "$OUT" [--batches 24]
[--dtype float8_e4m3fn]  (fp8: the files are checked bit for bit against the CPU quantisation of what was handed in)
Writes OUT/sglang_hook_gpu_<date>_<card>[_fp8].json and prints a summary. ``--tiny`` runs a small CPU/GPU smoke version.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens-per-batch", type=int, default=16384)
    ap.add_argument("--work-dir", default=None, help="where the files go (default: a temp dir on local disk)")
    ap.add_argument(
        "--writers", type=int, default=4, help="the hook's writer threads (EAGLE3OPS_SGLANG_WRITERS)"
    )
    ap.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float8_e4m3fn"], help="the store dtype"
    )
    ap.add_argument("--tiny", action="store_true")
    return ap.parse_args()


def _request_plans(args, g) -> list[list[tuple[int, int]]]:
    """Request lengths per batch: several requests of different lengths summing to tokens_per_batch."""
    import torch

    plans, index = [], 0
    for _ in range(args.batches):
        lens, left = [], args.tokens_per_batch
        while left > 0:
            n = min(left, int(torch.randint(64, max(65, args.tokens_per_batch // 3), (1,), generator=g)))
            lens.append(n)
            left -= n
        plans.append([(index + j, n) for j, n in enumerate(lens)])
        index += len(lens)
    return plans


def _one_batch(hook, model, plan, bufs, expected: dict, device: str, k: int, h: int) -> tuple[float, float]:
    """Fill the buffers, take the reference synchronously, run the hook, clobber the buffers.
    Returns (seconds of the synchronous .cpu() copy, seconds inside the hook calls)."""
    import torch
    from eagle3ops.sglang.hook import make_rid
    from sglang_standin import StandInForwardBatch

    aux_buf, last_buf, ids_buf = bufs
    n = sum(x for _, x in plan)
    aux_buf[:n].normal_()
    last_buf[:n].normal_()
    ids_buf[:n].random_(0, 160000)
    # the reference, taken synchronously (also the "synchronous .cpu()" cost to compare with)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    ref_aux, ref_last, ref_ids = aux_buf[:n].cpu(), last_buf[:n].cpu(), ids_buf[:n].cpu()
    sync_s = time.perf_counter() - t0
    off = 0
    for idx, ln in plan:
        hs = torch.cat([ref_aux[off : off + ln].view(ln, k, h), ref_last[off : off + ln].view(ln, 1, h)], 1)
        expected[idx] = (ref_ids[off : off + ln].to(torch.int64), hs)
        off += ln
    fb = StandInForwardBatch(
        rids=[make_rid(i, ln) for i, ln in plan],
        extend_seq_lens_cpu=[ln for _, ln in plan],
        extend_prefix_lens_cpu=[0] * len(plan),
        input_ids=ids_buf[:n],
    )
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    cap = hook.capture_last(fb)
    cap(last_buf[:n])
    hook.on_forward(model, fb, aux_buf[:n])
    hook_s = time.perf_counter() - t0
    # SGLang reuses its buffers: clobber them right away (on the compute stream)
    aux_buf[:n].fill_(float("nan"))
    last_buf[:n].fill_(float("nan"))
    ids_buf[:n].fill_(-1)
    return sync_s, hook_s


def _verify(store, expected: dict, fp8: bool) -> tuple[list[int], int]:
    """The samples whose file differs from what was handed in (fp8: from its quantisation on the CPU, bit for
    bit, states and scales), and the bytes of all files."""
    import torch
    from eagle3ops.store.sample import FP8_SCALES_KEY, quantize_fp8
    from safetensors.torch import load_file

    bad = []
    total_bytes = 0
    for idx, (tok, hs) in expected.items():
        f = load_file(str(store.path(idx)))
        total_bytes += store.path(idx).stat().st_size
        if fp8:
            q, sc = quantize_fp8(hs)
            same = torch.equal(f["hidden_states"].view(torch.uint8), q.view(torch.uint8)) and torch.equal(
                f[FP8_SCALES_KEY], sc
            )
        else:
            same = torch.equal(f["hidden_states"], hs)
        if not (torch.equal(f["token_ids"], tok) and same):
            bad.append(idx)
    return bad, total_bytes


def main() -> int:
    args = _parse_args()
    import torch
    from eagle3ops.sglang.hook import DumpHook
    from eagle3ops.store import HiddenStateStore
    from safetensors.torch import load_file  # noqa: F401 - _verify's; a missing one fails before the run
    from sglang_standin import StandInModel

    if args.tiny:
        args.hidden, args.tokens_per_batch, args.batches = 256, 512, 4
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layers = [2, 30, 58]
    k, h = len(layers), args.hidden
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="e3o-sglang-hook-", dir="/var/tmp"))
    store = HiddenStateStore(work)
    store.ensure_meta(
        {
            "layer_ids": layers,
            "hidden_size": h,
            "dtype": args.dtype,
            "num_layers": 61,
            "model_fingerprint": "bench",
            "dataset_fingerprint": "bench",
            "backend": "sglang",
        }
    )
    hook = DumpHook(work, layers, fsync=False, writers=args.writers)
    model = StandInModel(layers)
    g = torch.Generator(device="cpu").manual_seed(0)

    plans = _request_plans(args, g)

    # reusable "SGLang buffers" on the device, overwritten after each forward
    n_max = args.tokens_per_batch
    aux_buf = torch.empty((n_max, k * h), dtype=torch.bfloat16, device=device)
    last_buf = torch.empty((n_max, h), dtype=torch.bfloat16, device=device)
    ids_buf = torch.empty((n_max,), dtype=torch.int32, device=device)
    expected = {}
    hook_seconds, sync_seconds = [], []
    t_all = time.perf_counter()
    for plan in plans:
        sync_s, hook_s = _one_batch(hook, model, plan, (aux_buf, last_buf, ids_buf), expected, device, k, h)
        sync_seconds.append(sync_s)
        hook_seconds.append(hook_s)
    hook.flush(timeout=3600)
    wall = time.perf_counter() - t_all
    hook.close()

    bad, total_bytes = _verify(store, expected, args.dtype == "float8_e4m3fn")
    tokens = sum(ln for plan in plans for _, ln in plan)
    res = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": args.dtype,
        "hidden": h,
        "aux_layers": k,
        "writers": hook.writers,
        "batches": len(plans),
        "samples": len(expected),
        "tokens": tokens,
        "bytes": total_bytes,
        "mismatched_samples": bad[:20],
        "correct": not bad and hook.stats.errors == 0,
        "hook_errors": hook.stats.errors,
        "hook_last_error": hook.stats.last_error,
        "hook_seconds_per_batch_median": sorted(hook_seconds)[len(hook_seconds) // 2],
        "sync_cpu_copy_seconds_per_batch_median": sorted(sync_seconds)[len(sync_seconds) // 2],
        "forward_thread_queue_wait_seconds": round(hook.stats.wait_seconds, 3),
        "wall_seconds": round(wall, 3),
        "write_gb_per_s": round(total_bytes / wall / 1e9, 3),
        "tokens_per_s_written": round(tokens / wall, 1),
        "work_dir": str(work),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / result_name("sglang_hook_gpu", None if args.dtype == "bfloat16" else "fp8")).write_text(
        json.dumps(res, indent=2) + "\n"
    )
    print(json.dumps(res, indent=2))
    if not args.work_dir:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if res["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
