"""``eagle3ops storage``: inspect the /data migration onto a new disk (read-only).

``eagle3ops storage plan --disk /dev/disk/by-id/X`` probes the disk and /data exactly like the Ansible
phase does and prints the steps a run would do, or the refusal (exit 2) naming what was found.
``eagle3ops storage status`` prints the migration's state file. The migration itself runs through
``ansible-playbook site.yml --tags storage`` (roles/storage).
"""

from __future__ import annotations

from eagle3ops.command import CommandError, emit
from eagle3ops.host import storage


def register(subparsers) -> None:
    from eagle3ops.host.options import STORAGE, STORAGE_PLAN, STORAGE_STATUS

    parsers = STORAGE.add_parser(subparsers)
    parsers[STORAGE_PLAN.name].set_defaults(func=_plan)
    parsers[STORAGE_STATUS.name].set_defaults(func=_status)


def _plan(args) -> int:
    from eagle3ops.host.options import STORAGE_PLAN

    try:  # the definition's options are plan()'s parameters, one to one
        res = storage.plan(**{o.name: getattr(args, o.name) for o in STORAGE_PLAN.options})
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
