"""PVE storage volumes as a container's mount points: what ``pvesm`` says about storages and volumes, whether a
``mpN`` may name a volume (it exists, it belongs to this container), whether a wanted ``mpN`` is what the config
already has, and how full the storage underneath a path is.

A mount point's volume is a host path (``/mnt/nvme,mp=/data``: a bind mount), a new volume
(``local-lvm:500,mp=/data``: ``pct set`` allocates 500 GiB and writes ``local-lvm:vm-129-disk-1,...,size=500G``
back), or an existing one (``ceph-rbd:vm-129-disk-2``). Output formats follow PVE's own ``pvesm`` (recorded
with their source in tests/fixtures/pve/pvesm-format.json): ``pvesm status`` prints sizes in KiB, ``pvesm list``
in bytes. ``pvesm status`` already reports a storage's own usage: an LVM-thin pool's data% of its size, a Ceph
pool's ``stored`` and ``max_avail`` (``ceph df``), a ZFS pool's ``used``/``available``; only a thin pool's
metadata% needs ``lvs`` beside it. Standard library only (shipped as ``module_utils/eagle3ops_pve_volumes.py``).
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

try:
    from eagle3ops.host.pve import MP_KEY_RE, PveError, parse_property_string, read_config
except ImportError:  # on the PVE host, as module_utils/eagle3ops_pve_volumes.py
    from ansible.module_utils.eagle3ops_pve import MP_KEY_RE, PveError, parse_property_string, read_config

# PVE's own volume names: vm-<vmid>-disk-<n> (lvm, lvmthin, rbd, zfs zvols), subvol-<vmid>-disk-<n> (zfs
# datasets of containers), base-<vmid>-disk-<n> (templates); the vmid is the owner
OWNER_RE = re.compile(r"^(?:vm|subvol|base|basevol)-(\d+)-disk-\d+(?:\.\w+)?$")
SIZE_RE = re.compile(r"^\d+(?:\.\d+)?$")  # <storage>:<GiB> allocates a new volume


@dataclass
class StorageStatus:
    name: str
    type: str
    status: str  # active, inactive, disabled
    total: int  # bytes
    used: int
    avail: int


@dataclass
class Volume:
    volid: str
    format: str
    content: str
    size: int  # bytes
    vmid: int | None


def parse_pvesm_status(text: str) -> dict[str, StorageStatus]:
    """``pvesm status``: a header (Name Type Status Total Used Available %), then one row per storage, sizes in
    KiB; a disabled storage shows ``disabled`` and ``N/A``."""
    out = {}
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[0].split()[:3] != ["Name", "Type", "Status"]:
        raise PveError(
            f"cannot read `pvesm status` output (no Name/Type/Status header): {text.strip()[:200]!r}"
        )
    for line in lines[1:]:
        f = line.split()
        if len(f) != 7 or not all(x.isdigit() for x in f[3:6]):
            raise PveError(f"cannot read this `pvesm status` line: {line!r}")
        out[f[0]] = StorageStatus(f[0], f[1], f[2], int(f[3]) * 1024, int(f[4]) * 1024, int(f[5]) * 1024)
    return out


def parse_pvesm_list(text: str) -> list[Volume]:
    """``pvesm list <storage>``: a header (Volid Format Type Size VMID), then one row per volume, size in bytes,
    VMID empty for volumes no guest owns."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[0].split()[:2] != ["Volid", "Format"]:
        raise PveError(f"cannot read `pvesm list` output (no Volid/Format header): {text.strip()[:200]!r}")
    out = []
    for line in lines[1:]:
        f = line.split()
        if len(f) not in (4, 5) or not f[3].isdigit():
            raise PveError(f"cannot read this `pvesm list` line: {line!r}")
        out.append(Volume(f[0], f[1], f[2], int(f[3]), int(f[4]) if len(f) == 5 else None))
    return out


def parse_lvs_thinpool(text: str) -> dict:
    """``lvs --noheadings --units b --nosuffix --separator : -o lv_size,data_percent,metadata_percent VG/POOL``."""
    f = [x.strip() for x in text.strip().split(":")]
    if len(f) != 3 or not f[0].isdigit():
        raise PveError(f"cannot read `lvs` output for the thin pool: {text.strip()[:200]!r}")
    return {"size": int(f[0]), "data_percent": float(f[1] or 0), "metadata_percent": float(f[2] or 0)}


def parse_storage_cfg(text: str) -> dict[str, dict]:
    """``/etc/pve/storage.cfg``: ``<type>: <id>`` then indented ``key value`` lines."""
    out: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(\w+):\s*(\S+)\s*$", line)
        if m and not line[0].isspace():
            current = out[m.group(2)] = {"type": m.group(1)}
        elif current is not None:
            key, _, value = line.strip().partition(" ")
            current[key] = value.strip()
    return out


# --------------------------------------------------------------------------------------------------
# A mount point's volume
# --------------------------------------------------------------------------------------------------
def split_volume(value: str) -> tuple[str, str, str]:
    """A ``mpN``/``rootfs`` value's volume: ("path", path, ""), ("new", storage, GiB) or ("volume", storage,
    volume name)."""
    vol = parse_property_string(value).get("_", "")
    if vol.startswith("/"):
        return "path", vol, ""
    storage, sep, name = vol.partition(":")
    if not sep or not storage or not name:
        raise PveError(
            f"{value!r}: the volume must be a host path (/...), <storage>:<size in GiB> for a new volume, or "
            "<storage>:<volume> (vm-<vmid>-disk-<n>) for an existing one"
        )
    return ("new" if SIZE_RE.match(name) else "volume"), storage, name


def size_bytes(text: str) -> int | None:
    """A PVE size (``500G``, ``512M``, ``2T``; no suffix: bytes) in bytes; None when unreadable."""
    m = re.match(r"^(\d+(?:\.\d+)?)([KMGT]?)$", text.strip().upper())
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " ")) if m else None


def volume_owner(name: str) -> int | None:
    m = OWNER_RE.match(name)
    return int(m.group(1)) if m else None


def same_mount(current: str | None, wanted: str) -> bool:
    """Whether the config's ``current`` mount point already is the ``wanted`` one: equal property strings, where
    PVE's own ``size=`` counts only when asked for; a wanted new volume (``local-lvm:500,mp=/data``) is the one
    ``pct set`` allocated (``local-lvm:vm-129-disk-1,mp=/data,size=500G``: same storage, same size)."""
    if current is None:
        return False
    have, want = parse_property_string(current), parse_property_string(wanted)
    if have == want:
        return True
    try:
        kind, storage, name = split_volume(wanted)
        have_kind, have_storage, have_name = split_volume(current)
    except PveError:
        return False
    if kind == "new":
        same_volume = have_kind == "volume" and have_storage == storage
        want_size = int(float(name) * 2**30)
    else:  # an existing volume or a host path: the same one; a size only when the wanted string gives one
        same_volume = (kind, storage, name) == (have_kind, have_storage, have_name)
        want_size = size_bytes(want["size"]) if "size" in want else size_bytes(have.get("size", ""))
    if not same_volume or size_bytes(have.get("size", "")) != want_size:
        return False
    rest = lambda d: {k: v for k, v in d.items() if k not in ("_", "size")}  # noqa: E731
    return rest(have) == rest(want)


def check_volume(
    key: str,
    value: str,
    vmid: int,
    storages: dict[str, StorageStatus],
    volumes: list[Volume] | None,
    others: dict[int, list[tuple[str, str]]],
) -> None:
    """Refuse a ``mpN`` volume that cannot be this container's: its storage unknown or not active, an existing
    volume that ``pvesm list`` does not show, that another guest owns, or that another container's config
    names. ``volumes``: ``pvesm list <storage>`` (None for a new volume); ``others``: :func:`other_configs`."""
    kind, storage, name = split_volume(value)
    if kind == "path":
        return
    if storage not in storages:
        raise PveError(
            f"{key}: storage {storage!r} does not exist on this PVE host (`pvesm status` lists "
            f"{', '.join(sorted(storages)) or 'none'}); nothing was changed"
        )
    if storages[storage].status != "active":
        raise PveError(f"{key}: storage {storage!r} is {storages[storage].status}; nothing was changed")
    if kind == "new":
        return
    volid = f"{storage}:{name}"
    found = [v for v in volumes or [] if v.volid == volid]
    if not found:
        raise PveError(
            f"{key}: volume {volid} does not exist (`pvesm list {storage}` does not show it); nothing was changed"
        )
    owner = found[0].vmid if found[0].vmid is not None else volume_owner(name)
    if owner is not None and owner != vmid:
        raise PveError(
            f"{key}: volume {volid} belongs to guest {owner}, not to container {vmid}: attach a volume of this "
            f"container, or move it first (pct move-volume {owner} <mpN> --target-vmid {vmid}); nothing was changed"
        )
    for other, keys in sorted(others.items()):
        for k, v in keys:
            named = MP_KEY_RE.match(k) or k == "rootfs" or k.startswith("unused")
            if other != vmid and named and parse_property_string(v).get("_") == volid:
                raise PveError(
                    f"{key}: volume {volid} is attached to container {other} ({k}); nothing was changed"
                )


def other_configs(config_dir: str, vmid: int) -> dict[int, list[tuple[str, str]]]:
    """vmid -> (key, value) of every section (snapshots too) of every other container config in ``config_dir``:
    what :func:`check_volume` looks through for a volume attached elsewhere."""
    out = {}
    for name in sorted(os.listdir(config_dir)):
        stem = name[: -len(".conf")]
        if name.endswith(".conf") and stem.isdigit() and int(stem) != vmid:
            cfg = read_config(os.path.join(config_dir, name))
            out[int(stem)] = [(k, v) for s in cfg.sections for k, v in s.keys().items()]
    return out


def volume_for_path(keys: dict[str, str], path: str) -> tuple[str, str] | None:
    """(config key, volume) of the mount point that holds ``path`` inside the container (the deepest ``mpN``
    whose ``mp=`` contains it, else ``rootfs``); None when none is known."""
    best: tuple[int, str, str] | None = None
    for k, v in keys.items():
        props = parse_property_string(v)
        mp = "/" if k == "rootfs" else props.get("mp", "")
        holds = mp and (path == mp or path.startswith(mp.rstrip("/") + "/"))
        if (MP_KEY_RE.match(k) or k == "rootfs") and holds and (best is None or len(mp) > best[0]):
            best = (len(mp), k, props.get("_", ""))
    return (best[1], best[2]) if best else None


@dataclass
class PoolUsage:
    """How full the storage underneath a volume is (what the extract phase's preflight checks)."""

    storage: str
    type: str
    volume: str
    total: int
    used: int
    avail: int
    source: str  # what said it
    metadata_percent: float | None = None  # LVM-thin pools only

    def to_dict(self) -> dict:
        return asdict(self)


def pool_usage(volume: str, status: StorageStatus, thin: dict | None = None) -> PoolUsage:
    """The usage ``pvesm status`` gives (the storage's own: thin pool data%, Ceph pool, ZFS pool), with a thin
    pool's metadata% from ``lvs`` where given; a full thin pool's metadata leaves no room either."""
    u = PoolUsage(status.name, status.type, volume, status.total, status.used, status.avail, "pvesm status")
    if thin is not None:
        u.metadata_percent = thin["metadata_percent"]
        u.source += " + lvs (thin pool data%/meta%)"
        if thin["metadata_percent"] >= 100:
            u.avail = 0
    return u


def storage_usage(keys: dict[str, str], path: str, run, *, pvesm: str, lvs: str, storage_cfg: dict) -> dict:
    """How full the PVE storage under ``path`` (inside the container whose config ``keys`` are) is: the result of
    the module ``eagle3ops_extract_pve_usage``. ``usage`` is None when that mount point is a host path (a bind
    mount: ``statvfs`` inside the container sees its filesystem) or no mount point holds ``path``. ``run(argv)``
    -> (rc, stdout, stderr)."""
    found = volume_for_path(keys, path)
    if found is None:
        return {
            "mount": None,
            "volume": None,
            "usage": None,
            "why": f"no mount point of the container holds {path}",
        }
    key, volume = found
    kind, storage, _name = split_volume(volume)
    if kind == "path":
        return {"mount": key, "volume": volume, "usage": None,
                "why": f"{key} is a bind mount of the host path {volume}: statvfs inside the container sees it"}  # fmt: skip
    rc, out, err = run([pvesm, "status", "--storage", storage])
    if rc != 0:
        raise PveError(
            f"`{pvesm} status --storage {storage}` failed ({key} of {path}): {(err or out).strip()[-500:]}"
        )
    status = parse_pvesm_status(out).get(storage)
    if status is None:
        raise PveError(f"`pvesm status --storage {storage}` does not list {storage} ({key}: {volume})")
    thin = None
    cfg = storage_cfg.get(storage, {})
    if status.type == "lvmthin" and cfg.get("vgname") and cfg.get("thinpool"):
        argv = [lvs, "--noheadings", "--units", "b", "--nosuffix", "--separator", ":",
                "-o", "lv_size,data_percent,metadata_percent", f"{cfg['vgname']}/{cfg['thinpool']}"]  # fmt: skip
        rc, out, err = run(argv)
        if rc != 0:
            raise PveError(f"`{' '.join(argv)}` failed: {(err or out).strip()[-500:]}")
        thin = parse_lvs_thinpool(out)
    return {"mount": key, "volume": volume, "usage": pool_usage(volume, status, thin).to_dict(), "why": ""}
