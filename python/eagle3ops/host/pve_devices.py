"""The PVE host's NVIDIA device nodes: found under ``/dev`` (or read from a listing), checked against the majors
the drivers register, selected per GPU, and the driver version on the host and in a container. Part of the
host wing (:mod:`eagle3ops.host`, standard library only); shipped as ``module_utils/eagle3ops_pve_devices.py``."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

try:
    from eagle3ops.host.pve import PveError
except ImportError:  # on a target, as module_utils/eagle3ops_pve_devices.py: eagle3ops is not installed there
    from ansible.module_utils.eagle3ops_pve import PveError


# --------------------------------------------------------------------------------------------------
# NVIDIA devices on the host
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    path: str  # as the container sees it, e.g. /dev/nvidia0, /dev/nvidia-caps/nvidia-cap1
    major: int
    minor: int

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def gpu_index(self) -> int | None:
        m = re.fullmatch(r"nvidia(\d+)", self.name)
        return int(m.group(1)) if m else None


def parse_proc_devices(text: str) -> dict[int, str]:
    """Character-device majors from ``/proc/devices``: {major: driver name}."""
    majors: dict[int, str] = {}
    in_char = False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Character devices"):
            in_char = True
            continue
        if s.startswith("Block devices"):
            in_char = False
            continue
        if in_char and s:
            parts = s.split(None, 1)
            if len(parts) == 2 and parts[0].isdigit():
                majors.setdefault(int(parts[0]), parts[1])
    return majors


def scan_dev(dev_root: str = "/dev") -> list[Device]:
    """Every NVIDIA character-device node under ``dev_root`` (``nvidia*`` and ``nvidia*/`` dirs such
    as ``nvidia-caps/``), with major/minor from stat. Paths are reported as under ``/dev``."""
    found: list[Device] = []
    try:
        names = sorted(os.listdir(dev_root))
    except FileNotFoundError:
        raise PveError(f"{dev_root} does not exist") from None
    for name in names:
        if not name.startswith("nvidia"):
            continue
        full = os.path.join(dev_root, name)
        st = os.lstat(full)
        if stat.S_ISCHR(st.st_mode):
            found.append(Device(f"/dev/{name}", os.major(st.st_rdev), os.minor(st.st_rdev)))
        elif stat.S_ISDIR(st.st_mode):
            for sub in sorted(os.listdir(full)):
                sst = os.lstat(os.path.join(full, sub))
                if stat.S_ISCHR(sst.st_mode):
                    found.append(Device(f"/dev/{name}/{sub}", os.major(sst.st_rdev), os.minor(sst.st_rdev)))
    return sorted(found, key=_device_order)


def parse_dev_listing(text: str) -> list[Device]:
    """Devices from ``stat -c '%n %Hr %Lr' /dev/nvidia* /dev/nvidia-caps/*`` output (path, decimal major,
    minor) — the PVE host's /dev, copied elsewhere to plan offline. Lines that do not parse are ignored."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        if (
            len(parts) == 3
            and parts[0].startswith("/dev/nvidia")
            and parts[1].isdigit()
            and parts[2].isdigit()
        ):
            found.append(Device(parts[0], int(parts[1]), int(parts[2])))
    return sorted(found, key=_device_order)


def _device_order(d: Device):
    idx = d.gpu_index
    return (0, idx, "") if idx is not None else (1, 0, d.path)


def check_devices(devices: list[Device], majors: dict[int, str], dev_root: str = "/dev") -> list[str]:
    """Fail on nodes whose major no NVIDIA driver registers (stale nodes after a kernel/driver change);
    return warnings for things that will not break the container."""
    nvidia_majors = {m: n for m, n in majors.items() if n.startswith("nvidia")}
    for d in devices:
        if d.major not in nvidia_majors:
            registered = ", ".join(f"{n}={m}" for m, n in sorted(nvidia_majors.items())) or "none"
            raise PveError(
                f"{dev_root}{d.path[4:]} has major {d.major}, which no NVIDIA driver registers in "
                f"/proc/devices (registered: {registered}): the node is stale (the kernel or driver "
                "changed). Recreate it on the PVE host (rm it; nvidia-modprobe -u -c=0, or reboot), "
                "then re-run."
            )
    warnings = []
    if devices and not any(d.name == "nvidia-uvm" for d in devices):
        raise PveError(
            f"{dev_root}/nvidia-uvm is missing on the PVE host while GPUs are present: CUDA in the container "
            "needs it. Create it on the host with `nvidia-modprobe -u -c=0` (make it persistent, e.g. with "
            "nvidia-persistenced or a udev rule), then re-run."
        )
    if devices and not any(d.name == "nvidiactl" for d in devices):
        raise PveError(
            f"{dev_root}/nvidiactl is missing on the PVE host: is the NVIDIA driver loaded (nvidia-smi)?"
        )
    return warnings


def select_devices(devices: list[Device], gpus) -> list[Device]:
    """``gpus``: "all", "none", or a list of GPU indices; the shared nodes (nvidiactl, nvidia-uvm, caps,
    ...) come along whenever at least one GPU is selected."""
    if gpus in (None, "none", [], "") or gpus is False:
        return []
    if gpus == "all":
        return list(devices)
    try:
        want = {int(g) for g in (gpus if isinstance(gpus, (list, tuple)) else str(gpus).split(","))}
    except (TypeError, ValueError):
        raise PveError(
            f'gpus {gpus!r} is not all, none or a list of GPU indices (e.g. [0, 1] or "0,1"): fix the gpus '
            "option (container_gpus)"
        ) from None
    present = {d.gpu_index for d in devices if d.gpu_index is not None}
    missing = sorted(want - present)
    if missing:
        raise PveError(
            f"GPU(s) {missing} requested but the PVE host has only /dev/nvidia{sorted(present)}: "
            "fix the gpus list (or check nvidia-smi on the host)"
        )
    return [d for d in devices if d.gpu_index is None or d.gpu_index in want]


def host_driver_version(path: str = "/sys/module/nvidia/version") -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def container_driver_versions(listing: str) -> list[str]:
    """Versions from a listing of ``libnvidia-ml.so.<version>`` files found in the container."""
    out = set()
    for line in listing.split():
        m = re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$", line.strip())
        if m:
            out.add(m.group(1))
    return sorted(out)
