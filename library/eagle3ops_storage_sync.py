#!/usr/bin/python
# The logic lives in python/eagle3ops/storage.py (shipped as module_utils/eagle3ops_storage.py).
from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3ops_storage_sync
short_description: Copy, verify or quick-check the old /data against the new filesystem (rsync), with guards
description:
  - Reads the paths from the migration state file and runs rsync from the data directory to the staging
    mount of the new filesystem.
  - O(mode=copy) runs C(rsync -aHAX --numeric-ids --partial --sparse --delete); it is resumable (re-run = rsync
    again) and moves the state to C(copied). O(mode=verify) is a checksum dry-run (C(rsync -c -n -i)) that
    must find no difference; it moves the state to C(verified). O(mode=quick) is the size+mtime dry-run
    done right before the cut-over.
  - Before any rsync it checks that the source is still the filesystem the migration started from and is
    not empty, and that the staging path is the new filesystem; it fails with what was found otherwise.
  - Check mode runs rsync with C(--dry-run) to predict the change.
options:
  state_file:
    description: The migration's state file.
    type: path
    default: /var/lib/eagle3ops/storage-state.json
  mode:
    description: Which pass to run.
    type: str
    choices: [copy, verify, quick]
    required: true
  allow_empty_source:
    description: Allow an empty source (only if the migration started from an empty one).
    type: bool
    default: false
  rsync_opts:
    description: Extra rsync options (e.g. C(--bwlimit=100M)); C(--bwlimit) is not applied to verification.
    type: list
    elements: str
    default: []
author: eagle3ops developers (@eagle3ops)
"""

EXAMPLES = r"""
- name: Copy the old data onto the new disk
  eagle3ops_storage_sync:
    mode: copy
- name: Verify with checksums
  eagle3ops_storage_sync:
    mode: verify
"""

RETURN = r"""
n_changes:
  description: Number of items rsync transferred or would transfer (copy).
  returned: mode=copy
  type: int
changes:
  description: The first 200 itemized rsync lines.
  returned: mode=copy
  type: list
  elements: str
n_differences:
  description: Number of differences found (verify, quick); the module fails when it is not 0.
  returned: mode=verify or mode=quick
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_storage import StorageError, sync


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_file=dict(type="path", default="/var/lib/eagle3ops/storage-state.json"),
            mode=dict(type="str", required=True, choices=["copy", "verify", "quick"]),
            allow_empty_source=dict(type="bool", default=False),
            rsync_opts=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = sync(
            p["state_file"],
            p["mode"],
            check_mode=module.check_mode,
            allow_empty_source=p["allow_empty_source"],
            extra=p["rsync_opts"],
        )
    except StorageError as e:
        module.fail_json(msg=str(e), **e.details)
    changes = result.get("changes") or []
    result["diff"] = {"prepared": "\n".join(changes[:200]) + ("\n" if changes else "")}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
