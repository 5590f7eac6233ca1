"""Phase ``storage`` on nspawn hosts (real systemd, real /data and /etc/fstab, a loop device bound in as
the new disk /dev/vdb): converge, second run changed=0, --check, the testinfra suite, and the container
restart - where fstab device entries are ignored and /data comes back as an empty directory.

Stand-ins: the "new NVMe disk" is a loop device bound in as /dev/vdb (nspawn has no udev, so no
/dev/disk/by-id: ``storage_disk_require_stable_name: false``); the partition node is created by the role
from sysfs, as it does on any host without udev.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.nspawn, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = "playbooks/storage.yml"
VARS = {"storage_disk": "/dev/vdb", "storage_disk_require_stable_name": False}
STATE = "/var/lib/eagle3ops/storage-state.json"
FILL = (
    "mkdir -p /data/hidden_states/nested && "
    "for i in 0 1 2 3 4; do head -c 300000 /dev/urandom > /data/hidden_states/hs_$i.safetensors; done && "
    "ln /data/hidden_states/hs_0.safetensors /data/hard && ln -s hidden_states/hs_1.safetensors /data/latest && "
    "echo '{}' > '/data/hidden_states/nested/a b.json' && chown 4242:4343 '/data/hidden_states/nested/a b.json'"
)
# sha256 + mode/owner/link of every entry except our marker and lost+found: "checksums equal"
DIGEST = (
    "cd {root} && find . \\( -path ./.eagle3ops-storage.json -o -path ./lost+found \\) -prune -o -type d -printf "
    "'%y %m %U:%G %p\\n' -o -printf '%y %m %U:%G %n %l %p\\n' | LC_ALL=C sort && find . \\( -path "
    "./.eagle3ops-storage.json -o -path ./lost+found \\) -prune -o -type f -print0 | LC_ALL=C sort -z | "
    "xargs -0 -r sha256sum"
)  # directory link counts differ between filesystems (lost+found); file link counts are hard links


def _fresh(loop) -> None:
    # a reused loop device can carry the kernel's partitions of a previous user: drop them (ours now)
    subprocess.run(["partx", "-d", loop.device], capture_output=True, check=False)


def _infra(h) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/infra/test_storage.py",
         f"--hosts=ansible://{h.name}", f"--ansible-inventory={h.inventory}"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip


def _state(h) -> dict:
    return json.loads(h.ssh(f"cat {STATE}").stdout)


def test_migrate_idempotent_check_testinfra_and_remount_after_restart(
    make_host, make_loop_device, run_playbook
):
    new = make_loop_device("512M")
    _fresh(new)
    h = make_host(binds={new.device: "/dev/vdb"}, host_vars=VARS)
    h.ssh(FILL)
    before = h.ssh(DIGEST.format(root="/data")).stdout

    r = run_playbook(PLAYBOOK, h.inventory, check=True)
    assert r.rc == 0 and r.host(h.name)["changed"] > 0, r.summary()
    assert h.ssh(f"test -e {STATE}; echo $?").stdout.strip() == "1", "check mode wrote the state file"
    assert h.ssh("wipefs --no-act --noheadings /dev/vdb").stdout.strip() == "", "check mode touched the disk"
    assert h.ssh("cat /etc/fstab").stdout.count("/data") == 0

    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0, r.summary()
    uuid = _state(h)["fs_uuid"]
    src = h.ssh("findmnt -n -o SOURCE --mountpoint /data").stdout.strip()
    assert h.ssh(f"blkid -p -o value -s UUID {src}").stdout.strip() == uuid
    assert (
        f"UUID={uuid} /data xfs defaults,noatime,nofail,x-systemd.device-timeout=30s"
        in h.ssh("cat /etc/fstab").stdout
    )
    assert h.ssh(DIGEST.format(root="/data")).stdout == before
    assert h.ssh(DIGEST.format(root="/data.old")).stdout == before

    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0 and r.host(h.name)["changed"] == 0, r.changed_tasks()
    r = run_playbook(PLAYBOOK, h.inventory, check=True)
    assert r.rc == 0 and r.host(h.name)["changed"] == 0, r.changed_tasks()
    t = _infra(h)
    assert t.returncode == 0 and "4 passed" in t.stdout, t.stdout[-3000:] + t.stderr[-2000:]

    # container restart: fstab device entries are ignored, /data is an empty directory again
    h.restart()
    assert h.ssh("mountpoint -q /data; echo $?").stdout.strip() == "32"
    t = _infra(h)
    assert t.returncode != 0 and "not a mount point" in t.stdout, t.stdout[-3000:]
    r = run_playbook(PLAYBOOK, h.inventory)  # cut over already: re-mount by UUID, never copy
    assert r.rc == 0, r.summary()
    assert not any("copy" in task for task in r.changed_tasks()), r.changed_tasks()
    assert h.ssh(DIGEST.format(root="/data")).stdout == before
    assert _state(h)["step"] == "cutover"
    t = _infra(h)
    assert t.returncode == 0 and "4 passed" in t.stdout, t.stdout[-3000:]


def test_restart_before_cutover_refuses_then_completes(make_host, make_loop_device, run_playbook, tmp_path):
    """Old /data on its own disk (fstab); copied + verified; the container restarts and /data does not mount:
    the re-run must stop before any rsync, and the copy on the new disk must be intact."""
    old, new = make_loop_device("64M"), make_loop_device("512M")
    _fresh(old)
    _fresh(new)
    h = make_host(binds={old.device: "/dev/vdc", new.device: "/dev/vdb"}, host_vars=VARS)
    h.ssh("mkfs.ext4 -q /dev/vdc && mkdir -p /data && echo '/dev/vdc /data ext4 defaults,nofail 0 2' >> /etc/fstab "
          "&& mount /data")  # fmt: skip
    h.ssh(FILL)
    before = h.ssh(DIGEST.format(root="/data")).stdout

    r = run_playbook(PLAYBOOK, h.inventory, extravars={"storage_cutover": False})
    assert r.rc == 0, r.summary()
    assert _state(h)["step"] == "verified"
    staged = h.ssh(DIGEST.format(root="/mnt/eagle3ops-storage-new")).stdout
    assert staged == before

    h.restart()
    assert h.ssh("mountpoint -q /data; echo $?").stdout.strip() == "32"
    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc != 0
    assert "refusing to copy from /data" in r.stdout and "NOT mounted" in r.stdout, r.stdout[-3000:]
    assert _state(h)["step"] == "verified"
    # the copy on the new disk is intact (look at it read-only from the controller)
    mnt = tmp_path / "check"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "ro", f"{new.device}p1", mnt], check=True)
    try:
        got = subprocess.run(["bash", "-c", DIGEST.format(root=mnt)], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["umount", mnt], check=False)
    assert got == before

    h.ssh("mount /data")
    r = run_playbook(PLAYBOOK, h.inventory)
    assert r.rc == 0, r.summary()
    assert _state(h)["step"] == "cutover"
    assert h.ssh(DIGEST.format(root="/data")).stdout == before
    assert h.ssh("findmnt -n -o SOURCE --mountpoint /data.old").stdout.strip() == "/dev/vdc"
    fstab = h.ssh("cat /etc/fstab").stdout
    assert "/dev/vdc /data.old ext4 defaults,nofail" in fstab and "/dev/vdc /data " not in fstab, fstab
    t = _infra(h)
    assert t.returncode == 0 and "4 passed" in t.stdout, t.stdout[-3000:]


def test_cli_plan_reads_the_disk_like_the_module(make_loop_device, tmp_path):
    """``eagle3ops storage plan`` (parser generated from the definition the module's argument_spec also comes
    from) on a real blank loop device: a kernel name is refused by default, naming the variable to set;
    ``--no-require-stable-name`` accepts it and gives the whole run's steps; ``--no-cutover`` (a module option the CLI lacked) stops after
    the verification. Nothing is written (no state file appears)."""
    loop = make_loop_device(size="64M")
    _fresh(loop)
    data = tmp_path / "data"
    data.mkdir()
    (data / "x").write_text("x")
    state = tmp_path / "state.json"
    exe = [sys.executable, "-m", "eagle3ops", "storage", "plan", "--disk", loop.device, "--data-path", str(data),
           "--old-path", str(tmp_path / "data.old"), "--staging-path", str(tmp_path / "new"),
           "--state-file", str(state), "--json"]  # fmt: skip

    def run(*extra):
        return subprocess.run([*exe, *extra], capture_output=True, text=True, check=False, cwd=REPO)

    refused = run()
    assert refused.returncode == 2 and "not a stable name" in refused.stderr, refused.stderr
    assert "storage_disk_require_stable_name" in refused.stderr
    ok = run("--no-require-stable-name")
    assert ok.returncode == 0, ok.stderr
    steps = json.loads(ok.stdout.strip().splitlines()[-1])["steps"]
    assert steps[:3] == ["prepare", "copy", "verify"] and "cutover" in steps, steps
    kept = run("--no-require-stable-name", "--no-cutover")
    assert kept.returncode == 0, kept.stderr
    assert "cutover" not in json.loads(kept.stdout.strip().splitlines()[-1])["steps"]
    assert not state.exists()
