"""The `container` phase on a real Debian host (systemd-nspawn) that plays the Proxmox VE host.

STAND-INS (no PVE host can run here), said plainly:
* ``/usr/sbin/pct`` on the test host is tests/fixtures/pct: it keeps ``/etc/pve/lxc/<vmid>.conf`` in PVE's
  syntax (snapshot and ``[pve:pending]`` sections included; non-hotplug ``pct set`` on a running container
  goes to pending, ``start`` applies it) and runs ``pct exec <vmid> -- cmd`` on the test host itself, so
  "the container" of these tests is the test host.
* The NVIDIA nodes are real character devices made with mknod in the test host's /dev, with the majors of
  an H200 host (195, nvidia-uvm 508, nvidia-caps 234); /proc/devices is that host's copy
  (tests/fixtures/pve/proc-devices.txt), since no NVIDIA driver is loaded here.
Everything else is real: sshd, sudo, Ansible over ssh, community.proxmox.proxmox_pct_remote over paramiko.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.nspawn, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures"
PLAYBOOK = "playbooks/container.yml"
NODES = [("nvidia0", 195, 0), ("nvidia1", 195, 1), ("nvidiactl", 195, 255), ("nvidia-uvm", 508, 0),
         ("nvidia-uvm-tools", 508, 1), ("nvidia-caps/nvidia-cap1", 234, 1)]  # fmt: skip
PVE_VARS = {
    "container_vmid": 140,
    "container_proc_devices": "/srv/pve/proc-devices",
    "container_data_host_path": "/srv/data",
    "container_passthrough": "dev",
}


def make_pve_host(make_host, *, user: str = "root", sudo: str = "ALL", binds=None, **host_vars):
    """A booted test host with the stand-in pct, NVIDIA nodes in /dev and /srv/data; reached as ``user``
    (with become when not root: sudoers line ``user ALL=(root) NOPASSWD: <sudo>``)."""
    hv = {**PVE_VARS, **host_vars}
    if user != "root":
        hv.update(ansible_user=user, ansible_become="true")
    h = make_host(groups=("proxmox_hosts",), host_vars=hv, binds=binds)
    h.put("/usr/sbin/pct", (FIX / "pct").read_text(), mode="0755")
    h.put("/srv/pve/proc-devices", (FIX / "pve" / "proc-devices.txt").read_text())
    mk = " && ".join(f"mknod -m 0666 /dev/{n} c {ma} {mi}" for n, ma, mi in NODES)
    h.ssh(f"mkdir -p /dev/nvidia-caps /srv/data /etc/pve/lxc && {mk}")
    if user != "root":
        h.ssh(
            f"useradd -m -s /bin/bash {user} && install -d -m 700 -o {user} /home/{user}/.ssh && "
            f"install -m 600 -o {user} /root/.ssh/authorized_keys /home/{user}/.ssh/ && "
            f"echo '{user} ALL=(root) NOPASSWD: {sudo}' > /etc/sudoers.d/{user} && chmod 440 /etc/sudoers.d/{user}"
        )
    return h


def _infra(inv, env) -> subprocess.CompletedProcess:
    """Run the user-facing testinfra file against the gpu_containers group of ``inv``, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(REPO / "tests/infra/test_container.py"),
         "--hosts=ansible://gpu_containers", f"--ansible-inventory={inv}"],
        capture_output=True, text=True, cwd=REPO, timeout=600, check=False, env={**os.environ, **env},
    )  # fmt: skip


def conf(h, vmid: int) -> str:
    return h.ssh(f"cat /etc/pve/lxc/{vmid}.conf").stdout


def module_result(r, host):
    res = r.task_results("Container | GPUs, data mount, sizes and features; start it", host)
    assert res, r.summary()
    return res[-1]


def test_converge_second_run_and_check_change_nothing_with_become(make_host, run_playbook):
    """Fresh host, non-root ssh user with become: --check creates nothing; converge creates the container
    (pct create), passes every node through as devN, mounts /data, starts it; run 2 and --check: changed=0."""
    h = make_pve_host(make_host, user="ansible")

    r = run_playbook(PLAYBOOK, h.inventory, check=True, diff=True)
    assert r.rc == 0, r.summary()
    assert h.ssh("test -e /etc/pve/lxc/140.conf", check=False).returncode == 1, (
        "--check created the container"
    )
    assert h.ssh("ls /var/lib/pct-standin 2>/dev/null | grep -c running", check=False).stdout.strip() in (
        "",
        "0",
    )

    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0, r.summary()
    assert r.host(h.name)["changed"] >= 2, r.changed_tasks()
    text = conf(h, 140)
    devs = dict(re.findall(r"^(dev\d+): (\S+)$", text, flags=re.M))
    assert sorted(devs.values()) == sorted(f"/dev/{n}" for n, _ma, _mi in NODES), text
    assert "mp0: /srv/data,mp=/data,backup=0\n" in text
    assert "features: nesting=1\n" in text and "rootfs: local-lvm:vm-140-disk-0,size=64G\n" in text
    assert "lxc." not in text  # dev mode: no raw lines
    assert h.ssh("pct status 140").stdout.strip() == "status: running"
    res = module_result(r, h.name)
    assert res["passthrough"] == "dev" and res["started"] is True and res["restart_needed"] is False

    r2 = run_playbook(PLAYBOOK, h.inventory)
    assert r2.rc == 0 and r2.host(h.name)["changed"] == 0, r2.changed_tasks()
    before = hashlib.sha256(conf(h, 140).encode()).hexdigest()
    r3 = run_playbook(PLAYBOOK, h.inventory, check=True, diff=True)
    assert r3.rc == 0 and r3.host(h.name)["changed"] == 0, r3.changed_tasks()
    assert hashlib.sha256(conf(h, 140).encode()).hexdigest() == before


def test_snapshot_config_raw_lines_edited_in_main_section_only(make_host, run_playbook):
    """PVE < 8.1 style (raw lines) on a config with two snapshot sections, written for the previous kernel
    (nvidia-uvm was 509): --check --diff shows the lines and writes nothing; the run fixes the main section
    only — snapshot sections byte-for-byte unchanged, foreign raw lines kept — and says a restart is needed."""
    # the fixture's mp0 is /mnt/pve/nvme-data: replaced with /srv/data only because container_mp_replace says so
    h = make_pve_host(make_host, container_vmid=129, container_passthrough="raw",
                      container_cores=64, container_memory_mb=524288, container_mp_replace=True)  # fmt: skip
    original = (FIX / "pve" / "129.conf").read_text()
    h.put("/etc/pve/lxc/129.conf", original, mode="0640")
    h.ssh("pct start 129")
    snaps = original[original.index("\n[before-upgrade]\n") :]

    r = run_playbook(PLAYBOOK, h.inventory, check=True, diff=True)
    assert r.rc == 0, r.summary()
    assert r.host(h.name)["changed"] == 1, r.changed_tasks()
    assert conf(h, 129) == original, "--check wrote the config"
    assert "-lxc.cgroup2.devices.allow: c 509:* rwm" in r.stdout
    assert "+lxc.cgroup2.devices.allow: c 508:* rwm" in r.stdout
    assert "+mp0: /srv/data,mp=/data,backup=0" in r.stdout

    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0, r.summary()
    text = conf(h, 129)
    assert text.endswith(snaps), "a snapshot section changed"
    main = text[: text.index("\n[before-upgrade]\n")]
    raw = [x for x in main.splitlines() if x.startswith("lxc.")]
    assert "lxc.cgroup2.devices.allow: c 509:* rwm" not in raw
    for line in ("lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 508:* rwm",
                 "lxc.cgroup2.devices.allow: c 234:* rwm", "lxc.cgroup2.devices.allow: c 10:200 rwm",
                 "lxc.mount.entry: /dev/net/tun dev/net/tun none bind,create=file",
                 "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
                 "lxc.mount.entry: /dev/nvidia-caps/nvidia-cap1 dev/nvidia-caps/nvidia-cap1 none bind,optional,create=file"):  # fmt: skip
        assert raw.count(line) == 1, (line, main)
    assert main.startswith("#EAGLE-3 GPU container\n#%0Aowner%3A ml-team\narch: amd64\n")
    res = module_result(r, h.name)
    assert res["restart_needed"] is True and "pct reboot 129" in res["restart_reason"]
    assert res["snapshots"] == ["before-upgrade", "pre-driver-580"]

    r2 = run_playbook(PLAYBOOK, h.inventory)
    assert r2.rc == 0 and r2.host(h.name)["changed"] == 0, r2.changed_tasks()
    assert conf(h, 129) == text


def test_new_gpu_on_running_container_waits_for_restart_flag(make_host, run_playbook):
    """A GPU appears on the host while the container runs: devN goes to [pve:pending], the run warns and
    stays changed=0 on repeat; container_restart=true restarts and applies it, once."""
    h = make_pve_host(make_host)
    assert run_playbook(PLAYBOOK, h.inventory).rc == 0
    h.ssh("mknod -m 0666 /dev/nvidia2 c 195 2")

    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0 and r.host(h.name)["changed"] == 1, r.changed_tasks()
    res = module_result(r, h.name)
    assert res["restart_needed"] is True and res["restarted"] is False
    assert "[pve:pending]\ndev6: /dev/nvidia2\n" in conf(h, 140)
    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.host(h.name)["changed"] == 0 and module_result(r, h.name)["restart_needed"] is True

    r = run_playbook(PLAYBOOK, h.inventory, extravars={"container_restart": True})
    assert r.rc == 0 and module_result(r, h.name)["restarted"] is True, r.summary()
    text = conf(h, 140)
    assert "pve:pending" not in text and "\ndev6: /dev/nvidia2\n" in text
    r = run_playbook(PLAYBOOK, h.inventory, extravars={"container_restart": True})
    assert r.host(h.name)["changed"] == 0, r.changed_tasks()


def test_stale_device_node_and_missing_data_path_fail_with_the_fix(make_host, run_playbook):
    """A /dev/nvidia-uvm left from the old kernel (major 509) and a missing /data host path are refused
    with messages that say what to do; nothing is written. Another host path than the container's mp0 is
    refused first as a mount-point change (container_mp_replace); allowed, the missing path is refused."""
    h = make_pve_host(make_host)
    assert run_playbook(PLAYBOOK, h.inventory).rc == 0
    before = conf(h, 140)
    h.ssh("rm /dev/nvidia-uvm && mknod -m 0666 /dev/nvidia-uvm c 509 0")
    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc != 0 and "nvidia-modprobe -u -c=0" in r.stdout and "major 509" in r.stdout, r.summary()
    h.ssh("rm /dev/nvidia-uvm && mknod -m 0666 /dev/nvidia-uvm c 508 0")
    r = run_playbook(PLAYBOOK, h.inventory, extravars={"container_data_host_path": "/srv/nope"})
    assert r.rc != 0 and "container_mp_replace: true" in r.stdout, r.summary()
    assert conf(h, 140) == before
    xv = {"container_data_host_path": "/srv/nope", "container_mp_replace": True}
    r = run_playbook(PLAYBOOK, h.inventory, extravars=xv)
    assert r.rc != 0 and "run the storage phase first" in r.stdout, r.summary()
    assert conf(h, 140) == before


def test_driver_user_space_must_match_the_host_driver(make_host, run_playbook):
    """STAND-IN driver: the host's /sys/module/nvidia/version is a file the test writes, and the container's
    user-space is an (empty) libnvidia-ml.so.<version> file. Missing or different -> the run fails naming
    the installer to use; the same version -> passes, changed=0."""
    h = make_pve_host(make_host, container_driver_version_file="/srv/pve/nvidia-version")
    h.put("/srv/pve/nvidia-version", "580.159\n")
    lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so"
    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc != 0 and "libnvidia-ml nowhere" in r.stdout, r.summary()
    assert "NVIDIA-Linux-x86_64-580.159.run" in r.stdout and "--no-kernel-module" in r.stdout
    h.ssh(f"touch {lib}.575.64")
    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc != 0 and "has libnvidia-ml 575.64" in r.stdout, r.summary()
    h.ssh(f"rm {lib}.575.64 && touch {lib}.580.159")
    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0 and r.host(h.name)["changed"] == 0, r.summary()
    assert module_result(r, h.name)["container_driver_versions"] == ["580.159"]


def test_playbook_reaches_container_through_proxmox_pct_remote(make_host, run_playbook, tmp_path):
    """gpu_containers host over community.proxmox.proxmox_pct_remote: paramiko ssh to the PVE host as a
    non-root user whose only sudo right is /usr/sbin/pct (the documented sudoers line), then
    `sudo pct exec 140 -- ...` — commands, file put/fetch and facts arrive, as uid 0 in "the container"."""
    h = make_pve_host(make_host, user="ansible", sudo="/usr/sbin/pct")
    root_inv = tmp_path / "root.ini"
    root_inv.write_text(h.inventory.read_text().replace("ansible_user=ansible", "ansible_user=root"))
    assert run_playbook(PLAYBOOK, root_inv).rc == 0

    ct = {
        "ansible_host": h.ip, "ansible_user": "ansible", "proxmox_vmid": 140,
        "ansible_connection": "community.proxmox.proxmox_pct_remote",
        "ansible_ssh_private_key_file": str(h.key), "ansible_host_key_checking": "false",
        "ansible_python_interpreter": "/usr/bin/python3",
    }  # fmt: skip
    inv = tmp_path / "ct.ini"
    inv.write_text("[gpu_containers]\nct140 " + " ".join(f"{k}={v}" for k, v in ct.items()) + "\n")
    env = {"ANSIBLE_PARAMIKO_RECORD_HOST_KEYS": "False"}  # keep the throwaway host out of known_hosts
    r = run_playbook("tests/hosts/playbooks/container_reach.yml", inv, envvars=env)
    assert r.rc == 0, r.summary()
    assert f"uid=0 file=reached ct140 through pct exec 140 hostname={h.name}" in r.stdout
    assert h.ssh("cat /root/eagle3ops-reached").stdout == "reached ct140 through pct exec 140\n"
    log = h.ssh("cat /var/lib/pct-standin/exec.log").stdout
    assert re.search(r"^140 uid=0 /bin/sh -c ", log, flags=re.M), log
    assert h.ssh("grep -c . /var/lib/pct-standin/exec.log").stdout.strip() != "0"

    # the user-facing testinfra suite, through the same connection; PVE would bind /srv/data at /data
    # (mp0) when it starts the container: the stand-in does not, so the test does
    h.ssh("mkdir -p /data && mount --bind /srv/data /data")
    ok = _infra(inv, env)
    assert ok.returncode == 0 and "3 passed, 1 skipped" in ok.stdout, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert "no NVIDIA GPU behind this container" in ok.stdout
    h.ssh("umount /data && rm /dev/nvidia-uvm")  # a container started without its mount and a node
    bad = _infra(inv, env)
    assert bad.returncode == 1 and "2 failed" in bad.stdout, bad.stdout[-3000:]
    assert "missing: ['/dev/nvidia-uvm']" in bad.stdout and "/data is not a mount point" in bad.stdout

    h.ssh("pct stop 140")  # the container is down: the same play cannot reach it (pct exec exits 255)
    n = len(h.ssh("cat /var/lib/pct-standin/exec.log").stdout.splitlines())
    r = run_playbook("tests/hosts/playbooks/container_reach.yml", inv, envvars=env)
    assert r.host("ct140")["unreachable"] == 1 and "exited with result 255" in r.stdout, r.summary()
    assert len(h.ssh("cat /var/lib/pct-standin/exec.log").stdout.splitlines()) == n  # nothing ran


def test_data_cutover_reaches_the_running_container(make_host, make_loop_device, run_playbook):
    """Issue 16 section 5: site.yml's storage phase moves the PVE host's /data onto a new disk while container
    140 runs with ``mp0: /data,mp=/data``; the container phase after it must make the container see the new
    disk. A pipeline job inside refuses the restart (naming its PID) - meanwhile a write from inside really
    lands in the rollback copy /data.old; once the job is gone the container phase restarts the container and
    a file written from inside lands on the new disk. Second run: changed=0.

    STAND-INS (no PVE host can run here): the PVE host is an nspawn host carrying tests/fixtures/pct in its
    mount-namespace mode: "container 140" is a process in its own mount namespace with its own root, its
    ``mp0`` host path bind-mounted at start exactly as LXC does it (a real bind mount: it follows the renamed
    directory), ``pct exec`` enters it with nsenter. The new NVMe disk is a loop device bound in as /dev/vdb
    (no udev: ``storage_disk_require_stable_name: false``). The pipeline job is a python script named
    ``eagle3ops`` run as ``eagle3ops extract ...`` (the form the real CLI's command line has).
    """
    disk = make_loop_device("512M")  # mkfs.xfs wants 300 MB (sparse: nothing is allocated)
    # a reused loop device can carry the kernel's partitions of a previous user: drop them (ours now)
    subprocess.run(["partx", "-d", disk.device], capture_output=True, check=False)
    h = make_pve_host(
        make_host, binds={disk.device: "/dev/vdb"}, container_data_host_path="/data",
        storage_disk="/dev/vdb", storage_disk_require_stable_name=False, storage_async_timeout=0,
    )  # fmt: skip
    h.ssh("mkdir -p /data/eagle3 /var/lib/pct-standin && echo seed > /data/eagle3/prepared.txt && "
          "touch /var/lib/pct-standin/mount-namespaces")  # fmt: skip
    h.put("/etc/pve/lxc/140.conf", "arch: amd64\nhostname: eagle3\nmp0: /data,mp=/data,backup=0\nostype: debian\n"
          "rootfs: local-lvm:vm-140-disk-0,size=64G\n", mode="0640")  # fmt: skip
    h.ssh("pct start 140")
    assert h.ssh("pct exec 140 -- cat /data/eagle3/prepared.txt").stdout == "seed\n"
    job = "printf '#!/usr/bin/python3\\nimport time\\ntime.sleep(600)\\n' > /tmp/eagle3ops && chmod +x /tmp/eagle3ops"
    h.ssh(f"pct exec 140 -- sh -c \"{job} && setsid /tmp/eagle3ops extract --data /data/eagle3/data "
          "</dev/null >/dev/null 2>&1 &\"")  # fmt: skip
    job_pid = h.ssh("sleep 0.5; pgrep -f '/tmp/eagle3ops extract'").stdout.split()[0]

    r = run_playbook("site.yml", h.inventory, tags="storage,container")
    assert r.rc != 0, "the container phase let a container bound to the rollback copy go on: " + r.summary()
    new = h.ssh("findmnt -n -o SOURCE --mountpoint /data", check=False).stdout.strip()
    uuid = json.loads(h.ssh("cat /var/lib/eagle3ops/storage-state.json").stdout)["fs_uuid"]
    assert new and h.ssh(f"blkid -p -o value -s UUID {new}").stdout.strip() == uuid, (
        "no cut-over: " + r.summary()
    )
    assert "Not restarting container 140 while pipeline jobs run inside" in r.stdout, r.stdout[-3000:]
    assert f"PID {job_pid} `/usr/bin/python3 /tmp/eagle3ops extract" in r.stdout and "/data.old" in r.stdout
    # what the refusal is about, for real: the container still writes into the rollback copy
    h.ssh("pct exec 140 -- sh -c 'echo during > /data/eagle3/during-job.txt'")
    assert h.ssh("cat /data.old/eagle3/during-job.txt").stdout == "during\n"
    assert h.ssh("test -e /data/eagle3/during-job.txt", check=False).returncode == 1

    h.ssh(f"kill {job_pid}")
    r = run_playbook(PLAYBOOK, h.inventory, extravars={"container_on_stale_mount": "fail"})
    assert r.rc != 0 and "Restart the container when nothing runs inside (pct reboot 140)" in r.stdout, (
        r.summary()
    )
    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0, r.summary()
    res = module_result(r, h.name)
    assert res["restarted"] is True and [s["key"] for s in res["stale_mounts"]] == ["mp0"], res
    h.ssh("pct exec 140 -- sh -c 'echo after > /data/eagle3/written-inside.txt'")
    where = h.ssh("findmnt -n -o SOURCE --target /data/eagle3/written-inside.txt").stdout.strip()
    assert where == new, f"written from inside, the file is on {where}, not on the new disk {new}"
    assert h.ssh("cat /data/eagle3/written-inside.txt").stdout == "after\n"
    assert h.ssh("test -e /data.old/eagle3/written-inside.txt", check=False).returncode == 1
    assert h.ssh("pct exec 140 -- cat /data/eagle3/prepared.txt").stdout == "seed\n"  # the copied data

    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0 and r.host(h.name)["changed"] == 0, r.changed_tasks()
    assert module_result(r, h.name)["stale_mounts"] == []
