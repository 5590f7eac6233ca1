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
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from eagle3ops.gpu_free.holders import (
    AllowList,
    Holder,
    device_users,
    hint_for,
    inspect_process,
)
from eagle3ops.gpu_free.nvml import (
    DEFAULT_V1_RESERVED_ALLOWANCE_MIB,
    Device,
    GpuFreeError,
    NoDriver,
    load_nvml,
    select_devices,
)
from eagle3ops.gpu_free.stop import stop_holders

# --------------------------------------------------------------------------- NVML access


# --------------------------------------------------------------------------- /proc attribution


# --------------------------------------------------------------------------- allow-list


# --------------------------------------------------------------------------- stopping


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
            h.hint = hint_for(h)
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
