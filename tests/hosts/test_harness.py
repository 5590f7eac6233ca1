"""The nspawn harness itself: a host boots with real systemd, Ansible/testinfra reach it, a bound loop
device is a real block device inside, a restart keeps files but not mounts, teardown leaves nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hosts import nspawn

pytestmark = [pytest.mark.root, pytest.mark.nspawn]


def test_boot_ansible_testinfra_restart_teardown(make_host, make_loop_device, run_playbook):
    loop = make_loop_device("256M")
    h = make_host(binds={loop.device: "/dev/vdb"})
    assert h.boot_seconds < 60, f"boot took {h.boot_seconds:.1f}s"

    # real systemd as PID 1, our hostname and address
    assert h.ssh("cat /proc/1/comm").stdout.strip() == "systemd"
    assert h.ssh("hostname").stdout.strip() == h.name
    assert h.ssh("systemctl is-system-running").stdout.strip() in ("running", "degraded")
    # no route out: the host is air-gapped except for its /30
    routes = h.ssh("ip -4 route").stdout
    assert "default" not in routes, routes

    # the loop device is a block device inside the guest; a filesystem on it mounts
    assert h.ssh("test -b /dev/vdb && echo yes").stdout.strip() == "yes"
    h.ssh("mkfs.ext4 -q /dev/vdb && mkdir -p /mnt/d && mount /dev/vdb /mnt/d && echo hi > /mnt/d/f")
    assert h.ssh("cat /mnt/d/f").stdout.strip() == "hi"

    # Ansible through ansible-runner: changed on the first run, changed == 0 on the second
    pb = Path(__file__).parent / "playbooks/facts.yml"
    r1 = run_playbook(pb, h.inventory)
    assert r1.rc == 0, r1.summary()
    assert r1.host(h.name)["changed"] == 1, r1.summary()
    r2 = run_playbook(pb, h.inventory)
    assert r2.rc == 0 and r2.host(h.name)["changed"] == 0, r2.summary()
    assert h.ssh("cat /etc/e3t-marker").stdout.strip() == h.name

    # testinfra over both backends
    for backend in ("ssh", "ansible"):
        t = h.testinfra_host(backend)
        assert t.file("/etc/e3t-marker").content_string.strip() == h.name
        assert t.service("ssh").is_running

    # restart: written files stay, the mount is gone (what the storage phase must be safe against)
    pid_before = h.pid
    h.restart()
    assert h.pid != pid_before
    assert h.ssh("cat /etc/e3t-marker").stdout.strip() == h.name
    assert h.ssh("test -d /mnt/d && mountpoint -q /mnt/d; echo $?").stdout.strip() == "32"  # not a mountpoint
    assert h.ssh("test -b /dev/vdb && echo yes").stdout.strip() == "yes"

    # teardown by PID: process gone, veth gone, overlay unmounted, workdir removed
    pid, veth, merged, workdir = h.pid, f"ve-{h.name}", h.merged, h.workdir
    h.destroy()
    assert not os.path.exists(f"/proc/{pid}") or nspawn._is_zombie(pid)
    assert not Path(f"/sys/class/net/{veth}").exists()
    assert not os.path.ismount(merged)
    assert not workdir.exists()


def test_two_hosts_get_distinct_names_and_subnets(make_host):
    a, b = make_host(), make_host()
    assert a.name != b.name and a.ip != b.ip
    assert a.ssh("hostname").stdout.strip() == a.name
    assert b.ssh("hostname").stdout.strip() == b.name
    inv = nspawn.inventory_ini([a, b])
    assert f"{a.name} ansible_host={a.ip}" in inv and f"{b.name} ansible_host={b.ip}" in inv


def test_loop_device_detached_after_use(make_loop_device):
    loop = make_loop_device("64M")
    dev = loop.device
    out = subprocess.run(["losetup", "-j", str(loop.backing)], capture_output=True, text=True).stdout
    assert dev in out
    loop.detach()
    out = subprocess.run(["losetup", "-j", str(loop.backing)], capture_output=True, text=True).stdout
    assert dev not in out


def test_claims_of_a_dead_session_are_reaped(make_host):
    """A pytest session killed without finalizers leaves a running host behind; the next allocation
    finds its claim (owner PID dead), stops that host by its PID and removes its mount, veth and files."""
    h = make_host()
    dead = subprocess.Popen(["true"])
    dead.wait()
    claim = nspawn.RUN_DIR / "net" / str(h.idx)
    text = claim.read_text()
    claim.write_text(text.replace(f"owner={os.getpid()}", f"owner={dead.pid}"))
    pid, merged, workdir = h.pid, h.merged, h.workdir
    idx = nspawn.allocate_subnet()
    try:
        assert not (nspawn.RUN_DIR / "net" / str(h.idx)).exists() or h.idx == idx
        assert not os.path.exists(f"/proc/{pid}") or nspawn._is_zombie(pid)
        assert not Path(f"/sys/class/net/ve-{h.name}").exists()
        assert not os.path.ismount(merged) and not workdir.exists()
    finally:
        nspawn.release_subnet(idx)
        h.pid = 0  # already gone; the fixture's teardown then has nothing left to stop
