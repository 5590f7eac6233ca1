#!/usr/bin/python
# Thin module: the logic is eagle3ops.host.pve (module_utils/eagle3ops_pve.py is a symlink to it).
# Why not community.proxmox.proxmox for the container itself: it needs an API token on the controller, while
# this phase runs `pct` on the PVE host over ssh (no API credentials to manage); and it cannot write raw `lxc.*`
# lines (cgroup device rules, mount entries for /dev/nvidia*) at all. Device passthrough (`devN:`) arrived in
# community.proxmox after 2.0.0 (PR #506): once a release with it is pinned in collections/requirements.yml, the
# `devN` half can be handed to it; the raw lxc.* lines (nvidia-uvm majors read on the host) stay here.
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
        that a restart must not kill. Default - the eagle3ops data-writing commands (prepare, extract, train,
        convert, benchmark, regenerate, verify) and the detached trainer (C(eagle3ops.speculators_shim)).
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

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_pve import (
    PENDING,
    Plan,
    PveError,
    config_lock,
    mode_for_version,
    parse_pct_pid,
    parse_pct_status,
    parse_property_string,
    parse_pve_version,
    plan,
    read_config,
    write_config,
)
from ansible.module_utils.eagle3ops_pve_container import (
    DEFAULT_BUSY_PATTERNS,
    container_jobs,
    stale_bind_mounts,
)
from ansible.module_utils.eagle3ops_pve_devices import (
    check_devices,
    container_driver_versions,
    host_driver_version,
    parse_proc_devices,
    scan_dev,
    select_devices,
)

LIB_GLOB = (
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* /usr/lib/libnvidia-ml.so.*"
)


def pct_run(module, argv, what):
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"`{' '.join(argv)}` failed ({what}): {(err or out).strip()[-1500:]}", rc=rc)
    return out


def container_pid(module, pct, vmid):
    """The running container's init PID: `pct status --verbose`, else `lxc-info -p -H` (None when neither says)."""
    rc, out, _err = module.run_command([pct, "status", str(vmid), "--verbose"])
    pid = parse_pct_pid(out) if rc == 0 else None
    lxc_info = module.get_bin_path("lxc-info")
    if pid is None and lxc_info:
        rc, out, _err = module.run_command([lxc_info, "-n", str(vmid), "-p", "-H"])
        pid = int(out.strip()) if rc == 0 and out.strip().isdigit() else None
    return pid if pid and os.path.isdir(f"/proc/{pid}") else None


def restart(module, pct, vmid):
    pct_run(module, [pct, "stop", str(vmid)], "restart: stop")
    pct_run(module, [pct, "start", str(vmid)], "restart: start")


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
            on_stale_mount=dict(type="str", choices=["restart", "fail"], default="restart"),
            busy_patterns=dict(type="list", elements="str"),
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

    # A bind mount's host path that changed underneath the running container (the storage cut-over):
    # LXC bound the old directory at start, so the container keeps writing there until it restarts.
    pid = container_pid(module, pct, vmid) if running else None
    result.update(container_pid=pid, stale_mounts=[])
    if running and pid is None:
        module.warn(
            f"cannot tell whether container {vmid} still sees its bind mounts' host paths: `pct status {vmid} "
            "--verbose` (and lxc-info) gave no PID"
        )
    stale = stale_bind_mounts(config.main.keys(), pid) if pid else []
    result["stale_mounts"] = [s.to_dict() for s in stale]
    if stale:
        what = "; ".join(s.describe(vmid) for s in stale)
        paths = ", ".join(s.host_path for s in stale)
        if p["on_stale_mount"] == "fail":
            module.fail_json(
                msg=f"{what}. Everything written there inside the container lands in the old directory, not in "
                f"{paths}. Restart the container when nothing runs inside (pct reboot {vmid}), or set "
                "on_stale_mount: restart (proxmox_container_on_stale_mount: restart)",
                **result,
            )
        try:
            jobs = container_jobs(pid, p["busy_patterns"] or DEFAULT_BUSY_PATTERNS)
        except PveError as e:
            module.fail_json(msg=f"{what}. Not restarting container {vmid}: {e}", **result)
        if jobs:
            listed = "; ".join(f"PID {j} `{cmd[:200]}`" for j, cmd in jobs)
            module.fail_json(
                msg=f"{what}. Not restarting container {vmid} while pipeline jobs run inside (a restart kills "
                f"them): {listed}. They write into the old directory, not into {paths}: let them finish or stop "
                f"them (they resume after the restart), then re-run; or restart it yourself (pct reboot {vmid})",
                jobs=[{"pid": j, "cmdline": cmd} for j, cmd in jobs],
                **result,
            )
        if not module.check_mode:
            restart(module, pct, vmid)
            pid = container_pid(module, pct, vmid)
            left = stale_bind_mounts(read_config(path).main.keys(), pid) if pid else []
            if left:
                module.fail_json(
                    msg=f"container {vmid} was restarted but still: {'; '.join(s.describe(vmid) for s in left)}"
                    f". Check the mount point in /etc/pve/lxc/{vmid}.conf and `pct start {vmid} --debug`",
                    **result,
                )
            result["container_pid"] = pid
        result.update(changed=True, restarted=True)
        module.warn(
            f"container {vmid} restarted{' (check mode: would be)' if module.check_mode else ''}: {what}"
        )
        restart_needed = False

    if restart_needed and p["restart"]:
        if not module.check_mode:
            restart(module, pct, vmid)
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
