"""Issue #10.5, storage: an inventory that points the storage phase at a disk holding a MOUNTED filesystem is
refused — even with storage_force — with a message naming the device, the mount and the variable to fix,
and the filesystem, its files and the data directory are untouched.

Real parts: a loop device with ext4, a real mount, the real storage role through ansible-runner (the harness
of tests/hosts/test_storage_local.py, whose other storage faults are not repeated here: rsync killed
mid-copy, the empty-/data-after-restart refusal, a disk too small, a disk with a filesystem).
"""

from __future__ import annotations

import os

import pytest
from hosts.test_storage_local import NEEDS_ROOT_AND_TOOLS, Env, fs_uuid, run, sh, snapshot

pytestmark = NEEDS_ROOT_AND_TOOLS  # the harness's own marks: root, loop devices, the storage tools


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.cleanup()


def test_a_mounted_filesystem_is_refused_even_with_force(env, run_playbook, figures):
    env.disk = env.loop("64M")
    sh("mkfs.ext4", "-q", "-L", "inuse", env.disk)
    uuid = fs_uuid(env.disk)
    mnt = env.tmp / "inuse"
    mnt.mkdir()
    sh("mount", env.disk, mnt)
    (mnt / "precious.bin").write_bytes(os.urandom(100_000))
    (env.data / "hidden_states").mkdir(parents=True)
    (env.data / "hidden_states" / "hs_0.safetensors").write_bytes(os.urandom(50_000))
    in_use, data_before = snapshot(mnt), snapshot(env.data)
    for force in (False, True):
        r = run(run_playbook, env, storage_force=force)
        assert r.rc != 0, r.summary()
        out = r.stdout
        assert f"refusing disk {env.disk}" in out and f"mounted: {env.disk} on {mnt} (ext4)" in out, out[
            -3000:
        ]
        assert "storage_disk" in out, out[-3000:]
        assert snapshot(mnt) == in_use and snapshot(env.data) == data_before
        assert fs_uuid(env.disk) == uuid and not env.state.exists()
        assert env.fstab.read_text() == "# test fstab\n"
        figures["bad_inputs_refused"] += 1
