"""Proxmox VE LXC container config: parse, compare, edit — and NVIDIA passthrough entries.

This file is pure standard library (Python >= 3.9, what PVE 7/8 ship) because it also runs *on the
PVE host* inside the Ansible module ``library/eagle3ops_container_gpu.py``: ``module_utils/eagle3ops_pve.py``
is a symlink to it. Keep it free of other ``eagle3ops`` imports.

``/etc/pve/lxc/<vmid>.conf`` has a main section, then optional sections in brackets: one per snapshot
(``[before-upgrade]``) and ``[pve:pending]`` for changes that wait for a restart. A line is
``key: value``, a raw LXC key ``lxc.some.key: value`` (may repeat, order matters), a ``#`` comment (the
container's description) or blank. Snapshot sections follow the main section, so a line appended at the
end of the file lands in the last snapshot: raw lines are inserted into the main section only.

Parsing keeps every byte: ``PveConfig.parse(text).render() == text``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from dataclasses import dataclass, field

SECTION_RE = re.compile(r"^\[([A-Za-z0-9_\-:.]+)\]\s*$")
RAW_RE = re.compile(r"^(lxc\.[A-Za-z0-9_\-.]+)(?::|\s*=)\s*(.*?)\s*$")
KEY_RE = re.compile(r"^([a-z][a-z_]*\d*):\s*(.*?)\s*$")
DEV_KEY_RE = re.compile(r"^dev(\d+)$")
PENDING = "pve:pending"

# Keys PVE applies to a running container without a restart; any other change to a running container
# (devN, mpN, features, raw lxc.* lines, ...) takes effect at its next start.
HOTPLUG_KEYS = frozenset(
    {
        "cores",
        "cpulimit",
        "cpuunits",
        "memory",
        "swap",
        "description",
        "onboot",
        "protection",
        "startup",
        "tags",
    }
)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class PveError(Exception):
    """An error the user can act on: the message says what was found and what to do."""


# --------------------------------------------------------------------------------------------------
# Config file
# --------------------------------------------------------------------------------------------------
@dataclass
class Section:
    """One section: ``name`` None for the main section; ``header`` the raw ``[name]`` line."""

    name: str | None
    header: str = ""
    lines: list[str] = field(default_factory=list)  # raw, each with its line ending (last may lack one)

    def entries(self) -> list[tuple[int, str, str]]:
        """(line index, key, value) for every ``key: value`` and raw ``lxc.*`` line, in order."""
        out = []
        for i, line in enumerate(self.lines):
            text = line.rstrip("\r\n")
            m = RAW_RE.match(text) or KEY_RE.match(text)
            if m and not text.startswith("#"):
                out.append((i, m.group(1), m.group(2)))
        return out

    def get(self, key: str) -> str | None:
        for _i, k, v in self.entries():
            if k == key:
                return v
        return None

    def keys(self) -> dict[str, str]:
        """Non-raw keys and their values (raw ``lxc.*`` keys repeat: see ``raw_lines``)."""
        return {k: v for _i, k, v in self.entries() if not k.startswith("lxc.")}

    def raw_lines(self) -> list[str]:
        """Raw LXC entries normalised to ``lxc.key: value``, in file order."""
        return [f"{k}: {v}" for _i, k, v in self.entries() if k.startswith("lxc.")]

    def render(self) -> str:
        return self.header + "".join(self.lines)


@dataclass
class PveConfig:
    sections: list[Section]

    @classmethod
    def parse(cls, text: str) -> PveConfig:
        sections = [Section(None)]
        for line in text.splitlines(keepends=True):
            m = SECTION_RE.match(line.rstrip("\r\n"))
            if m:
                sections.append(Section(m.group(1), header=line))
            else:
                sections[-1].lines.append(line)
        return cls(sections)

    def render(self) -> str:
        return "".join(s.render() for s in self.sections)

    @property
    def main(self) -> Section:
        return self.sections[0]

    def section(self, name: str) -> Section | None:
        for s in self.sections[1:]:
            if s.name == name:
                return s
        return None

    def snapshots(self) -> list[str]:
        return [s.name for s in self.sections[1:] if s.name != PENDING]

    def effective(self) -> dict[str, str]:
        """Main-section keys with ``[pve:pending]`` changes applied (what the next start will use)."""
        current = self.main.keys()
        pending = self.section(PENDING)
        if pending is not None:
            for key, value in pending.keys().items():
                if key == "delete":
                    for d in value.split(","):
                        current.pop(d.strip().lstrip("!"), None)
                else:
                    current[key] = value
        return current

    # ---- edits, main section only -------------------------------------------------------------
    def _main_insert_at(self) -> int:
        """Index in main.lines after the last non-blank line (before the blank line that separates a
        following section)."""
        lines = self.main.lines
        i = len(lines)
        while i > 0 and not lines[i - 1].strip():
            i -= 1
        return i

    def _newline(self) -> str:
        for line in self.main.lines:
            if line.endswith("\r\n"):
                return "\r\n"
        return "\n"

    def _ensure_terminated(self, idx: int) -> None:
        lines = self.main.lines
        if idx > 0 and not lines[idx - 1].endswith("\n"):
            lines[idx - 1] += self._newline()

    def set_key(self, key: str, value: str) -> None:
        """Set a non-raw key in the main section (in place if present, else after the last entry)."""
        for i, k, _v in self.main.entries():
            if k == key:
                end = self.main.lines[i][len(self.main.lines[i].rstrip("\r\n")) :]
                self.main.lines[i] = f"{key}: {value}{end}"
                return
        # PVE writes raw lxc.* lines after the keys: insert before the first of them, if any
        raw_idx = [i for i, k, _v in self.main.entries() if k.startswith("lxc.")]
        idx = raw_idx[0] if raw_idx else self._main_insert_at()
        self._ensure_terminated(idx)
        self.main.lines.insert(idx, f"{key}: {value}{self._newline()}")
        self._keep_separator()

    def delete_key(self, key: str) -> None:
        drop = {i for i, k, _v in self.main.entries() if k == key}
        self.main.lines = [line for j, line in enumerate(self.main.lines) if j not in drop]

    def add_raw(self, line: str) -> None:
        """Insert a raw ``lxc.key: value`` line after the last raw line of the main section (or after
        its last entry) — never at the end of the file when snapshot sections follow."""
        entries = self.main.entries()
        raw_idx = [i for i, k, _v in entries if k.startswith("lxc.")]
        idx = raw_idx[-1] + 1 if raw_idx else self._main_insert_at()
        self._ensure_terminated(idx)
        self.main.lines.insert(idx, line + self._newline())
        self._keep_separator()

    def remove_raw(self, line: str) -> bool:
        """Remove the first main-section raw line equal (normalised) to ``line``."""
        want = normalise_raw(line)
        for i, k, v in self.main.entries():
            if k.startswith("lxc.") and normalise_raw(f"{k}: {v}") == want:
                del self.main.lines[i]
                return True
        return False

    def _keep_separator(self) -> None:
        """A following section must stay separated from the main section by a blank line."""
        if len(self.sections) > 1:
            lines = self.main.lines
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += self._newline()
            if not lines or lines[-1].strip():
                lines.append(self._newline())


def normalise_raw(line: str) -> str:
    m = RAW_RE.match(line.strip())
    if not m:
        return line.strip()
    return f"{m.group(1)}: {' '.join(m.group(2).split())}"


def read_config(path: str) -> PveConfig:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return PveConfig.parse(f.read())
    except FileNotFoundError:
        raise PveError(
            f"{path} does not exist: the container is not defined on this node "
            "(create it first, or check the vmid and that this is the node that owns it)"
        ) from None


def write_config(path: str, config: PveConfig) -> None:
    """Atomically replace ``path`` the way PVE does (``<path>.tmp.<pid>`` in the same directory, then
    rename; /etc/pve is pmxcfs, which allows exactly that). The mode is kept where the filesystem allows."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o640
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(config.render())
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):  # pmxcfs refuses modes other than its own (0640)
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def config_lock(vmid: int, lock_dir: str = "/run/lock/lxc"):
    """PVE's own per-container config lock (``pct`` takes it around every config change), so a raw-line
    edit never interleaves with a ``pct set``/snapshot writing the same file."""
    os.makedirs(lock_dir, exist_ok=True)
    with open(os.path.join(lock_dir, f"pve-config-{vmid}.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------------
# Property strings: "volume,mp=/data,backup=0", "nesting=1,keyctl=1", "/dev/nvidia0,mode=0666"
# --------------------------------------------------------------------------------------------------
def parse_property_string(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in str(value).split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            v = v.strip()
            low = v.lower()
            out[k.strip()] = "1" if low in _TRUE else "0" if low in _FALSE else v
        else:
            out["_"] = part
    return out


def same_value(key: str, current: str | None, wanted: str) -> bool:
    if current is None:
        return False
    if "=" in str(wanted) or "," in str(wanted) or "=" in current or "," in current:
        return parse_property_string(current) == parse_property_string(str(wanted))
    return _scalar(current) == _scalar(str(wanted))


def _scalar(v: str) -> str:
    low = v.strip().lower()
    return "1" if low in _TRUE else "0" if low in _FALSE else v.strip()


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
            "option (proxmox_container_gpus)"
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


# --------------------------------------------------------------------------------------------------
# Wanted state and the plan
# --------------------------------------------------------------------------------------------------
def wanted_raw_lines(selected: list[Device], all_devices: list[Device]) -> list[str]:
    """``lxc.cgroup2.devices.allow`` per major (``M:*`` when every host node of that major is passed,
    else one line per minor) and one ``lxc.mount.entry`` bind per node."""
    lines = []
    for major in sorted({d.major for d in selected}):
        sel = sorted({d.minor for d in selected if d.major == major})
        host = sorted({d.minor for d in all_devices if d.major == major})
        if sel == host:
            lines.append(f"lxc.cgroup2.devices.allow: c {major}:* rwm")
        else:
            lines.extend(f"lxc.cgroup2.devices.allow: c {major}:{m} rwm" for m in sel)
    for d in selected:
        lines.append(f"lxc.mount.entry: {d.path} {d.path[1:]} none bind,optional,create=file")
    return lines


def is_nvidia_raw(line: str, nvidia_majors: set[int], registered: set[int], prune_unregistered: bool) -> bool:
    """Whether a raw line is an NVIDIA passthrough line this tool manages."""
    k, _, v = normalise_raw(line).partition(": ")
    if k == "lxc.mount.entry":
        return v.split()[0].startswith("/dev/nvidia") if v.split() else False
    if k in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
        m = re.match(r"^c\s+(\d+):", v)
        if m:
            major = int(m.group(1))
            return major in nvidia_majors or (prune_unregistered and major not in registered)
    return False


@dataclass
class Plan:
    vmid: int
    set: dict[str, str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    raw_add: list[str] = field(default_factory=list)
    raw_remove: list[str] = field(default_factory=list)
    running: bool = False
    pending_before: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete or self.raw_add or self.raw_remove)

    @property
    def restart_needed(self) -> bool:
        """A running container only sees these changes after a restart (or pending ones exist)."""
        if not self.running:
            return False
        if self.pending_before or self.raw_add or self.raw_remove:
            return True
        return any(k not in HOTPLUG_KEYS for k in [*self.set, *self.delete])

    def pct_set_argv(self, pct: str = "/usr/sbin/pct") -> list[str] | None:
        if not (self.set or self.delete):
            return None
        argv = [pct, "set", str(self.vmid)]
        for k, v in self.set.items():
            argv += [f"--{k}", str(v)]
        if self.delete:
            argv += ["--delete", ",".join(self.delete)]
        return argv

    def apply_to(self, config: PveConfig, raw_only: bool = False) -> PveConfig:
        """The config after the plan (a copy). ``raw_only`` skips the keys (``pct set`` writes those)."""
        new = PveConfig.parse(config.render())
        if not raw_only:
            for k, v in self.set.items():
                new.set_key(k, v)
            for k in self.delete:
                new.delete_key(k)
        for line in self.raw_remove:
            new.remove_raw(line)
        for line in self.raw_add:
            new.add_raw(line)
        return new

    def to_dict(self) -> dict:
        return {
            "set": dict(self.set),
            "delete": list(self.delete),
            "raw_add": list(self.raw_add),
            "raw_remove": list(self.raw_remove),
            "restart_needed": self.restart_needed,
            "warnings": list(self.warnings),
        }


def plan(
    vmid: int,
    config: PveConfig,
    *,
    options: dict | None = None,
    devices: list[Device] | None = None,
    all_devices: list[Device] | None = None,
    majors: dict[int, str] | None = None,
    mode: str = "dev",
    running: bool = False,
    prune_unregistered: bool = True,
    dev_options: str = "",
) -> Plan:
    """What must change so that ``config`` has ``options`` and passes ``devices`` through.

    ``mode`` "dev": ``devN: /dev/...`` entries (PVE >= 8.1, set with ``pct set``); "raw": the
    ``lxc.cgroup2.devices.allow`` + ``lxc.mount.entry`` lines. Either way the other mode's NVIDIA
    entries, NVIDIA entries for nodes the host no longer has, and (``prune_unregistered``) allow lines
    for majors no driver registers any more are removed. Other entries are never touched.
    """
    if mode not in ("dev", "raw"):
        raise PveError(f"passthrough mode must be 'dev' or 'raw', not {mode!r}")
    devices = list(devices or [])
    all_devices = list(all_devices if all_devices is not None else devices)
    majors = dict(majors or {})
    p = Plan(vmid=vmid, running=running, pending_before=config.section(PENDING) is not None)
    if config.main.get("lock"):
        raise PveError(
            f"container {vmid} is locked ({config.main.get('lock')}): a backup, snapshot or migration is "
            f"running or was interrupted; wait for it, or `pct unlock {vmid}` if nothing runs, then re-run"
        )
    current = config.effective()

    # plain keys (cores, memory, features, mp0, ...)
    for key, value in (options or {}).items():
        if value is None:
            continue
        if DEV_KEY_RE.match(key) or key.startswith("lxc."):
            raise PveError(f"option {key!r}: devN and lxc.* entries are computed from the host's devices")
        if isinstance(value, bool):  # YAML true/false -> what PVE stores
            value = int(value)
        if not same_value(key, current.get(key), str(value)):
            p.set[key] = str(value)

    # devN entries
    dev_entries = {k: v for k, v in current.items() if DEV_KEY_RE.match(k)}
    ours = {
        k: v
        for k, v in dev_entries.items()
        if parse_property_string(v).get("_", "").startswith("/dev/nvidia")
    }
    wanted_paths = [d.path for d in devices] if mode == "dev" else []
    used = {int(DEV_KEY_RE.match(k).group(1)) for k in dev_entries}
    have_by_path = {parse_property_string(v).get("_"): k for k, v in ours.items()}
    for path in wanted_paths:
        value = path + (f",{dev_options}" if dev_options else "")
        key = have_by_path.get(path)
        if key is not None:
            if not same_value(key, ours[key], value):
                p.set[key] = value
            continue
        n = 0
        while n in used:
            n += 1
        used.add(n)
        p.set[f"dev{n}"] = value
    for key, v in sorted(ours.items(), key=lambda kv: int(kv[0][3:])):
        if parse_property_string(v).get("_") not in wanted_paths:
            p.delete.append(key)

    # raw lines (main section only)
    nvidia_majors = {m for m, n in majors.items() if n.startswith("nvidia")} | {d.major for d in all_devices}
    registered = set(majors) if majors else nvidia_majors
    wanted_raw = [normalise_raw(x) for x in wanted_raw_lines(devices, all_devices)] if mode == "raw" else []
    have_raw = [normalise_raw(x) for x in config.main.raw_lines()]
    for line in have_raw:
        if is_nvidia_raw(line, nvidia_majors, registered, prune_unregistered) and line not in wanted_raw:
            p.raw_remove.append(line)
            if (
                line.startswith("lxc.cgroup")
                and int(re.search(r"c\s+(\d+):", line).group(1)) not in registered
            ):
                p.warnings.append(f"removing '{line}': no driver registers that major on this host any more")
    for line in wanted_raw:
        if line not in have_raw:
            p.raw_add.append(line)
    return p


def diff_text(before: PveConfig, after: PveConfig) -> tuple[str, str]:
    """The main sections before/after (what Ansible's --diff shows); snapshot sections never change."""
    return before.main.render(), after.main.render()


# --------------------------------------------------------------------------------------------------
# A running container's bind mounts: does it still see what its mpN host path is now?
# --------------------------------------------------------------------------------------------------
MP_KEY_RE = re.compile(r"^mp\d+$")
# Command lines of pipeline jobs that a container restart would kill (they resume, but the run is lost):
# the CLI's data-writing commands (console script or ``python -m eagle3ops``) and the detached trainer.
DEFAULT_BUSY_PATTERNS = (
    r"\beagle3ops(\.cli)?\s+(prepare|extract|train|convert|benchmark|regenerate|verify)\b",
    r"\beagle3ops\.speculators_shim\b",
)


@dataclass
class StaleMount:
    """A bind mount point whose host path is no longer what the running container has mounted."""

    key: str
    host_path: str
    mount_point: str
    host: tuple[int, int] | None  # (st_dev, st_ino) of the host path now; None: it does not exist
    container: tuple[int, int] | None  # what the container sees at mount_point; None: nothing there
    container_source: str = ""  # "major:minor path-in-that-filesystem" from the container's mountinfo

    def describe(self, vmid: int) -> str:
        def ident(x):
            return f"device {os.major(x[0])}:{os.minor(x[0])} inode {x[1]}" if x else "missing"

        seen = ident(self.container)
        if self.container_source:
            seen += f", mounted from {self.container_source}"
        return (
            f"{self.key}: container {vmid}'s {self.mount_point} is {seen} but the host path {self.host_path} "
            f"is now {ident(self.host)} (it changed underneath the running container: e.g. the storage "
            f"phase's cut-over moved the old directory to its rollback path and mounted the new disk there)"
        )

    def to_dict(self) -> dict:
        return {"key": self.key, "host_path": self.host_path, "mount_point": self.mount_point,
                "host": list(self.host) if self.host else None,
                "container": list(self.container) if self.container else None,
                "container_source": self.container_source}  # fmt: skip


def bind_mount_points(keys: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, host path, mount point) of every ``mpN`` whose volume is a host path (a bind mount)."""
    out = []
    for key, value in sorted(keys.items()):
        if MP_KEY_RE.match(key):
            props = parse_property_string(value)
            vol, mp = props.get("_", ""), props.get("mp", "")
            if vol.startswith("/") and mp.startswith("/"):
                out.append((key, vol, mp))
    return out


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _mountinfo_source(pid: int, mount_point: str, proc: str = "/proc") -> str:
    """``major:minor root`` of the mount at ``mount_point`` in the process's mount namespace (last wins)."""
    found = ""
    try:
        with open(f"{proc}/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 4 and parts[4].replace("\\040", " ") == mount_point:
                    root = parts[3].replace("\\040", " ")
                    found = f"{parts[2]} {root}"
    except OSError:
        return ""
    return found


def stale_bind_mounts(keys: dict[str, str], pid: int, proc: str = "/proc") -> list[StaleMount]:
    """The bind mount points (of the config the container runs with, ``keys``) whose host path is no
    longer the directory the running container (init ``pid``) sees there: compared by device and inode,
    the container's side through ``/proc/<pid>/root``."""
    stale = []
    for key, host_path, mp in bind_mount_points(keys):
        host = _ident(host_path)
        container = _ident(f"{proc}/{pid}/root{mp}")
        if host != container or host is None:
            stale.append(StaleMount(key, host_path, mp, host, container, _mountinfo_source(pid, mp, proc)))
    return stale


def container_jobs(pid: int, patterns=DEFAULT_BUSY_PATTERNS, proc: str = "/proc") -> list[tuple[int, str]]:
    """(PID, command line) of the processes in the container's mount namespace (that of its init ``pid``)
    whose command line matches one of ``patterns``."""
    try:
        ns = os.readlink(f"{proc}/{pid}/ns/mnt")
    except OSError as e:
        raise PveError(f"cannot read the mount namespace of the container's init (PID {pid}): {e}") from None
    regexes = [re.compile(p) for p in patterns]
    found = []
    for entry in sorted(os.listdir(proc), key=lambda x: (len(x), x)):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"{proc}/{entry}/ns/mnt") != ns:
                continue
            with open(f"{proc}/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        if cmd and any(r.search(cmd) for r in regexes):
            found.append((int(entry), cmd))
    return found


def parse_pct_pid(text: str) -> int | None:
    """The container's init PID from ``pct status <vmid> --verbose`` (``pid: 12345``)."""
    m = re.search(r"^pid:\s*(\d+)\s*$", text, flags=re.M)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------------------------------
# pct output
# --------------------------------------------------------------------------------------------------
def parse_pct_status(text: str) -> str:
    """``pct status <vmid>`` prints ``status: running`` (or stopped)."""
    m = re.search(r"status:\s*(\w+)", text)
    if not m:
        raise PveError(f"cannot read `pct status` output: {text.strip()[:200]!r}")
    return m.group(1)


def parse_pve_version(text: str) -> tuple[int, int] | None:
    """``pveversion`` prints ``pve-manager/8.2.4/faa83925 (running kernel: 6.8.8-2-pve)``."""
    m = re.search(r"pve-manager/(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def mode_for_version(version: tuple[int, int] | None) -> str:
    """devN entries exist since PVE 8.1; older hosts need the raw lines."""
    if version is None:
        raise PveError(
            "cannot tell the Proxmox VE version (`pveversion` missing or unreadable): set the passthrough "
            "mode explicitly ('dev' on PVE >= 8.1, 'raw' before)"
        )
    return "dev" if version >= (8, 1) else "raw"


def container_driver_versions(listing: str) -> list[str]:
    """Versions from a listing of ``libnvidia-ml.so.<version>`` files found in the container."""
    out = set()
    for line in listing.split():
        m = re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$", line.strip())
        if m:
            out.add(m.group(1))
    return sorted(out)
