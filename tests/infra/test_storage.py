"""Phase ``storage``: the data directory is mounted from the new disk, by UUID, with ``nofail``, and the
copy equals the old data.

Run on the machine that owns the disk (the PVE host in production). ``storage_disk``, ``storage_data_path``,
``storage_old_path``, ``storage_state_file`` and ``storage_fstab`` come from the host's inventory variables
(ansible backend), else the role defaults; a host without ``storage_disk`` is skipped (phase not configured).
The data comparison uses sha256sum, not rsync, so that it checks rsync's work with another tool; it runs
while the rollback copy exists (before ``storage_cleanup_old``).
"""

from __future__ import annotations

import json
import shlex

import pytest

MARKER = ".eagle3ops-storage.json"


@pytest.fixture
def cfg(host, phase_var):
    c = {
        k: phase_var("storage", f"storage_{k}")
        for k in ("disk", "data_path", "old_path", "state_file", "fstab")
    }
    if not c["disk"]:
        pytest.skip("storage_disk is not set for this host: the storage phase is not configured here")
    f = host.file(c["state_file"])
    assert f.exists, f"no state file {c['state_file']}: the storage phase never ran on this host"
    c["state"] = json.loads(f.content_string)
    return c


def _sh(host, cmd: str) -> str:
    r = host.run(cmd)
    assert r.rc == 0, f"{cmd}: exit {r.rc}: {r.stderr}"
    return r.stdout.strip()


def test_migration_finished(cfg):
    assert cfg["state"]["step"] in ("cutover", "cleaned"), (
        f"state file {cfg['state_file']} is at step {cfg['state']['step']!r}: re-run the storage phase"
    )


def test_data_is_mounted_from_the_new_disk(host, cfg):
    path, uuid = cfg["data_path"], cfg["state"]["fs_uuid"]
    r = host.run(f"findmnt -n -o SOURCE,MAJ:MIN --mountpoint {shlex.quote(path)}")
    assert r.rc == 0 and r.stdout.strip(), f"{path} is not a mount point (not mounted); run the storage phase"
    source, majmin = r.stdout.split()[-2:]
    found = _sh(host, f"blkid -p -o value -s UUID {shlex.quote(source)}")
    assert found == uuid, (
        f"{path} is mounted from {source} (UUID={found}), not the new filesystem UUID={uuid}"
    )
    # that filesystem is a partition of storage_disk (kernel names from sysfs; no udev needed)
    disk_kname = _sh(host, f"lsblk -dno KNAME {shlex.quote(cfg['disk'])}")
    parent = _sh(host, f"lsblk -no PKNAME {shlex.quote(source)}")
    assert parent == disk_kname, f"{path} ({source}, {majmin}) is not on {cfg['disk']} ({disk_kname})"
    marker = json.loads(host.file(f"{path}/{MARKER}").content_string)
    assert marker["fs_uuid"] == uuid, f"marker {path}/{MARKER} names UUID={marker['fs_uuid']}"


def test_fstab_mounts_data_by_uuid_with_nofail(host, cfg):
    path, uuid = cfg["data_path"], cfg["state"]["fs_uuid"]
    lines = [ln.split() for ln in host.file(cfg["fstab"]).content_string.splitlines()]
    entries = [f for f in lines if len(f) >= 4 and not f[0].startswith("#") and f[1] == path]
    assert len(entries) == 1, f"{cfg['fstab']} has {len(entries)} entries for {path}: {entries}"
    src, opts = entries[0][0], entries[0][3]
    assert src == f"UUID={uuid}", f"{cfg['fstab']}: {path} is mounted from {src}, expected UUID={uuid}"
    opts = opts.split(",")
    assert "nofail" in opts, (
        f"{cfg['fstab']}: {path} lacks nofail ({opts}): a missing disk would stop the boot"
    )
    assert any(o.startswith("x-systemd.device-timeout=") for o in opts), opts


def _digest_cmd(root: str) -> str:
    q = shlex.quote(root)
    return (
        f"cd {q} && find . \\( -path ./{MARKER} -o -path ./lost+found \\) -prune -o \\( -type f -o -type l \\) "
        "-printf '%y %m %U:%G %p\\n' | LC_ALL=C sort && "
        f"find . \\( -path ./{MARKER} -o -path ./lost+found \\) -prune -o -type f -print0 | LC_ALL=C sort -z | "
        "xargs -0 -r sha256sum"
    )


def test_data_equals_the_rollback_copy(host, cfg):
    old = cfg["old_path"]
    if cfg["state"]["step"] == "cleaned" or not host.file(old).exists:
        pytest.skip(f"no rollback copy at {old} (cleaned up): nothing to compare with")
    new_sum = _sh(host, _digest_cmd(cfg["data_path"]))
    old_sum = _sh(host, _digest_cmd(old))
    assert new_sum, f"{cfg['data_path']} holds no files"
    if new_sum != old_sum:
        a, b = set(new_sum.splitlines()), set(old_sum.splitlines())
        pytest.fail(
            f"{cfg['data_path']} differs from {old}: only new {sorted(a - b)[:5]}, only old {sorted(b - a)[:5]}"
        )
