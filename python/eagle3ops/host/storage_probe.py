"""What the storage phase reads of the machine before it acts: block devices (sysfs and util-linux; no udev
needed: containers and minimal hosts have none), their partitions, signatures and stable names, the mounts and
fstab. Standard library only (the host wing: :mod:`eagle3ops.host`); shipped as
``module_utils/eagle3ops_storage_probe.py``."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time

try:
    from eagle3ops.host import _fs
except (
    ImportError
):  # on a target, as module_utils/eagle3ops_storage_probe.py: eagle3ops is not installed there
    from ansible.module_utils import eagle3ops_fs as _fs


ZERO_PROBE_BYTES = 1 << 20


class StorageError(RuntimeError):
    """A refusal or failure the user must act on; the message names the thing and what to do."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


def _run(cmd: list[str], *, check: bool = False, timeout: float | None = None) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise StorageError(f"{cmd[0]} is not installed on this host; install it (util-linux/rsync)") from e
    if check and proc.returncode != 0:
        raise StorageError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.returncode, proc.stdout, proc.stderr


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


def majmin(text: str) -> tuple[int, int]:
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
                    "number": int(_fs.read_text(os.path.join(d, "partition"), "0")),
                    "devnum": _fs.read_text(os.path.join(d, "dev")),
                    "holders": sorted(os.listdir(os.path.join(d, "holders")))
                    if os.path.isdir(os.path.join(d, "holders"))
                    else [],
                }
            )
    return sorted(out, key=lambda p: p["number"])


def mount_at(path: str, mounts: list[dict] | None = None) -> dict | None:
    """The mount whose target is exactly ``path`` (the last one mounted there), or None."""
    mounts = _fs.read_mounts() if mounts is None else mounts
    path = os.path.normpath(path)
    found = [m for m in mounts if m["target"] == path]
    return found[-1] if found else None


def mount_containing(path: str, mounts: list[dict] | None = None) -> dict:
    """The mount that holds ``path`` (longest target prefix; the last mounted wins on ties)."""
    mounts = _fs.read_mounts() if mounts is None else mounts
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
    mounts = _fs.read_mounts() if mounts is None else mounts
    root = mount_at("/", mounts)
    names: set[str] = set()
    if not root:
        return names
    try:
        start = sysfs_dir(*majmin(root["devnum"]), sys_root=sys_root)
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
    fp = {"size_bytes": int(_fs.read_text(os.path.join(sysdir, "size"), "0")) * 512}
    for key, rel in (("wwid", "wwid"), ("wwid", "device/wwid"), ("serial", "device/serial")):
        val = _fs.read_text(os.path.join(sysdir, rel))
        if val and key not in fp:
            fp[key] = val
    backing = _fs.read_text(os.path.join(sysdir, "loop", "backing_file"))
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
    mounts = _fs.read_mounts() if mounts is None else mounts
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
    for line in _fs.read_text("/proc/swaps").splitlines()[1:]:
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
        "size_bytes": int(_fs.read_text(os.path.join(sysdir, "size"), "0")) * 512,
        "read_only": _fs.read_text(os.path.join(sysdir, "ro")) == "1",
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
        probe = probe_devnum(majmin(p["devnum"]))
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
            node = find_node(majmin(part["devnum"]))
            if node:
                return {"path": node, "kname": part["kname"], "devnum": part["devnum"], "created": False}
            if not udev_running():
                path = os.path.join("/dev", part["kname"])
                if create:
                    # no udev (a container, a minimal host): make the node the kernel announced in sysfs
                    os.mknod(path, 0o660 | stat.S_IFBLK, os.makedev(*majmin(part["devnum"])))
                return {"path": path, "kname": part["kname"], "devnum": part["devnum"], "created": True}
        if time.monotonic() > deadline:
            raise StorageError(
                f"partition {number} of {disk} ({os.path.basename(sysdir)}) did not appear within {timeout:.0f}s "
                f"(sysfs {sysdir}); run `partprobe {real}` and re-run"
            )
        time.sleep(0.5)


def read_fstab(path: str = "/etc/fstab") -> list[dict]:
    entries = []
    for line in _fs.read_text(path).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        f = line.split()
        if len(f) >= 2:
            entries.append(
                {
                    "src": _fs.unescape_mount(f[0]),
                    "path": os.path.normpath(_fs.unescape_mount(f[1])),
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
            node = find_node(majmin(devnum_text))
        except ValueError:
            node = None
    if node is None:
        return None
    return blkid_probe(node).get("UUID")
