"""The container role in check mode on a PVE host with no container yet: it predicts the creation and changes
nothing.

Real: playbooks/container.yml through ansible-playbook (ansible-runner) on localhost as the PVE host. Stood in:
``pct`` (``container_pct``: a script that records any call) and the config directory (``container_config_dir``:
an empty temp dir); neither may be touched when the run is refused.
"""

from __future__ import annotations

import sys

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
