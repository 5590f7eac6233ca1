"""``eagle3ops gpu-free``: wait until the GPUs' memory is free, stopping only allow-listed holders.

Exit 0 with ``free: true`` (or ``skipped: true`` with ``--gpu-optional`` on a host without the
NVIDIA driver); exit 2 with the full holder list when a GPU is still held after ``--timeout``.
"""

from __future__ import annotations

import sys

from eagle3ops.cli import CommandError, add_json_flag, emit


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "gpu-free",
        help="assert free VRAM on every (selected) GPU, naming and optionally stopping the holders",
        description=__doc__,
    )
    p.add_argument(
        "--gpus",
        default="all",
        help="'all' (default) or a comma-separated list of NVML indices and/or GPU UUIDs",
    )
    p.add_argument(
        "--threshold-mib", type=float, default=0, help="used MiB still counted as free (default 0)"
    )
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for free memory (default 60)")
    p.add_argument(
        "--poll-interval", type=float, default=0.1, help="seconds between NVML reads (default 0.1)"
    )
    p.add_argument("--grace", type=float, default=15, help="seconds between SIGTERM and SIGKILL (default 15)")
    p.add_argument(
        "--allow-unit",
        action="append",
        default=[],
        metavar="UNIT",
        help="systemd unit (glob) whose processes may be stopped; repeatable",
    )
    p.add_argument(
        "--allow-cmdline",
        action="append",
        default=[],
        metavar="REGEX",
        help="command-line regular expression whose processes may be stopped; repeatable",
    )
    p.add_argument(
        "--allow-run-id",
        action="append",
        default=[],
        metavar="ID",
        help="EAGLE3OPS_RUN_ID value (environment or command-line token) whose processes may be stopped",
    )
    p.add_argument("--check", action="store_true", help="report what would be stopped; stop nothing")
    p.add_argument(
        "--gpu-optional",
        action="store_true",
        help="without an NVIDIA driver, skip (exit 0, skipped: true) instead of failing",
    )
    p.add_argument(
        "--v1-allowance-mib",
        type=float,
        default=None,
        help="without NVML's v2 memory struct: MiB of v1 'used' taken as driver-reserved (default 1024)",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from eagle3ops import gpu

    try:
        allow = gpu.AllowList(
            units=args.allow_unit, cmdline_patterns=args.allow_cmdline, run_ids=args.allow_run_id
        )
        result = gpu.ensure_free(
            [g for g in args.gpus.split(",") if g.strip()],
            threshold_mib=args.threshold_mib,
            timeout_s=args.timeout,
            poll_s=args.poll_interval,
            grace_s=args.grace,
            allow=allow,
            check_mode=args.check,
            gpu_required=not args.gpu_optional,
            v1_allowance_mib=(
                gpu.DEFAULT_V1_RESERVED_ALLOWANCE_MIB
                if args.v1_allowance_mib is None
                else args.v1_allowance_mib
            ),
            log=lambda s: print(s, file=sys.stderr, flush=True),
        )
    except gpu.GpuFreeError as e:
        raise CommandError(str(e), **e.details) from e
    human = result["msg"]
    for g in result.get("gpus", []):
        human += (
            f"\n  GPU {g['index']} {g['name']}: used {g['used_mib']:.0f} / {g['total_mib']:.0f} MiB, "
            f"reserved {g['reserved_mib']:.0f} MiB ({g['memory_source']})"
        )
    emit(args, result, human)
    return 0
