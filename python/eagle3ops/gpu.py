"""The verification checkpoint: every selected GPU has its memory free, with the holders named.

Reads NVIDIA's management library (NVML, through ``nvidia-ml-py``/``pynvml``), never nvidia-smi output.

**What "free" means.** A GPU is free when NVML lists no running compute or graphics process on it
and its *used* memory is at most ``threshold_mib``. Used memory is read like this:

* the v2 memory struct (``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)``) where the driver
  has it: its ``used`` excludes the memory the driver reserves for itself, which it reports
  separately as ``reserved``. An idle H200 reads used 0 MiB, reserved 615 MiB (what nvidia-smi
  prints as 0 MiB).
* otherwise (older drivers, or an nvidia-ml-py without the v2 call) the v1 struct, whose ``used``
  *includes* that reservation (the idle H200 reads 615 MiB there). The rule: used = v1 used minus
  ``v1_reserved_allowance_mib`` (default 1024 MiB, floored at 0), and the allowance is reported as
  ``reserved``; ``memory_source`` says which struct a figure came from.

**Holders.** For every PID NVML lists on a GPU: user, command line, MiB on that GPU, and, from
``/proc/PID/cgroup``, the systemd unit and/or container it runs in. NVML reports the PIDs of the
PID namespace the driver sees (the host's): a PID with no ``/proc`` entry here is reported as being
in another PID namespace, and a PID whose ``/proc`` entry has no ``/dev/nvidia*`` file open is
reported as *unverified* (the number may belong to an unrelated process here). Neither is ever
signalled. When NVML's PIDs cannot be used here (inside an LXC container, say), or memory is used
by no listed process, the processes of this namespace that have the GPU's ``/dev/nvidiaN`` open are
taken as its holders instead (``source: device-file``): named, and stopped when allow-listed.

**Stopping** is opt-in and narrow: only a verified holder matched by the allow-list (unit names,
command-line regular expressions, or our own run id: ``EAGLE3OPS_RUN_ID=<id>`` in its environment
or as a command-line token) is stopped: ``systemctl stop UNIT`` for an allow-listed systemd
service when systemd runs, otherwise SIGTERM, then SIGKILL after ``grace_s``. Everything else
holding memory makes the check fail, with the full list. Check mode reports what would be stopped
and stops nothing.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

MIB = 1024 * 1024
DEFAULT_V1_RESERVED_ALLOWANCE_MIB = 1024
RUN_ID_VAR = "EAGLE3OPS_RUN_ID"


class GpuFreeError(Exception):
    """The GPUs are not free (or cannot be read); ``details`` is the full report."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


class NoDriver(GpuFreeError):
    """NVML cannot be loaded or initialised on this host."""


# --------------------------------------------------------------------------- NVML access


def load_nvml():
    """Import ``pynvml`` and initialise NVML; raise NoDriver with what to do when that fails."""
    host = socket.gethostname()
    try:
        import pynvml
    except ImportError as e:
        raise NoDriver(
            f"nvidia-ml-py is not installed for {sys.executable} on {host} ({e}); install the "
            "workload requirements (runtime phase) or set gpu_free_gpu_required: false on hosts without GPUs",
            reason=f"nvidia-ml-py is not installed on {host}",
        ) from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NoDriver(
            f"NVML could not initialise on {host}: {e}. Install/load the NVIDIA driver (host) or pass "
            "/dev/nvidia* into the container (container phase); on a CPU-only host set "
            "gpu_free_gpu_required: false",
            reason=f"no usable NVIDIA driver on {host} (NVML: {e})",
        ) from e
    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Memory:
    total_mib: float
    used_mib: float
    reserved_mib: float
    source: str  # "v2" or "v1-minus-allowance"
    raw_used_mib: float  # what the struct itself said


class Device:
    """One GPU as NVML shows it; remembers whether the v2 memory call works for it."""

    def __init__(self, nvml, index: int, v1_allowance_mib: float):
        self.nvml = nvml
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.uuid = _text(nvml.nvmlDeviceGetUUID(self.handle))
        try:
            self.name = _text(nvml.nvmlDeviceGetName(self.handle))
        except Exception:
            self.name = "?"
        try:
            self.minor = int(nvml.nvmlDeviceGetMinorNumber(self.handle))
        except Exception:
            self.minor = index
        self.v1_allowance_mib = v1_allowance_mib
        self._v2 = getattr(nvml, "nvmlMemory_v2", None) is not None

    def memory(self) -> Memory:
        if self._v2:
            try:
                m = self.nvml.nvmlDeviceGetMemoryInfo(self.handle, version=self.nvml.nvmlMemory_v2)
                return Memory(m.total / MIB, m.used / MIB, m.reserved / MIB, "v2", m.used / MIB)
            except (self.nvml.NVMLError, TypeError):
                self._v2 = False  # driver (or binding) without the v2 struct: v1 from now on
        m = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        raw = m.used / MIB
        allowance = min(raw, self.v1_allowance_mib)
        return Memory(m.total / MIB, raw - allowance, allowance, "v1-minus-allowance", raw)

    def processes(self) -> dict[int, float | None]:
        """PID -> MiB (None where NVML does not say) over compute and graphics processes."""
        found: dict[int, float | None] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(self.nvml, fn)(self.handle)
            except self.nvml.NVMLError:
                continue  # e.g. graphics processes not supported on this GPU
            for p in procs:
                mib = None if p.usedGpuMemory is None else p.usedGpuMemory / MIB
                prev = found.get(p.pid)
                found[p.pid] = mib if prev is None else prev + (mib or 0)
        return found


def select_devices(nvml, gpus: Sequence[str | int] | None, v1_allowance_mib: float) -> list[Device]:
    count = nvml.nvmlDeviceGetCount()
    all_devices = [Device(nvml, i, v1_allowance_mib) for i in range(count)]
    wanted = [str(g).strip() for g in (gpus or ["all"]) if str(g).strip()]
    if not wanted or "all" in wanted:
        return all_devices
    chosen: list[Device] = []
    for w in wanted:
        match = [d for d in all_devices if (w.isdigit() and d.index == int(w)) or d.uuid == w]
        if not match:
            listing = ", ".join(f"{d.index}={d.uuid}" for d in all_devices) or "none"
            raise GpuFreeError(
                f"GPU {w!r} is not on {socket.gethostname()}: NVML sees {count} GPU(s) ({listing}); "
                "fix gpu_free_gpus (indices or UUIDs, or 'all')"
            )
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen


# --------------------------------------------------------------------------- /proc attribution

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


def _read(path: str, mode: str = "r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def _starttime(pid: int, proc: str = "/proc") -> int | None:
    stat = _read(f"{proc}/{pid}/stat")
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
    h.starttime = _starttime(pid, proc)
    try:
        h.user = pwd.getpwuid(os.stat(base).st_uid).pw_name
    except (KeyError, OSError):
        h.user = str(getattr(_safe_stat(base), "st_uid", "?"))
    raw = _read(f"{base}/cmdline", "rb")
    h.cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip() if raw else ""
    cg = _read(f"{base}/cgroup")
    if cg:
        info = parse_cgroup(cg)
        h.cgroup, h.unit, h.user_unit, h.container = (
            info["cgroup"],
            info["unit"],
            info["user_unit"],
            info["container"],
        )
    env = _read(f"{base}/environ", "rb")
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


# --------------------------------------------------------------------------- allow-list


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


def _hint(h: Holder) -> str:
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


# --------------------------------------------------------------------------- stopping


def _alive(pid: int, starttime: int | None, proc: str = "/proc") -> bool:
    st = _starttime(pid, proc)
    if st is None or (starttime is not None and st != starttime):
        return False  # gone, or the PID now belongs to another process
    stat = _read(f"{proc}/{pid}/stat") or ""
    try:
        state = stat.rsplit(")", 1)[1].split()[0]
    except IndexError:
        return False
    return state not in ("Z", "X")


def _signal(pid: int, starttime: int | None, sig: int) -> str:
    """Signal PID only if it is still the process we inspected (pidfd where the kernel has it).

    Returns "sent", "gone" (exited, or the PID now names another process) or "denied" (EPERM).
    """
    pidfd = None
    try:
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                return "gone"
            except OSError:
                pidfd = None
        if _starttime(pid) != starttime:
            return "gone"
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return "sent"
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "denied"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system") and shutil.which("systemctl") is not None


def stop_holders(holders: list[Holder], grace_s: float, log: Callable[[str], None]) -> None:
    """Stop the given (allow-listed, verified) holders; sets ``action`` on each."""
    # a unit of this host's systemd only: the same unit name inside a container is not ours to systemctl
    units = sorted(
        {h.unit for h in holders if h.allowed_by and h.allowed_by.startswith("unit:") and not h.container}
    )
    by_systemctl: set[str] = set()
    if units and _systemd_running():
        for unit in units:
            if not unit.endswith(".service"):
                continue
            log(f"gpu-free: systemctl stop {unit}")
            r = subprocess.run(
                ["systemctl", "stop", unit], capture_output=True, text=True, timeout=grace_s + 90
            )
            if r.returncode == 0:
                by_systemctl.add(unit)
            else:
                log(f"gpu-free: systemctl stop {unit} failed ({r.stderr.strip()}); signalling its PIDs")
    pending = []
    for h in holders:
        if h.unit in by_systemctl and not h.container:
            h.action = "systemctl-stopped"
            continue
        log(f"gpu-free: SIGTERM PID {h.pid} ({h.allowed_by}) {h.cmdline!r}")
        sent = _signal(h.pid, h.starttime, signal.SIGTERM)
        if sent == "denied":
            h.action = "stop_failed"
            h.hint = f"allow-listed by {h.allowed_by}, but signalling it is not permitted: run as root or as {h.user}"
            continue
        if sent == "sent":
            pending.append(h)
        h.action = "stopped"
    deadline = time.monotonic() + grace_s
    while pending and time.monotonic() < deadline:
        pending = [h for h in pending if _alive(h.pid, h.starttime)]
        if pending:
            time.sleep(0.02)
    for h in pending:
        log(f"gpu-free: PID {h.pid} still running after {grace_s:g}s: SIGKILL")
        _signal(h.pid, h.starttime, signal.SIGKILL)
        h.action = "killed"
    deadline = time.monotonic() + 10
    while pending and time.monotonic() < deadline:
        pending = [h for h in pending if _alive(h.pid, h.starttime)]
        if pending:
            time.sleep(0.02)
    for h in pending:
        h.action = "stop_failed"
        h.hint = f"allow-listed by {h.allowed_by}, still running 10 s after SIGKILL (uninterruptible sleep?)"


# --------------------------------------------------------------------------- the check


@dataclass
class GpuState:
    index: int
    uuid: str
    name: str
    total_mib: float
    used_mib: float
    reserved_mib: float
    memory_source: str
    raw_used_mib: float
    pids: list[int]
    free: bool
    device_users: list[int] | None = None

    def public(self) -> dict:
        d = asdict(self)
        for k in ("total_mib", "used_mib", "reserved_mib", "raw_used_mib"):
            d[k] = round(d[k], 1)
        return d


def read_gpus(devices: list[Device], threshold_mib: float) -> tuple[list[GpuState], dict[int, dict]]:
    states, procs = [], {}
    for d in devices:
        mem = d.memory()
        p = d.processes()
        procs[d.index] = p
        states.append(
            GpuState(
                d.index,
                d.uuid,
                d.name,
                mem.total_mib,
                mem.used_mib,
                mem.reserved_mib,
                mem.source,
                mem.raw_used_mib,
                sorted(p),
                free=not p and mem.used_mib <= threshold_mib,
            )
        )
    return states, procs


def ensure_free(
    gpus: Sequence[str | int] | None = None,
    *,
    threshold_mib: float = 0,
    timeout_s: float = 60,
    poll_s: float = 0.1,
    grace_s: float = 15,
    allow: AllowList | None = None,
    check_mode: bool = False,
    gpu_required: bool = True,
    v1_allowance_mib: float = DEFAULT_V1_RESERVED_ALLOWANCE_MIB,
    nvml=None,
    dev_dir: str = "/dev",
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Wait until every selected GPU is free, stopping allow-listed holders; return the report.

    ``nvml`` is the ``pynvml`` module (loaded and initialised here when None) or any object with
    the same functions. Raises GpuFreeError (with the report in ``details``) when a GPU is still
    held after ``timeout_s``; NoDriver when NVML is missing and ``gpu_required``.
    """
    allow = allow or AllowList()
    t0 = time.monotonic()
    owned = nvml is None
    try:
        if owned:
            nvml = load_nvml()
    except NoDriver as e:
        if gpu_required:
            raise
        if os.path.exists(os.path.join(dev_dir, "nvidiactl")):
            # NVIDIA devices but no usable NVML: never skip the checkpoint silently on a GPU host
            raise NoDriver(
                f"{e} ({dev_dir}/nvidiactl exists, so this host has NVIDIA GPUs: not skipping although "
                "gpu_required is false; fix the driver / nvidia-ml-py)",
                **e.details,
            ) from e
        return {
            "changed": False,
            "skipped": True,
            "free": None,
            "msg": f"skipped: {e.details.get('reason', e)} and gpu_required is false",
        }
    try:
        return _ensure_free(
            nvml,
            gpus,
            threshold_mib,
            timeout_s,
            poll_s,
            grace_s,
            allow,
            check_mode,
            v1_allowance_mib,
            dev_dir,
            log,
            t0,
        )
    finally:
        if owned:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()


def _ensure_free(
    nvml, gpus, threshold_mib, timeout_s, poll_s, grace_s, allow, check_mode, v1_allowance, dev_dir, log, t0
):
    devices = select_devices(nvml, gpus, v1_allowance)
    if not devices:
        raise GpuFreeError(f"NVML sees no GPU on {socket.gethostname()}; nothing to check")
    minors = {d.index: d.minor for d in devices}
    seen: dict[int, Holder] = {}  # every holder met, by PID (latest facts)
    acted: dict[int, Holder] = {}  # stopped (or, in check mode, would be stopped)

    def holder(pid: int) -> Holder:
        h = seen.get(pid)
        fresh = inspect_process(pid, dev_dir)
        if h is None or h.starttime != fresh.starttime:
            h = fresh
        h.gpus = {}
        return h

    def predicted_free(s: GpuState) -> bool:
        """Check mode: would this GPU be free once the holders in ``acted`` are stopped?"""
        if not s.pids:
            return False
        if all(p in acted for p in s.pids):
            return True
        foreign = all(p in seen and (not seen[p].visible or seen[p].verified is False) for p in s.pids)
        return foreign and any(h.source == "device-file" and s.index in h.gpus for h in acted.values())

    initial = None
    stopped_at = None
    deadline = t0 + timeout_s
    while True:
        states, procs = read_gpus(devices, threshold_mib)
        if initial is None:
            initial = [s.public() for s in states]
        pending_gpus = [s for s in states if not s.free]
        if check_mode:
            pending_gpus = [s for s in pending_gpus if not predicted_free(s)]
        if not pending_gpus:
            break
        current: dict[int, Holder] = {}
        for s in pending_gpus:
            for pid, mib in procs[s.index].items():
                if pid not in current:
                    current[pid] = holder(pid)
                    current[pid].source = "nvml"
                current[pid].gpus[s.index] = mib
        # NVML's PIDs not usable here (another PID namespace, e.g. inside an LXC container), or memory used
        # by no listed process: the processes of this namespace with the GPU's /dev/nvidiaN open stand in.
        blind = [
            s
            for s in pending_gpus
            if (not s.pids and s.used_mib > threshold_mib)
            or any(not current[p].visible or current[p].verified is False for p in s.pids)
        ]
        if blind:
            users = device_users([minors[s.index] for s in blind], dev_dir)
            for s in blind:
                s.device_users = users.get(minors[s.index], [])
                for pid in s.device_users:
                    if pid not in current:
                        current[pid] = holder(pid)
                        current[pid].source = "device-file"
                    if current[pid].source == "device-file":
                        current[pid].gpus[s.index] = None
        to_stop = []
        for h in current.values():
            seen[h.pid] = h
            if acted.get(h.pid) is h:
                continue  # already handled: keep what the stop found out
            h.allowed_by = allow.match(h) if (h.visible and h.verified) else None
            h.hint = _hint(h)
            if h.allowed_by and h.pid not in acted:
                to_stop.append(h)
        if to_stop:
            if check_mode:
                for h in to_stop:
                    h.action = "would_stop"
                    acted[h.pid] = h
                continue  # re-evaluate the same reading with those counted out
            stop_holders(to_stop, grace_s, log)
            stopped_at = time.monotonic()
            for h in to_stop:
                acted[h.pid] = h
            continue
        if time.monotonic() >= deadline:
            return _fail(states, pending_gpus, current, acted, initial, t0, check_mode, threshold_mib)
        time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
    verdict_at = time.time()
    elapsed = time.monotonic() - t0
    report = _report(states, acted, initial, elapsed, check_mode)
    report.update(free=True, verdict_at=verdict_at, seconds_to_free=round(elapsed, 4))
    if stopped_at is not None:
        report["seconds_from_stop_to_free"] = round(time.monotonic() - stopped_at, 4)
    report["msg"] = (
        f"{len(states)} GPU(s) free"
        + (f" after stopping {len(acted)} process(es)" if acted and not check_mode else "")
        + (f"; check mode: would stop {len(acted)} process(es)" if acted and check_mode else "")
    )
    return report


def _report(states, acted, initial, elapsed, check_mode) -> dict:
    key = "would_stop" if check_mode else "stopped"
    return {
        "changed": bool(acted),
        "check_mode": check_mode,
        "gpus": [s.public() for s in states],
        "initial": initial,
        key: [asdict(h) for h in acted.values()],
        "holders": [],
    }


def _fail(states, pending, current, acted, initial, t0, check_mode, threshold_mib):
    elapsed = time.monotonic() - t0
    report = _report(states, acted, initial, elapsed, check_mode)
    blocking = [h for h in current.values() if h.pid not in acted or h.action == "stop_failed"]
    report["holders"] = [asdict(h) for h in blocking]
    report.update(free=False, seconds_waited=round(elapsed, 3))
    lines = [h.describe() for h in blocking]
    for s in pending:
        if not s.pids:
            lines.append(
                f"GPU {s.index}: {s.used_mib:.0f} MiB used (> {threshold_mib:g}) by no process NVML lists; "
                f"processes here with its device file open: {s.device_users or 'none'}"
            )
    gpus_txt = ", ".join(f"GPU {s.index} ({s.used_mib:.0f} MiB used)" for s in pending)
    msg = (
        f"{'check mode: ' if check_mode else ''}{len(pending)} GPU(s) on {socket.gethostname()} "
        f"still held after {elapsed:.1f}s: {gpus_txt}. Holders:\n  " + "\n  ".join(lines)
    )
    raise GpuFreeError(msg, **report)
