"""Who holds a GPU: a PID NVML lists, attributed from ``/proc`` (user, command line, systemd unit and container
from its cgroup, the ``/dev/nvidia*`` files it has open, so that a PID of another namespace is never taken for a
local process), the processes holding ``/dev/nvidiaN`` open where NVML's PIDs cannot be used, and the allow-list
that says which holders may be stopped."""

from __future__ import annotations

import fnmatch
import os
import pwd
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from eagle3ops.gpu_free.nvml import (
    GpuFreeError,
)

RUN_ID_VAR = "EAGLE3OPS_RUN_ID"  # our own processes: in the environment or as a command-line token

_CONTAINER_PATTERNS = [
    (re.compile(r"docker-([0-9a-f]{12,64})\.scope"), "docker"),
    (re.compile(r"/docker/([0-9a-f]{12,64})"), "docker"),
    (re.compile(r"libpod-([0-9a-f]{12,64})\.scope"), "podman"),
    (re.compile(r"cri-containerd-([0-9a-f]{12,64})\.scope"), "containerd"),
    (re.compile(r"crio-([0-9a-f]{12,64})\.scope"), "cri-o"),
    (re.compile(r"/kubepods[^ ]*/pod[^/]+/([0-9a-f]{12,64})"), "kubernetes"),
    (re.compile(r"/lxc\.payload\.([^/]+)"), "lxc"),
    (re.compile(r"/lxc/([^/]+)"), "lxc"),
    (re.compile(r"systemd-nspawn@([^/]+)\.service"), "nspawn"),
    (re.compile(r"machine-([^/]+)\.scope"), "machine"),
]


def parse_cgroup(text: str) -> dict:
    """``/proc/PID/cgroup`` text -> {"cgroup", "unit", "user_unit", "container"}.

    The unified (``0::``) line is used when it names a cgroup, else ``name=systemd`` (v1/hybrid),
    else the first line that names a ``.service``/``.scope``. ``unit`` is the deepest systemd
    service/scope on the path (a user manager's unit is flagged ``user_unit``).
    """
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3:
            paths.setdefault(parts[1], parts[2])
    path = paths.get("")
    if not path or path == "/":
        path = paths.get("name=systemd")
    if not path or path == "/":
        path = next((p for p in paths.values() if ".service" in p or ".scope" in p), path or "/")
    unit = None
    user_unit = False
    for comp in path.split("/"):
        if comp.endswith((".service", ".scope")):
            if unit and re.fullmatch(r"user@\d+\.service", unit):
                user_unit = True
            unit = comp
    container = None
    for rx, kind in _CONTAINER_PATTERNS:
        m = rx.search(path)
        if m:
            ident = m.group(1)
            short = kind in ("docker", "podman", "containerd", "cri-o", "kubernetes")
            container = f"{kind}:{ident[:12] if short else ident}"
            break
    return {"cgroup": path, "unit": unit, "user_unit": user_unit, "container": container}


def read_proc(path: str, mode: str = "r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def starttime_of(pid: int, proc: str = "/proc") -> int | None:
    stat = read_proc(f"{proc}/{pid}/stat")
    if not stat:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def nvidia_fds(pid: int, dev_dir: str = "/dev", proc: str = "/proc") -> list[str] | None:
    """The ``dev_dir/nvidia*`` files PID has open; None when its fds cannot be read (not root)."""
    fd_dir = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    prefix = os.path.join(dev_dir, "nvidia")
    found = set()
    for n in names:
        try:
            target = os.readlink(f"{fd_dir}/{n}")
        except OSError:
            continue
        if target.startswith(prefix):
            found.add(target)
    return sorted(found)


def device_users(minors: Iterable[int], dev_dir: str = "/dev", proc: str = "/proc") -> dict[int, list[int]]:
    """minor -> PIDs of this namespace holding ``dev_dir/nvidia<minor>`` open (ourselves excluded)."""
    wanted = {os.path.join(dev_dir, f"nvidia{m}"): m for m in minors}
    users: dict[int, list[int]] = {m: [] for m in wanted.values()}
    me = os.getpid()
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == me:
            continue
        for target in nvidia_fds(int(entry), dev_dir, proc) or []:
            if target in wanted:
                users[wanted[target]].append(int(entry))
    return users


@dataclass
class Holder:
    pid: int
    gpus: dict = field(default_factory=dict)  # GPU index -> MiB (None: NVML did not say)
    source: str = "nvml"  # or "device-file"
    visible: bool = False  # a /proc entry exists in our PID namespace
    verified: bool | None = None  # has /dev/nvidia* open (None: could not read its fds)
    user: str | None = None
    cmdline: str | None = None
    cgroup: str | None = None
    unit: str | None = None
    user_unit: bool = False
    container: str | None = None
    run_id: str | None = None
    starttime: int | None = None
    allowed_by: str | None = None
    action: str | None = None  # would_stop / stopped / systemctl-stopped / stop_failed
    hint: str = ""

    def describe(self) -> str:
        if not self.visible:
            where = (
                "not in this PID namespace (NVML reports host PIDs): check it on the host or in its container"
            )
            return f"PID {self.pid} on GPU {_gpu_list(self.gpus)}: {where}"
        mib = ", ".join(
            f"GPU {g}: " + ("device file open" if m is None else f"{m:.0f} MiB")
            for g, m in sorted(self.gpus.items())
        )
        owner = f"{self.unit}" if self.unit else "no systemd unit"
        if self.container:
            owner += f", container {self.container}"
        cmd = self.cmdline or ""
        cmd = cmd if len(cmd) <= 200 else cmd[:200] + "..."
        return f"PID {self.pid} ({self.user}; {owner}; {mib}) {cmd!r}: {self.hint}"


def _gpu_list(gpus: dict) -> str:
    return ",".join(str(g) for g in sorted(gpus))


def inspect_process(pid: int, dev_dir: str = "/dev", proc: str = "/proc") -> Holder:
    h = Holder(pid=pid)
    base = f"{proc}/{pid}"
    if not os.path.exists(base):
        h.hint = "in another PID namespace (or already gone); never signalled from here"
        return h
    h.visible = True
    h.starttime = starttime_of(pid, proc)
    try:
        h.user = pwd.getpwuid(os.stat(base).st_uid).pw_name
    except (KeyError, OSError):
        h.user = str(getattr(_safe_stat(base), "st_uid", "?"))
    raw = read_proc(f"{base}/cmdline", "rb")
    h.cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip() if raw else ""
    cg = read_proc(f"{base}/cgroup")
    if cg:
        info = parse_cgroup(cg)
        h.cgroup, h.unit, h.user_unit, h.container = (
            info["cgroup"],
            info["unit"],
            info["user_unit"],
            info["container"],
        )
    env = read_proc(f"{base}/environ", "rb")
    if env:
        for item in env.split(b"\0"):
            if item.startswith(RUN_ID_VAR.encode() + b"="):
                h.run_id = item.split(b"=", 1)[1].decode(errors="replace")
    if h.run_id is None and h.cmdline:
        m = re.search(rf"(?:^|\s){RUN_ID_VAR}=(\S+)", h.cmdline)
        if m:
            h.run_id = m.group(1)
    fds = nvidia_fds(pid, dev_dir, proc)
    h.verified = None if fds is None else bool(fds)
    return h


def _safe_stat(path):
    try:
        return os.stat(path)
    except OSError:
        return None


# An allow-list entry matching any of these would stop far more than GPU jobs ("kill every python3").
_GENERIC_CMDLINES = (
    "python",
    "python3",
    "/usr/bin/python3",
    "python3 -c pass",
    "bash",
    "/bin/sh -c true",
    "sleep 1",
)


_GENERIC_UNITS = (
    "sshd.service",
    "ssh.service",
    "systemd-journald.service",
    "cron.service",
    "session-1.scope",
)


@dataclass
class AllowList:
    """Who may be stopped. Empty: nobody (the default)."""

    units: list[str] = field(default_factory=list)  # fnmatch patterns: "vllm.service", "sglang-*.service"
    cmdline_patterns: list[str] = field(default_factory=list)  # re.search on the command line
    run_ids: list[str] = field(default_factory=list)  # EAGLE3OPS_RUN_ID values

    def __post_init__(self):
        self._rx = []
        for p in self.cmdline_patterns:
            try:
                self._rx.append((p, re.compile(p)))
            except re.error as e:
                raise GpuFreeError(
                    f"gpu_free_stop_cmdline_patterns: {p!r} is not a regular expression ({e})"
                ) from e
        for p, rx in self._rx:
            if rx.search(""):
                raise GpuFreeError(
                    f"gpu_free_stop_cmdline_patterns: {p!r} matches an empty command line, i.e. every "
                    "process; make it specific (e.g. 'speculators.*extract')"
                )
            generic = next((c for c in _GENERIC_CMDLINES if rx.search(c)), None)
            if generic:
                raise GpuFreeError(
                    f"gpu_free_stop_cmdline_patterns: {p!r} matches the generic command line {generic!r}, "
                    "i.e. any Python/shell process; name the program instead (e.g. 'sglang.launch_server')"
                )
        for u in self.units:
            generic = next((c for c in _GENERIC_UNITS if fnmatch.fnmatchcase(c, u)), None)
            if generic:
                raise GpuFreeError(
                    f"gpu_free_stop_units: {u!r} also matches {generic}; list the GPU services by name "
                    "(e.g. 'vllm.service', 'sglang-*.service')"
                )

    def match(self, h: Holder) -> str | None:
        if h.unit and not h.user_unit:
            for u in self.units:
                if fnmatch.fnmatchcase(h.unit, u):
                    return f"unit:{u}"
        if h.run_id:
            for r in self.run_ids:
                if r and h.run_id == r:
                    return f"run_id:{r}"
        for p, rx in self._rx:
            if h.cmdline and rx.search(h.cmdline):
                return f"cmdline:{p}"
        return None

    def empty(self) -> bool:
        return not (self.units or self.cmdline_patterns or self.run_ids)


def hint_for(h: Holder) -> str:
    if not h.visible:
        return "in another PID namespace: NVML reports host PIDs; stop it on the host or in its container"
    if h.verified is False:
        return (
            "this PID has no /dev/nvidia* open here: NVML's PID belongs to another PID namespace, "
            "never signalled from here; stop it on the host or in its container"
        )
    if h.allowed_by:
        return f"allow-listed by {h.allowed_by}"
    if h.source == "device-file":
        return (
            "has the GPU's device file open while NVML's PIDs for it are not visible here, so it may be the "
            "holder: stop it, or allow-list it (gpu_free_stop_units / _cmdline_patterns / _run_ids)"
        )
    if h.verified is None:
        return "cannot read its open files (run as root) so it cannot be verified or stopped"
    if h.unit and h.unit.endswith(".service") and not h.user_unit:
        return (
            f"held by {h.unit}: add it to the services phase (stop/disable it before this checkpoint) "
            "or allow-list it in gpu_free_stop_units"
        )
    if h.container:
        return f"held by container {h.container}: stop that container, or allow-list its processes"
    if h.run_id:
        return f"run id {h.run_id} is not allow-listed: add it to gpu_free_stop_run_ids if it is yours"
    return "not allow-listed: stop it yourself or add a narrow gpu_free_stop_cmdline_patterns entry"
