"""testinfra: every GPU of a host has its memory free (the gpu_free checkpoint, checked from outside).

Runs against any inventory: ``pytest tests/infra/test_gpu_free.py --hosts=ansible://gpu_hosts
--ansible-inventory=inventory/production`` (``--hosts=local://`` checks this machine; without ``--hosts``
tests/infra skips, see its conftest). Hosts without an NVIDIA driver are skipped with the reason.

Two independent readings: ``nvidia-smi``'s own CSV query (independent of eagle3ops; its ``memory.used``
already leaves out driver-reserved memory, so an idle GPU reads 0 MiB), and, where the host has the
``eagle3ops`` command, ``eagle3ops gpu-free --check`` (NVML v2 rule), which must agree.
Allowed used MiB per GPU: the host's ``gpu_free_threshold_mib`` (inventory, else the role default 0),
overridden by ``EAGLE3OPS_GPU_FREE_THRESHOLD_MIB``.
"""

from __future__ import annotations

import json
import os

import pytest

EAGLE3OPS_CANDIDATES = ("/opt/eagle3ops/venv/bin/eagle3ops", "eagle3ops")


@pytest.fixture
def threshold_mib(phase_var) -> float:
    env = os.environ.get("EAGLE3OPS_GPU_FREE_THRESHOLD_MIB")
    return float(env if env is not None else phase_var("gpu_free", "gpu_free_threshold_mib") or 0)


def _require_nvidia(host):
    if not host.file("/dev/nvidiactl").exists and not host.exists("nvidia-smi"):
        pytest.skip(f"{host.backend.get_hostname()}: no NVIDIA driver (/dev/nvidiactl, nvidia-smi absent)")
    if not host.exists("nvidia-smi"):
        pytest.skip(f"{host.backend.get_hostname()}: /dev/nvidiactl exists but nvidia-smi is not installed")


def _csv(host, query: str) -> list[list[str]]:
    out = host.check_output(f"nvidia-smi {query} --format=csv,noheader,nounits")
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def test_every_gpu_has_free_memory_and_no_process(host, threshold_mib):
    _require_nvidia(host)
    gpus = _csv(host, "--query-gpu=index,uuid,memory.used,memory.total")
    assert gpus, "nvidia-smi lists no GPU"
    apps = _csv(host, "--query-compute-apps=gpu_uuid,pid,used_memory,process_name")
    problems = []
    for index, uuid, used, total in gpus:
        held = [f"PID {pid} {name} ({mib} MiB)" for g, pid, mib, name in apps if g == uuid]
        if float(used) > threshold_mib or held:
            problems.append(f"GPU {index}: {used} / {total} MiB used; processes: {held or 'none listed'}")
    assert not problems, (
        f"{host.backend.get_hostname()}: GPU memory is held (run the gpu_free phase to see the holders' units):\n"
        + "\n".join(problems)
    )


def test_eagle3ops_gpu_free_agrees(host, phase_var, threshold_mib):
    _require_nvidia(host)
    configured = phase_var("gpu_free", "gpu_free_executable") or ""
    candidates = ([configured] if configured and "{{" not in configured else []) + list(EAGLE3OPS_CANDIDATES)
    exe = next((c for c in candidates if host.exists(c) or host.file(c).exists), None)
    if exe is None:
        pytest.skip("eagle3ops is not installed on this host (runtime phase)")
    r = host.run(f"{exe} gpu-free --check --timeout 0 --threshold-mib {threshold_mib:g} --json")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.rc == 0 and result.get("free") is True, result.get("msg")
    assert all(g["free"] for g in result["gpus"]) and not result.get("would_stop")
