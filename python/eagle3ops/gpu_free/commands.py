"""``eagle3ops gpu-free``: wait until the GPUs' memory is free, stopping only allow-listed holders (the options:
eagle3ops.gpu_free.options)."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, emit
from eagle3ops.gpu_free.options import GPU_FREE


def register(subparsers) -> None:
    GPU_FREE.add_parser(subparsers).set_defaults(func=run)


def run(args) -> int:
    from eagle3ops.gpu_free import check as gpu
    from eagle3ops.gpu_free.holders import AllowList
    from eagle3ops.gpu_free.nvml import GpuFreeError

    try:
        allow = AllowList(
            units=args.stop_units, cmdline_patterns=args.stop_cmdline_patterns, run_ids=args.stop_run_ids
        )
        result = gpu.ensure_free(
            [g for word in args.gpus for g in word.split(",") if g.strip()],
            threshold_mib=args.threshold_mib,
            timeout_s=args.timeout,
            poll_s=args.poll_interval,
            grace_s=args.stop_grace,
            allow=allow,
            check_mode=args.check,
            gpu_required=args.gpu_required,
            v1_allowance_mib=args.v1_reserved_allowance_mib,
            log=lambda s: print(s, file=sys.stderr, flush=True),
        )
    except GpuFreeError as e:
        raise CommandError(str(e), **e.details) from e
    human = result["msg"]
    for g in result.get("gpus", []):
        human += (
            f"\n  GPU {g['index']} {g['name']}: used {g['used_mib']:.0f} / {g['total_mib']:.0f} MiB, "
            f"reserved {g['reserved_mib']:.0f} MiB ({g['memory_source']})"
        )
    emit(args, result, human)
    return 0
