"""gpu_free: a holder attributed to its systemd unit or container from its real cgroup (tests/unit/gpu_free/test_gpu_free.py
has the checkpoint itself). The parsing of /proc/PID/cgroup; then, as root, real ``sleep`` holders moved into
real cgroups under a test-owned slice: named by unit and container, an allow-listed unit stopped by signal or
(through a STAND-IN ``systemctl``) by systemd, a unit inside a container signalled. NVML is ``StandInNVML``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from eagle3ops.gpu_free import holders as gpu_holders
from eagle3ops.gpu_free import nvml as gpu_nvml
from eagle3ops.gpu_free import stop as gpu_stop
from gpu_free_fixtures import run
from nvml_standin import StandInNVML, alive

# --------------------------------------------------------------------------- cgroup attribution


@pytest.mark.parametrize(
    ("text", "unit", "container"),
    [
        ("0::/system.slice/vllm.service\n", "vllm.service", None),
        ("12:name=systemd:/system.slice/sglang.service\n0::/\n", "sglang.service", None),
        (
            "0::/system.slice/docker-" + "ab" * 32 + ".scope\n",
            "docker-" + "ab" * 32 + ".scope",
            "docker:abababababab",
        ),
        ("0::/lxc.payload.105/system.slice/vllm.service\n", "vllm.service", "lxc:105"),
        (
            "0::/machine.slice/systemd-nspawn@gpu1.service/payload\n",
            "systemd-nspawn@gpu1.service",
            "nspawn:gpu1",
        ),
        ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/jup.service\n", "jup.service", None),
        ("0::/\n", None, None),
    ],
)
def test_parse_cgroup(text, unit, container):
    info = gpu_holders.parse_cgroup(text)
    assert info["unit"] == unit and info["container"] == container


def test_user_manager_units_are_flagged_and_not_matched_by_unit_allow_list():
    info = gpu_holders.parse_cgroup(
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service\n"
    )
    assert info["user_unit"] is True
    h = gpu_holders.Holder(pid=1, visible=True, verified=True, unit=info["unit"], user_unit=True)
    assert gpu_holders.AllowList(units=["vllm.service"]).match(h) is None


needs_cgroup_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/sys/fs/cgroup", os.W_OK),
    reason="moving processes into test cgroups needs root and a writable /sys/fs/cgroup",
)


@pytest.fixture
def cgroups():
    """Make real cgroups under a test-owned slice; move processes in; remove them afterwards."""
    tops: list[Path] = []
    slice_name = f"eagle3ops-test-{uuid.uuid4().hex[:8]}.slice"

    def _put(pid: int, unit: str) -> Path:
        roots = [Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup")]
        for root in roots:
            if (root / "cgroup.procs").exists():
                d = root / slice_name / unit
                d.mkdir(parents=True, exist_ok=True)
                if root / slice_name not in tops:
                    tops.append(root / slice_name)
                (d / "cgroup.procs").write_text(str(pid))
                return d
        pytest.skip("no writable cgroup hierarchy with cgroup.procs")

    yield _put
    for top in tops:  # processes may still be running: move them back to the root, then remove deepest first
        dirs = [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), top]
        for d in dirs:
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (top.parent / "cgroup.procs").write_text(pid)
        for d in dirs:
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


@needs_cgroup_root
def test_holder_in_a_systemd_unit_names_the_unit_and_the_services_phase(dev, spawn, cgroups):
    p = spawn(0)
    cgroups(p.pid, "vllm.service")
    nvml = StandInNVML([{"procs": {p.pid: 70000}}])
    with pytest.raises(gpu_nvml.GpuFreeError) as e:
        run(nvml, dev, timeout_s=0.3)
    (h,) = e.value.details["holders"]
    assert h["unit"] == "vllm.service" and h["cgroup"].endswith(".slice/vllm.service")
    assert "held by vllm.service: add it to the services phase" in str(e.value)
    assert alive(p.pid)


@needs_cgroup_root
def test_allow_listed_unit_is_stopped_by_signal_without_systemd(dev, spawn, cgroups, monkeypatch):
    monkeypatch.setattr(gpu_stop, "systemd_running", lambda: False)
    p = spawn(0)
    q = spawn(1)  # same GPU box, another unit: must stay
    cgroups(p.pid, "sglang-extract.service")
    cgroups(q.pid, "vllm.service")
    nvml = StandInNVML([{"procs": {p.pid: 1000}}, {}])
    r = run(nvml, dev, allow=gpu_holders.AllowList(units=["sglang-*.service"]), gpus=["0"])
    assert r["free"] and r["stopped"][0]["allowed_by"] == "unit:sglang-*.service"
    assert p.wait(timeout=60) == -signal.SIGTERM and alive(q.pid)


def _systemctl_standin(tmp_path, monkeypatch, then: str = "") -> Path:
    """A STAND-IN ``systemctl`` first on PATH (systemd is not PID 1 here) that appends its arguments to the
    returned log and then runs the shell line ``then``; and ``eagle3ops.gpu_free`` told that systemd runs."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "systemctl.log"
    (bindir / "systemctl").write_text(f'#!/bin/bash\necho "$@" >> {log}\n{then}\n')
    (bindir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setattr(gpu_stop, "systemd_running", lambda: True)
    return log


@needs_cgroup_root
def test_allow_listed_unit_is_stopped_with_systemctl_when_systemd_runs(
    dev, spawn, cgroups, monkeypatch, tmp_path
):
    """``systemctl`` here is a STAND-IN script (systemd is not PID 1 on this host): it records its
    arguments and kills the processes of the unit's real cgroup, as ``systemctl stop`` would."""
    p = spawn(0)
    cg = cgroups(p.pid, "vllm.service")
    log = _systemctl_standin(tmp_path, monkeypatch, f"kill $(cat {cg}/cgroup.procs)")
    nvml = StandInNVML([{"procs": {p.pid: 1000}}])
    r = run(nvml, dev, allow=gpu_holders.AllowList(units=["vllm.service"]))
    assert r["free"] and r["stopped"][0]["action"] == "systemctl-stopped"
    assert log.read_text().split() == ["stop", "vllm.service"]
    assert p.wait(timeout=60) == -signal.SIGTERM


@needs_cgroup_root
def test_unit_inside_a_container_is_signalled_not_systemctl_stopped(
    dev, spawn, cgroups, monkeypatch, tmp_path
):
    """Seen from the host, a container's vllm.service is not the host's unit: no host ``systemctl stop``
    (``systemctl`` here is a STAND-IN that records calls; systemd is not PID 1 on this machine)."""
    p = spawn(0)
    cgroups(p.pid, "lxc.payload.105/system.slice/vllm.service")
    log = _systemctl_standin(tmp_path, monkeypatch)
    nvml = StandInNVML([{"procs": {p.pid: 1000}}])
    r = run(nvml, dev, allow=gpu_holders.AllowList(units=["vllm.service"]))
    (s,) = r["stopped"]
    assert s["container"] == "lxc:105" and s["unit"] == "vllm.service" and s["action"] == "stopped"
    assert not log.exists()
    assert p.wait(timeout=60) == -signal.SIGTERM


@needs_cgroup_root
def test_holder_in_a_container_scope_names_the_container(dev, spawn, cgroups):
    p = spawn(0)
    cid = "c0ffee" * 10 + "abcd"
    cgroups(p.pid, f"docker-{cid}.scope")
    nvml = StandInNVML([{"procs": {p.pid: 1000}}])
    with pytest.raises(gpu_nvml.GpuFreeError) as e:
        run(nvml, dev, timeout_s=0.2)
    (h,) = e.value.details["holders"]
    assert h["container"] == f"docker:{cid[:12]}"
    assert f"held by container docker:{cid[:12]}" in str(e.value)
