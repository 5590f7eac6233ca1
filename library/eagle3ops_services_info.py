#!/usr/bin/python
# The logic lives in python/eagle3ops/services.py (shipped as module_utils/eagle3ops_services.py).
# Why not ansible.builtin.service_facts / systemd_service without a state for the unit part: service_facts
# lists loaded units only (a masked or not-found unit's UnitFileState and what occupies
# /etc/systemd/system/<unit> — file, link, mask — are not there), and globbed allow-lists (vllm*.service) need
# the unit files too; the role needs exactly that to decide whether mask would fail. The /proc scan for processes
# holding /dev/nvidia* open has no collection counterpart at all.
from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3ops_services_info
short_description: The GPU-grabbing systemd units of the services phase, their backups, and NVIDIA holders
description:
  - Expands unit names and glob patterns (C(vllm*.service)) into the units present on the host; names
    without a glob are kept even when no such unit is installed (masking them keeps a later install from
    starting).
  - For each unit returns its systemd states and what occupies C(/etc/systemd/system/<unit>)
    (C(absent), C(mask), C(file), C(link)); C(systemctl mask) fails when a unit file or link is there,
    so the role moves it aside first (the C(eagle3ops_services_backup) module of this project).
  - Also returns the units recorded in O(backup_dir) (what the services role's C(services_state=restored) acts on) and the
    other processes that hold C(/dev/nvidia*) open, read from C(/proc/*/fd).
  - On a host where systemd is not the init system (no C(/run/systemd/system)) nothing can start a unit, so
    RV(systemd_running) is false and no unit is returned.
  - Read-only; never changes anything.
options:
  units:
    description: Unit names or glob patterns; a name without a suffix means C(<name>.service).
    type: list
    elements: str
    default: []
  backup_dir:
    description: Where the phase keeps its per-unit state records and moved unit files.
    type: path
    default: /var/lib/eagle3ops/services
  holders:
    description: Scan C(/proc) for processes holding C(/dev/nvidia*) open (other than O(units)).
    type: bool
    default: true
author: eagle3ops developers (@eagle3ops)
"""

EXAMPLES = r"""
- name: Find the GPU units
  eagle3ops_services_info:
    units: [vllm.service, "sglang*.service"]
  register: services_info
"""

RETURN = r"""
systemd_running:
  description: Whether systemd is the init system of the host.
  returned: always
  type: bool
units:
  description: One entry per unit matched by O(units).
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: Unit name., type: str}
    load_state: {description: "systemd LoadState (loaded, masked, not-found).", type: str}
    active_state: {description: systemd ActiveState., type: str}
    unit_file_state: {description: "systemd UnitFileState (enabled, disabled, masked, static, ...).", type: str}
    fragment_path: {description: The unit file systemd loaded., type: str}
    etc_entry: {description: "What is at /etc/systemd/system/<unit>: absent, mask, file, link or other.", type: str}
    masked: {description: Whether the unit is masked., type: bool}
    running: {description: Whether the unit is active (or activating/deactivating)., type: bool}
    record: {description: The state recorded before the phase first changed the unit (or null)., type: dict}
    backup: {description: Path of the moved unit file in O(backup_dir) (or null)., type: str}
records:
  description: The same entries for every unit with a record in O(backup_dir).
  returned: always
  type: list
  elements: dict
holders:
  description: Processes outside O(units) holding /dev/nvidia* open (pid, comm, cmdline, unit, devices).
  returned: when O(holders=true)
  type: list
  elements: dict
"""

from ansible.module_utils.eagle3ops_host_options import SERVICES_INFO
from ansible.module_utils.eagle3ops_module import run_host_module
from ansible.module_utils.eagle3ops_services import ServicesError, gather


def _info(module):
    p = module.params
    return {"changed": False, **gather(p["units"], p["backup_dir"], holders=p["holders"])}


def main():
    run_host_module(SERVICES_INFO, _info, ServicesError)


if __name__ == "__main__":
    main()
