"""Phase ``services`` on real systemd (nspawn hosts): mask, idempotence, check mode, testinfra, restore.

Stand-ins, said plainly: the GPU units run ``sleep infinity`` instead of vLLM, and "an NVIDIA device" is
a character node made at ``/dev/nvidia0`` inside the container with the major/minor of /dev/null; the
holder scan only looks at ``/proc/*/fd`` link targets, which is exactly what it reads on a GPU host.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.nspawn, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = "playbooks/services.yml"
UNITS = ["vllm.service", "gpu-*.service"]
BACKUP = "/var/lib/eagle3ops/services"

# A hand-installed unit, as the seed's vLLM unit is: in /etc/systemd/system, enabled, running.
VLLM_UNIT = """# hand-installed by the seed image (kept byte-exact by the services phase)
[Unit]
Description=vLLM stand-in (sleep)
After=network.target

[Service]
ExecStart=/bin/sleep infinity
Restart=always

[Install]
WantedBy=multi-user.target
"""
# A packaged unit: in /lib/systemd/system.
WORKER_UNIT = """[Unit]
Description=packaged GPU worker stand-in

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""
# Not in services_units: holds the fake /dev/nvidia0 open, must be reported.
HOLDER_UNIT = """[Unit]
Description=other process holding an NVIDIA device (stand-in)

[Service]
ExecStart=/bin/sh -c 'exec sleep infinity < /dev/nvidia0'
"""


def _state(h, unit):
    out = h.ssh(f"systemctl is-enabled {unit}; systemctl is-active {unit}", check=False).stdout.split()
    return tuple(out)


def _sha(h, path):
    return h.ssh(f"sha256sum {path} | cut -d' ' -f1; stat -c %a:%U {path}").stdout.split()


def _infra(h) -> subprocess.CompletedProcess:
    """Run the user-facing testinfra suite file against the host, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(REPO / "tests/infra/test_services.py"),
         f"--hosts=ansible://{h.name}", f"--ansible-inventory={h.inventory}"],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
    )  # fmt: skip


def test_services_mask_idempotent_check_testinfra_restore(make_host, run_playbook):
    h = make_host(host_vars={"services_units": UNITS}, groups=("gpu_hosts",))
    h.install_unit("vllm.service", VLLM_UNIT)  # /etc/systemd/system
    h.install_unit("gpu-worker.service", WORKER_UNIT, directory="/lib/systemd/system")
    h.ssh("mknod -m 0666 /dev/nvidia0 c 1 3")
    h.install_unit("holder.service", HOLDER_UNIT, directory="/lib/systemd/system", enable=False)
    before = _sha(h, "/etc/systemd/system/vllm.service")
    assert _state(h, "vllm.service") == ("enabled", "active")
    assert _state(h, "gpu-worker.service") == ("enabled", "active")

    # --check on the fresh host predicts changes and changes nothing
    rc = run_playbook(PLAYBOOK, h.inventory, check=True, diff=True)
    assert rc.rc == 0, rc.summary()
    assert rc.host(h.name)["changed"] > 0, rc.summary()
    assert _state(h, "vllm.service") == ("enabled", "active")
    assert _state(h, "gpu-worker.service") == ("enabled", "active")
    assert _sha(h, "/etc/systemd/system/vllm.service") == before
    assert h.ssh(f"test -e {BACKUP}; echo $?").stdout.strip() == "1", "check mode wrote the backup dir"

    # the real run: both units stopped, disabled, masked; the /etc file moved aside byte-exact
    r1 = run_playbook(PLAYBOOK, h.inventory)
    assert r1.rc == 0, r1.summary()
    assert r1.host(h.name)["changed"] > 0
    for unit in ("vllm.service", "gpu-worker.service"):
        assert _state(h, unit) == ("masked", "inactive"), unit
    assert h.ssh("readlink /etc/systemd/system/vllm.service").stdout.strip() == "/dev/null"
    assert _sha(h, f"{BACKUP}/vllm.service.unit") == before
    rec = json.loads(h.ssh(f"cat {BACKUP}/vllm.service.json").stdout)
    assert rec["was_enabled"] and rec["was_active"] and not rec["was_masked"]
    # the other NVIDIA holder is reported (and the masked units are not)
    info = r1.task_results(
        "Services | Find the GPU units, their backups and other NVIDIA device holders", h.name
    )
    holders = info[0]["holders"]
    assert [x["unit"] for x in holders] == ["holder.service"], holders
    assert holders[0]["devices"] == ["/dev/nvidia0"]
    assert any(
        "hold /dev/nvidia* open" in json.dumps(ev) for ev in r1.events if ev.get("event") == "runner_on_ok"
    )

    # second run: nothing to do
    r2 = run_playbook(PLAYBOOK, h.inventory)
    assert r2.rc == 0 and r2.host(h.name)["changed"] == 0, r2.changed_tasks(h.name)

    # the user-facing testinfra suite passes ...
    ok = _infra(h)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert "2 passed" in ok.stdout, ok.stdout[-2000:]
    # ... and fails once somebody unmasks and starts a unit by hand
    h.ssh("systemctl unmask gpu-worker.service && systemctl start gpu-worker.service")
    bad = _infra(h)
    assert bad.returncode == 1, bad.stdout[-3000:]
    assert "gpu-worker.service" in bad.stdout and "2 failed" in bad.stdout, bad.stdout[-3000:]

    # converge again, then restore: file back byte-exact, enabled and running again, records gone
    r3 = run_playbook(PLAYBOOK, h.inventory)
    assert r3.rc == 0 and _state(h, "gpu-worker.service") == ("masked", "inactive"), r3.summary()
    rs_check = run_playbook(PLAYBOOK, h.inventory, check=True, extravars={"services_state": "restored"})
    assert rs_check.rc == 0 and rs_check.host(h.name)["changed"] > 0, rs_check.summary()
    assert _state(h, "vllm.service") == ("masked", "inactive"), "check mode restored something"
    rs = run_playbook(PLAYBOOK, h.inventory, extravars={"services_state": "restored"})
    assert rs.rc == 0, rs.summary()
    assert h.ssh("test -L /etc/systemd/system/vllm.service; echo $?").stdout.strip() == "1"
    assert _sha(h, "/etc/systemd/system/vllm.service") == before
    assert h.ssh("cat /etc/systemd/system/vllm.service").stdout == VLLM_UNIT
    for unit in ("vllm.service", "gpu-worker.service"):
        assert _state(h, unit) == ("enabled", "active"), unit
    assert h.ssh(f"ls -A {BACKUP}").stdout.strip() == ""
    rs2 = run_playbook(PLAYBOOK, h.inventory, extravars={"services_state": "restored"})
    assert rs2.rc == 0 and rs2.host(h.name)["changed"] == 0, rs2.changed_tasks(h.name)


def test_services_premasked_and_linked_units(make_host, run_playbook):
    """A unit masked before the phase stays masked after `restored`; a `systemctl link`ed unit (a symlink
    in /etc/systemd/system to a file elsewhere) is moved aside as a symlink and comes back as one; a name
    with no unit installed is masked (a later install cannot start it) and unmasked again; the masked
    units stay off across a restart of the host."""
    h = make_host(
        host_vars={"services_units": ["vllm.service", "sglang-old.service", "ghost"]}, groups=("gpu_hosts",)
    )
    h.put("/opt/vllm/vllm.service", VLLM_UNIT)
    h.ssh("systemctl link /opt/vllm/vllm.service && systemctl enable --now vllm.service")
    h.install_unit(
        "sglang-old.service", WORKER_UNIT, directory="/lib/systemd/system", enable=False, start=False
    )
    h.ssh("systemctl mask sglang-old.service")
    assert h.ssh("readlink /etc/systemd/system/vllm.service").stdout.strip() == "/opt/vllm/vllm.service"

    r1 = run_playbook(PLAYBOOK, h.inventory)
    assert r1.rc == 0, r1.summary()
    for unit in ("vllm.service", "sglang-old.service", "ghost.service"):
        assert _state(h, unit)[0] == "masked", unit
    assert _state(h, "vllm.service") == ("masked", "inactive")
    assert h.ssh(f"readlink {BACKUP}/vllm.service.unit").stdout.strip() == "/opt/vllm/vllm.service"
    # a reboot (container restart) does not bring the seed's auto-start back
    h.restart()
    assert _state(h, "vllm.service") == ("masked", "inactive")
    assert run_playbook(PLAYBOOK, h.inventory).host(h.name)["changed"] == 0

    rs = run_playbook(PLAYBOOK, h.inventory, extravars={"services_state": "restored"})
    assert rs.rc == 0, rs.summary()
    assert h.ssh("readlink /etc/systemd/system/vllm.service").stdout.strip() == "/opt/vllm/vllm.service"
    assert _state(h, "vllm.service") == ("linked", "active") or _state(h, "vllm.service") == (
        "enabled",
        "active",
    )
    assert _state(h, "sglang-old.service")[0] == "masked", "a unit masked before the phase must stay masked"
    assert _state(h, "ghost.service")[0] != "masked"
