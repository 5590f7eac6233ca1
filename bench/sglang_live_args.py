"""The command line of bench/sglang_live_lanes.py (the live SGLang run, issues #17 and #18): its argument parser.

Only the options and their defaults; ``--smoke`` shrinks the sizes in sglang_live.main().
"""

from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    """bench/sglang_live_lanes.py's options."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/live")
    ap.add_argument("--assets", default="/tmp/assets")
    ap.add_argument("--lanes", default="smol,demo")
    ap.add_argument("--budget-s", type=float, default=1500)
    ap.add_argument("--n-conv", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument(
        "--loadgen-requests", type=int, default=600, help="first turns the plain load generator sends"
    )
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--total-seq-len", type=int, default=8192)
    ap.add_argument("--train-timeout", type=int, default=300, help="training budget of each draft, seconds")
    ap.add_argument(
        "--reserve-s", type=float, default=560, help="seconds kept after training for the servers"
    )
    ap.add_argument("--checkpoint-freq", type=float, default=0.5, help="epochs between checkpoints")
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument(
        "--agreement-prompts", type=int, default=16, help="MT-bench prompts of the target-agreement check"
    )
    ap.add_argument("--agreement-tokens", type=int, default=64, help="greedy tokens per prompt of that check")
    ap.add_argument("--prepare-rows", choices=["turn", "conversation"], default="turn", help="prepare --rows")
    ap.add_argument("--prepare-workers", type=int, default=8, help="prepare --workers")
    ap.add_argument(
        "--heldout-prompts",
        type=int,
        default=64,
        help="held-out ShareGPT first turns measured at 3/1/4 (0: none)",
    )
    ap.add_argument(
        "--curve", default="", help="N,N,...: also drafts on the first N regenerated conversations"
    )
    ap.add_argument("--no-orig", action="store_true", help="no draft on the original answers")
    ap.add_argument(
        "--serve-configs",
        default="regen:3-1-4,orig:3-1-4,regen:5-1-6,wrong:3-1-4,broken:3-1-4",
        help="EAGLE3 servers started side by side (KEY:STEPS-TOPK-DRAFT; wrong/broken: the guard's bad copies); "
        "the curve's points are added at 3-1-4",
    )
    ap.add_argument("--smol-dir", default="", help="lane smol's work directory (default WORK/smol)")
    # with CUDA graphs the 135M target decodes at ~730 tok/s at batch 1 on the box (2026-12-01): all 80 MT-bench
    # first turns x 256 new tokens take ~30 s per batch-1 run; a server without graphs is measured on 24 x 128
    ap.add_argument("--mt-prompts", type=int, default=80)
    ap.add_argument("--bench-tokens", type=int, default=256)
    ap.add_argument("--bench-concurrency", type=int, default=8)
    ap.add_argument("--quiet-wait-s", type=float, default=150, help="how long measuring waits for lane demo")
    ap.add_argument("--offline-prompts", type=int, default=8)
    # the offline estimate at the benchmark's own length (2026-12-02: 64 tokens offline vs 256 on the server were not
    # comparable: acceptance rose with the answer's length)
    ap.add_argument("--offline-tokens", type=int, default=256)
    ap.add_argument("--offline-threads", type=int, default=10)
    ap.add_argument("--offline-device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--offline-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--playbook-need-s", type=float, default=330, help="the smol playbook stage runs if this is left"
    )
    ap.add_argument(
        "--guard-floor", type=float, default=1.3, help="serve_min_accept_length of the guard stage"
    )
    ap.add_argument(
        "--device", default="cuda", help="cpu: a local smoke run of the harness (stand-in server)"
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CPU dry run of the control flow here: the stand-in server (tests/fixtures) instead of SGLang, "
        "tiny sizes, the real 0.5.17 wheel's deepseek_v2.py + dist-info unpacked into --smoke-site for the patch "
        "(tests/.artifacts/sglang or EAGLE3OPS_SGLANG_WHEEL_0_5_17; pip download when neither has it)",
    )
    ap.add_argument("--smoke-site", default="/tmp/sgl017")
    ap.add_argument(
        "--mid",
        action="store_true",
        help="lane demo also measures the capture overhead on a "
        "realistic-width DeepSeek-V3-shaped target (bench/capture_target.py) in lane smol's GPU window",
    )
    ap.add_argument(
        "--mid-wait-s", type=float, default=150, help="how long lane smol's extraction waits for it"
    )
    return ap
