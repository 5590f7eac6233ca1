#!/usr/bin/python
# Thin module: the logic is eagle3ops.container, which plans with eagle3ops.pve (module_utils/eagle3ops_container.py
# and eagle3ops_pve.py are symlinks to them); this file is the adapter between AnsibleModule and container.converge.
# Why not community.proxmox.proxmox for the container itself: it needs an API token on the controller, while
# this phase runs `pct` on the PVE host over ssh (no API credentials to manage); and it cannot write raw `lxc.*`
# lines (cgroup device rules, mount entries for /dev/nvidia*) at all. Device passthrough (`devN:`) arrived in
# community.proxmox after 2.0.0 (PR #506): once a release with it is pinned in collections/requirements.yml, the
# `devN` half can be handed to it; the raw lxc.* lines (nvidia-uvm majors read on the host) stay here.
from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3ops_container_gpu
short_description: Pass every NVIDIA device of a Proxmox VE host into an LXC container, and set its options
description:
  - Runs on the PVE host (as root, or with become). Reads C(/etc/pve/lxc/<vmid>.conf), the host's
    C(/dev/nvidia*) nodes and their majors (C(stat) and C(/proc/devices); they change across kernels), and
    computes what must change.
  - Plain keys (C(cores), C(memory), C(features), C(mp0), ...) and C(devN) entries are applied with
    C(pct set). On PVE older than 8.1 the raw C(lxc.cgroup2.devices.allow) and C(lxc.mount.entry) lines are
    written into the main section of the config only, never into a C([snapshot]) section that follows it.
  - NVIDIA entries of the other mode, entries for nodes the host no longer has, and allow lines for majors
    no driver registers any more (the previous kernel's C(nvidia-uvm) major) are removed. Other entries are
    never touched.
  - A change that a running container only sees after a restart is reported as C(restart_needed); the
    container is restarted only with O(restart=true).
  - A running container whose bind mount point (C(mpN) with a host path, e.g. C(mp0) behind C(/data)) no
    longer shows what that host path is now (compared by device and inode through C(/proc/<pid>/root); the
    storage phase's cut-over renames the old directory and mounts the new disk there) is restarted, so that
    LXC binds the host path anew (O(on_stale_mount=restart)) - unless a pipeline job runs inside
    (O(busy_patterns)); then, or with O(on_stale_mount=fail), the module fails saying why and what to do.
  - Check mode predicts C(changed); diff mode shows the main section of the config before and after.
options:
  vmid:
    description: The container's id.
    type: int
    required: true
  options:
    description:
      - Plain config keys to enforce, as C(pct set) takes them (C(cores), C(memory), C(features), C(mp0), ...).
      - Property strings compare as sets (C(nesting=1,keyctl=1) equals C(keyctl=1,nesting=true)).
      - A bind mount point (C(mpN) whose volume is an absolute path) must exist on the host.
    type: dict
    default: {}
  gpus:
    description:
      - C(all), C(none), or a list of GPU indices (C(/dev/nvidiaN)). The shared nodes (C(nvidiactl),
        C(nvidia-uvm), C(nvidia-uvm-tools), C(nvidia-modeset), C(nvidia-caps/*)) come with any GPU.
    type: raw
    default: all
  passthrough:
    description:
      - C(dev) writes C(devN) entries (PVE >= 8.1); C(raw) the C(lxc.cgroup2.devices.allow) and
        C(lxc.mount.entry) lines; C(auto) picks from C(pveversion).
    type: str
    choices: [auto, dev, raw]
    default: auto
  dev_options:
    description: Extra options appended to every C(devN) entry, e.g. C(mode=0666) or C(uid=0,gid=44).
    type: str
    default: ""
  prune_unregistered_majors:
    description: Remove C(lxc.cgroup2.devices.allow) lines whose major no driver registers in C(/proc/devices).
    type: bool
    default: true
  restart:
    description: Restart a running container (C(pct stop) + C(pct start)) when a change needs it.
    type: bool
    default: false
  on_stale_mount:
    description:
      - What to do with a running container whose bind mount point no longer shows its host path.
      - C(restart) (C(pct stop) + C(pct start)), refused while a process matching O(busy_patterns) runs in
        the container; C(fail) never restarts and fails with the reason.
    type: str
    choices: [restart, fail]
    default: restart
  busy_patterns:
    description:
      - Regular expressions (Python, searched in the space-joined command line) of processes in the container
        that a restart must not kill. Default - the eagle3ops data-writing commands (prepare, regenerate,
        extract, extract-sglang, extract-verify, train, serve-convert, benchmark-*, and their former names
        sglang-extract, verify, convert; not the read-only ones such as extract-status or train-status) and the
        detached trainer (C(eagle3ops.speculators_shim)).
      - Add e.g. C(sglang\.launch_server) to keep a serving container from being restarted.
    type: list
    elements: str
  state:
    description: C(started) also starts a stopped container (after the config is right); C(present) leaves it.
    type: str
    choices: [present, started]
    default: present
  pct:
    description: Path of C(pct).
    type: path
    default: /usr/sbin/pct
  config_dir:
    description: Where the container configs live.
    type: path
    default: /etc/pve/lxc
  dev_root:
    description: Where to look for the NVIDIA device nodes (reported as under C(/dev)); for tests.
    type: path
    default: /dev
  proc_devices:
    description: The host's character-device majors; for tests.
    type: path
    default: /proc/devices
  driver_version_file:
    description: The host driver's version (compared with the user-space libraries found in the container).
    type: path
    default: /sys/module/nvidia/version
author: eagle3ops developers (@eagle3ops)
"""

EXAMPLES = r"""
- name: GPUs, data mount and sizes of container 129
  eagle3ops_container_gpu:
    vmid: 129
    options:
      cores: 64
      memory: 524288
      features: nesting=1
      mp0: /mnt/nvme-data,mp=/data
    gpus: all
  become: true
  register: ct

- name: Say when the running container still has the old config
  ansible.builtin.debug:
    msg: "{{ ct.restart_reason }}"
  when: ct.restart_needed
"""

RETURN = r"""
passthrough:
  description: The mode used (dev or raw).
  type: str
  returned: always
devices:
  description: The host's NVIDIA nodes passed through, with their majors and minors.
  type: list
  returned: always
  sample: [{path: /dev/nvidia0, major: 195, minor: 0}, {path: /dev/nvidia-uvm, major: 508, minor: 0}]
plan:
  description: What was (or in check mode would be) changed; C(set)/C(delete) via pct set, C(raw_add)/C(raw_remove) in the main section.
  type: dict
  returned: always
restart_needed:
  description: The running container sees the change only after a restart (and O(restart) was false).
  type: bool
  returned: always
restart_reason:
  description: Why, and what to do.
  type: str
  returned: always
restarted:
  description: The container was restarted (in check mode - would be).
  type: bool
  returned: always
stale_mounts:
  description: Bind mount points of the running container whose host path changed underneath it (before any restart).
  type: list
  returned: always
  sample: [{key: mp0, host_path: /data, mount_point: /data, host: [2049, 128], container: [64768, 1835009],
            container_source: "254:0 /data.old"}]
container_pid:
  description: The running container's init PID on the host (C(pct status --verbose)); null when unknown or stopped.
  type: int
  returned: always
started:
  description: The stopped container was started (O(state=started)).
  type: bool
  returned: always
status:
  description: The container's state after the module (running or stopped).
  type: str
  returned: always
host_driver_version:
  description: The NVIDIA driver version of the host (null when no driver is loaded).
  type: str
  returned: always
container_driver_versions:
  description: Versions of C(libnvidia-ml.so.*) found in the running container (empty when none or stopped).
  type: list
  returned: always
snapshots:
  description: Snapshot sections of the config (never edited).
  type: list
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_container import ContainerFailed, converge
from ansible.module_utils.eagle3ops_host_options import CONTAINER_GPU
from ansible.module_utils.eagle3ops_module import refuse_bad_values


class ModuleHost:
    """eagle3ops.container.Host on the AnsibleModule: its run_command, get_bin_path and warn."""

    def __init__(self, module):
        self.module = module

    def run(self, argv):
        return self.module.run_command(argv)

    def which(self, name):
        return self.module.get_bin_path(name)

    def warn(self, msg):
        self.module.warn(msg)


def main():
    module = AnsibleModule(argument_spec=CONTAINER_GPU.argument_spec(), supports_check_mode=True)
    refuse_bad_values(module, CONTAINER_GPU)
    try:
        result = converge(module.params, ModuleHost(module), check_mode=module.check_mode)
    except ContainerFailed as e:
        module.fail_json(msg=str(e), **e.fields)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
