#!/usr/bin/python
# The logic lives in python/eagle3ops/storage.py (shipped as module_utils/eagle3ops_storage.py).
from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3ops_storage_state
short_description: Record a step of the /data migration in its state file (idempotent)
description:
  - Steps only move forward (preparing, prepared, cutover_started, cutover, cleaned); recording a step
    already reached changes nothing.
  - O(step=preparing) creates the state file from O(disk_info) and O(source) (the plan module's result).
  - O(step=prepared) reads the new filesystem's UUID from O(partition) and writes a marker file
    (C(.eagle3ops-storage.json)) into the root of the new filesystem, which must be mounted at the
    staging path.
options:
  step:
    description: The step reached.
    type: str
    required: true
    choices: [preparing, prepared, cutover_started, cutover, cleaned]
  disk_info:
    description: The plan module's C(disk) result (for O(step=preparing)).
    type: dict
  source:
    description: The plan module's C(source) result (for O(step=preparing)).
    type: dict
  partition:
    description: The new partition's device (for O(step=prepared)).
    type: path
  data_path:
    description: The data directory.
    type: path
    default: /data
  staging_path:
    description: The staging mount point.
    type: path
    default: /mnt/eagle3ops-storage-new
  old_path:
    description: The rollback location.
    type: path
    default: /data.old
  fstype:
    description: The filesystem type made.
    type: str
    default: xfs
  fstab:
    description: The fstab file used.
    type: path
    default: /etc/fstab
extends_documentation_fragment:
  - eagle3ops.storage_state
author: eagle3ops developers (@eagle3ops)
"""

EXAMPLES = r"""
- name: Record the cut-over
  eagle3ops_storage_state:
    step: cutover
"""

RETURN = r"""
state:
  description: The state file's content after this step.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_host_options import STORAGE_STATE
from ansible.module_utils.eagle3ops_storage import StorageError, load_state, record


def main():
    module = AnsibleModule(
        argument_spec=STORAGE_STATE.argument_spec(),
        required_if=[("step", "preparing", ("disk_info", "source")), ("step", "prepared", ("partition",))],
        supports_check_mode=True,
    )
    p = module.params
    create = None
    if p["step"] == "preparing":
        create = dict(
            disk_info=p["disk_info"],
            source=p["source"],
            data_path=p["data_path"],
            staging_path=p["staging_path"],
            old_path=p["old_path"],
            fstype=p["fstype"],
            fstab=p["fstab"],
        )
    try:
        before = load_state(p["state_file"])
        result = record(
            p["state_file"], p["step"], check_mode=module.check_mode, create=create, partition=p["partition"]
        )
    except StorageError as e:
        module.fail_json(msg=str(e), **e.details)
    diff = {
        "before": f"step: {before['step'] if before else '(no state file)'}\n",
        "after": f"step: {result['state']['step']}\n",
    }
    module.exit_json(changed=result["changed"], state=result["state"], diff=diff)


if __name__ == "__main__":
    main()
