"""The container phase on the Proxmox VE host: bring one LXC container's config and state to what is asked.

What :func:`converge` does, in order: read ``/etc/pve/lxc/<vmid>.conf`` and the container's state; find the
host's NVIDIA nodes and their majors; plan the change (:func:`eagle3ops.host.pve.plan`); apply it (``pct set`` for
keys and ``devN``, the raw ``lxc.*`` lines written into the main section under PVE's config lock) and check
that nothing is left; restart a running container whose bind mount no longer shows its host path (unless a
pipeline job runs inside); restart or start it when asked; report the driver versions of host and container.
Check mode computes the same result without running anything that changes the host.

**Standard library only** (it runs on the PVE host, where eagle3ops is not installed): the module
``library/eagle3ops_container_gpu.py`` imports it as ``module_utils/eagle3ops_container.py`` (a symlink to this
file) and is only the adapter: its parameters, check mode and a :class:`Host` built on its AnsibleModule in,
the result or :class:`ContainerFailed` (-> ``fail_json``) out. The config parsing and planning stay in
``eagle3ops.host.pve``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

try:
    from eagle3ops.host import options as _options
    from eagle3ops.host import pve, pve_container, pve_devices, pve_volumes
except ImportError:  # on the PVE host (module_utils/eagle3ops_container.py): eagle3ops is not installed
    from ansible.module_utils import eagle3ops_host_options as _options
    from ansible.module_utils import eagle3ops_pve as pve
    from ansible.module_utils import eagle3ops_pve_container as pve_container
    from ansible.module_utils import eagle3ops_pve_devices as pve_devices
    from ansible.module_utils import eagle3ops_pve_volumes as pve_volumes

# where the user-space NVML library of the container's driver is (its version is the file name's suffix)
LIB_GLOB = (
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* /usr/lib/libnvidia-ml.so.*"
)
# The module's parameters: its definition (eagle3ops.host.options.CONTAINER_GPU), from which
# library/eagle3ops_container_gpu.py builds its AnsibleModule; converge() takes the same names and fills in these
# defaults for a caller that leaves one out.
ARGUMENT_SPEC = _options.CONTAINER_GPU.argument_spec()


class ContainerFailed(Exception):
    """The phase cannot go on: ``str(e)`` says why and what to do; ``fields`` go into the failed result."""

    def __init__(self, msg: str, **fields):
        super().__init__(msg)
        self.fields = fields


class Host:
    """What converge needs of the PVE host besides files: run a command (no shell), find a program, warn.
    This one uses subprocess (the CLI, tests); the module passes one built on its AnsibleModule."""

    def __init__(self):
        self.warnings: list[str] = []

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        p = subprocess.run(argv, capture_output=True, text=True, check=False)
        return p.returncode, p.stdout, p.stderr

    def which(self, name: str) -> str | None:
        # as Ansible's get_bin_path: PATH, then the sbin directories (pct and pveversion live in /usr/sbin)
        path = os.pathsep.join([os.environ.get("PATH", ""), "/sbin", "/usr/sbin", "/usr/local/sbin"])
        return shutil.which(name, path=path)

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)


def _pct(host: Host, argv: list[str], what: str) -> str:
    rc, out, err = host.run(argv)
    if rc != 0:
        raise ContainerFailed(f"`{' '.join(argv)}` failed ({what}): {(err or out).strip()[-1500:]}", rc=rc)
    return out


def container_pid(host: Host, pct: str, vmid: int) -> int | None:
    """The running container's init PID: `pct status --verbose`, else `lxc-info -p -H` (None when neither says)."""
    rc, out, _err = host.run([pct, "status", str(vmid), "--verbose"])
    pid = pve.parse_pct_pid(out) if rc == 0 else None
    lxc_info = host.which("lxc-info")
    if pid is None and lxc_info:
        rc, out, _err = host.run([lxc_info, "-n", str(vmid), "-p", "-H"])
        pid = int(out.strip()) if rc == 0 and out.strip().isdigit() else None
    return pid if pid and os.path.isdir(f"/proc/{pid}") else None


def _restart(host: Host, pct: str, vmid: int) -> None:
    _pct(host, [pct, "stop", str(vmid)], "restart: stop")
    _pct(host, [pct, "start", str(vmid)], "restart: start")


def _devices(p: dict) -> tuple[list, dict]:
    """(every NVIDIA node of the host, {major: driver}) — nothing when no GPU is asked for."""
    if p["gpus"] in (None, "none", [], "", False):
        return [], {}
    all_devices = pve_devices.scan_dev(p["dev_root"])
    with open(p["proc_devices"], encoding="utf-8") as f:
        majors = pve_devices.parse_proc_devices(f.read())
    if not all_devices:
        raise ContainerFailed(
            f"no NVIDIA device nodes under {p['dev_root']} on this PVE host: load the driver "
            "(nvidia-smi; nvidia-modprobe -u -c=0 creates /dev/nvidia-uvm) or set gpus: none"
        )
    pve_devices.check_devices(all_devices, majors, p["dev_root"])
    return all_devices, majors


def _check_mounts(host: Host, p: dict, config, options: dict) -> dict:
    """The mount points of ``options`` checked before anything changes, and those the config already has
    dropped (a new volume PVE allocated compares equal to its ``<storage>:<size>``). A host path must exist; a
    storage volume must exist and be this container's (``pvesm``); a different ``mpN`` is replaced only with
    ``mp_replace``."""
    current = config.effective()
    out = dict(options)
    others = None
    for key, value in sorted(options.items()):
        if not pve.MP_KEY_RE.match(key):
            continue
        have = current.get(key)
        if pve_volumes.same_mount(have, str(value)):
            out.pop(key)
            continue
        if have is not None and not p["mp_replace"]:
            raise ContainerFailed(
                f"{key} of container {p['vmid']} is already {have!r}; the asked {key} is {value!r}. Not "
                f"replacing a mount point the container has: set mp_replace: true (container_mp_replace: true) "
                f"to replace it (run with --check --diff first to see the change), or ask for {have!r}. "
                "Nothing was changed",
                key=key, current=have, wanted=str(value),
            )  # fmt: skip
        kind, storage, _name = pve_volumes.split_volume(str(value))
        if kind == "path":
            if not os.path.isdir(storage):
                raise ContainerFailed(
                    f"{key}: the host path {storage} does not exist on the PVE host: run the storage "
                    "phase first (ansible-playbook site.yml --tags storage) or fix the mount's host path"
                )
            continue
        status = pve_volumes.parse_pvesm_status(_pct(host, [p["pvesm"], "status"], "storage status"))
        volumes = None
        if kind == "volume" and storage in status:
            volumes = pve_volumes.parse_pvesm_list(_pct(host, [p["pvesm"], "list", storage], "volumes"))
        if others is None:
            others = pve_volumes.other_configs(p["config_dir"], p["vmid"])
        pve_volumes.check_volume(key, str(value), p["vmid"], status, volumes, others)
    return out


def _apply(host: Host, p: dict, path: str, pl, replan) -> bool:
    """Apply the plan (pct set, then the raw lines under the config lock), check nothing is left; return
    whether the running container still waits for a restart ([pve:pending] or raw lines, read at start)."""
    vmid, pct = p["vmid"], p["pct"]
    argv = pl.pct_set_argv(pct)
    if argv:
        _pct(host, argv, "applying the config keys")
    if pl.raw_add or pl.raw_remove:
        lock_dir = "/run/lock/lxc" if p["config_dir"] == "/etc/pve/lxc" else p["config_dir"]
        try:
            with pve.config_lock(vmid, lock_dir):
                current = pve.read_config(path)  # pct set rewrote the file
                raw = pve.Plan(vmid=vmid, raw_add=pl.raw_add, raw_remove=pl.raw_remove)
                pve.write_config(path, raw.apply_to(current))
        except (OSError, pve.PveError) as e:
            raise ContainerFailed(
                f"writing the raw lines into {path} failed: {e}", plan=pl.to_dict()
            ) from None
    try:
        verify = pve.read_config(path)
        left = replan(verify)
    except pve.PveError as e:
        raise ContainerFailed(f"re-reading {path} after the change failed: {e}") from None
    if left.changed:
        raise ContainerFailed(
            f"{path} still differs after pct set (pct ignored a change?)", left=left.to_dict()
        )
    return verify.section(pve.PENDING) is not None or bool(pl.raw_add or pl.raw_remove)


def _stale_mounts(
    host: Host, p: dict, path: str, config, running: bool, check_mode: bool, result: dict
) -> bool:
    """A bind mount's host path that changed underneath the running container (the storage cut-over): LXC
    bound the old directory at start, so the container keeps writing there until it restarts. Restart it
    (unless a pipeline job runs inside, or on_stale_mount is fail); return whether it was restarted."""
    vmid, pct = p["vmid"], p["pct"]
    pid = container_pid(host, pct, vmid) if running else None
    result.update(container_pid=pid, stale_mounts=[])
    if running and pid is None:
        host.warn(
            f"cannot tell whether container {vmid} still sees its bind mounts' host paths: `pct status {vmid} "
            "--verbose` (and lxc-info) gave no PID"
        )
    stale = pve_container.stale_bind_mounts(config.main.keys(), pid) if pid else []
    result["stale_mounts"] = [s.to_dict() for s in stale]
    if not stale:
        return False
    what = "; ".join(s.describe(vmid) for s in stale)
    paths = ", ".join(s.host_path for s in stale)
    if p["on_stale_mount"] == "fail":
        raise ContainerFailed(
            f"{what}. Everything written there inside the container lands in the old directory, not in "
            f"{paths}. Restart the container when nothing runs inside (pct reboot {vmid}), or set "
            "on_stale_mount: restart (container_on_stale_mount: restart)",
            **result,
        )
    try:
        jobs = pve_container.container_jobs(pid, p["busy_patterns"] or pve_container.DEFAULT_BUSY_PATTERNS)
    except pve.PveError as e:
        raise ContainerFailed(f"{what}. Not restarting container {vmid}: {e}", **result) from None
    if jobs:
        listed = "; ".join(f"PID {j} `{cmd[:200]}`" for j, cmd in jobs)
        raise ContainerFailed(
            f"{what}. Not restarting container {vmid} while pipeline jobs run inside (a restart kills "
            f"them): {listed}. They write into the old directory, not into {paths}: let them finish or stop "
            f"them (they resume after the restart), then re-run; or restart it yourself (pct reboot {vmid})",
            jobs=[{"pid": j, "cmdline": cmd} for j, cmd in jobs],
            **result,
        )
    if not check_mode:
        _restart(host, pct, vmid)
        pid = container_pid(host, pct, vmid)
        left = pve_container.stale_bind_mounts(pve.read_config(path).main.keys(), pid) if pid else []
        if left:
            raise ContainerFailed(
                f"container {vmid} was restarted but still: {'; '.join(s.describe(vmid) for s in left)}"
                f". Check the mount point in /etc/pve/lxc/{vmid}.conf and `pct start {vmid} --debug`",
                **result,
            )
        result["container_pid"] = pid
    result.update(changed=True, restarted=True)
    host.warn(f"container {vmid} restarted{' (check mode: would be)' if check_mode else ''}: {what}")
    return True


def converge(params: dict, host: Host, check_mode: bool = False) -> dict:
    """Bring container ``params['vmid']`` to the asked config and state; the module's result (``changed``,
    ``plan``, ``diff``, ``restart_needed``, ...: library/eagle3ops_container_gpu.py's RETURN). Raises
    ContainerFailed saying what is wrong and what to do (also for a config or host file that cannot be read)."""
    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p.update(params)
    path = os.path.join(p["config_dir"], f"{p['vmid']}.conf")
    try:
        return _converge(p, path, host, check_mode)
    except pve.PveError as e:
        raise ContainerFailed(str(e), config=path) from None
    except OSError as e:
        raise ContainerFailed(f"{e.filename or path}: {e.strerror or e}", config=path) from None


def _converge(p: dict, path: str, host: Host, check_mode: bool) -> dict:
    vmid, pct = p["vmid"], p["pct"]
    if not os.access(pct, os.X_OK):
        raise ContainerFailed(
            f"{pct} not found or not executable: is this the Proxmox VE host? (set the pct option)"
        )
    config = pve.read_config(path)
    status = pve.parse_pct_status(_pct(host, [pct, "status", str(vmid)], "container state"))
    running = status == "running"
    mode = p["passthrough"]
    if mode == "auto":
        pveversion = host.which("pveversion")
        mode = pve.mode_for_version(pve.parse_pve_version(host.run([pveversion])[1] if pveversion else ""))
    all_devices, majors = _devices(p)
    devices = pve_devices.select_devices(all_devices, p["gpus"])
    options = {k: v for k, v in (p["options"] or {}).items() if v is not None}
    options = _check_mounts(host, p, config, options)

    def replan(cfg, running=False):
        have = cfg.effective()  # a new volume that PVE allocated is the <storage>:<size> asked for
        opts = {
            k: v for k, v in options.items()
            if not (pve.MP_KEY_RE.match(k) and pve_volumes.same_mount(have.get(k), str(v)))
        }  # fmt: skip
        return pve.plan(
            vmid, cfg, options=opts, devices=devices, all_devices=all_devices, majors=majors, mode=mode,
            running=running, prune_unregistered=p["prune_unregistered_majors"], dev_options=p["dev_options"],
        )  # fmt: skip

    pl = replan(config, running)

    after = pl.apply_to(config)
    result = dict(
        changed=pl.changed, passthrough=mode, plan=pl.to_dict(), snapshots=config.snapshots(), status=status,
        devices=[{"path": d.path, "major": d.major, "minor": d.minor} for d in devices], restarted=False,
        diff={"before": config.main.render(), "after": after.main.render(),
              "before_header": f"{path} (main section)", "after_header": f"{path} (main section)"},
    )  # fmt: skip
    for w in pl.warnings:
        host.warn(w)
    # check mode predicts from the keys PVE never hotplugs (Plan.restart_needed)
    restart_needed = pl.restart_needed
    if pl.changed and not check_mode:
        waits = _apply(host, p, path, pl, replan)
        restart_needed = running and waits

    if _stale_mounts(host, p, path, config, running, check_mode, result):
        restart_needed = False
    if restart_needed and p["restart"]:
        if not check_mode:
            _restart(host, pct, vmid)
        result.update(changed=True, restarted=True)
        restart_needed = False
    result["started"] = False
    if p["state"] == "started" and status != "running":
        if not check_mode:
            _pct(host, [pct, "start", str(vmid)], "starting the container")
            status = pve.parse_pct_status(_pct(host, [pct, "status", str(vmid)], "container state"))
            if status != "running":
                raise ContainerFailed(
                    f"`pct start {vmid}` returned but the container is {status}; see "
                    f"`pct start {vmid} --debug` or journalctl on the PVE host"
                )
        result.update(changed=True, started=True, status=status)
    result["restart_needed"] = restart_needed
    result["restart_reason"] = (
        f"container {vmid} is running with its old device/mount config (changes wait in [pve:pending] or in "
        f"raw lxc lines read at start): restart it (pct reboot {vmid}) or set restart: true "
        "(container_restart: true)"
        if restart_needed
        else ""
    )
    if restart_needed:
        host.warn(result["restart_reason"])

    result["host_driver_version"] = pve_devices.host_driver_version(p["driver_version_file"])
    result["container_driver_versions"] = []
    if result["host_driver_version"] and status == "running":  # read-only: also in check mode
        rc, out, _err = host.run(
            [pct, "exec", str(vmid), "--", "sh", "-c", f"ls -1 {LIB_GLOB} 2>/dev/null; true"]
        )
        if rc == 0:
            result["container_driver_versions"] = pve_devices.container_driver_versions(out)
    return result
