"""Phase ``storage`` on this machine with real loop devices (the role runs against localhost).

Real parts: loop block devices from sparse files, parted/mkfs.xfs/mkfs.ext4, real mounts, real rsync, the
real role through ansible-runner, real SIGKILL. Every path the role touches (data, rollback, staging,
state file, fstab) lives under the test's tmp_path: ``storage_fstab`` points at a private fstab file, so
this machine's /etc/fstab and /data are never touched. What a machine-level run cannot show (udev names,
fstab at boot, a container restart) is in test_storage_nspawn.py.

Loop devices are created and detached here, by name; every mount under tmp_path is unmounted first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eagle3ops.host import storage
from eagle3ops.host import storage_probe as storage_storage_probe
from proc_helpers import run_infra

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = "playbooks/storage.yml"
MARKER = ".eagle3ops-storage.json"
TOOLS = ("losetup", "parted", "mkfs.xfs", "mkfs.ext4", "rsync", "wipefs", "blkid", "partx", "findmnt")

NEEDS_ROOT_AND_TOOLS = [  # this module's marks, shared by the tests that use its harness
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (loop devices, mounts); CI runs as root"),
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in TOOLS),
        reason=f"needs {', '.join(TOOLS)}: run `make system-deps`",
    ),
]
pytestmark = NEEDS_ROOT_AND_TOOLS


def sh(*cmd, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
    if check and p.returncode:
        raise AssertionError(f"{' '.join(map(str, cmd))}: exit {p.returncode}: {p.stderr}")
    return p


class Env:
    """One test's world: a new disk, a data directory, and the role's variables pointing inside tmp_path."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.loops: list[str] = []
        self.data, self.old, self.staging = tmp / "data", tmp / "data.old", tmp / "staging"
        self.state, self.fstab, self.inv = tmp / "state.json", tmp / "fstab", tmp / "inventory.yml"
        self.fstab.write_text("# test fstab\n")
        self.disk = ""

    def loop(self, size: str) -> str:
        img = self.tmp / f"disk{len(self.loops)}.img"
        sh("truncate", "-s", size, img)
        dev = sh("losetup", "-f", "--show", img).stdout.strip()
        assert dev.startswith("/dev/loop"), dev
        self.loops.append(dev)
        # a loop device reused after someone's parted keeps the kernel's old partitions: drop them (ours now)
        sh("partx", "-d", dev, check=False)
        return dev

    def vars(self, **extra) -> dict:
        v = {
            "storage_disk": self.disk,
            "storage_disk_require_stable_name": False,
            "storage_data_path": str(self.data),
            "storage_old_path": str(self.old),
            "storage_staging_path": str(self.staging),
            "storage_state_file": str(self.state),
            "storage_fstab": str(self.fstab),
        }
        v.update(extra)
        return v

    def write_inventory(self, **extra) -> Path:
        hv = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            **self.vars(**extra),
        }
        self.inv.write_text(json.dumps({"all": {"hosts": {"localhost": hv}}}))
        return self.inv

    def cleanup(self) -> None:
        mounts = sh("findmnt", "-rn", "-o", "TARGET", check=False).stdout.split()
        mine = [m for m in mounts if m.startswith(str(self.tmp))]
        for m in sorted(mine, key=len, reverse=True):
            sh("umount", m, check=False)
        for dev in self.loops:
            sh("partx", "-d", dev, check=False)  # partitions added by parted outlive a plain detach
            sh("losetup", "-d", dev, check=False)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.cleanup()


def fill(root: Path, n_files: int = 6, size: int = 200_000) -> None:
    """Data that exercises -aHAX --numeric-ids: owners without names, modes, hard links, symlinks, xattrs."""
    (root / "hidden_states" / "nested").mkdir(parents=True, exist_ok=True)
    (root / "empty dir").mkdir(exist_ok=True)
    for i in range(n_files):
        (root / "hidden_states" / f"hs_{i}.safetensors").write_bytes(os.urandom(size))
    f = root / "hidden_states" / "nested" / "ünïcode name.json"
    f.write_text('{"a": 1}\n')
    os.chown(f, 4242, 4343)  # ids no passwd entry names: --numeric-ids must keep them
    os.chmod(f, 0o600)
    os.link(root / "hidden_states" / "hs_0.safetensors", root / "hardlink.safetensors")
    (root / "latest").symlink_to("hidden_states/hs_1.safetensors")
    os.setxattr(root / "hidden_states" / "hs_1.safetensors", "user.eagle3ops", b"kept")


def snapshot(root: Path) -> dict:
    """Everything rsync -aHAX must keep, hard links as groups; the marker and lost+found are not data."""
    out, inodes = {}, {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel == MARKER or rel.split("/")[0] == "lost+found":
            continue
        st = p.lstat()
        entry = [st.st_mode, st.st_uid, st.st_gid]
        if p.is_symlink():
            entry.append(os.readlink(p))
        elif p.is_file():
            entry += [st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()]
            entry.append(sorted((k, os.getxattr(p, k)) for k in os.listxattr(p)))
            if st.st_nlink > 1:
                entry.append(inodes.setdefault(st.st_ino, len(inodes)))
        out[rel] = entry
    return out


def run(run_playbook, env: Env, check=False, **extra):
    return run_playbook(PLAYBOOK, env.write_inventory(**extra), check=check, diff=True)


def fs_uuid(dev: str) -> str:
    return sh("blkid", "-p", "-o", "value", "-s", "UUID", dev).stdout.strip()


def mounted_source(path: Path) -> str | None:
    p = sh("findmnt", "-n", "-o", "SOURCE", "--mountpoint", path, check=False)
    return p.stdout.strip() or None


def infra(env: Env) -> subprocess.CompletedProcess:
    """The user-facing testinfra checks (tests/infra/test_storage.py) against this host's inventory."""
    return run_infra(
        "tests/infra/test_storage.py", "--hosts=ansible://localhost", f"--ansible-inventory={env.inv}"
    )


@pytest.mark.slow
def test_converge_idempotent_check_and_testinfra(env, run_playbook):
    env.disk = env.loop("512M")
    fill(env.data)
    before = snapshot(env.data)

    # --check on a fresh host: predicts changes, changes nothing
    r = run(run_playbook, env, check=True)
    assert r.rc == 0, r.summary()
    assert r.host("localhost")["changed"] > 0, "check mode should predict the migration"
    assert not env.state.exists() and env.fstab.read_text() == "# test fstab\n"
    assert storage_storage_probe.wipefs_signatures(
        env.disk
    ) == [] and not storage_storage_probe.first_bytes_nonzero(env.disk)
    assert not os.path.exists(f"{env.disk}p1") and not env.old.exists() and snapshot(env.data) == before

    r = run(run_playbook, env)
    assert r.rc == 0, r.summary()
    part = f"{env.disk}p1"
    uuid = fs_uuid(part)
    state = json.loads(env.state.read_text())
    assert state["step"] == "cutover" and state["fs_uuid"] == uuid
    assert mounted_source(env.data) == part
    assert (
        f"UUID={uuid} {env.data} xfs defaults,noatime,nofail,x-systemd.device-timeout=30s"
        in env.fstab.read_text()
    )
    assert snapshot(env.data) == before, "the new filesystem must hold exactly the old data"
    assert snapshot(env.old) == before, "the rollback copy must be untouched"
    assert json.loads((env.data / MARKER).read_text())["fs_uuid"] == uuid

    r2 = run(run_playbook, env)
    assert r2.rc == 0 and r2.host("localhost")["changed"] == 0, r2.changed_tasks()
    r3 = run(run_playbook, env, check=True)
    assert r3.rc == 0 and r3.host("localhost")["changed"] == 0, r3.changed_tasks()

    t = infra(env)
    assert t.returncode == 0 and "4 passed" in t.stdout, t.stdout[-3000:] + t.stderr[-2000:]
    # the checks can fail: a changed byte in the copy is caught
    victim = env.data / "hidden_states" / "hs_2.safetensors"
    victim.write_bytes(b"\0" + victim.read_bytes()[1:])
    t = infra(env)
    assert t.returncode != 0 and "differs from" in t.stdout and "hs_2" in t.stdout, t.stdout[-3000:]


def test_refuses_a_disk_with_a_filesystem_and_force_wipes_it(env, run_playbook):
    env.disk = env.loop("400M")
    sh("mkfs.ext4", "-q", "-L", "precious", env.disk)
    uuid = fs_uuid(env.disk)
    fill(env.data, n_files=2)
    r = run(run_playbook, env)
    assert r.rc != 0
    msg = r.stdout
    assert f"refusing disk {env.disk}" in msg and "ext4 signature" in msg and uuid in msg, msg
    assert "storage_force" in msg
    assert fs_uuid(env.disk) == uuid and not env.state.exists(), "a refused disk must be left untouched"

    # a partition table with a filesystem on a partition: named too (partition, type, UUID)
    sh("wipefs", "-q", "--all", env.disk)
    sh("parted", "-s", env.disk, "mklabel", "gpt", "mkpart", "old", "1MiB", "100%")
    sh("mkfs.xfs", "-q", f"{env.disk}p1")
    part_uuid = fs_uuid(f"{env.disk}p1")
    r = run(run_playbook, env)
    assert r.rc != 0
    assert "partition table gpt" in r.stdout and f"p1 (xfs UUID={part_uuid})" in r.stdout, r.stdout[-3000:]
    assert fs_uuid(f"{env.disk}p1") == part_uuid and not env.state.exists()

    r = run(run_playbook, env, storage_force=True)
    assert r.rc == 0, r.summary()
    assert fs_uuid(f"{env.disk}p1") not in ("", part_uuid) and mounted_source(env.data) == f"{env.disk}p1"


def _rsync_pids(marker: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"rsync" and any(marker.encode() in a for a in argv):
            pids.append(int(d))
    return pids


@pytest.mark.slow
def test_rsync_killed_mid_copy_resumes_and_verifies(env, run_playbook):
    env.disk = env.loop("512M")
    fill(env.data, n_files=30, size=1_000_000)
    before = snapshot(env.data)
    inv = env.write_inventory(storage_rsync_opts=["--bwlimit=3000"])  # ~10 s: time to kill it mid-copy
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv), PLAYBOOK],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        killed = []
        while time.monotonic() < deadline and proc.poll() is None:
            pids = _rsync_pids(str(env.staging))
            copied = (
                list((env.staging / "hidden_states").glob("hs_*"))
                if (env.staging / "hidden_states").is_dir()
                else []
            )
            if pids and len(copied) >= 3:
                for pid in pids:  # our own rsync processes, found by our unique staging path
                    os.kill(pid, signal.SIGKILL)
                killed = pids
                break
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed, "rsync was never seen copying: " + out[-3000:]
    assert proc.returncode != 0, out[-3000:]
    assert "killed by signal 9" in out or "rsync failed" in out, out[-3000:]
    state = json.loads(env.state.read_text())
    assert state["step"] == "copying", state["step"]
    n_copied = len(list((env.staging / "hidden_states").glob("hs_*")))
    assert 3 <= n_copied < 30 or snapshot(env.staging) != before, "the copy should be partial"
    assert mounted_source(env.data) is None, "nothing may be cut over after a killed copy"
    fstab = env.fstab.read_text()

    # --check in the middle of a migration: predicts the copy, verification and cut-over, changes nothing
    r = run(run_playbook, env, check=True)
    assert r.rc == 0 and r.host("localhost")["changed"] > 0, r.summary()
    assert json.loads(env.state.read_text())["step"] == "copying" and env.fstab.read_text() == fstab
    assert not env.old.exists() and len(list((env.staging / "hidden_states").glob("hs_*"))) == n_copied

    r = run(run_playbook, env)
    assert r.rc == 0, r.summary()
    hist = [h["step"] for h in json.loads(env.state.read_text())["history"]]
    assert hist.count("copying") == 1 and hist[-4:] == ["copied", "verified", "cutover_started", "cutover"], (
        hist
    )
    assert snapshot(env.data) == before and snapshot(env.old) == before


@pytest.mark.slow
def test_unmounted_old_data_is_refused_then_cutover_keeps_the_old_device(env, run_playbook):
    """/data on its own disk, in fstab; after a "reboot" it is not mounted: a re-run must not copy."""
    old_dev = env.loop("64M")
    sh("mkfs.ext4", "-q", old_dev)
    old_uuid = fs_uuid(old_dev)
    env.data.mkdir()
    env.fstab.write_text(f"# test fstab\nUUID={old_uuid} {env.data} ext4 defaults 0 2\n")
    sh("mount", old_dev, env.data)
    fill(env.data, n_files=4)
    before = snapshot(env.data)
    env.disk = env.loop("512M")

    r = run(run_playbook, env, storage_cutover=False)  # copy + verify now, cut over later
    assert r.rc == 0, r.summary()
    assert json.loads(env.state.read_text())["step"] == "verified"
    staged = snapshot(env.staging)
    assert staged == before

    sh("umount", env.data)  # what a reboot/container restart leaves: an empty directory
    r = run(run_playbook, env)
    assert r.rc != 0
    out = r.stdout
    assert "refusing to copy" in out and "NOT mounted" in out and str(env.data) in out, out[-3000:]
    assert snapshot(env.staging) == staged, "the copy on the new disk must be untouched"
    assert json.loads(env.state.read_text())["step"] == "verified"

    # without the fstab line the identity check (filesystem of /data) catches the same situation
    env.fstab.write_text("# test fstab\n")
    r = run(run_playbook, env)
    assert r.rc != 0 and "not the filesystem the migration started from" in r.stdout, r.stdout[-3000:]
    assert snapshot(env.staging) == staged

    env.fstab.write_text(f"# test fstab\nUUID={old_uuid} {env.data} ext4 defaults 0 2\n")
    sh("mount", old_dev, env.data)
    r = run(run_playbook, env)
    assert r.rc == 0, r.summary()
    new_uuid = json.loads(env.state.read_text())["fs_uuid"]
    assert mounted_source(env.data) == f"{env.disk}p1" and mounted_source(env.old) == old_dev, (
        r.stdout[-6000:] + env.fstab.read_text() + sh("findmnt", "-rn").stdout[-2000:]
    )
    fstab = env.fstab.read_text()
    assert (
        f"UUID={new_uuid} {env.data} xfs" in fstab
        and f"UUID={old_uuid} {env.old} ext4 defaults,nofail" in fstab
    )
    assert f"UUID={old_uuid} {env.data} " not in fstab
    assert snapshot(env.data) == before and snapshot(env.old) == before
    r = run(run_playbook, env)
    assert r.rc == 0 and r.host("localhost")["changed"] == 0, r.changed_tasks()

    r = run(run_playbook, env, storage_cleanup_old=True)
    assert r.rc == 0, r.summary()
    assert mounted_source(env.old) is None and str(env.old) not in env.fstab.read_text()
    assert fs_uuid(old_dev) == old_uuid, "cleanup never wipes the old device"
    assert json.loads(env.state.read_text())["step"] == "cleaned"
    r = run(run_playbook, env, storage_cleanup_old=True)
    assert r.rc == 0 and r.host("localhost")["changed"] == 0, r.changed_tasks()


def test_a_disk_too_small_is_refused_before_copying(env, run_playbook):
    env.disk = env.loop("320M")  # xfs needs 300 MB; the data below needs more than the whole filesystem
    fill(env.data, n_files=2, size=180_000_000)
    r = run(run_playbook, env)
    assert r.rc != 0
    assert "smaller than the data" in r.stdout and "bigger disk" in r.stdout, r.stdout[-3000:]
    assert json.loads(env.state.read_text())["step"] == "prepared"
    assert not list(env.staging.glob("hidden_states")), "nothing may be copied"
    assert mounted_source(env.data) is None


def test_rsync_disk_full_message_from_a_real_full_filesystem(env):
    """rsync hitting ENOSPC on a real (tmpfs, 1 MiB) filesystem is reported as 'the new disk is full'."""
    src, dst = env.tmp / "src", env.tmp / "small"
    src.mkdir()
    dst.mkdir()
    (src / "big").write_bytes(os.urandom(3_000_000))
    sh("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dst)
    cmd = storage.rsync_command(str(src), str(dst), mode="copy")
    res = storage.run_rsync(cmd)
    assert res["rc"] != 0
    err = storage.rsync_failure(res, cmd, src=str(src), dst=str(dst))
    assert "is full" in str(err) and "bigger disk" in str(err), str(err)
