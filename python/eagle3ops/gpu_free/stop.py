"""Stopping allow-listed holders: ``systemctl stop UNIT`` for a systemd service when systemd runs, else SIGTERM,
then SIGKILL after the grace period; a PID is signalled only while it is the same process (its start time)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable

from eagle3ops.gpu_free.holders import (
    Holder,
    read_proc,
    starttime_of,
)


def alive(pid: int, starttime: int | None, proc: str = "/proc") -> bool:
    st = starttime_of(pid, proc)
    if st is None or (starttime is not None and st != starttime):
        return False  # gone, or the PID now belongs to another process
    stat = read_proc(f"{proc}/{pid}/stat") or ""
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
        if starttime_of(pid) != starttime:
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


def systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system") and shutil.which("systemctl") is not None


def stop_holders(holders: list[Holder], grace_s: float, log: Callable[[str], None]) -> None:
    """Stop the given (allow-listed, verified) holders; sets ``action`` on each."""
    # a unit of this host's systemd only: the same unit name inside a container is not ours to systemctl
    units = sorted(
        {h.unit for h in holders if h.allowed_by and h.allowed_by.startswith("unit:") and not h.container}
    )
    by_systemctl: set[str] = set()
    if units and systemd_running():
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
        pending = [h for h in pending if alive(h.pid, h.starttime)]
        if pending:
            time.sleep(0.02)
    for h in pending:
        log(f"gpu-free: PID {h.pid} still running after {grace_s:g}s: SIGKILL")
        _signal(h.pid, h.starttime, signal.SIGKILL)
        h.action = "killed"
    deadline = time.monotonic() + 10
    while pending and time.monotonic() < deadline:
        pending = [h for h in pending if alive(h.pid, h.starttime)]
        if pending:
            time.sleep(0.02)
    for h in pending:
        h.action = "stop_failed"
        h.hint = f"allow-listed by {h.allowed_by}, still running 10 s after SIGKILL (uninterruptible sleep?)"
