#!/usr/bin/python
# Thin module: the logic is eagle3ops.pve (module_utils/eagle3ops_pve.py is a symlink to it).
from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_lxc_gpu
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
  proxmox_lxc_gpu:
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
  description: The container was restarted.
  type: bool
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

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_pve import (
    PENDING,
    Plan,
    PveError,
    check_devices,
    config_lock,
    container_driver_versions,
    host_driver_version,
    mode_for_version,
    parse_pct_status,
    parse_proc_devices,
    parse_property_string,
    parse_pve_version,
    plan,
    read_config,
    scan_dev,
    select_devices,
    write_config,
)

LIB_GLOB = (
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* /usr/lib/libnvidia-ml.so.*"
)


def pct_run(module, argv, what):
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"`{' '.join(argv)}` failed ({what}): {(err or out).strip()[-1500:]}", rc=rc)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            options=dict(type="dict", default={}),
            gpus=dict(type="raw", default="all"),
            passthrough=dict(type="str", choices=["auto", "dev", "raw"], default="auto"),
            dev_options=dict(type="str", default=""),
            prune_unregistered_majors=dict(type="bool", default=True),
            restart=dict(type="bool", default=False),
            state=dict(type="str", choices=["present", "started"], default="present"),
            pct=dict(type="path", default="/usr/sbin/pct"),
            config_dir=dict(type="path", default="/etc/pve/lxc"),
            dev_root=dict(type="path", default="/dev"),
            proc_devices=dict(type="path", default="/proc/devices"),
            driver_version_file=dict(type="path", default="/sys/module/nvidia/version"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    vmid, pct = p["vmid"], p["pct"]
    path = os.path.join(p["config_dir"], f"{vmid}.conf")
    if not os.access(pct, os.X_OK):
        module.fail_json(
            msg=f"{pct} not found or not executable: is this the Proxmox VE host? (set the pct option)"
        )
    try:
        config = read_config(path)
        status = parse_pct_status(pct_run(module, [pct, "status", str(vmid)], "container state"))
        running = status == "running"

        mode = p["passthrough"]
        if mode == "auto":
            pveversion = module.get_bin_path("pveversion")
            text = module.run_command([pveversion])[1] if pveversion else ""
            mode = mode_for_version(parse_pve_version(text))

        gpus = p["gpus"]
        all_devices, majors = [], {}
        if gpus not in (None, "none", [], "", False):
            all_devices = scan_dev(p["dev_root"])
            with open(p["proc_devices"], encoding="utf-8") as f:
                majors = parse_proc_devices(f.read())
            if not all_devices:
                module.fail_json(
                    msg=f"no NVIDIA device nodes under {p['dev_root']} on this PVE host: load the driver "
                    "(nvidia-smi; nvidia-modprobe -u -c=0 creates /dev/nvidia-uvm) or set gpus: none"
                )
            check_devices(all_devices, majors, p["dev_root"])
        devices = select_devices(all_devices, gpus)

        options = {k: v for k, v in (p["options"] or {}).items() if v is not None}
        for key, value in options.items():
            if key.startswith("mp"):
                volume = parse_property_string(str(value)).get("_", "")
                if volume.startswith("/") and not os.path.isdir(volume):
                    module.fail_json(
                        msg=f"{key}: the host path {volume} does not exist on the PVE host: run the storage "
                        "phase first (ansible-playbook site.yml --tags storage) or fix the mount's host path"
                    )

        pl = plan(
            vmid, config, options=options, devices=devices, all_devices=all_devices, majors=majors, mode=mode,
            running=running, prune_unregistered=p["prune_unregistered_majors"], dev_options=p["dev_options"],
        )  # fmt: skip
    except PveError as e:
        module.fail_json(msg=str(e), config=path)

    after = pl.apply_to(config)
    result = dict(
        changed=pl.changed, passthrough=mode, plan=pl.to_dict(), snapshots=config.snapshots(), status=status,
        devices=[{"path": d.path, "major": d.major, "minor": d.minor} for d in devices], restarted=False,
        diff={"before": config.main.render(), "after": after.main.render(),
              "before_header": f"{path} (main section)", "after_header": f"{path} (main section)"},
    )  # fmt: skip
    for w in pl.warnings:
        module.warn(w)
    restart_needed = pl.restart_needed

    if pl.changed and not module.check_mode:
        argv = pl.pct_set_argv(pct)
        if argv:
            pct_run(module, argv, "applying the config keys")
        if pl.raw_add or pl.raw_remove:
            lock_dir = "/run/lock/lxc" if p["config_dir"] == "/etc/pve/lxc" else p["config_dir"]
            try:
                with config_lock(vmid, lock_dir):
                    current = read_config(path)  # pct set rewrote the file
                    raw = Plan(vmid=vmid, raw_add=pl.raw_add, raw_remove=pl.raw_remove)
                    write_config(path, raw.apply_to(current))
            except (OSError, PveError) as e:
                module.fail_json(msg=f"writing the raw lines into {path} failed: {e}", plan=pl.to_dict())
        try:
            verify = read_config(path)
            left = plan(
                vmid, verify, options=options, devices=devices, all_devices=all_devices, majors=majors, mode=mode,
                prune_unregistered=p["prune_unregistered_majors"], dev_options=p["dev_options"],
            )  # fmt: skip
        except PveError as e:
            module.fail_json(msg=f"re-reading {path} after the change failed: {e}")
        if left.changed:
            module.fail_json(
                msg=f"{path} still differs after pct set (pct ignored a change?)", left=left.to_dict()
            )
        # What PVE could not apply live waits in [pve:pending]; raw lines are read at start only.
        # (Check mode predicts from the keys PVE never hotplugs: Plan.restart_needed.)
        restart_needed = running and (
            verify.section(PENDING) is not None or bool(pl.raw_add or pl.raw_remove)
        )

    if restart_needed and p["restart"]:
        if not module.check_mode:
            pct_run(module, [pct, "stop", str(vmid)], "restart: stop")
            pct_run(module, [pct, "start", str(vmid)], "restart: start")
        result.update(changed=True, restarted=True)
        restart_needed = False
    result["started"] = False
    if p["state"] == "started" and status != "running":
        if not module.check_mode:
            pct_run(module, [pct, "start", str(vmid)], "starting the container")
            status = parse_pct_status(pct_run(module, [pct, "status", str(vmid)], "container state"))
            if status != "running":
                module.fail_json(
                    msg=f"`pct start {vmid}` returned but the container is {status}; see "
                    f"`pct start {vmid} --debug` or journalctl on the PVE host"
                )
        result.update(changed=True, started=True, status=status)
    result["restart_needed"] = restart_needed
    result["restart_reason"] = (
        f"container {vmid} is running with its old device/mount config (changes wait in [pve:pending] or in "
        f"raw lxc lines read at start): restart it (pct reboot {vmid}) or set restart: true "
        "(proxmox_container_restart: true)"
        if restart_needed
        else ""
    )
    if restart_needed:
        module.warn(result["restart_reason"])

    result["host_driver_version"] = host_driver_version(p["driver_version_file"])
    result["container_driver_versions"] = []
    if result["host_driver_version"] and status == "running":  # read-only: also in check mode
        rc, out, _err = module.run_command(
            [pct, "exec", str(vmid), "--", "sh", "-c", f"ls -1 {LIB_GLOB} 2>/dev/null; true"]
        )
        if rc == 0:
            result["container_driver_versions"] = container_driver_versions(out)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
