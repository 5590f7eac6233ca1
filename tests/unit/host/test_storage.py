"""Unit tests for eagle3ops.host.storage: mount parsing, the source guard, the state file, rsync copy/verify.

No root needed: the guard runs on real temporary directories (the mount table is given explicitly where a
test needs a mount that this unprivileged process cannot make), rsync is the real rsync on real files.
The block-device, mount and Ansible proofs are in tests/hosts/test_storage_local.py (loop devices) and
tests/hosts/test_storage_nspawn.py (nspawn hosts).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from eagle3ops.host import _fs as storage__fs
from eagle3ops.host import storage
from eagle3ops.host import storage_probe as storage_storage_probe

REPO = Path(__file__).resolve().parents[3]
MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 7:3 / /srv/data rw,relatime shared:2 - xfs /dev/loop3 rw
31 22 259:0 / /srv/data\\040x rw,relatime shared:3 - xfs /dev/loop4p1 rw
32 30 7:5 / /srv/data/sub rw - ext4 /dev/loop5 rw
"""

pytestmark = pytest.mark.skipif(
    shutil.which("rsync") is None, reason="rsync not installed (make system-deps)"
)


def test_parse_mountinfo_unescapes_and_finds_containing_mount():
    mounts = storage__fs.parse_mountinfo(MOUNTINFO)
    assert [m["target"] for m in mounts] == ["/", "/srv/data", "/srv/data x", "/srv/data/sub"]
    assert storage_storage_probe.mount_at("/srv/data x", mounts)["source"] == "/dev/loop4p1"
    assert storage_storage_probe.mount_at("/srv/nothing", mounts) is None
    assert storage_storage_probe.mount_containing("/srv/data/a/b", mounts)["devnum"] == "7:3"
    assert storage_storage_probe.mount_containing("/srv/data/sub/c", mounts)["devnum"] == "7:5"
    assert (
        storage_storage_probe.mount_containing("/srv/datax", mounts)["devnum"] == "254:0"
    )  # a prefix is not a parent


def _ident(tmp_path, mounts_text, data, fstab_text=""):
    fstab = tmp_path / "fstab"
    fstab.write_text(fstab_text)
    return storage.source_identity(
        str(data), mounts=storage__fs.parse_mountinfo(mounts_text), fstab=str(fstab)
    )


def _mounts_with(data: Path, devnum="7:9", source="/dev/loop9") -> str:
    return f"22 1 254:0 / / rw - ext4 /dev/vda rw\n40 22 {devnum} / {data} rw - ext4 {source} rw\n"


def test_guard_refuses_an_empty_fresh_source_unless_allowed(tmp_path):
    data = tmp_path / "data"
    (data / "lost+found").mkdir(parents=True)  # an empty ext4 root still counts as empty
    ident = _ident(tmp_path, "22 1 254:0 / / rw - ext4 /dev/vda rw\n", data)
    assert ident["empty"] and not ident["is_mountpoint"]
    with pytest.raises(storage.StorageError, match=r"is empty.*storage_allow_empty_source"):
        storage.check_source(ident)
    storage.check_source(ident, allow_empty=True)


def test_guard_refuses_a_source_listed_in_fstab_but_not_mounted(tmp_path):
    data = tmp_path / "data"
    (data / "stale").mkdir(parents=True)  # even non-empty: it is the directory under the missing mount
    ident = _ident(
        tmp_path,
        "22 1 254:0 / / rw - ext4 /dev/vda rw\n",
        data,
        f"UUID=abc {data} ext4 defaults,nofail 0 2\n",
    )
    assert ident["fstab"]["src"] == "UUID=abc"
    with pytest.raises(storage.StorageError, match=r"lists it \(UUID=abc ext4\) but it is NOT mounted"):
        storage.check_source(ident)
    noauto = _ident(
        tmp_path, "22 1 254:0 / / rw - ext4 /dev/vda rw\n", data, f"UUID=abc {data} ext4 noauto 0 2\n"
    )
    storage.check_source(noauto)  # noauto: not mounted is its normal state


def test_guard_refuses_a_source_that_is_no_longer_the_recorded_filesystem(tmp_path):
    """The reboot/container-restart case: /data was its own mount, now it is an empty dir on /."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "hs_0.safetensors").write_bytes(b"x" * 10)
    recorded = _ident(tmp_path, _mounts_with(data), data)
    assert recorded["is_mountpoint"] and recorded["devnum"] == "7:9"
    storage.check_source(_ident(tmp_path, _mounts_with(data), data), recorded)  # same mount: fine
    (data / "hs_0.safetensors").unlink()
    after_reboot = _ident(tmp_path, "22 1 254:0 / / rw - ext4 /dev/vda rw\n", data)
    with pytest.raises(storage.StorageError, match="not the filesystem the migration started from") as e:
        storage.check_source(after_reboot, recorded)
    assert "/dev/loop9" in str(e.value) and "Nothing was copied" in str(e.value)
    # another filesystem mounted there instead: also refused
    with pytest.raises(storage.StorageError, match="not the filesystem"):
        storage.check_source(_ident(tmp_path, _mounts_with(data, "7:10", "/dev/loop10"), data), recorded)


def test_guard_refuses_a_source_that_became_empty_and_the_new_fs_itself(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a").write_text("1")
    recorded = _ident(tmp_path, "22 1 254:0 / / rw - ext4 /dev/vda rw\n", data)
    (data / "a").unlink()
    now = _ident(tmp_path, "22 1 254:0 / / rw - ext4 /dev/vda rw\n", data)
    with pytest.raises(storage.StorageError, match="empty now but had 1 entries"):
        storage.check_source(now, recorded, allow_empty=True)  # allow_empty does not cover this
    same = dict(recorded, fs_uuid="NEW")
    with pytest.raises(storage.StorageError, match="already the new filesystem"):
        storage.check_source(same, dict(recorded, fs_uuid="NEW"), new_fs_uuid="NEW")


def _state(tmp_path, step="prepared") -> Path:
    info = {
        "disk": "/dev/disk/by-id/x",
        "realpath": "/dev/loop7",
        "fingerprint": {"size_bytes": 1, "serial": "S1"},
    }
    st = storage.new_state(
        info,
        {"path": "/data"},
        data_path="/data",
        staging_path="/mnt/s",
        old_path="/data.old",
        fstype="xfs",
        fstab="/etc/fstab",
    )
    for s in storage.STEPS[1 : storage.STEPS.index(step) + 1]:
        st = storage.advance(st, s)
    path = tmp_path / "state.json"
    storage.atomic_write_json(str(path), st)
    return path


def test_state_file_steps_only_move_forward_and_survive_reload(tmp_path):
    path = _state(tmp_path, "verified")
    assert storage.load_state(str(path))["step"] == "verified"
    r = storage.record(str(path), "cutover_started", check_mode=True)
    assert r["changed"] and storage.load_state(str(path))["step"] == "verified"  # check mode wrote nothing
    assert storage.record(str(path), "cutover_started")["changed"]
    assert not storage.record(str(path), "cutover_started")["changed"]
    assert len(storage.load_state(str(path))["history"]) == storage.STEPS.index("cutover_started") + 1
    assert storage.record(str(path), "cutover")["changed"]
    st = storage.load_state(str(path))
    assert [h["step"] for h in st["history"]] == list(storage.STEPS[:7])
    assert not list(tmp_path.glob(".state.json.*.tmp"))  # atomic writes leave no temp file


def test_state_file_garbage_is_named(tmp_path):
    bad = tmp_path / "state.json"
    bad.write_text('{"version": 1, "step": "prepa')
    with pytest.raises(storage.StorageError, match=str(bad)):
        storage.load_state(str(bad))


def test_same_disk_uses_serial_or_backing_file_not_the_kernel_name():
    st = {"disk_realpath": "/dev/nvme1n1", "disk_fingerprint": {"serial": "S1", "size_bytes": 10}}
    assert storage.same_disk(
        st, {"realpath": "/dev/nvme2n1", "fingerprint": {"serial": "S1", "size_bytes": 10}}
    )
    assert not storage.same_disk(
        st, {"realpath": "/dev/nvme1n1", "fingerprint": {"serial": "S2", "size_bytes": 10}}
    )
    loop = {"disk_realpath": "/dev/loop3", "disk_fingerprint": {"backing_file": "/a.img", "size_bytes": 10}}
    assert not storage.same_disk(
        loop, {"realpath": "/dev/loop3", "fingerprint": {"backing_file": "/b.img", "size_bytes": 10}}
    )


def test_blank_problems_separates_what_force_may_override():
    info = {
        "is_root_disk": False,
        "mounts": [],
        "holders": [],
        "swaps": [],
        "read_only": False,
        "blkid": {"TYPE": "ext4", "UUID": "u-1"},
        "signatures": [{"type": "ext4", "offset": "0x438"}],
        "partitions": [],
        "partition_fs": {},
        "nonzero_head": False,
    }
    soft, hard = storage_storage_probe.blank_problems(info)
    assert (
        not hard
        and any("ext4 signature" in s and "u-1" in s for s in soft)
        and any("0x438" in s for s in soft)
    )
    info.update(mounts=[{"device": "/dev/sdb", "target": "/mnt", "fstype": "ext4"}], is_root_disk=True)
    soft, hard = storage_storage_probe.blank_problems(info)
    assert any("root filesystem" in h for h in hard) and any("/dev/sdb on /mnt" in h for h in hard)


def _tree(root: Path) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel == storage.MARKER_NAME:
            continue
        st = p.lstat()
        out[rel] = (
            oct(st.st_mode),
            st.st_nlink,
            p.read_bytes() if p.is_file() and not p.is_symlink() else None,
        )
    return out


def test_rsync_copy_then_verify_catches_a_same_size_same_mtime_change(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "d").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(100_000))
    os.link(src / "a.bin", src / "d" / "hard")
    (src / "link").symlink_to("d/hard")
    dst.mkdir()
    (dst / "stale").write_text("left from an earlier copy")
    (dst / storage.MARKER_NAME).write_text("{}")
    res = storage.run_rsync(storage.rsync_command(str(src), str(dst), mode="copy"))
    assert res["rc"] == 0, res["stderr"]
    assert _tree(src) == _tree(dst)
    assert (dst / "a.bin").stat().st_ino == (dst / "d" / "hard").stat().st_ino  # -H kept the hard link
    assert not (dst / "stale").exists() and (dst / storage.MARKER_NAME).exists()  # --delete spares the marker
    assert storage.run_rsync(storage.rsync_command(str(src), str(dst), mode="verify"))["changes"] == []
    # flip one byte, keep size and mtime: the quick check cannot see it, the checksum pass must
    target = dst / "a.bin"
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[5000] ^= 0xFF
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert storage.run_rsync(storage.rsync_command(str(src), str(dst), mode="quick"))["changes"] == []
    diff = storage.run_rsync(storage.rsync_command(str(src), str(dst), mode="verify"))["changes"]
    assert any(line.endswith("a.bin") for line in diff), diff


def test_rsync_copy_keeps_sparse_files_sparse(tmp_path):
    """The size check counts allocated bytes, so the copy must not inflate sparse files."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    with open(src / "sparse.img", "wb") as f:
        f.truncate(64 << 20)
        f.write(b"head")
    res = storage.run_rsync(storage.rsync_command(str(src), str(dst), mode="copy"))
    assert res["rc"] == 0, res["stderr"]
    st = (dst / "sparse.img").stat()
    assert st.st_size == 64 << 20 and st.st_blocks * 512 < 1 << 20, st
    assert storage.tree_size(str(dst)) < 1 << 20


def test_rsync_failures_say_what_to_do(tmp_path):
    killed = storage.rsync_failure({"rc": -9, "stderr": ""}, ["rsync"], src="/data", dst="/mnt/s")
    assert "killed by signal 9" in str(killed) and "re-run" in str(killed)
    full = storage.rsync_failure(
        {"rc": 11, "stderr": 'rsync: write failed on "x": No space left on device (28)'},
        ["rsync"],
        src="/data",
        dst=str(tmp_path),
    )
    assert "is full" in str(full) and "bigger disk" in str(full)


def test_module_utils_ships_this_file_and_the_durable_primitives_it_imports():
    """The PVE host has no eagle3ops: module_utils/eagle3ops_storage.py must be this very file, with the durable
    primitives it imports beside it (that both need only the stdlib: tests/unit/core/test_durable.py)."""
    link = REPO / "module_utils" / "eagle3ops_storage.py"
    assert link.resolve() == Path(storage.__file__).resolve()
    assert (REPO / "module_utils" / "eagle3ops_durable.py").resolve() == Path(
        storage__fs._durable.__file__
    ).resolve()


def test_cli_status_prints_the_state_and_refuses_a_missing_file(tmp_path):
    path = _state(tmp_path, "copied")
    exe = [sys.executable, "-m", "eagle3ops", "storage", "status", "--state-file"]
    ok = subprocess.run([*exe, str(path), "--json"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["step"] == "copied"
    missing = subprocess.run([*exe, str(tmp_path / "none.json")], capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and "no migration has started" in missing.stderr
