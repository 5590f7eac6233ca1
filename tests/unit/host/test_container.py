"""eagle3ops.host.container.converge — the container phase's orchestration — called directly, as the module calls it.

STAND-INS (no Proxmox VE host can run here), said plainly: ``pct`` is tests/fixtures/pct (PVE's config syntax,
``[pve:pending]`` for non-hotplug keys of a running container, ``start`` applies them; its files under
``PCT_STANDIN_ROOT``), and the NVIDIA nodes are real character devices made with mknod in a temporary "/dev"
with an H200 host's majors, whose /proc/devices is tests/fixtures/pve/proc-devices.txt. Real: the config files,
the planning (eagle3ops.host.pve), the raw-line write under the config lock, every ``pct`` call as a process.
The whole module over Ansible on an nspawn host: tests/hosts/test_container.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from eagle3ops.host import container

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of character devices needs root")

FIX = Path(__file__).resolve().parents[2] / "fixtures"
PCT = FIX / "pct"
NODES = [("nvidia0", 195, 0), ("nvidia1", 195, 1), ("nvidiactl", 195, 255), ("nvidia-uvm", 508, 0),
         ("nvidia-uvm-tools", 508, 1), ("nvidia-caps/nvidia-cap1", 234, 1)]  # fmt: skip


@pytest.fixture
def ct(tmp_path, monkeypatch):
    """Container 140 made with `pct create` (stopped), and the parameters the role would give the module."""
    monkeypatch.setenv("PCT_STANDIN_ROOT", str(tmp_path / "pve"))
    dev = tmp_path / "dev"
    for name, major, minor in NODES:
        (dev / name).parent.mkdir(parents=True, exist_ok=True)
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(major, minor))
    (tmp_path / "data").mkdir()
    subprocess.run([str(PCT), "create", "140", "local:vztmpl/debian-12.tar.zst", "--cores", "2"], check=True,
                   capture_output=True)  # fmt: skip
    return {
        "vmid": 140, "pct": str(PCT), "config_dir": str(tmp_path / "pve/etc/pve/lxc"), "dev_root": str(dev),
        "proc_devices": str(FIX / "pve/proc-devices.txt"), "passthrough": "dev",
        "driver_version_file": str(tmp_path / "no-driver-loaded"),
        "options": {"cores": 4, "mp0": f"{tmp_path / 'data'},mp=/data"},
    }  # fmt: skip


def _conf(p) -> str:
    return Path(p["config_dir"], "140.conf").read_text()


def test_check_mode_predicts_the_run_and_a_second_run_changes_nothing(ct):
    before = _conf(ct)
    predicted = container.converge(ct, container.Host(), check_mode=True)
    assert predicted["changed"] and _conf(ct) == before, "check mode wrote the config"
    assert "dev0: /dev/nvidia0\n" in predicted["diff"]["after"] and "cores: 4\n" in predicted["diff"]["after"]
    done = container.converge(ct, container.Host())
    assert done["changed"] and done["plan"] == predicted["plan"] and done["status"] == "stopped"
    conf = _conf(ct)
    assert "cores: 4\n" in conf and f"mp0: {ct['options']['mp0']}\n" in conf, conf
    dev_lines = sorted(x.split(": ", 1)[1] for x in conf.splitlines() if x.startswith("dev"))
    assert dev_lines == sorted(f"/dev/{name}" for name, _, _ in NODES), conf
    assert [d["path"] for d in done["devices"]][:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    for check_mode in (True, False):
        again = container.converge(ct, container.Host(), check_mode=check_mode)
        assert not again["changed"] and not again["restart_needed"], again["plan"]
    assert _conf(ct) == conf


def test_raw_lines_go_into_the_main_section_under_the_lock_and_stay_put(ct):
    ct["passthrough"] = "raw"
    done = container.converge(ct, container.Host())
    conf = _conf(ct)
    assert done["changed"] and "lxc.cgroup2.devices.allow: c 508:* rwm\n" in conf, conf
    assert "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n" in conf, conf
    assert not container.converge(ct, container.Host())["changed"] and _conf(ct) == conf


def test_started_then_a_non_hotplug_change_waits_for_a_restart_unless_asked(ct):
    host = container.Host()
    first = container.converge({**ct, "state": "started"}, host)
    assert first["started"] and first["status"] == "running" and first["changed"]
    assert not container.converge({**ct, "state": "started"}, container.Host())["changed"]
    # features is not hotplugged: PVE keeps it in [pve:pending] until the container restarts
    ct["options"] = {**ct["options"], "features": "nesting=1"}
    host = container.Host()
    pending = container.converge(ct, host)
    assert pending["changed"] and pending["restart_needed"] and not pending["restarted"]
    assert "[pve:pending]" in _conf(ct) and any("pct reboot 140" in w for w in host.warnings), host.warnings
    restarted = container.converge({**ct, "restart": True}, container.Host())
    assert restarted["restarted"] and not restarted["restart_needed"]
    assert "[pve:pending]" not in _conf(ct) and "features: nesting=1\n" in _conf(ct)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"pct": "/nonexistent/pct"}, "/nonexistent/pct not found or not executable"),
        (
            {"options": {"mp0": "/nonexistent/data,mp=/data"}},
            "mp0: the host path /nonexistent/data does not exist",
        ),
        ({"proc_devices": "/nonexistent/devices"}, "/nonexistent/devices: No such file or directory"),
        ({"vmid": 141}, "141.conf"),
    ],
    ids=["no-pct", "no-bind-source", "no-proc-devices", "no-such-container"],
)
def test_a_fault_is_one_message_naming_the_thing_and_nothing_is_written(ct, change, named):
    before = _conf(ct)
    with pytest.raises(container.ContainerFailed) as e:
        container.converge({**ct, **change}, container.Host())
    assert named in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert _conf(ct) == before
