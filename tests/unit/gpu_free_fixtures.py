"""Shared by tests/unit/gpu_free/test_gpu_free*.py: the fixtures of the gpu_free checkpoint's tests (a stand-in /dev,
real ``sleep`` holders that keep a stand-in device file open, the checkpoint's injected clock), a PID of no
process here, and the checkpoint run with short timeouts. tests/unit/conftest.py imports the fixtures, so pytest finds them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest
from clock import VirtualClock
from eagle3ops.gpu_free import check as gpu_check


@pytest.fixture
def dev(tmp_path):
    """A directory standing in for /dev, with the files nvidia0, nvidia1 and nvidiactl."""
    d = tmp_path / "dev"
    d.mkdir()
    for n in ("nvidia0", "nvidia1", "nvidiactl"):
        (d / n).write_text("")
    return d


@pytest.fixture
def spawn(dev):
    """Start real `sleep` processes that hold dev/nvidiaN open (fd 3); all are reaped afterwards."""
    procs = []

    def _spawn(minor=0, env=None, ignore_term=False, argv0_marker="", hold=True):
        trap = "trap '' TERM; " if ignore_term else ""
        redirect = f" 3<{dev}/nvidia{minor}" if hold else ""
        # a marker goes into argv[0] (exec -a), so the command line reads "sleep MARKER 300"
        argv0 = f"-a 'sleep {argv0_marker}' " if argv0_marker else ""
        cmd = f"{trap}exec {argv0}sleep 300{redirect}"
        p = subprocess.Popen(["bash", "-c", cmd], env={**os.environ, **(env or {})})
        procs.append(p)
        deadline = time.monotonic() + 60  # a guard only: bash execs sleep at once
        while True:  # wait until bash has exec'd sleep
            with contextlib.suppress(OSError):
                if Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"sleep"):
                    break
            assert time.monotonic() < deadline, f"bash (PID {p.pid}) never exec'd sleep"
            time.sleep(0.01)
        return p

    yield _spawn
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def free_pid() -> int:
    """A PID no process of this namespace has: stands for a process of another PID namespace."""
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


@pytest.fixture
def clock(monkeypatch):
    """The checkpoint's clock, injected: its time moves only by its own polls' sleeps, so what it reports
    (``seconds_to_free``, ``seconds_waited``) and when it gives up do not depend on the machine's speed. The
    stop's grace period (gpu_free/stop.py) keeps the real clock: it waits for real processes."""
    c = VirtualClock()
    monkeypatch.setattr(gpu_check, "time", c)
    return c


def run(nvml, dev, **kw):
    kw.setdefault("timeout_s", 2)
    kw.setdefault("poll_s", 0.02)
    kw.setdefault("grace_s", 2)
    return gpu_check.ensure_free(nvml=nvml, dev_dir=str(dev), **kw)
