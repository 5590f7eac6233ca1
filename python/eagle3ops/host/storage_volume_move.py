"""The storage phase's move of a container's data mount onto a NEW PVE storage volume (``storage_target_volume:
local-lvm:500``): allocate it (``pvesm alloc``), make its filesystem (ext4, as PVE makes a container volume's;
on a zfspool a ``subvol`` dataset, bind-mounted, as PVE gives a container there), copy the old data onto it (rsync -aHAX, the phase's own command lines), verify by checksum (a dry-run with
``--checksum`` must list nothing), then switch the container's ``mpN`` to the new volume (``pct set``). The old
volume is never written: it is mounted read-only while it is copied and PVE keeps it as ``unusedN`` (the rollback:
``pct set <vmid> --mp0 <old volume>,mp=/data`` puts it back); an old host path stays where it is.

Refused before anything is allocated or copied, naming the thing: a target that is not ``<storage>:<GiB>``, a
storage that ``pvesm status`` does not list or that is not active, a target smaller than the data (both sizes
named) or a storage with less room than the data, a container that is not stopped (its volume would be mounted
twice), a container without that mount point. Resumable: the state file records the allocated volume and the
step (allocated, formatted, switched); a re-run reuses the volume (formatting it only if that had not finished),
copies again and verifies; once switched a re-run changes nothing. Standard library only (shipped as ``module_utils/eagle3ops_storage_volume_move.py``).
"""

from __future__ import annotations

import os
import re
import subprocess

try:
    from eagle3ops.host import _fs, pve, pve_volumes
    from eagle3ops.host import storage_rsync as _rsync
except ImportError:  # on the PVE host, as module_utils/eagle3ops_storage_volume_move.py
    from ansible.module_utils import eagle3ops_fs as _fs
    from ansible.module_utils import eagle3ops_pve as pve
    from ansible.module_utils import eagle3ops_pve_volumes as pve_volumes
    from ansible.module_utils import eagle3ops_storage_rsync as _rsync

CREATED_RE = re.compile(
    r"^successfully created '([^']+)'$", re.M
)  # `pvesm alloc`'s one line (src/PVE/CLI/pvesm.pm)


def _out(run, argv: list[str], what: str) -> str:
    rc, out, err = run(argv)
    if rc != 0:
        raise pve.PveError(f"`{' '.join(map(str, argv))}` failed ({what}): {(err or out).strip()[-500:]}")
    return out


def _sh(argv: list[str]) -> tuple[int, str, str]:
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


def _load(path: str) -> dict:
    return _fs.read_json(path) or {}


def _free_name(vmid: int, listed: list, config_dir: str, prefix: str = "vm") -> str:
    """The first ``<prefix>-<vmid>-disk-<n>`` no volume of the storage and no container config names."""
    taken = {v.volid.split(":", 1)[1] for v in listed}
    for name in sorted(os.listdir(config_dir)):
        if name.endswith(".conf"):
            with open(os.path.join(config_dir, name)) as f:
                taken |= set(re.findall(rf"{prefix}-{vmid}-disk-\d+", f.read()))
    return next(f"{prefix}-{vmid}-disk-{n}" for n in range(1000) if f"{prefix}-{vmid}-disk-{n}" not in taken)


def _mount(sh, dev: str, at: str, what: str, ro: bool = False) -> None:
    """A block device mounted, or a ZFS subvol (a dataset: a directory) bound, at ``at``."""
    how = ["--bind"] if os.path.isdir(dev) else []
    _out(sh, ["mount", *how, *(["-o", "ro"] if ro else []), dev, at], what)


def _mounted(path: str) -> bool:
    return any(m["target"] == os.path.normpath(path) for m in _fs.read_mounts())


def plan(p: dict, run) -> dict:
    """Read-only: where the data is now, where it goes, and what is refused (PveError). ``run(argv)`` -> (rc,
    stdout, stderr). The sizes are compared once the old data is measured (:func:`move`)."""
    vmid, key, target = p["vmid"], p["mount_point"], p["target"]
    conf = os.path.join(p["config_dir"], f"{vmid}.conf")
    keys = pve.read_config(conf).main.keys()
    if key not in keys:
        raise pve.PveError(
            f"container {vmid} has no {key} in {conf}: there is no data mount to move; nothing was moved"
        )
    current = keys[key]
    state = _load(p["state_file"])
    here = pve.parse_property_string(current).get("_")
    done = state.get("step") == "switched" and state.get("target") == target and here == state.get("volume")
    out = {"current": current, "state": state, "done": done}
    if done:
        return out
    kind, storage, size = pve_volumes.split_volume(target)
    if kind != "new":
        raise pve.PveError(
            f"storage_target_volume {target!r} must be <storage>:<size in GiB> (a new volume); nothing was moved"
        )
    status = pve_volumes.parse_pvesm_status(_out(run, [p["pvesm"], "status"], "storage status"))
    pve_volumes.check_volume("storage_target_volume", target, vmid, status, None, {})
    ct = pve.parse_pct_status(_out(run, [p["pct"], "status", str(vmid)], "container state"))
    if ct != "stopped":
        raise pve.PveError(
            f"container {vmid} is {ct}: its {key} is mounted inside it; stop it (pct shutdown {vmid}) and re-run; "
            "nothing was moved"
        )
    old_kind, _, _ = pve_volumes.split_volume(current)
    out.update(storage=status[storage], size=int(float(size) * 2**30), old_kind=old_kind)
    out["old_volume"] = pve.parse_property_string(current)["_"]
    return out


def _refuse_small(p: dict, pl: dict, need: int) -> None:
    old, size, st = pl["old_volume"], pl["size"], pl["storage"]
    if need > size:
        raise pve.PveError(
            f"storage_target_volume {p['target']} ({size} bytes) is smaller than the data on {old} ({need} bytes "
            "allocated): give a bigger size; nothing was moved"
        )
    if need > st.avail:
        raise pve.PveError(
            f"storage {st.name} ({st.type}) has {st.avail} bytes available (pvesm status), less than the data on "
            f"{old} ({need} bytes allocated); nothing was moved"
        )


def move(p: dict, run, *, check_mode: bool = False, sh=_sh) -> dict:
    """Allocate, copy, verify, switch (or, in check mode, say so after measuring the old data read-only)."""
    pl = plan(p, run)
    if pl["done"]:
        return {
            "changed": False,
            "volume": pl["state"]["volume"],
            "msg": f"{p['mount_point']} is {pl['current']} already",
        }
    source, ours = pl["old_volume"], []
    try:
        if pl["old_kind"] == "volume":  # the old volume, read-only: it is the rollback
            src = p["source_path"]
            if not _mounted(src):
                os.makedirs(src, exist_ok=True)
                dev = _out(run, [p["pvesm"], "path", source], "the old volume's path").strip()
                _mount(sh, dev, src, f"mount {source} read-only", ro=True)
                ours.append(src)
        else:
            src = source
        need = _rsync.tree_size(src)
        _refuse_small(p, pl, need)
        if check_mode:
            return {"changed": True, "bytes": need, "msg": f"would allocate {p['target']}, copy {need} bytes from "
                    f"{source}, verify and switch {p['mount_point']} of container {p['vmid']}"}  # fmt: skip
        state = pl["state"] if pl["state"].get("target") == p["target"] else {}
        storage = pl["storage"].name
        # on a zfspool a container's volume is a subvol (a dataset, no filesystem to make), as PVE allocates it
        subvol = pl["storage"].type == "zfspool"
        if not state.get("volume"):
            listed = pve_volumes.parse_pvesm_list(_out(run, [p["pvesm"], "list", storage], "volumes"))
            name = _free_name(p["vmid"], listed, p["config_dir"], "subvol" if subvol else "vm")
            size = f"{int(float(p['target'].split(':', 1)[1]) * 2**20)}"  # KiB, as pvesm alloc takes it
            fmt = ["--format", "subvol"] if subvol else []
            made = CREATED_RE.search(
                _out(run, [p["pvesm"], "alloc", storage, str(p["vmid"]), name, size, *fmt], "alloc")
            )
            if not made:
                raise pve.PveError(f"`pvesm alloc` did not say which volume it created ({storage}:{name})")
            state = {
                "target": p["target"],
                "volume": made.group(1),
                "old": pl["current"],
                "step": "formatted" if subvol else "allocated",
            }
            _fs.write_json(
                p["state_file"], state
            )  # before mkfs: a re-run reuses the volume, never allocates twice
        if state["step"] == "allocated":  # ours (recorded above): -F re-formats what an interrupted mkfs left
            dev = _out(run, [p["pvesm"], "path", state["volume"]], "the new volume's path").strip()
            _out(sh, ["mkfs.ext4", "-q", "-F", dev], f"mkfs.ext4 on {state['volume']}")
            state = {**state, "step": "formatted"}
            _fs.write_json(p["state_file"], state)
        dst = p["staging_path"]
        if not _mounted(dst):
            os.makedirs(dst, exist_ok=True)
            dev = _out(run, [p["pvesm"], "path", state["volume"]], "the new volume's path").strip()
            _mount(sh, dev, dst, f"mount {state['volume']}")
            ours.append(dst)
        res = _rsync.run_rsync(
            cmd := _rsync.rsync_command(src, dst, mode="copy", extra=p.get("rsync_opts") or [])
        )
        if res["rc"] != 0:
            raise pve.PveError(str(_rsync.rsync_failure(res, cmd, src=src, dst=dst)))
        res = _rsync.run_rsync(cmd := _rsync.rsync_command(src, dst, mode="verify"))
        if res["rc"] != 0 or res["changes"]:
            raise pve.PveError(
                f"the checksum verification of {state['volume']} against {source} found differences "
                f"({res['changes'][:5] or res['stderr'][-300:]}); nothing was switched: re-run"
            )
    finally:
        for m in reversed(ours):
            sh(["umount", m])
    props = pve.parse_property_string(pl["current"])
    rest = ",".join(f"{k}={v}" for k, v in props.items() if k not in ("_", "size"))
    value = ",".join(x for x in (state["volume"], rest, f"size={p['target'].split(':', 1)[1]}G") if x)
    _out(run, [p["pct"], "set", str(p["vmid"]), f"--{p['mount_point']}", value], f"switch {p['mount_point']}")
    _fs.write_json(p["state_file"], {**state, "step": "switched", "bytes": need})
    return {"changed": True, "volume": state["volume"], "old": pl["current"], "bytes": need, "value": value}
