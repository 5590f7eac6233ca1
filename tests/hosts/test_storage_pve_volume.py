"""Phase ``storage`` with the old /data on a PVE storage volume that filled up: moved onto a bigger disk, nothing
lost, the volume kept as the rollback (the storage half of the original run's story: its Ceph volume ran out
mid-extraction, a new NVMe took /data).

Real: loop block devices (the "Ceph RBD volume" is an ext4 loop device of 64 MiB filled until the kernel says
ENOSPC; the new disk a 512 MiB one), mkfs, mounts, rsync, the storage role through ansible-runner against
localhost, and then the container phase's ``converge`` switching ``mp0`` to the host path. STAND-INS (no PVE host
can run here): ``pvesm`` is tests/fixtures/pvesm (``pvesm path`` answers the loop device) and ``pct``
tests/fixtures/pct, their state under the test's tmp_path; the harness (Env, fill, snapshot) is
test_storage_local.py's. Every path the role touches lives under tmp_path (fstab included).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest
from eagle3ops.host import container

from hosts.test_storage_local import NEEDS_ROOT_AND_TOOLS, Env, fill, mounted_source, run, sh, snapshot

pytestmark = NEEDS_ROOT_AND_TOOLS
FIX = Path(__file__).resolve().parents[1] / "fixtures"
MiB = 2**20


def standin(tmp: Path, name: str, root: Path) -> str:
    """A wrapper that runs the stand-in ``name`` with its state under ``root`` (the role's modules do not pass
    the test's environment on)."""
    path = tmp / name
    path.write_text(f'#!/bin/sh\nPCT_STANDIN_ROOT={root} exec {sys.executable} {FIX / name} "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.cleanup()


def fill_until_full(root: Path) -> int:
    """Write 1 MiB files until the filesystem refuses (ENOSPC), as the extraction did; the last one is left as
    the kernel left it (short). The number of whole files."""
    n = 0
    while True:
        try:
            with open(root / f"rows_{n}.pt", "wb") as f:
                f.write(os.urandom(MiB))
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            return n
        n += 1


def data_volume(env: Env) -> tuple[str, Path]:
    """The container's data volume: a 64 MiB ext4 loop device, mounted at ``env.tmp/vol`` with four files on it."""
    vol = env.loop("64M")
    sh("mkfs.ext4", "-q", "-F", vol)
    mnt = env.tmp / "vol"
    mnt.mkdir()
    sh("mount", vol, mnt)
    fill(mnt, n_files=4)
    return vol, mnt


@pytest.mark.slow
def test_a_full_volume_moves_to_a_bigger_disk_and_stays_the_rollback(env, run_playbook):
    vol, mnt = data_volume(env)
    whole = fill_until_full(mnt)
    assert whole > 10 and os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize < MiB
    before = snapshot(mnt)
    sh("umount", mnt)

    root = env.tmp / "pve"
    (root / "var/lib/pct-standin").mkdir(parents=True)
    volumes = [{"name": "vm-129-disk-1", "format": "raw", "content": "rootdir", "size": 64 * MiB, "vmid": 129,
                "path": vol}]  # fmt: skip
    (root / "var/lib/pct-standin/storage.json").write_text(json.dumps({
        "storages": {"ceph-rbd": {"type": "rbd", "total": 11 * 2**40, "used": 11 * 2**40 - MiB}},
        "volumes": {"ceph-rbd": volumes}}))  # fmt: skip
    (root / "etc/pve/lxc").mkdir(parents=True)
    (root / "etc/pve/lxc/129.conf").write_text(
        "arch: amd64\nmp0: ceph-rbd:vm-129-disk-1,mp=/data,backup=0,size=64M\nrootfs: local-lvm:vm-129-disk-0,size=8G\n"
    )
    pvesm, pct = standin(env.tmp, "pvesm", root), standin(env.tmp, "pct", root)
    env.disk = env.loop("512M")
    ask = dict(storage_source_volume="ceph-rbd:vm-129-disk-1", storage_source_vmid=129, storage_pvesm=pvesm,
               storage_pct=pct, storage_pve_config_dir=str(root / "etc/pve/lxc"))  # fmt: skip

    # the container still runs: its volume would be mounted twice; refused before anything is mounted
    sh(pct, "start", "129")
    r = run(run_playbook, env, **ask)
    assert r.rc != 0 and "container 129 is running" in r.stdout, r.summary()
    assert mounted_source(env.data) is None and not env.state.exists()
    sh(pct, "stop", "129")

    # --check says what it would do and changes nothing
    r = run(run_playbook, env, check=True, **ask)
    assert r.rc == 0 and "Would mount ceph-rbd:vm-129-disk-1" in r.stdout, r.summary()
    assert mounted_source(env.data) is None and not env.state.exists()

    r = run(run_playbook, env, **ask)
    assert r.rc == 0, r.summary()
    assert mounted_source(env.data) == f"{env.disk}p1" and snapshot(env.data) == before, "nothing lost"
    assert mounted_source(env.old) == vol and snapshot(env.old) == before, (
        "the volume is the rollback, untouched"
    )
    again = run(run_playbook, env, **ask)
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.changed_tasks()

    # the container phase points mp0 at the host path (only when asked); PVE keeps the volume as unused0
    params = {"vmid": 129, "pct": pct, "pvesm": pvesm, "gpus": "none", "config_dir": str(root / "etc/pve/lxc"),
              "passthrough": "dev", "driver_version_file": str(env.tmp / "no-driver"),
              "options": {"mp0": f"{env.data},mp=/data,backup=0"}}  # fmt: skip
    with pytest.raises(container.ContainerFailed, match="container_mp_replace: true"):
        container.converge(params, container.Host())
    container.converge({**params, "mp_replace": True}, container.Host())
    conf = (root / "etc/pve/lxc/129.conf").read_text()
    assert f"mp0: {env.data},mp=/data,backup=0\n" in conf and "unused0: ceph-rbd:vm-129-disk-1\n" in conf, (
        conf
    )
    # the bigger disk takes what the volume could not
    (env.data / "rows_more.pt").write_bytes(os.urandom(80 * MiB))


def pve_host(env: Env, vol: str) -> tuple[Path, str, str]:
    """The stand-ins' PVE host: container 129 with its data on ``ceph-rbd:vm-129-disk-1`` (the loop device ``vol``)
    and an empty LVM-thin storage ``local-lvm`` to move it to."""
    root = env.tmp / "pve"
    (root / "var/lib/pct-standin").mkdir(parents=True)
    (root / "var/lib/pct-standin/storage.json").write_text(json.dumps({
        "storages": {"ceph-rbd": {"type": "rbd", "total": 11 * 2**40, "used": 11 * 2**40 - MiB},
                     "local-lvm": {"type": "lvmthin", "total": 100 * 2**30, "used": 0, "vgname": "pve",
                                   "thinpool": "data"}},
        "volumes": {"ceph-rbd": [{"name": "vm-129-disk-1", "format": "raw", "content": "rootdir",
                                  "size": 64 * MiB, "vmid": 129, "path": vol}]}}))  # fmt: skip
    (root / "etc/pve/lxc").mkdir(parents=True)
    (root / "etc/pve/lxc/129.conf").write_text(
        "arch: amd64\nmp0: ceph-rbd:vm-129-disk-1,mp=/data,backup=0,size=64M\nrootfs: local-lvm:vm-129-disk-0,size=8G\n"
    )
    return root, standin(env.tmp, "pvesm", root), standin(env.tmp, "pct", root)


@pytest.mark.slow
def test_the_data_mount_moves_onto_a_new_pve_volume_and_the_old_one_stays(env, run_playbook):
    """``storage_target_volume: local-lvm:<GiB>``: the volume is allocated (stand-in ``pvesm alloc``: a sparse file
    standing in for the LV), formatted, the data copied and verified by checksum, ``mp0`` switched; the old volume
    is never written and PVE keeps it as ``unused0``. Too small a target, a running container: refused first."""
    vol, mnt = data_volume(env)
    (mnt / "rows_0.pt").write_bytes(os.urandom(30 * MiB))
    before = snapshot(mnt)
    sh("umount", mnt)
    root, pvesm, pct = pve_host(env, vol)
    state_json, conf = root / "var/lib/pct-standin/storage.json", root / "etc/pve/lxc/129.conf"
    pve_before = (state_json.read_text(), conf.read_text())
    ask = dict(storage_target_vmid=129, storage_pvesm=pvesm, storage_pct=pct,
               storage_pve_config_dir=str(root / "etc/pve/lxc"), storage_volume_source_path=str(env.tmp / "old"),
               storage_volume_state_file=str(env.tmp / "move.json"))  # fmt: skip

    # a target smaller than the data: refused naming both sizes, nothing allocated, mounted or switched
    r = run(run_playbook, env, storage_target_volume="local-lvm:0.02", **ask)
    assert r.rc == 2, r.summary()
    assert (
        "local-lvm:0.02 (21474836 bytes) is smaller than the data on ceph-rbd:vm-129-disk-1 (" in r.stdout
    ), r.stdout[-3000:]
    assert (state_json.read_text(), conf.read_text()) == pve_before and not (env.tmp / "move.json").exists()
    assert mounted_source(env.tmp / "old") is None and mounted_source(env.staging) is None

    ask["storage_target_volume"] = "local-lvm:1"
    sh(pct, "start", "129")
    r = run(run_playbook, env, **ask)
    assert r.rc == 2 and "container 129 is running" in r.stdout, r.summary()
    assert (state_json.read_text(), conf.read_text()) == pve_before
    sh(pct, "stop", "129")

    r = run(run_playbook, env, check=True, **ask)
    assert r.rc == 0 and r.host("localhost")["changed"] > 0 and "would allocate local-lvm:1" in r.stdout, (
        r.summary()
    )
    assert (state_json.read_text(), conf.read_text()) == pve_before

    r = run(run_playbook, env, **ask)
    assert r.rc == 0, r.summary()
    cfg = conf.read_text()
    assert "mp0: local-lvm:vm-129-disk-2,mp=/data,backup=0,size=1G\n" in cfg, cfg  # 0 and 1 are named
    assert "unused0: ceph-rbd:vm-129-disk-1\n" in cfg, cfg
    new = json.loads(state_json.read_text())["volumes"]["local-lvm"][0]
    assert new["name"] == "vm-129-disk-2" and new["size"] == 2**30 and new["vmid"] == 129
    for dev, label in (
        (new["path"], "the new volume holds every file"),
        (vol, "the old volume is untouched"),
    ):
        sh("mount", "-o", "ro", dev, mnt)
        try:
            assert snapshot(mnt) == before, label
        finally:
            sh("umount", mnt)
    assert mounted_source(env.tmp / "old") is None and mounted_source(env.staging) is None

    again = run(run_playbook, env, **ask)
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.changed_tasks()
    assert conf.read_text() == cfg
