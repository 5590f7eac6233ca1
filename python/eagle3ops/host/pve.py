"""Proxmox VE LXC container config: parse, compare, edit — and NVIDIA passthrough entries.

Part of the host wing (:mod:`eagle3ops.host`): pure standard library (Python >= 3.9, what PVE 7/8 ship) because
it also runs *on the PVE host* inside the Ansible module ``library/eagle3ops_container_gpu.py`` (through
:mod:`.container`): ``module_utils/eagle3ops_pve.py`` is a symlink to it. The host's NVIDIA device nodes are
:mod:`.pve_devices`'s, a running container's bind mounts and jobs :mod:`.pve_container`'s.

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
MP_KEY_RE = re.compile(r"^mp\d+$")  # a mount point's key: mp0, mp1, ...
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
# Wanted state and the plan
# --------------------------------------------------------------------------------------------------
def wanted_raw_lines(selected: list, all_devices: list) -> list[str]:
    """(Devices: :class:`.pve_devices.Device`.) ``lxc.cgroup2.devices.allow`` per major (``M:*`` when every host node of that major is passed,
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
    devices: list | None = None,  # pve_devices.Device
    all_devices: list | None = None,
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


# --------------------------------------------------------------------------------------------------
# pct output
# --------------------------------------------------------------------------------------------------
def parse_pct_pid(text: str) -> int | None:
    """The container's init PID from ``pct status <vmid> --verbose`` (``pid: 12345``)."""
    m = re.search(r"^pid:\s*(\d+)\s*$", text, flags=re.M)
    return int(m.group(1)) if m else None


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
