"""``eagle3ops storage``: inspect the /data migration onto a new disk (read-only).

``eagle3ops storage plan --disk /dev/disk/by-id/X`` probes the disk and /data exactly like the Ansible
phase does and prints the steps a run would do, or the refusal (exit 2) naming what was found.
``eagle3ops storage status`` prints the migration's state file. The migration itself runs through
``ansible-playbook site.yml --tags storage`` (roles/storage).
"""

from __future__ import annotations

from eagle3ops.command import CommandError, add_json_flag, emit
from eagle3ops.host import storage

DEFAULT_STATE = "/var/lib/eagle3ops/storage-state.json"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "storage", help="inspect the /data migration onto a new disk", description=__doc__
    )
    sub = p.add_subparsers(dest="storage_command", metavar="ACTION")
    pl = sub.add_parser(
        "plan", help="probe the disk and /data; print the steps or the refusal (changes nothing)"
    )
    pl.add_argument("--disk", required=True, help="the new disk, by a stable name (/dev/disk/by-id/...)")
    pl.add_argument("--data-path", default="/data")
    pl.add_argument("--old-path", default="/data.old")
    pl.add_argument("--staging-path", default="/mnt/eagle3ops-storage-new")
    pl.add_argument("--state-file", default=DEFAULT_STATE)
    pl.add_argument("--fstab", default="/etc/fstab")
    pl.add_argument("--force", action="store_true", help="accept a disk that is not blank (as storage_force)")
    pl.add_argument("--allow-empty-source", action="store_true")
    pl.add_argument("--allow-kernel-name", action="store_true", help="accept /dev/sdX-style names")
    add_json_flag(pl)
    pl.set_defaults(func=_plan)
    st = sub.add_parser("status", help="print the migration's state file")
    st.add_argument("--state-file", default=DEFAULT_STATE)
    add_json_flag(st)
    st.set_defaults(func=_status)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _plan(args) -> int:
    try:
        res = storage.plan(
            disk=args.disk,
            data_path=args.data_path,
            old_path=args.old_path,
            staging_path=args.staging_path,
            state_file=args.state_file,
            fstab=args.fstab,
            force=args.force,
            allow_empty_source=args.allow_empty_source,
            require_stable_name=not args.allow_kernel_name,
        )
    except storage.StorageError as e:
        raise CommandError(str(e), **e.details) from e
    steps = res["steps"]
    human = f"{args.disk} -> {args.data_path}: " + (", ".join(steps) if steps else "nothing to do (migrated)")
    emit(args, res, human)
    return 0


def _status(args) -> int:
    try:
        state = storage.load_state(args.state_file)
    except storage.StorageError as e:
        raise CommandError(str(e)) from e
    if state is None:
        raise CommandError(f"no state file {args.state_file}: no migration has started on this host")
    history = ", ".join(f"{h['step']} {h['at']}" for h in state.get("history", []))
    emit(
        args,
        state,
        f"{state['disk']} -> {state['data_path']}: {state['step']} (UUID={state.get('fs_uuid')}); {history}",
    )
    return 0
