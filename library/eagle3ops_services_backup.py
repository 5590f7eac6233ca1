#!/usr/bin/python
# The logic lives in python/eagle3ops/services.py (shipped as module_utils/eagle3ops_services.py).
# Why not ansible.builtin.copy (force: false) + command with creates/removes: the move must keep a symlink a
# symlink and a file byte-exact with mode, owner and times (copy follows links and resets times), the record
# must be written once and never overwritten (first record wins), and restore must refuse to overwrite a
# different file at the destination; as separate tasks each of these is a condition someone can drop.
from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3ops_services_backup
short_description: Record a systemd unit's state, move its unit file out of /etc/systemd/system, put it back
description:
  - The part of masking a unit that M(ansible.builtin.systemd_service) cannot do.
    C(systemctl mask) writes a symlink to /dev/null at C(/etc/systemd/system/<unit>) and fails when a
    hand-installed unit file (or a C(systemctl link) symlink) is there.
  - O(state=recorded) writes C(<backup_dir>/<unit>.json) with the unit's state (enabled, active, masked)
    unless a record exists; the first record wins, so re-runs never overwrite the original state.
  - O(state=aside) moves C(/etc/systemd/system/<unit>) to C(<backup_dir>/<unit>.unit) byte-exact (mode,
    owner and times kept; a symlink stays a symlink). Run C(daemon-reload) and mask afterwards.
  - O(state=restored) puts the moved file back byte-exact and removes the backup; the path must be free
    (unmask first) or hold the identical file; a different file there is never overwritten.
  - O(state=forgotten) removes the record after a completed restore.
options:
  unit:
    description: The unit name (no glob).
    type: str
    required: true
  state:
    description: What to do (see the description).
    type: str
    required: true
    choices: [recorded, aside, restored, forgotten]
  backup_dir:
    description: Where the records and moved unit files are kept.
    type: path
    default: /var/lib/eagle3ops/services
author: eagle3ops developers (@eagle3ops)
"""

EXAMPLES = r"""
- name: Record vllm.service's state before the phase changes it
  eagle3ops_services_backup:
    unit: vllm.service
    state: recorded

- name: Move the hand-installed unit file aside so that it can be masked
  eagle3ops_services_backup:
    unit: vllm.service
    state: aside
"""

RETURN = r"""
record:
  description: The unit's recorded state (O(state=recorded)).
  returned: when O(state=recorded)
  type: dict
path:
  description: The path under /etc/systemd/system acted on.
  returned: when O(state) is C(aside) or C(restored)
  type: str
backup:
  description: The backup file in O(backup_dir).
  returned: when O(state) is C(aside) or C(restored)
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_host_options import SERVICES_BACKUP
from ansible.module_utils.eagle3ops_services import (
    ServicesError,
    backup_path,
    forget,
    move_aside,
    read_record,
    record,
    record_path,
    restore,
)


def main():
    module = AnsibleModule(
        argument_spec=SERVICES_BACKUP.argument_spec(),
        supports_check_mode=True,
    )
    p = module.params
    unit, bdir, check = p["unit"], p["backup_dir"], module.check_mode
    if "/" in unit or unit in (".", ".."):
        module.fail_json(msg=f"unit {unit!r} is not a unit name; give a name like vllm.service")
    try:
        if p["state"] == "recorded":
            changed, rec = record(unit, bdir, check=check)
            diff = {"before": "", "after": f"{record_path(unit, bdir)}\n"} if changed else None
            module.exit_json(changed=changed, record=rec, **({"diff": diff} if diff else {}))
        if p["state"] == "aside":
            r = move_aside(unit, bdir, check=check)
            diff = {
                "before": f"{r['src']}: {r['kind']}\n",
                "after": f"{r['src']}: absent (moved to {r['backup']})\n",
            }
            module.exit_json(
                changed=r["changed"],
                path=r["src"],
                backup=r["backup"],
                **({"diff": diff} if r["changed"] else {}),
            )
        if p["state"] == "restored":
            r = restore(unit, bdir, check=check)
            diff = {"before": f"{r['dst']}: absent\n", "after": f"{r['dst']}: restored from {r['backup']}\n"}
            module.exit_json(
                changed=r["changed"],
                path=r["dst"],
                backup=r["backup"],
                **({"diff": diff} if r["changed"] else {}),
            )
        if read_record(unit, bdir) is None and not os.path.lexists(backup_path(unit, bdir)):
            module.exit_json(changed=False)
        changed = forget(unit, bdir, check=check)
        module.exit_json(changed=changed)
    except ServicesError as e:
        module.fail_json(msg=str(e))
    except OSError as e:
        module.fail_json(msg=f"{unit}: {e}; check {bdir} and /etc/systemd/system")


if __name__ == "__main__":
    main()
