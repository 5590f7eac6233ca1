"""The STAND-IN ``pct`` (tests/fixtures/pct) that the container-phase proofs rely on behaves like PVE's where
those proofs depend on it: snapshot sections kept, non-hotplug changes of a running container pending until
start, raw keys refused, exec only into a running container. Runs the script with PCT_STANDIN_ROOT."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from eagle3ops.host import pve

FIX = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.fixture
def pct(tmp_path):
    (tmp_path / "etc/pve/lxc").mkdir(parents=True)

    def run(*args, check=True):
        p = subprocess.run([sys.executable, str(FIX / "pct"), *map(str, args)], capture_output=True, text=True,
                           env={**os.environ, "PCT_STANDIN_ROOT": str(tmp_path)}, check=False)  # fmt: skip
        if check:
            assert p.returncode == 0, p.stderr
        return p

    run.conf = lambda vmid: (tmp_path / f"etc/pve/lxc/{vmid}.conf").read_text()
    run.root = tmp_path
    return run


def test_create_status_start_exec_stop(pct):
    pct("create", 140, "local:vztmpl/debian.tar.zst", "--storage", "local-lvm", "--rootfs", "local-lvm:8",
        "--cores", "4", "--hostname", "ct")  # fmt: skip
    assert "rootfs: local-lvm:vm-140-disk-0,size=8G\n" in pct.conf(140)
    assert "already exists" in pct("create", 140, "x", check=False).stderr
    assert pct("status", 140).stdout == "status: stopped\n"
    assert pct("exec", 140, "--", "true", check=False).returncode == 255
    pct("start", 140)
    assert pct("exec", 140, "--", "sh", "-c", "echo hi").stdout == "hi\n"
    assert "140 uid=" in (pct.root / "var/lib/pct-standin/exec.log").read_text()
    assert "140" in pct("list").stdout and "running" in pct("list").stdout
    pct("stop", 140)
    assert pct("status", 140).stdout == "status: stopped\n"


def test_set_keeps_snapshots_and_pends_while_running(pct):
    original = (FIX / "pve" / "129.conf").read_text()
    (pct.root / "etc/pve/lxc/129.conf").write_text(original)
    snaps = original[original.index("\n[before-upgrade]\n") :]
    pct("set", 129, "--cores", "8", "--dev0", "/dev/nvidia0")
    text = pct.conf(129)
    assert text.endswith(snaps) and "cores: 8\n" in text and "dev0: /dev/nvidia0\n" in text
    assert "lxc.cgroup2.devices.allow: c 10:200 rwm\n" in text  # raw lines kept
    assert "property is not defined" in pct("set", 129, "--lxc.foo", "x", check=False).stderr
    pct("start", 129)
    pct("set", 129, "--memory", "1024", "--dev1", "/dev/nvidia1", "--delete", "dev0")
    cfg = pve.PveConfig.parse(pct.conf(129))
    assert cfg.main.get("memory") == "1024" and cfg.main.get("dev0") == "/dev/nvidia0"
    assert cfg.section(pve.PENDING).keys() == {"dev1": "/dev/nvidia1", "delete": "dev0"}
    assert [s.render() for s in cfg.sections[2:]] == [
        s.render() for s in pve.PveConfig.parse(original).sections[1:]
    ]
    pct("stop", 129)
    pct("start", 129)
    cfg = pve.PveConfig.parse(pct.conf(129))
    assert (
        cfg.section(pve.PENDING) is None
        and cfg.main.get("dev1") == "/dev/nvidia1"
        and cfg.main.get("dev0") is None
    )
