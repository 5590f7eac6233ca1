"""The storage phase's source on a PVE storage volume: the container's /data lives in a volume (``ceph-rbd:vm-129-
disk-1``, an LVM-thin or ZFS volume), not in a host directory. The volume is mounted at the data path on the PVE
host, and from there the phase is the one it is for a disk: copy, verify by checksum, cut over (the volume is
unmounted from the data path and mounted at the rollback path, the new disk mounted at the data path by UUID), so
the old volume is the rollback. The container phase then points ``mp0`` at the host path
(``container_mp_replace: true``); PVE keeps the volume as ``unusedN``.

Refused before anything is mounted, naming the thing: a volume that ``pvesm`` does not list, that another guest
owns or another container's config names; a running owner container (its volume would be mounted twice, inside
it and on the host: that corrupts a filesystem); a volume with no device node (an inactive LV, an unmapped RBD
image); something else mounted at the data path, or files in it that the mount would hide. Standard library
only (shipped as ``module_utils/eagle3ops_storage_volume.py``).
"""

from __future__ import annotations

import os

try:
    from eagle3ops.host import _fs, pve, pve_volumes
    from eagle3ops.host import storage as _storage
except ImportError:  # on the PVE host, as module_utils/eagle3ops_storage_volume.py
    from ansible.module_utils import eagle3ops_fs as _fs
    from ansible.module_utils import eagle3ops_pve as pve
    from ansible.module_utils import eagle3ops_pve_volumes as pve_volumes
    from ansible.module_utils import eagle3ops_storage as _storage


def _out(run, argv: list[str], what: str) -> str:
    rc, out, err = run(argv)
    if rc != 0:
        raise pve.PveError(f"`{' '.join(argv)}` failed ({what}): {(err or out).strip()[-500:]}")
    return out


def plan_source_volume(p: dict, run, mounts: list[dict] | None = None) -> dict:
    """What the storage phase must do to read the old data from the volume ``p['volume']`` of container
    ``p['vmid']`` at ``p['data_path']``: ``action`` ``mount`` (with ``device``, ``fstype``, ``opts``) or ``none``
    (with ``why``). ``run(argv)`` -> (rc, stdout, stderr). Raises PveError naming what is refused."""
    volume, vmid, data_path = p["volume"], p["vmid"], os.path.normpath(p["data_path"])
    state = _storage.load_state(p["state_file"])
    step = (state or {}).get("step")
    if step and _storage.step_index(step) >= _storage.step_index("cutover_started"):
        return {"action": "none", "why": f"the cut-over is {step}: {volume} is the rollback copy now"}
    kind, storage, _name = pve_volumes.split_volume(volume)
    if kind != "volume":
        raise pve.PveError(
            f"storage_source_volume {volume!r} must name an existing PVE volume (<storage>:vm-<vmid>-disk-<n>); "
            "nothing was mounted"
        )
    status = pve_volumes.parse_pvesm_status(_out(run, [p["pvesm"], "status"], "storage status"))
    listed = None
    if storage in status:
        listed = pve_volumes.parse_pvesm_list(_out(run, [p["pvesm"], "list", storage], "volumes"))
    pve_volumes.check_volume(
        "storage_source_volume",
        volume,
        vmid,
        status,
        listed,
        pve_volumes.other_configs(p["config_dir"], vmid),
    )
    ct = pve.parse_pct_status(_out(run, [p["pct"], "status", str(vmid)], "container state"))
    if ct != "stopped":
        raise pve.PveError(
            f"container {vmid} is {ct}: {volume} is mounted inside it, and mounting it on the host as well "
            f"can corrupt its filesystem. Stop it (pct shutdown {vmid}), re-run, then let the container phase "
            "start it on the new /data; nothing was mounted"
        )
    device = _out(run, [p["pvesm"], "path", volume], "the volume's path").strip()
    is_dir = os.path.isdir(device)  # a ZFS subvol is a dataset directory; the others are block devices
    if not is_dir and not os.path.exists(device):
        raise pve.PveError(
            f"{volume}: its device {device} does not exist on this host (an inactive LV: lvchange -ay; an "
            f"unmapped RBD image: pct mount {vmid} then pct unmount {vmid} maps it); nothing was mounted"
        )
    mounts = _fs.read_mounts() if mounts is None else mounts
    here = [m for m in mounts if m["target"] == data_path]
    if here:
        src = here[-1]["source"]
        if is_dir:  # a bind mount shows the dataset's filesystem as its source: compare what is seen there
            same = _fs.file_id(device) == _fs.file_id(data_path)
        else:
            same = src == device or _same_device(src, device)
        if same:
            return {"action": "none", "device": device, "why": f"{volume} is mounted at {data_path} already"}
        raise pve.PveError(
            f"{data_path} is a mount of {src} ({here[-1]['fstype']}), not of {volume} ({device}): unmount it or "
            "set storage_data_path to a free path; nothing was mounted"
        )
    if os.path.isdir(data_path) and os.listdir(data_path):
        raise pve.PveError(
            f"{data_path} holds {len(os.listdir(data_path))} entries that mounting {volume} there would hide: "
            "move them away or set storage_data_path to an empty path; nothing was mounted"
        )
    if is_dir:
        return {"action": "mount", "device": device, "fstype": "none", "opts": "bind", "why": ""}
    fstype = _out(
        run, ["blkid", "-p", "-o", "value", "-s", "TYPE", device], "the volume's filesystem"
    ).strip()
    return {"action": "mount", "device": device, "fstype": fstype or "auto", "opts": "defaults", "why": ""}


def _same_device(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_rdev == os.stat(b).st_rdev
    except OSError:
        return False
