"""Phase ``gpu_free`` on real systemd (an nspawn host): a GPU holder inside ``vllm.service``.

Real: systemd as PID 1 placing the unit's process in its cgroup, ``/proc/PID/cgroup`` read by the real
``eagle3ops gpu-free`` CLI, ``systemctl stop`` of the allow-listed unit. Stand-ins, said plainly: there is
no GPU, so NVML is ``tests/unit/nvml_standin.StandInNVML`` (it lists the unit's PID, with 70000 MiB,
while that process lives), driven through the stand-in CLI launcher; "an NVIDIA device" is a character
node made at ``/dev/nvidia0`` inside the container with the major/minor of /dev/null, held open by the
unit's ``sleep``; the unit runs ``sleep`` instead of vLLM, with vLLM's ``Restart=always``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.nspawn, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))

VLLM_UNIT = """[Unit]
Description=vLLM stand-in holding an NVIDIA device (sleep)

[Service]
ExecStart=/bin/sh -c 'exec sleep infinity 3</dev/nvidia0'
Restart=always

[Install]
WantedBy=multi-user.target
"""
SHIPPED = [
    "python/eagle3ops/__init__.py",
    "python/eagle3ops/__main__.py",
    "python/eagle3ops/cli.py",
    "python/eagle3ops/command.py",
    "python/eagle3ops/errors.py",
    "python/eagle3ops/options.py",
    "python/eagle3ops/option_def.py",
    "python/eagle3ops/tools/__init__.py",
    "python/eagle3ops/gpu_free/__init__.py",
    "python/eagle3ops/gpu_free/check.py",
    "python/eagle3ops/gpu_free/commands.py",
    "python/eagle3ops/gpu_free/holders.py",
    "python/eagle3ops/gpu_free/nvml.py",
    "python/eagle3ops/gpu_free/options.py",
    "python/eagle3ops/gpu_free/stop.py",
    "tests/unit/nvml_standin.py",
]


def _cli(h, *args):
    r = h.ssh(f"/opt/e3t/eagle3ops gpu-free {' '.join(args)} --json", check=False, timeout=120)
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_holder_in_a_unit_is_named_then_stopped_with_systemctl(make_host, tmp_path):
    import nvml_standin
    import pynvml

    h = make_host(groups=("gpu_hosts",))
    for rel in SHIPPED:
        h.put(f"/opt/e3t/{rel}", (REPO / rel).read_bytes())
    h.put("/opt/e3t/tests/unit/pynvml.py", Path(pynvml.__file__).read_bytes())
    launcher = tmp_path / "eagle3ops"
    nvml_standin.write_launcher(
        launcher,
        python="/usr/bin/python3",
        paths=["/opt/e3t/python", "/opt/e3t/tests/unit"],
        config="/opt/e3t/nvml.json",
        dev="/dev",
    )
    h.put("/opt/e3t/eagle3ops", launcher.read_text(), mode="0755")
    h.ssh("mknod -m 0666 /dev/nvidia0 c 1 3")
    h.install_unit("vllm.service", VLLM_UNIT)
    pid = int(h.ssh("systemctl show -p MainPID --value vllm.service").stdout)
    assert pid > 0
    h.put("/opt/e3t/nvml.json", json.dumps([{"procs": {str(pid): 70000}}]))

    # not allow-listed: fails, naming the PID, the unit from systemd's cgroup, and the services phase
    rc, out, err = _cli(h, "--timeout", "0.5")
    assert rc == 2 and out["failed"], err
    (holder,) = out["holders"]
    assert holder["pid"] == pid and holder["unit"] == "vllm.service" and holder["verified"] is True
    assert holder["cgroup"].endswith("system.slice/vllm.service"), holder["cgroup"]
    assert "held by vllm.service: add it to the services phase" in out["msg"]

    # a broad unit glob is refused before anything is looked at
    rc, out, _ = _cli(h, "--stop-unit='*'", "--timeout", "0.5")
    assert rc == 2 and "list the GPU services by name" in out["msg"]

    # check mode predicts the stop and stops nothing
    rc, out, err = _cli(h, "--check", "--stop-unit", "vllm.service", "--timeout", "5")
    assert rc == 0 and out["changed"] and [w["pid"] for w in out["would_stop"]] == [pid], err
    assert h.ssh("systemctl is-active vllm.service", check=False).stdout.strip() == "active"

    # allow-listed unit: stopped through systemd (a SIGTERM alone would meet Restart=always)
    rc, out, err = _cli(h, "--stop-unit", "vllm.service", "--timeout", "30")
    assert rc == 0 and out["free"] is True, err
    assert [(s["pid"], s["action"]) for s in out["stopped"]] == [(pid, "systemctl-stopped")]
    assert "systemctl stop vllm.service" in err
    assert h.ssh("systemctl is-active vllm.service", check=False).stdout.strip() == "inactive"
    assert h.ssh(f"test -e /proc/{pid}; echo $?").stdout.strip() == "1"

    # second run: nothing to stop
    rc, out, _ = _cli(h, "--stop-unit", "vllm.service", "--timeout", "5")
    assert rc == 0 and out["free"] is True and out["changed"] is False
