#!/usr/bin/python
# The logic lives in python/eagle3ops/storage.py (shipped as module_utils/eagle3ops_storage.py).
# Why not ansible.posix.synchronize (delegated to the host itself, checksum + check mode for the verify pass):
# - the guard that makes `rsync --delete` safe must run in the same process right before rsync: the source must
#   still be the filesystem the migration started from and not empty (after a restart without the old disk,
#   /data is an empty directory, and synchronize would mirror that emptiness onto the new disk); a separate
#   stat/assert task before synchronize leaves a window and is one forgotten `when:` away from data loss;
# - each pass moves the migration's state file (copied -> verified) only when rsync exited 0 and, for verify and
#   quick, found zero differences; synchronize reports `changed`, not a difference count to fail on;
# - it runs on the PVE host over plain ssh, where synchronize's delegate-to-self path would need the host to
#   reach itself; the container connection (proxmox_pct_remote) is refused by synchronize altogether.
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
extends_documentation_fragment:
  - eagle3ops.storage_state
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

from ansible.module_utils.eagle3ops_host_options import STORAGE_SYNC
from ansible.module_utils.eagle3ops_module import run_host_module
from ansible.module_utils.eagle3ops_storage import StorageError, sync


def _sync(module):
    p = module.params
    result = sync(
        p["state_file"],
        p["mode"],
        check_mode=module.check_mode,
        allow_empty_source=p["allow_empty_source"],
        extra=p["rsync_opts"],
    )
    changes = result.get("changes") or []
    result["diff"] = {"prepared": "\n".join(changes[:200]) + ("\n" if changes else "")}
    return result


def main():
    run_host_module(STORAGE_SYNC, _sync, StorageError)


if __name__ == "__main__":
    main()
