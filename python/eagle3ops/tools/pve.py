"""``eagle3ops pve``: read a Proxmox VE LXC config and preview the GPU passthrough change (writes nothing).

``eagle3ops pve show /etc/pve/lxc/129.conf`` prints its sections (main, ``[pve:pending]``, snapshots), keys
and raw ``lxc.*`` lines. ``eagle3ops pve plan /etc/pve/lxc/129.conf`` computes what the ``container`` phase
would change — ``pct set`` keys, raw lines added/removed in the main section, restart needed — from the
host's ``/dev/nvidia*`` and ``/proc/devices``, or offline from a copy of them
(``--dev-listing`` = output of ``stat -c '%n %Hr %Lr' /dev/nvidia* /dev/nvidia-caps/*``). The change itself
is made by ``ansible-playbook site.yml --tags container`` (roles/container).
"""

from __future__ import annotations

import difflib
import os
import re
import sys

from eagle3ops.command import CommandError, emit
from eagle3ops.host import pve, pve_devices


def register(subparsers) -> None:
    from eagle3ops.tools._options import PVE

    parsers = PVE.add_parser(subparsers)
    parsers["show"].set_defaults(func=_show)
    parsers["plan"].set_defaults(func=_plan)


def _read(path: str) -> pve.PveConfig:
    try:
        return pve.read_config(path)
    except pve.PveError as e:
        raise CommandError(str(e), config=path) from e


def _show(args) -> int:
    cfg = _read(args.config)
    res = {
        "config": args.config,
        "main": cfg.main.keys(),
        "raw": cfg.main.raw_lines(),
        "pending": cfg.section(pve.PENDING).keys() if cfg.section(pve.PENDING) else {},
        "snapshots": cfg.snapshots(),
    }
    human = "\n".join([f"{k}: {v}" for k, v in res["main"].items()] + res["raw"]
                      + [f"[pve:pending] {k}: {v}" for k, v in res["pending"].items()]
                      + [f"snapshot: {s}" for s in res["snapshots"]])  # fmt: skip
    emit(args, res, human)
    return 0


def _plan(args) -> int:
    cfg = _read(args.config)
    try:
        if args.gpus == "none":
            devices, majors = [], {}
        else:
            if args.dev_listing:
                with open(args.dev_listing, encoding="utf-8") as f:
                    devices = pve_devices.parse_dev_listing(f.read())
            else:
                devices = pve_devices.scan_dev(args.dev_root)
            with open(args.proc_devices, encoding="utf-8") as f:
                majors = pve_devices.parse_proc_devices(f.read())
            if not devices:
                raise CommandError(f"no NVIDIA device nodes in {args.dev_listing or args.dev_root}")
            pve_devices.check_devices(devices, majors, args.dev_root)
        gpus = (
            args.gpus
            if args.gpus in ("all", "none")
            else [int(x) for x in re.split(r"[,\s]+", args.gpus) if x]
        )
        selected = pve_devices.select_devices(devices, gpus)
        options = {}
        for kv in args.option:
            if "=" not in kv:
                raise CommandError(f"--option {kv!r}: expected KEY=VALUE")
            k, v = kv.split("=", 1)
            options[k] = v
        pl = pve.plan(int(re.sub(r"\D", "", os.path.basename(args.config)) or 0), cfg, options=options,
                      devices=selected, all_devices=devices, majors=majors, mode=args.mode,
                      running=args.running)  # fmt: skip
    except (OSError, pve.PveError) as e:
        raise CommandError(str(e), config=args.config) from e
    after = pl.apply_to(cfg)
    diff = "".join(difflib.unified_diff(cfg.main.render().splitlines(True), after.main.render().splitlines(True),
                                        f"{args.config} (main section)", "after"))  # fmt: skip
    res = {"changed": pl.changed, **pl.to_dict(), "diff": diff, "snapshots": cfg.snapshots(),
           "pct_set": pl.pct_set_argv()}  # fmt: skip
    for w in pl.warnings:
        print(f"warning: {w}", file=sys.stderr)
    emit(args, res, diff or "no change")
    return 0
