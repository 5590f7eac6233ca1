"""The container role in check mode on a PVE host with no container yet: it predicts the creation and changes
nothing.

Real: playbooks/container.yml through ansible-playbook (ansible-runner) on localhost as the PVE host. Stood in:
``pct`` (``container_pct``: a script that records any call) and the config directory (``container_config_dir``:
an empty temp dir); neither may be touched when the run is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PLAYBOOK = "playbooks/container.yml"


@pytest.fixture
def pve(tmp_path):
    """localhost as the only proxmox_hosts host; a recording pct."""
    calls = tmp_path / "pct-calls"
    pct = tmp_path / "pct"
    pct.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    pct.chmod(0o755)
    config_dir = tmp_path / "lxc"
    config_dir.mkdir()
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        f"[proxmox_hosts]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    extravars = {"ansible_become": False, "container_pct": str(pct), "container_config_dir": str(config_dir)}
    return inv, extravars, calls, config_dir


def _ran(r) -> list[str]:
    """Every task that reported a result (ok, changed, failed or skipped), in order."""
    return [
        ev["event_data"].get("task")
        for ev in r.events
        if ev.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped")
    ]


def test_check_mode_predicts_the_creation_and_calls_nothing(run_playbook, pve):
    """In check mode with no config yet the role looks for the config and predicts the creation (changed, pct not
    called), the rest is skipped."""
    inv, extravars, calls, config_dir = pve
    r = run_playbook(PLAYBOOK, inv, extravars={**extravars, "container_vmid": 131}, check=True)
    s = r.host("localhost")
    assert r.rc == 0 and s["failed"] == 0, r.summary()
    assert r.changed_tasks() == ["localhost: Container | Create the container from its template"], r.summary()
    assert "Container | Look for the container's config" in _ran(r), _ran(r)
    assert not calls.exists() and not any(config_dir.iterdir())


def test_the_data_volume_and_an_existing_mp0_through_the_role(run_playbook, tmp_path):
    """The role's data mount on a PVE storage volume (container_data_volume), a re-run changed=0, an existing mp0
    refused without container_mp_replace (both named, nothing changed), and with it --check --diff showing the
    change without making it. STAND-INS: tests/fixtures/pct and tests/fixtures/pvesm (wrapped with their state
    under tmp_path) as /usr/sbin/pct and pvesm on localhost, the PVE host here."""
    fix = Path(__file__).resolve().parents[1] / "fixtures"
    root = tmp_path / "pve"
    (root / "var/lib/pct-standin").mkdir(parents=True)
    (root / "var/lib/pct-standin/storage.json").write_text(
        json.dumps({"storages": {"local-lvm": {"type": "lvmthin", "total": 2**40, "used": 0}}, "volumes": {}})
    )
    tools = {}
    for name in ("pct", "pvesm"):
        tools[name] = tmp_path / name
        tools[name].write_text(
            f'#!/bin/sh\nPCT_STANDIN_ROOT={root} exec {sys.executable} {fix / name} "$@"\n'
        )
        tools[name].chmod(0o755)
    subprocess.run([tools["pct"], "create", "129", "local:vztmpl/debian.tar.zst", "--rootfs", "local-lvm:8"],
                   check=True, capture_output=True)  # fmt: skip
    conf = root / "etc/pve/lxc/129.conf"
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        f"[proxmox_hosts]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    (tmp_path / "data").mkdir()
    xv = {"ansible_become": False, "container_pct": str(tools["pct"]), "container_pvesm": str(tools["pvesm"]),
          "container_config_dir": str(root / "etc/pve/lxc"), "container_gpus": "none", "container_start": False,
          "container_passthrough": "dev", "container_driver_check": False, "container_data_volume": "local-lvm:500"}  # fmt: skip
    r = run_playbook(PLAYBOOK, inv, extravars=xv)
    assert r.rc == 0 and r.host("localhost")["changed"] == 1, r.summary()
    assert "mp0: local-lvm:vm-129-disk-1,mp=/data,backup=0,size=500G\n" in conf.read_text(), conf.read_text()
    r = run_playbook(PLAYBOOK, inv, extravars=xv)
    assert r.rc == 0 and r.host("localhost")["changed"] == 0, r.changed_tasks()
    before = conf.read_text()
    xv = {**xv, "container_data_volume": "", "container_data_host_path": str(tmp_path / "data")}
    r = run_playbook(PLAYBOOK, inv, extravars=xv)
    (failure,) = r.failures()
    assert "mp0 of container 129 is already 'local-lvm:vm-129-disk-1" in failure, failure
    assert "container_mp_replace: true" in failure and conf.read_text() == before
    r = run_playbook(PLAYBOOK, inv, extravars={**xv, "container_mp_replace": True}, check=True, diff=True)
    assert r.rc == 0 and r.host("localhost")["changed"] == 1, r.summary()
    assert f"+mp0: {tmp_path / 'data'},mp=/data,backup=0" in r.stdout, r.stdout[-3000:]
    assert (
        "-mp0: local-lvm:vm-129-disk-1,mp=/data,backup=0,size=500G" in r.stdout and conf.read_text() == before
    )
