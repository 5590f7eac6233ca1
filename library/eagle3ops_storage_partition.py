#!/usr/bin/python
# The logic lives in python/eagle3ops/host/storage_probe.py (shipped as module_utils/eagle3ops_storage_probe.py).
# Why not /dev/disk/by-partlabel/... + ansible.builtin.wait_for: that is what this module does where udev runs
# (it prefers udev's link and waits for it). It exists for the hosts without udev (LXC containers, minimal
# hosts, the nspawn test hosts): there no by-partlabel link ever appears, and the node must be created from the
# device number the kernel announced in sysfs, which no builtin or collection module does.
from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3ops_storage_partition
short_description: Find the device node of a disk's partition; wait for udev, or create it where there is no udev
description:
  - Looks the partition up in sysfs, prefers udev's C(<disk>-partN) link, then any node with the same device
    number under C(/dev). Where udev does not run (containers, minimal hosts), creates C(/dev/<kname>) from
    the device number the kernel announced (reported as a change).
options:
  disk:
    description: The whole disk.
    type: path
    required: true
  number:
    description: Partition number.
    type: int
    default: 1
  timeout:
    description: Seconds to wait for the partition to appear.
    type: int
    default: 10
author: eagle3ops developers (@eagle3ops)
"""

EXAMPLES = r"""
- name: Partition device
  eagle3ops_storage_partition:
    disk: /dev/disk/by-id/nvme-EXAMPLE
  register: part
"""

RETURN = r"""
path:
  description: The partition's device node.
  returned: always
  type: str
kname:
  description: The kernel name (e.g. nvme1n1p1).
  returned: always
  type: str
created:
  description: Whether the node was (or, in check mode, would be) created.
  returned: always
  type: bool
"""

from ansible.module_utils.eagle3ops_host_options import STORAGE_PARTITION
from ansible.module_utils.eagle3ops_module import run_host_module
from ansible.module_utils.eagle3ops_storage_probe import StorageError, partition_path


def _partition(module):
    p = module.params
    res = partition_path(p["disk"], p["number"], create=not module.check_mode, timeout=p["timeout"])
    diff = {"before": "", "after": f"block node {res['path']} ({res['devnum']})\n"} if res["created"] else {}
    return {"changed": res["created"], "diff": diff, **res}


def main():
    run_host_module(
        STORAGE_PARTITION,
        _partition,
        (StorageError, OSError),
        context=lambda p: f"partition {p['number']} of {p['disk']}",
    )


if __name__ == "__main__":
    main()
