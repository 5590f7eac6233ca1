#!/usr/bin/python
# The logic lives in python/eagle3ops/storage.py (shipped as module_utils/eagle3ops_storage.py).
from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3ops_storage_plan
short_description: Decide (read-only) which steps of the /data migration onto a new disk this run must do
description:
  - Probes the new disk (sysfs, C(wipefs --no-act), C(blkid -p), mounts, holders, root disk), reads the
    migration state file and the current source (/data), and returns the list of steps still to do.
  - Refuses (fails, naming what was found and the device) a disk that is not blank unless O(force); a
    mounted, in-use, read-only or root disk is refused always.
  - Refuses to plan a copy from a /data that is empty, listed in fstab but not mounted, or not the
    filesystem the migration started from (a reboot or container restart where /data did not mount).
  - Changes nothing, in check mode or not.
options:
  disk:
    description: The new disk, by a stable name (C(/dev/disk/by-id/...)).
    type: path
    required: true
  data_path:
    description: The data directory to move onto the new disk.
    type: path
    default: /data
  staging_path:
    description: Where the new filesystem is mounted while copying.
    type: path
    default: /mnt/eagle3ops-storage-new
  old_path:
    description: Where the old data is kept as the rollback after the cut-over.
    type: path
    default: /data.old
  fstab:
    description: The fstab file consulted for /data.
    type: path
    default: /etc/fstab
  fstype:
    description: Filesystem to create.
    type: str
    default: xfs
  force:
    description: Accept a disk with a partition table, signatures or unknown data (it is wiped).
    type: bool
    default: false
  allow_empty_source:
    description: Allow migrating an empty data directory (a host with no data yet).
    type: bool
    default: false
  cleanup_old:
    description: Plan the removal of the rollback copy after the cut-over.
    type: bool
    default: false
  cutover:
    description: Cut over after the verification; false stops after it (copy now, cut over in a later run).
    type: bool
    default: true
  require_stable_name:
    description: Refuse kernel names such as C(/dev/nvme1n1) (they can change between boots).
    type: bool
    default: true
extends_documentation_fragment:
  - eagle3ops.storage_state
author: eagle3ops developers (@eagle3ops)
"""

EXAMPLES = r"""
- name: Plan the migration
  eagle3ops_storage_plan:
    disk: /dev/disk/by-id/nvme-SAMSUNG_MZQL27T6HBLA_S6CKNE0T123456
  register: plan
"""

RETURN = r"""
steps:
  description: Steps still to do, in order (prepare, mount_staging, copy, verify, cutover, mount, cleanup).
  returned: always
  type: list
  elements: str
disk:
  description: What was found on the disk (realpath, kname, partitions, signatures, mounts, holders, fingerprint).
  returned: always
  type: dict
source:
  description: Identity of the data directory (mount, filesystem UUID, is_mountpoint, entries, fstab entry).
  returned: always
  type: dict
state:
  description: The state file's content, or null before the first run.
  returned: always
  type: dict
wipe:
  description: Whether the disk carries signatures that must be wiped first (only with force).
  returned: when prepare is planned
  type: bool
partition:
  description: The partition device of an already prepared disk.
  returned: always
  type: str
fs_uuid:
  description: The new filesystem's UUID once prepared.
  returned: always
  type: str
"""

from ansible.module_utils.eagle3ops_host_options import STORAGE_PLAN
from ansible.module_utils.eagle3ops_module import run_host_module
from ansible.module_utils.eagle3ops_storage import StorageError, plan


def main():
    run_host_module(STORAGE_PLAN, lambda module: {"changed": False, **plan(**module.params)}, StorageError)


if __name__ == "__main__":
    main()
