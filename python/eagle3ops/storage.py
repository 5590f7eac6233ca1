"""Phase ``storage``: a newly attached disk becomes /data, without ever losing the old data.

This file is deliberately **standard library only** and imports nothing from ``eagle3ops`` but
``eagle3ops.durable`` (stdlib only as well): it is also shipped to targets as
``module_utils/eagle3ops_storage.py`` (a symlink to this file, with ``module_utils/eagle3ops_durable.py``
beside it), because the phase runs on the machine that owns the disk (the PVE host in production), where
eagle3ops is not installed. ``tests/unit/test_durable.py`` enforces it.

The migration is a small state machine, recorded in a JSON *state file* on the disk-owning machine
(default ``/var/lib/eagle3ops/storage-state.json``)::

    (none) -> preparing -> prepared -> copying -> copied -> verified -> cutover_started -> cutover -> cleaned

- ``preparing``: the disk was accepted (blank, or ``force``); written before anything touches the disk.
- ``prepared``: GPT partition + filesystem made, mounted at the staging path, marker written on it.
- ``copying``: an rsync copy started (or a verification found a difference); re-run = rsync again.
- ``copied`` / ``verified``: rsync finished / a checksum dry-run found no difference.
- ``cutover_started`` / ``cutover``: /data is being / has been switched to the new filesystem (fstab by
  UUID, ``nofail``); the old data stays at ``old_path`` (a renamed directory, or the old device mounted
  there) as the rollback.
- ``cleaned``: the rollback copy was removed on request (``cleanup_old``).

Safety rules enforced here (not in YAML, so that no code path can skip them):
- a disk with a partition table, a filesystem/RAID/LVM signature or non-zero data in its first MiB is
  refused unless ``force``; a mounted, in-use (holders) or root disk is refused always;
- rsync never runs unless the *source* is still the one the migration started from: same filesystem
  (UUID / device number), same mount point, not empty, and /data is not listed in fstab while unmounted.
  After a reboot or container restart where /data did not mount, this stops the run with an error
  instead of mirroring an empty directory (``rsync --delete``) over the copied data;
- rsync never writes into a staging path that is not the new filesystem.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import stat
import subprocess
import time
import uuid as uuidlib

try:
    from eagle3ops import durable as _durable
except ImportError:  # on a target, as module_utils/eagle3ops_storage.py: eagle3ops is not installed there
    from ansible.module_utils import eagle3ops_durable as _durable

STATE_VERSION = 1
MARKER_NAME = ".eagle3ops-storage.json"
STEPS = ("preparing", "prepared", "copying", "copied", "verified", "cutover_started", "cutover", "cleaned")
# rsync options shared by the copy and the verification: archive + hard links + ACLs + xattrs, ids as
# numbers (the container's uid map must not be translated through the host's passwd)
RSYNC_BASE = ("-aHAX", "--numeric-ids")
# never transferred nor deleted: our marker, and the filesystem's own lost+found
RSYNC_EXCLUDES = (f"--exclude=/{MARKER_NAME}", "--exclude=/lost+found")
ITEMIZE_FORMAT = "--out-format=%i %n%L"
ZERO_PROBE_BYTES = 1 << 20


class StorageError(RuntimeError):
    """A refusal or failure the user must act on; the message names the thing and what to do."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


def step_index(step: str | None) -> int:
    return -1 if step is None else STEPS.index(step)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _run(cmd: list[str], *, check: bool = False, timeout: float | None = None) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise StorageError(f"{cmd[0]} is not installed on this host; install it (util-linux/rsync)") from e
    if check and proc.returncode != 0:
        raise StorageError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.returncode, proc.stdout, proc.stderr


# --------------------------------------------------------------------------------------------------
# Block devices (sysfs + util-linux; no udev needed: containers and minimal hosts have none)
# --------------------------------------------------------------------------------------------------


def devnum(path: str) -> tuple[int, int]:
    st = os.stat(path)
    if not stat.S_ISBLK(st.st_mode):
        raise StorageError(
            f"{path} is not a block device; give the whole new disk (e.g. /dev/disk/by-id/nvme-...)"
        )
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def sysfs_dir(major: int, minor: int, sys_root: str = "/sys") -> str:
    link = os.path.join(sys_root, "dev", "block", f"{major}:{minor}")
    if not os.path.exists(link):
        raise StorageError(f"no sysfs entry {link} for block device {major}:{minor}")
    return os.path.realpath(link)


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _majmin(text: str) -> tuple[int, int]:
    a, b = text.split(":")
    return int(a), int(b)


def partitions_of(sysdir: str) -> list[dict]:
    """Partitions of the disk at ``sysdir`` (sysfs), sorted by number."""
    out = []
    try:
        entries = sorted(os.listdir(sysdir))
    except OSError:
        return out
    for name in entries:
        d = os.path.join(sysdir, name)
        if os.path.isfile(os.path.join(d, "partition")):
            out.append(
                {
                    "kname": name,
                    "number": int(_read(os.path.join(d, "partition"), "0")),
                    "devnum": _read(os.path.join(d, "dev")),
                    "holders": sorted(os.listdir(os.path.join(d, "holders")))
                    if os.path.isdir(os.path.join(d, "holders"))
                    else [],
                }
            )
    return sorted(out, key=lambda p: p["number"])


def parse_mountinfo(text: str) -> list[dict]:
    """Parse /proc/self/mountinfo into dicts (devnum, root, target, fstype, source, options)."""
    mounts = []
    for line in text.splitlines():
        if " - " not in line:
            continue
        left, right = line.split(" - ", 1)
        lf, rf = left.split(), right.split()
        if len(lf) < 6 or len(rf) < 2:
            continue
        mounts.append(
            {
                "devnum": lf[2],
                "root": _unescape(lf[3]),
                "target": _unescape(lf[4]),
                "options": lf[5],
                "fstype": rf[0],
                "source": _unescape(rf[1]),
            }
        )
    return mounts


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def read_mounts() -> list[dict]:
    return parse_mountinfo(_read("/proc/self/mountinfo"))


def mount_at(path: str, mounts: list[dict] | None = None) -> dict | None:
    """The mount whose target is exactly ``path`` (the last one mounted there), or None."""
    mounts = read_mounts() if mounts is None else mounts
    path = os.path.normpath(path)
    found = [m for m in mounts if m["target"] == path]
    return found[-1] if found else None


def mount_containing(path: str, mounts: list[dict] | None = None) -> dict:
    """The mount that holds ``path`` (longest target prefix; the last mounted wins on ties)."""
    mounts = read_mounts() if mounts is None else mounts
    path = os.path.realpath(path) if os.path.exists(path) else os.path.normpath(path)
    best = None
    for m in mounts:
        t = m["target"]
        inside = path == t or path.startswith(t.rstrip("/") + "/") or t == "/"
        if inside and (best is None or len(t) >= len(best["target"])):
            best = m
    if best is None:
        raise StorageError(f"cannot find the mount holding {path} in /proc/self/mountinfo")
    return best


def blkid_probe(dev: str) -> dict:
    """Low-level probe (``blkid -p``: reads the device, no cache/udev). {} when nothing is found."""
    rc, out, _ = _run(["blkid", "-p", "-o", "export", dev])
    if rc not in (0, 2):  # 2: nothing found
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wipefs_signatures(dev: str) -> list[dict]:
    """Signatures wipefs sees on ``dev`` (listing mode: nothing is erased)."""
    rc, out, err = _run(["wipefs", "--no-act", "--json", dev])
    if rc != 0:
        raise StorageError(f"wipefs --no-act {dev} failed (exit {rc}): {err.strip()}")
    if not out.strip():
        return []
    return json.loads(out).get("signatures", [])


def first_bytes_nonzero(dev: str, nbytes: int = ZERO_PROBE_BYTES) -> bool:
    with open(dev, "rb") as f:
        data = f.read(nbytes)
    return any(data)


def root_knames(mounts: list[dict] | None = None, sys_root: str = "/sys") -> set[str]:
    """Kernel names of every block device that / lives on (partition, its disk, dm/md slaves...)."""
    mounts = read_mounts() if mounts is None else mounts
    root = mount_at("/", mounts)
    names: set[str] = set()
    if not root:
        return names
    try:
        start = sysfs_dir(*_majmin(root["devnum"]), sys_root=sys_root)
    except StorageError:
        return names
    todo = [start]
    while todo:
        d = todo.pop()
        name = os.path.basename(d)
        if name in names:
            continue
        names.add(name)
        if os.path.isfile(os.path.join(d, "partition")):
            todo.append(os.path.dirname(d))
        slaves = os.path.join(d, "slaves")
        if os.path.isdir(slaves):
            todo.extend(os.path.realpath(os.path.join(slaves, s)) for s in os.listdir(slaves))
    return names


def stable_names(
    dev_real: str, by_dirs: tuple[str, ...] = ("/dev/disk/by-id", "/dev/disk/by-path")
) -> list[str]:
    """udev's stable links that point at ``dev_real`` (empty without udev)."""
    out = []
    for d in by_dirs:
        try:
            for name in sorted(os.listdir(d)):
                p = os.path.join(d, name)
                if os.path.realpath(p) == dev_real:
                    out.append(p)
        except OSError:
            continue
    return out


def disk_fingerprint(sysdir: str) -> dict:
    """What identifies a disk across renumbering: serial/wwid (real disks) or backing file (loop)."""
    fp = {"size_bytes": int(_read(os.path.join(sysdir, "size"), "0")) * 512}
    for key, rel in (("wwid", "wwid"), ("wwid", "device/wwid"), ("serial", "device/serial")):
        val = _read(os.path.join(sysdir, rel))
        if val and key not in fp:
            fp[key] = val
    backing = _read(os.path.join(sysdir, "loop", "backing_file"))
    if backing:
        fp["backing_file"] = backing
    return fp


def probe_disk(disk: str, *, mounts: list[dict] | None = None, sys_root: str = "/sys") -> dict:
    """Everything we need to know about ``disk`` before touching it; reads only."""
    if not os.path.exists(disk):
        raise StorageError(
            f"disk {disk} does not exist; list candidates with `ls -l /dev/disk/by-id/` and "
            "`lsblk -o NAME,SIZE,SERIAL,MODEL,FSTYPE,MOUNTPOINTS`, then set storage_disk"
        )
    real = os.path.realpath(disk)
    major, minor = devnum(real)
    sysdir = sysfs_dir(major, minor, sys_root=sys_root)
    kname = os.path.basename(sysdir)
    if os.path.isfile(os.path.join(sysdir, "partition")):
        raise StorageError(
            f"{disk} ({kname}) is a partition, not a whole disk; give the disk itself "
            f"(e.g. {os.path.basename(os.path.dirname(sysdir))}) as storage_disk"
        )
    mounts = read_mounts() if mounts is None else mounts
    parts = partitions_of(sysdir)
    devnums = {f"{major}:{minor}": disk, **{p["devnum"]: p["kname"] for p in parts}}
    mounted = [
        {"device": devnums[m["devnum"]], "target": m["target"], "fstype": m["fstype"]}
        for m in mounts
        if m["devnum"] in devnums
    ]
    holders = (
        sorted(os.listdir(os.path.join(sysdir, "holders")))
        if os.path.isdir(os.path.join(sysdir, "holders"))
        else []
    )
    for p in parts:
        holders += [f"{p['kname']}:{h}" for h in p["holders"]]
    swaps = []
    for line in _read("/proc/swaps").splitlines()[1:]:
        name = line.split()[0] if line.split() else ""
        try:
            if (
                os.path.exists(name)
                and f"{os.major(os.stat(name).st_rdev)}:{os.minor(os.stat(name).st_rdev)}" in devnums
            ):
                swaps.append(name)
        except OSError:
            continue
    info = {
        "disk": disk,
        "realpath": real,
        "kname": kname,
        "devnum": f"{major}:{minor}",
        "sysfs": sysdir,
        "fingerprint": disk_fingerprint(sysdir),
        "size_bytes": int(_read(os.path.join(sysdir, "size"), "0")) * 512,
        "read_only": _read(os.path.join(sysdir, "ro")) == "1",
        "stable_names": stable_names(real),
        "partitions": parts,
        "signatures": [],
        "blkid": {},
        "probe_error": None,
        "mounts": mounted,
        "holders": holders,
        "swaps": swaps,
        "is_root_disk": kname in root_knames(mounts, sys_root=sys_root),
    }
    try:
        info["signatures"] = wipefs_signatures(real)
        info["blkid"] = blkid_probe(real)
        info["nonzero_head"] = False
        if not info["signatures"] and not parts and not info["blkid"]:
            info["nonzero_head"] = first_bytes_nonzero(real)
    except (StorageError, OSError) as e:
        info["probe_error"] = str(e)
    info["partition_fs"] = {}
    for p in parts:
        probe = probe_devnum(_majmin(p["devnum"]))
        if probe and probe.get("TYPE"):
            info["partition_fs"][p["kname"]] = {
                k: probe.get(k) for k in ("TYPE", "UUID", "LABEL") if probe.get(k)
            }
    return info


def blank_problems(info: dict) -> tuple[list[str], list[str]]:
    """(problems ``force`` may override, problems nothing overrides) for a candidate disk."""
    soft, hard = [], []
    if info["is_root_disk"]:
        hard.append("it holds the root filesystem (/)")
    if info["mounts"]:
        hard.append(
            "mounted: " + ", ".join(f"{m['device']} on {m['target']} ({m['fstype']})" for m in info["mounts"])
        )
    if info["holders"]:
        hard.append("in use by " + ", ".join(info["holders"]) + " (LVM/dm/md); release it first")
    if info["swaps"]:
        hard.append("used as swap: " + ", ".join(info["swaps"]))
    if info["read_only"]:
        hard.append("read-only")
    bl = info["blkid"]
    if bl.get("PTTYPE"):
        soft.append(f"partition table {bl['PTTYPE']}")
    if bl.get("TYPE"):
        soft.append(f"{bl['TYPE']} signature on the whole disk (UUID={bl.get('UUID', '?')})")
    sigs = [f"{s['type']} at {s['offset']}" for s in info["signatures"]]
    if sigs:
        soft.append("wipefs: " + ", ".join(sigs))
    if info["partitions"]:
        desc = []
        for p in info["partitions"]:
            fs = info["partition_fs"].get(p["kname"])
            desc.append(p["kname"] + (f" ({fs.get('TYPE')} UUID={fs.get('UUID', '?')})" if fs else ""))
        soft.append(f"{len(info['partitions'])} partition(s): " + ", ".join(desc))
    if info.get("probe_error"):
        soft.append(f"its contents could not be probed ({info['probe_error']})")
    if info.get("nonzero_head"):
        soft.append("non-zero data in its first MiB with no known signature (unknown contents)")
    return soft, hard


def lsblk_text(dev: str) -> str:
    rc, out, _ = _run(["lsblk", "-o", "NAME,SIZE,TYPE,FSTYPE,PTTYPE,MOUNTPOINTS", dev])
    return out.strip() if rc == 0 else ""


def find_node(devnum_: tuple[int, int], dirs: tuple[str, ...] = ("/dev",)) -> str | None:
    """A block device node under /dev with this device number (no udev needed)."""
    want = os.makedev(*devnum_)
    for d in dirs:
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        st = os.stat(e.path, follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISBLK(st.st_mode) and st.st_rdev == want:
                        return e.path
        except OSError:
            continue
    return None


def probe_devnum(devnum_: tuple[int, int], path: str | None = None) -> dict:
    """blkid -p of a block device by number; without a node (no udev, e.g. after a container restart)
    through a temporary node in /dev that is removed right after (nothing stays changed)."""
    if path and os.path.exists(path):
        return blkid_probe(path)
    node = find_node(devnum_)
    if node:
        return blkid_probe(node)
    tmp = f"/dev/.eagle3ops-probe-{os.getpid()}"
    try:
        os.mknod(tmp, 0o600 | stat.S_IFBLK, os.makedev(*devnum_))
    except OSError:
        return {}
    try:
        return blkid_probe(tmp)
    finally:
        os.unlink(tmp)


def udev_running() -> bool:
    return os.path.exists("/run/udev/control")


def partition_path(disk: str, number: int = 1, *, create: bool = True, timeout: float = 10.0) -> dict:
    """Find the device node of partition ``number`` of ``disk``; wait for udev; without udev create it.

    Returns {"path", "kname", "devnum", "created"}. With ``create=False`` (check mode) a missing node is
    reported with ``created=True`` and the path it would get.
    """
    real = os.path.realpath(disk)
    sysdir = sysfs_dir(*devnum(real))
    if udev_running() and shutil.which("udevadm"):
        _run(["udevadm", "settle", f"--timeout={int(timeout)}"])
    deadline = time.monotonic() + timeout
    while True:
        part = next((p for p in partitions_of(sysdir) if p["number"] == number), None)
        if part:
            # udev's stable link first (what an admin recognises), then any node with that number
            if disk.startswith("/dev/disk/by-id/") and os.path.exists(f"{disk}-part{number}"):
                return {
                    "path": f"{disk}-part{number}",
                    "kname": part["kname"],
                    "devnum": part["devnum"],
                    "created": False,
                }
            node = find_node(_majmin(part["devnum"]))
            if node:
                return {"path": node, "kname": part["kname"], "devnum": part["devnum"], "created": False}
            if not udev_running():
                path = os.path.join("/dev", part["kname"])
                if create:
                    # no udev (a container, a minimal host): make the node the kernel announced in sysfs
                    os.mknod(path, 0o660 | stat.S_IFBLK, os.makedev(*_majmin(part["devnum"])))
                return {"path": path, "kname": part["kname"], "devnum": part["devnum"], "created": True}
        if time.monotonic() > deadline:
            raise StorageError(
                f"partition {number} of {disk} ({os.path.basename(sysdir)}) did not appear within {timeout:.0f}s "
                f"(sysfs {sysdir}); run `partprobe {real}` and re-run"
            )
        time.sleep(0.5)


# --------------------------------------------------------------------------------------------------
# The source (/data): identity and the guard
# --------------------------------------------------------------------------------------------------


def read_fstab(path: str = "/etc/fstab") -> list[dict]:
    entries = []
    for line in _read(path).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        f = line.split()
        if len(f) >= 2:
            entries.append(
                {
                    "src": _unescape(f[0]),
                    "path": os.path.normpath(_unescape(f[1])),
                    "fstype": f[2] if len(f) > 2 else "",
                    "opts": f[3] if len(f) > 3 else "defaults",
                    "line": line,
                }
            )
    return entries


def fs_uuid_of(devnum_text: str, source: str) -> str | None:
    """Filesystem UUID of a mounted source (blkid -p on its node; None for tmpfs/overlay/unknown)."""
    node = source if source.startswith("/dev/") and os.path.exists(source) else None
    if node is None:
        try:
            node = find_node(_majmin(devnum_text))
        except ValueError:
            node = None
    if node is None:
        return None
    return blkid_probe(node).get("UUID")


def dir_entries(path: str, ignore: tuple[str, ...] = ("lost+found", MARKER_NAME)) -> list[str]:
    return sorted(n for n in os.listdir(path) if n not in ignore)


def source_identity(data_path: str, *, mounts: list[dict] | None = None, fstab: str = "/etc/fstab") -> dict:
    """Where /data lives now: its mount, filesystem UUID, whether it is a mount point, empty or not."""
    mounts = read_mounts() if mounts is None else mounts
    data_path = os.path.normpath(data_path)
    ident: dict = {"path": data_path, "exists": os.path.isdir(data_path)}
    if os.path.exists(data_path) and not os.path.isdir(data_path):
        raise StorageError(
            f"{data_path} exists but is not a directory; move it away or fix storage_data_path"
        )
    m = mount_containing(data_path, mounts)
    ident.update(
        mount_target=m["target"],
        devnum=m["devnum"],
        fstype=m["fstype"],
        source=m["source"],
        fsroot=m["root"],
        is_mountpoint=m["target"] == data_path,
        fs_uuid=fs_uuid_of(m["devnum"], m["source"]),
    )
    entries = dir_entries(data_path) if ident["exists"] else []
    ident["entries"] = len(entries)
    ident["sample"] = entries[:5]
    ident["empty"] = not entries
    ident["fstab"] = next((e for e in read_fstab(fstab) if e["path"] == data_path), None)
    return ident


def _describe(ident: dict) -> str:
    where = "its own mount" if ident.get("is_mountpoint") else f"a directory on {ident.get('mount_target')}"
    return (
        f"{ident['path']} is {where} (source {ident.get('source')}, {ident.get('fstype')}, "
        f"UUID={ident.get('fs_uuid') or '?'}, dev {ident.get('devnum')}; {ident.get('entries', 0)} entries)"
    )


def check_source(
    current: dict,
    recorded: dict | None = None,
    *,
    allow_empty: bool = False,
    new_fs_uuid: str | None = None,
) -> None:
    """Raise StorageError unless it is safe to copy *from* ``current`` (see the module docstring)."""
    path = current["path"]
    if not current["exists"]:
        raise StorageError(f"refusing to copy: {path} does not exist on this host; check storage_data_path")
    if new_fs_uuid and current.get("fs_uuid") == new_fs_uuid:
        raise StorageError(
            f"refusing to copy: {path} is already the new filesystem (UUID={new_fs_uuid}) but the state file "
            "says the copy is not finished; inspect `findmnt " + path + "` and the state file"
        )
    fstab = current.get("fstab")
    if fstab and not current["is_mountpoint"] and "noauto" not in fstab["opts"].split(","):
        raise StorageError(
            f"refusing to copy from {path}: /etc/fstab lists it ({fstab['src']} {fstab['fstype']}) but it is NOT "
            f"mounted, so it is an empty stand-in for the real data (after a reboot or container restart the "
            f"mount did not come up). Mount it (`mount {path}`) and re-run; nothing was copied. "
            f"Now: {_describe(current)}"
        )
    if recorded is not None:
        same_fs = (
            current.get("fs_uuid") == recorded.get("fs_uuid")
            if current.get("fs_uuid") and recorded.get("fs_uuid")
            else current.get("devnum") == recorded.get("devnum")
        )
        if (
            not same_fs
            or current["is_mountpoint"] != recorded.get("is_mountpoint")
            or (current.get("mount_target") != recorded.get("mount_target"))
        ):
            raise StorageError(
                f"refusing to copy from {path}: it is not the filesystem the migration started from. "
                f"Then: {_describe(recorded)}. Now: {_describe(current)}. "
                f"The old /data probably did not mount after a reboot or container restart; mount it again "
                f"(e.g. `mount {recorded.get('source')} {path}`) and re-run. Nothing was copied.",
                recorded=recorded,
                current=current,
            )
        if current["empty"] and not recorded.get("empty"):
            raise StorageError(
                f"refusing to copy from {path}: it is empty now but had {recorded.get('entries')} entries "
                f"when the migration started ({', '.join(recorded.get('sample') or [])}...). Restore/mount the "
                f"old data and re-run; nothing was copied (an rsync --delete from here would erase the copy)."
            )
        return
    if current["empty"] and not allow_empty:
        raise StorageError(
            f"refusing to migrate {path}: it is empty ({_describe(current)}). If /data normally lives on "
            f"another disk, it is not mounted: mount it and re-run. If this host really has no data yet, "
            f"set storage_allow_empty_source: true."
        )


# --------------------------------------------------------------------------------------------------
# State file and marker
# --------------------------------------------------------------------------------------------------


def atomic_write_json(path: str, obj: dict) -> None:
    """Durably replace ``path`` with ``obj`` as JSON (anything not JSON is written as ``str``), creating the
    directory if needed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    _durable.atomic_write_json(path, obj, default=str)


def load_state(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        raise StorageError(f"state file {path} is unreadable ({e}); fix or move it away and re-run") from e
    if state.get("version") != STATE_VERSION or state.get("step") not in STEPS:
        raise StorageError(
            f"state file {path} has an unknown version/step ({state.get('version')}, {state.get('step')})"
        )
    return state


def advance(state: dict, step: str, **fields) -> dict:
    """Return ``state`` moved to ``step`` (history appended); fields are merged."""
    new = {**state, **fields, "step": step, "updated": now()}
    new["history"] = [*state.get("history", []), {"step": step, "at": new["updated"]}]
    return new


def new_state(
    disk_info: dict,
    source: dict,
    *,
    data_path: str,
    staging_path: str,
    old_path: str,
    fstype: str,
    fstab: str,
) -> dict:
    base = {
        "version": STATE_VERSION,
        "id": str(uuidlib.uuid4()),
        "disk": disk_info["disk"],
        "disk_realpath": disk_info["realpath"],
        "disk_fingerprint": disk_info["fingerprint"],
        "data_path": os.path.normpath(data_path),
        "staging_path": os.path.normpath(staging_path),
        "old_path": os.path.normpath(old_path),
        "fstype": fstype,
        "fstab": fstab,
        "source": source,
        "created": now(),
        "history": [],
    }
    return advance(base, "preparing")


def same_disk(state: dict, disk_info: dict) -> bool:
    a, b = state.get("disk_fingerprint") or {}, disk_info["fingerprint"]
    for key in ("wwid", "serial", "backing_file"):
        if a.get(key) or b.get(key):
            return a.get(key) == b.get(key) and a.get("size_bytes") == b.get("size_bytes")
    return state.get("disk_realpath") == disk_info["realpath"] and a.get("size_bytes") == b.get("size_bytes")


def read_marker(root: str) -> dict | None:
    try:
        with open(os.path.join(root, MARKER_NAME)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------------
# The plan: which steps a run must do, from the state file + what is on the machine
# --------------------------------------------------------------------------------------------------


def _tail(cutover: bool, cleanup_old: bool) -> list[str]:
    if not cutover:  # copy + verify now, cut over in a later run (a maintenance window)
        return []
    return ["cutover", "cleanup"] if cleanup_old else ["cutover"]


def plan(
    *,
    disk: str,
    data_path: str = "/data",
    staging_path: str = "/mnt/eagle3ops-storage-new",
    old_path: str = "/data.old",
    state_file: str = "/var/lib/eagle3ops/storage-state.json",
    fstab: str = "/etc/fstab",
    fstype: str = "xfs",
    force: bool = False,
    allow_empty_source: bool = False,
    cleanup_old: bool = False,
    require_stable_name: bool = True,
    cutover: bool = True,
) -> dict:
    """Read-only: decide the steps of this run. Raises StorageError for every refusal."""
    data_path, staging_path, old_path = (os.path.normpath(p) for p in (data_path, staging_path, old_path))
    mounts = read_mounts()
    state = load_state(state_file)
    info = probe_disk(disk, mounts=mounts)
    result: dict = {
        "disk": info,
        "state": state,
        "steps": [],
        "state_file": state_file,
        "fs_uuid": None,
        "partition": None,
        "data_path": data_path,
        "old_path": old_path,
        "staging_path": staging_path,
    }
    if require_stable_name and not disk.startswith("/dev/disk/"):
        hint = ", ".join(info["stable_names"]) or "none found (no udev?)"
        raise StorageError(
            f"storage_disk {disk} is not a stable name (kernel names like nvme1n1/sdb can change between boots); "
            f"use one of: {hint}; or set storage_disk_require_stable_name: false (tests only)"
        )

    if state is not None and not same_disk(state, info):
        raise StorageError(
            f"state file {state_file} records a migration to {state['disk']} ({state['disk_realpath']}, "
            f"{state.get('disk_fingerprint')}), not {disk} ({info['realpath']}, {info['fingerprint']}). "
            f"Finish or roll back that migration first, or move the state file away if it is stale"
        )
    if state is not None and (state["data_path"], state["old_path"]) != (data_path, old_path):
        raise StorageError(
            f"state file {state_file} records data_path={state['data_path']} old_path={state['old_path']}, "
            f"this run asks for {data_path} / {old_path}; keep the variables of the migration in progress"
        )

    soft, hard = blank_problems(info)
    if state is None:
        if hard:
            raise StorageError(
                f"refusing disk {disk} ({info['realpath']}): "
                + "; ".join(hard)
                + ". Pick another disk (storage_disk). "
                f"lsblk:\n{lsblk_text(info['realpath'])}",
                found=hard,
            )
        if soft and not force:
            raise StorageError(
                f"refusing disk {disk} ({info['realpath']}): it is not blank: "
                + "; ".join(soft)
                + ". Everything on it would be lost: if that is intended set storage_force: true, else pick "
                f"another disk (storage_disk). lsblk:\n{lsblk_text(info['realpath'])}",
                found=soft,
            )
        if os.path.exists(old_path):
            raise StorageError(
                f"{old_path} (the rollback location, storage_old_path) already exists; move it away or choose "
                "another storage_old_path"
            )
        source = source_identity(data_path, mounts=mounts, fstab=fstab)
        check_source(source, None, allow_empty=allow_empty_source)
        result["source"] = source
        result["wipe"] = bool(soft)
        result["steps"] = ["prepare", "copy", "verify", *_tail(cutover, cleanup_old)]
        return result

    step = state["step"]
    result["fs_uuid"] = state.get("fs_uuid")
    result["partition"] = state.get("partition")
    result["source"] = state["source"]
    if hard and step_index(step) < step_index("prepared"):
        raise StorageError(f"refusing disk {disk}: " + "; ".join(hard))
    if step == "preparing":
        # accepted earlier; the preparation was interrupted. Re-doing it is idempotent.
        source = source_identity(data_path, mounts=mounts, fstab=fstab)
        check_source(source, state["source"], allow_empty=allow_empty_source)
        result["wipe"] = False
        result["steps"] = ["prepare", "copy", "verify", *_tail(cutover, cleanup_old)]
        return result

    # from here on the disk carries our filesystem: check that it is still the one in the state file
    part = partition_path(disk, 1, create=False, timeout=2)
    probe = probe_devnum(_majmin(part["devnum"]), part["path"])
    if probe.get("UUID") != state.get("fs_uuid"):
        raise StorageError(
            f"{disk} partition 1 has filesystem UUID={probe.get('UUID')} but the state file {state_file} "
            f"recorded UUID={state.get('fs_uuid')}: the disk was changed behind our back; inspect it and move "
            "the state file away to start over"
        )
    result["partition"] = part["path"]

    if step_index(step) < step_index("cutover_started"):
        source = source_identity(data_path, mounts=mounts, fstab=fstab)
        check_source(
            source, state["source"], allow_empty=allow_empty_source, new_fs_uuid=state.get("fs_uuid")
        )
        todo = {
            "prepared": ["copy", "verify"],
            "copying": ["copy", "verify"],
            "copied": ["verify"],
            "verified": [],
        }[step]
        st = mount_at(staging_path, mounts)
        result["staging_mounted"] = bool(st) and fs_uuid_of(st["devnum"], st["source"]) == state.get(
            "fs_uuid"
        )
        result["steps"] = ["mount_staging", *todo, *_tail(cutover, cleanup_old)]
        return result

    # cut over (or in the middle of it): never copy again
    cur = mount_at(data_path, mounts)
    mounted_new = bool(cur) and fs_uuid_of(cur["devnum"], cur["source"]) == state.get("fs_uuid")
    result["data_mounted_from_new"] = mounted_new
    if step == "cutover_started":
        result["steps"] = ["cutover"] + (["cleanup"] if cleanup_old else [])
        return result
    if not mounted_new:
        if os.path.isdir(data_path) and dir_entries(data_path):
            raise StorageError(
                f"{data_path} should be the new filesystem (UUID={state.get('fs_uuid')}) but it is not mounted and "
                f"holds {len(dir_entries(data_path))} entries ({', '.join(dir_entries(data_path)[:5])}) written "
                f"while it was unmounted; move them away (they would be hidden), then re-run to mount it"
            )
        result["steps"].append("mount")
    if cleanup_old and step != "cleaned":
        result["steps"].append("cleanup")
    return result


# --------------------------------------------------------------------------------------------------
# rsync: copy and verification
# --------------------------------------------------------------------------------------------------


def rsync_command(src: str, dst: str, *, mode: str, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``mode``: copy (resumable), verify (checksums, dry-run), quick (size+mtime, dry-run), preview."""
    cmd = ["rsync", *RSYNC_BASE, "--delete", *RSYNC_EXCLUDES, ITEMIZE_FORMAT]
    if mode == "copy":
        cmd += ["--partial", "--sparse"]  # sparse files stay sparse: the size check counts allocated bytes
    elif mode == "verify":
        cmd += ["--checksum", "--dry-run"]
    elif mode in ("quick", "preview"):
        cmd += ["--dry-run"]
    else:
        raise ValueError(mode)
    return [*cmd, *extra, src.rstrip("/") + "/", dst.rstrip("/") + "/"]


def tree_size(path: str) -> int:
    """Allocated bytes under ``path`` (like du), hard links counted once."""
    total, seen = 0, set()
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
        except OSError:
            continue
    return total


def run_rsync(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return {"rc": proc.returncode, "changes": lines, "stderr": proc.stderr}


def rsync_failure(res: dict, cmd: list[str], *, src: str, dst: str) -> StorageError:
    rc, err = res["rc"], res["stderr"].strip()
    if rc < 0:
        return StorageError(
            f"rsync {src}/ -> {dst}/ was killed by signal {-rc}; the copy is resumable: re-run the storage phase "
            "(the state file stays at 'copying'; nothing was cut over)",
            rc=rc,
        )
    if "No space left on device" in err or (rc == 12 and "(28)" in err):
        st = os.statvfs(dst)
        return StorageError(
            f"the new filesystem at {dst} is full ({st.f_blocks * st.f_frsize} bytes) while copying {src}: the new "
            f"disk is too small for the data. Use a bigger disk (storage_disk) or free space in {src}; nothing "
            f"was cut over. rsync: {err[-600:]}",
            rc=rc,
        )
    return StorageError(f"rsync failed (exit {rc}): {err[-1500:]}; command: {' '.join(cmd)}", rc=rc)


def staging_check(state: dict, mounts: list[dict] | None = None) -> None:
    """The staging path must be the new filesystem, else rsync would fill the root disk."""
    m = mount_at(state["staging_path"], mounts)
    if not m or fs_uuid_of(m["devnum"], m["source"]) != state.get("fs_uuid"):
        raise StorageError(
            f"{state['staging_path']} is not the new filesystem (UUID={state.get('fs_uuid')}) "
            f"({'mounted from ' + m['source'] if m else 'not mounted'}); mount it (re-run the storage phase) first"
        )


def sync(
    state_file: str,
    mode: str,
    *,
    check_mode: bool = False,
    allow_empty_source: bool = False,
    extra: list[str] | tuple[str, ...] = (),
) -> dict:
    """Run one rsync step of the migration (copy | verify | quick) with every guard; update the state."""
    state = load_state(state_file)
    if state is None:
        raise StorageError(
            f"no state file {state_file}: the disk was not prepared; run the whole storage phase"
        )
    if step_index(state["step"]) < step_index("prepared") or step_index(state["step"]) >= step_index(
        "cutover_started"
    ):
        raise StorageError(f"cannot {mode} in state '{state['step']}' ({state_file})")
    mounts = read_mounts()
    src, dst = state["data_path"], state["staging_path"]
    source = source_identity(src, mounts=mounts, fstab=state.get("fstab", "/etc/fstab"))
    check_source(source, state["source"], allow_empty=allow_empty_source, new_fs_uuid=state.get("fs_uuid"))
    staging_check(state, mounts)
    out: dict = {"mode": mode, "src": src, "dst": dst, "changed": False}
    if mode == "copy":
        if check_mode:
            res = run_rsync(rsync_command(src, dst, mode="preview", extra=extra))
            out.update(
                changed=bool(res["changes"]), changes=res["changes"][:200], n_changes=len(res["changes"])
            )
            return out
        need = tree_size(src)
        st = os.statvfs(dst)
        # usable = free now + what an earlier (interrupted) copy already put there
        have = st.f_bavail * st.f_frsize + tree_size(dst)
        if need > have:
            raise StorageError(
                f"the new filesystem ({dst}, {have} bytes usable) is smaller than the data in {src} ({need} "
                f"bytes allocated); use a bigger disk. Nothing was copied.",
                need=need,
                have=have,
            )
        if state["step"] != "copying":
            state = advance(state, "copying")
            atomic_write_json(state_file, state)
        cmd = rsync_command(src, dst, mode="copy", extra=extra)
        t0 = time.monotonic()
        res = run_rsync(cmd)
        if res["rc"] != 0:
            raise rsync_failure(res, cmd, src=src, dst=dst)
        state = advance(state, "copied", copy_seconds=round(time.monotonic() - t0, 1))
        atomic_write_json(state_file, state)
        out.update(
            changed=True,
            n_changes=len(res["changes"]),
            changes=res["changes"][:200],
            seconds=state["copy_seconds"],
        )
        return out
    if mode in ("verify", "quick"):
        needs = "copied" if mode == "verify" else "verified"
        if check_mode and step_index(state["step"]) < step_index(needs):
            # the pass before it was only predicted in this check run: comparing now would report its work
            out.update(
                changed=True, predicted=True, msg=f"check mode: {mode} follows a copy that would run first"
            )
            return out
        cmd = rsync_command(src, dst, mode=mode, extra=[e for e in extra if not e.startswith("--bwlimit")])
        res = run_rsync(cmd)
        if res["rc"] != 0:
            raise rsync_failure(res, cmd, src=src, dst=dst)
        out.update(differences=res["changes"][:200], n_differences=len(res["changes"]))
        if res["changes"]:
            if not check_mode:
                atomic_write_json(state_file, advance(state, "copying", last_differences=res["changes"][:50]))
            raise StorageError(
                f"{'verification' if mode == 'verify' else 'final check'} found {len(res['changes'])} difference(s) "
                f"between {src}/ and {dst}/ (first: {res['changes'][:5]}): something wrote to {src} during the "
                "migration. Stop the writers, then re-run (it copies again and re-verifies); nothing was cut over.",
                differences=res["changes"][:200],
            )
        if mode == "verify" and state["step"] != "verified":
            out["changed"] = True
            if not check_mode:
                atomic_write_json(state_file, advance(state, "verified"))
        return out
    raise ValueError(mode)


def record(
    state_file: str,
    step: str,
    *,
    check_mode: bool = False,
    create: dict | None = None,
    partition: str | None = None,
) -> dict:
    """Move the state file to ``step`` (idempotent). ``create`` = new_state kwargs for 'preparing'.

    For 'prepared', reads the filesystem UUID from ``partition`` and writes the marker into the staging
    root (which must be that filesystem)."""
    state = load_state(state_file)
    if step == "preparing":
        if state is not None:
            return {"changed": False, "state": state}
        if create is None:
            raise StorageError("record(preparing) needs the disk and source description")
        state = new_state(**create)
        if not check_mode:
            atomic_write_json(state_file, state)
        return {"changed": True, "state": state}
    if state is None:
        raise StorageError(f"no state file {state_file}; cannot record '{step}'")
    if step_index(state["step"]) >= step_index(step):
        return {"changed": False, "state": state}
    fields: dict = {}
    if step == "prepared":
        if not partition:
            raise StorageError("record(prepared) needs the partition")
        fs = blkid_probe(partition)
        if not fs.get("UUID"):
            raise StorageError(f"{partition} has no filesystem; the mkfs step did not run")
        fields = {"partition": partition, "fs_uuid": fs["UUID"], "fstype_found": fs.get("TYPE")}
        marker = {
            "id": state["id"],
            "fs_uuid": fs["UUID"],
            "disk": state["disk"],
            "created": now(),
            "source": {k: state["source"].get(k) for k in ("path", "source", "fs_uuid", "devnum")},
        }
        if not check_mode:
            staging_check({**state, **fields})
            atomic_write_json(os.path.join(state["staging_path"], MARKER_NAME), marker)
    new = advance(state, step, **fields)
    if not check_mode:
        atomic_write_json(state_file, new)
    return {"changed": True, "state": new}
