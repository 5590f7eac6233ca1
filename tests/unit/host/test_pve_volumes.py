"""A PVE storage volume as the container's data mount: eagle3ops.host.pve_volumes (reading ``pvesm``, refusing a
volume that is not this container's, a wanted mount point equal to what PVE wrote back) and the container phase's
``converge`` with it (an existing ``mpN`` never replaced without ``mp_replace``; check mode and diff), and the
storage phase's move onto a new volume (eagle3ops.host.storage_volume_move): ``pvesm alloc`` as PVE prints it, and
what is refused before anything is allocated (the move itself, with mounts: tests/hosts/test_storage_pve_volume.py).

STAND-INS (no Proxmox VE host can run here): ``pvesm``/``lvs`` are tests/fixtures/pvesm and ``pct`` is
tests/fixtures/pct, their state under ``PCT_STANDIN_ROOT``. Their output format is checked here against
tests/fixtures/pve/pvesm-format.json, a record of PVE's own format read from its source (the file says where).
Real: the config files, the parsing and the checks, every ``pct``/``pvesm`` call as a process. No root needed
(no GPU nodes: ``gpus: none``) but for the one move that mounts (a ZFS subvol's; skipped without root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from eagle3ops.host import container, pve_volumes, storage_volume_move
from eagle3ops.host.pve import PveError

FIX = Path(__file__).resolve().parents[2] / "fixtures"
FORMAT = json.loads((FIX / "pve/pvesm-format.json").read_text())
GiB = 2**30

STORAGES = {
    "ceph-rbd": {"type": "rbd", "total": 10 * GiB, "used": 9 * GiB},
    "local-lvm": {"type": "lvmthin", "total": 900 * 2**20, "used": 450 * 2**20, "vgname": "pve",
                  "thinpool": "data", "metadata_percent": 12.5},
    "old-nfs": {"type": "nfs", "total": 0, "used": 0, "enabled": False},
}  # fmt: skip
VOLUMES = {
    "local-lvm": [
        {"name": "vm-129-disk-0", "format": "raw", "content": "rootdir", "size": 64 * GiB, "vmid": 129},
        {"name": "vm-129-disk-1", "format": "raw", "content": "rootdir", "size": 500 * GiB, "vmid": 129},
        {"name": "vm-130-disk-0", "format": "raw", "content": "rootdir", "size": 8 * GiB, "vmid": 130},
    ],
    "ceph-rbd": [
        {"name": "vm-129-disk-2", "format": "raw", "content": "rootdir", "size": 5 * GiB, "vmid": 129}
    ],
}


def render(spec: dict, rows: list[list[str]]) -> list[str]:
    """Lines laid out as the record says (this test's own reading of it, not the stand-in's code)."""
    cols = spec["columns"]
    out = []
    for row in rows:
        words = []
        for i, (col, word) in enumerate(zip(cols, row, strict=True)):
            w = col["width"]
            if w == "longest storage id + 1":
                w = max(len(r[0]) for r in rows[1:]) + 1
            elif w == "longest volid":
                w = max(len(r[0]) for r in rows[1:])
            elif w == "digits of the largest size":
                w = max(len(r[i]) for r in rows[1:])
            elif not isinstance(w, int):
                w = 0
            words.append(word.ljust(w) if col["align"] == "left" else word.rjust(w))
        out.append(" ".join(words))
    return out


def status_rows(storages: dict) -> list[list[str]]:
    rows = [[c["name"] for c in FORMAT["pvesm status"]["columns"]]]
    for sid in sorted(storages):
        s = storages[sid]
        on = s.get("enabled", True)
        per = f"{s['used'] * 100 / s['total'] if s['total'] else 0: 7.2f}%" if on else "N/A"
        rows.append([sid, s["type"], "active" if on else "disabled", str(s["total"] // 1024),
                     str(s["used"] // 1024), str((s["total"] - s["used"]) // 1024), per])  # fmt: skip
    return rows


@pytest.fixture
def pve(tmp_path, monkeypatch):
    """The stand-ins' state: the storages above, container 129 (root volume vm-129-disk-0) and 130."""
    monkeypatch.setenv("PCT_STANDIN_ROOT", str(tmp_path))
    state = tmp_path / "var/lib/pct-standin"
    state.mkdir(parents=True)
    (state / "storage.json").write_text(json.dumps({"storages": STORAGES, "volumes": VOLUMES}))
    (tmp_path / "etc/pve/lxc").mkdir(parents=True)
    for vmid in (129, 130):
        subprocess.run([str(FIX / "pct"), "create", str(vmid), "local:vztmpl/debian-12.tar.zst", "--rootfs",
                        "local-lvm:8"], check=True, capture_output=True)  # fmt: skip
    os.symlink(FIX / "pvesm", tmp_path / "lvs")
    return tmp_path


def run(*argv) -> str:
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True).stdout


def test_the_record_is_self_consistent_and_the_parsers_read_its_samples():
    st = FORMAT["pvesm status"]
    sample = [line.split() for line in st["sample"]]
    assert render(st, sample) == st["sample"]
    parsed = pve_volumes.parse_pvesm_status("\n".join(st["sample"]))
    assert parsed["local-lvm"].total == 943718400 * 1024 and parsed["old-nfs"].status == "disabled"
    ls = FORMAT["pvesm list"]
    assert render(ls, [line.split() for line in ls["sample"]]) == ls["sample"]
    vols = pve_volumes.parse_pvesm_list("\n".join(ls["sample"]))
    assert [(v.volid, v.size, v.vmid) for v in vols][1] == ("local-lvm:vm-129-disk-1", 536870912000, 129)
    assert pve_volumes.parse_lvs_thinpool(FORMAT["lvs thin pool"]["sample"])["metadata_percent"] == 12.5


def test_the_standin_prints_what_pve_prints(pve):
    out = run(FIX / "pvesm", "status").splitlines()
    assert out == render(FORMAT["pvesm status"], status_rows(STORAGES)), out
    one = run(FIX / "pvesm", "status", "--storage", "local-lvm").splitlines()
    assert one == render(FORMAT["pvesm status"], status_rows({"local-lvm": STORAGES["local-lvm"]}))
    listed = run(FIX / "pvesm", "list", "local-lvm").splitlines()
    rows = [["Volid", "Format", "Type", "Size", "VMID"]] + [
        [f"local-lvm:{v['name']}", v["format"], v["content"], str(v["size"]), str(v["vmid"])]
        for v in VOLUMES["local-lvm"]
    ]
    assert listed == render(FORMAT["pvesm list"], rows), listed
    assert run(pve / "lvs", "--noheadings", "pve/data") == "  943718400:50.00:12.50\n"


def test_a_volume_that_is_not_this_containers_is_refused():
    status = pve_volumes.parse_pvesm_status("\n".join(render(FORMAT["pvesm status"], status_rows(STORAGES))))
    vols = [pve_volumes.Volume(f"local-lvm:{v['name']}", "raw", "rootdir", v["size"], v["vmid"])
            for v in VOLUMES["local-lvm"]]  # fmt: skip
    others = {131: [("mp1", "local-lvm:vm-129-disk-1,mp=/scratch")]}
    cases = {
        "local-lvm:vm-129-disk-7,mp=/data": "does not exist (`pvesm list local-lvm`",
        "local-lvm:vm-130-disk-0,mp=/data": "belongs to guest 130, not to container 129",
        "local-lvm:vm-129-disk-1,mp=/data": "attached to container 131 (mp1)",
        "nvme:500,mp=/data": "storage 'nvme' does not exist",
        "old-nfs:500,mp=/data": "storage 'old-nfs' is disabled",
        "data,mp=/data": "must be a host path",
    }
    for value, named in cases.items():
        with pytest.raises(PveError, match=named.replace("(", r"\(").replace(")", r"\)")):
            pve_volumes.check_volume("mp0", value, 129, status, vols, others)
    pve_volumes.check_volume("mp0", "local-lvm:vm-129-disk-1,mp=/data", 129, status, vols, {})
    pve_volumes.check_volume("mp0", "local-lvm:500,mp=/data", 129, status, None, others)


def test_mount_points_compare_as_pve_writes_them_back():
    same = pve_volumes.same_mount
    assert same("local-lvm:vm-129-disk-1,mp=/data,backup=0,size=500G", "local-lvm:500,mp=/data,backup=0")
    assert not same("local-lvm:vm-129-disk-1,mp=/data,size=400G", "local-lvm:500,mp=/data")
    assert not same("ceph-rbd:vm-129-disk-1,mp=/data,size=500G", "local-lvm:500,mp=/data")
    assert not same("local-lvm:vm-129-disk-1,mp=/data,size=500G", "local-lvm:500,mp=/other")
    assert same("/mnt/a,mp=/data,backup=0", "/mnt/a,backup=false,mp=/data") and not same(None, "/a,mp=/b")
    assert same("ceph-rbd:vm-129-disk-1,mp=/data,size=64M", "ceph-rbd:vm-129-disk-1,mp=/data")  # PVE's size=
    assert not same("ceph-rbd:vm-129-disk-1,mp=/data,size=64M", "ceph-rbd:vm-129-disk-1,mp=/data,size=2G")
    assert not same("ceph-rbd:vm-129-disk-1,mp=/data,size=64M", "ceph-rbd:vm-129-disk-2,mp=/data")
    keys = {"rootfs": "local-lvm:vm-129-disk-0,size=8G", "mp0": "ceph-rbd:vm-129-disk-2,mp=/data,size=5G"}
    assert pve_volumes.volume_for_path(keys, "/data/eagle3/hidden_states") == (
        "mp0",
        "ceph-rbd:vm-129-disk-2",
    )
    assert pve_volumes.volume_for_path(keys, "/database") == ("rootfs", "local-lvm:vm-129-disk-0")


def params(pve: Path, **over) -> dict:
    return {"vmid": 129, "pct": str(FIX / "pct"), "pvesm": str(FIX / "pvesm"), "gpus": "none",
            "config_dir": str(pve / "etc/pve/lxc"), "passthrough": "dev",
            "driver_version_file": str(pve / "no-driver-loaded"), **over}  # fmt: skip


def conf(pve: Path, vmid: int = 129) -> str:
    return (pve / f"etc/pve/lxc/{vmid}.conf").read_text()


def test_an_existing_mp0_is_replaced_only_when_asked_and_the_diff_shows_it(pve):
    (pve / "old").mkdir()
    (pve / "new").mkdir()
    container.converge(params(pve, options={"mp0": f"{pve}/old,mp=/data"}), container.Host())
    before = conf(pve)
    ask = params(pve, options={"mp0": "local-lvm:vm-129-disk-1,mp=/data"})
    with pytest.raises(
        container.ContainerFailed, match=r"mp0 of container 129 is already .*/old,mp=/data"
    ) as e:
        container.converge(ask, container.Host(), check_mode=True)
    assert "container_mp_replace: true" in str(e.value) and conf(pve) == before
    ask["mp_replace"] = True
    predicted = container.converge(ask, container.Host(), check_mode=True)
    assert predicted["changed"] and conf(pve) == before, "check mode wrote the config"
    assert f"mp0: {pve}/old,mp=/data" in predicted["diff"]["before"]
    assert "mp0: local-lvm:vm-129-disk-1,mp=/data" in predicted["diff"]["after"]
    done = container.converge(ask, container.Host())
    assert done["plan"] == predicted["plan"] and "mp0: local-lvm:vm-129-disk-1,mp=/data\n" in conf(pve)
    # the volume replaced by a host path is kept by PVE as unusedN: the rollback
    ask = params(pve, options={"mp0": f"{pve}/new,mp=/data"}, mp_replace=True)
    container.converge(ask, container.Host())
    assert "unused0: local-lvm:vm-129-disk-1\n" in conf(pve)
    assert not container.converge(ask, container.Host())["changed"]


def test_a_new_volume_is_allocated_once_and_a_second_run_changes_nothing(pve):
    ask = params(pve, options={"mp0": "local-lvm:500,mp=/data,backup=0"})
    assert container.converge(ask, container.Host(), check_mode=True)["changed"]
    container.converge(ask, container.Host())
    text = conf(pve)
    assert "mp0: local-lvm:vm-129-disk-2,mp=/data,backup=0,size=500G\n" in text, text
    for check_mode in (True, False):
        assert not container.converge(ask, container.Host(), check_mode=check_mode)["changed"]
    assert conf(pve) == text


def test_a_new_volume_on_a_zfspool_is_a_subvol_and_a_second_run_changes_nothing(pve):
    """PVE gives a container's new volume on a zfspool as ``subvol-<vmid>-disk-<n>`` (the stand-in ``pct`` does
    too): what it writes back is the wanted mount point, so the second run changes nothing."""
    storage_json = pve / "var/lib/pct-standin/storage.json"
    st = json.loads(storage_json.read_text())
    st["storages"]["local-zfs"] = {"type": "zfspool", "total": 2000 * GiB, "used": 0}
    storage_json.write_text(json.dumps(st))
    ask = params(pve, options={"mp0": "local-zfs:500,mp=/data,backup=0"})
    container.converge(ask, container.Host())
    assert "mp0: local-zfs:subvol-129-disk-0,mp=/data,backup=0,size=500G\n" in conf(pve), conf(pve)
    assert not container.converge(ask, container.Host())["changed"]


@pytest.mark.parametrize(
    "value, named",
    [
        ("local-lvm:vm-129-disk-9,mp=/data", "volume local-lvm:vm-129-disk-9 does not exist"),
        ("local-lvm:vm-130-disk-0,mp=/data", "belongs to guest 130"),
        ("nvme:500,mp=/data", "storage 'nvme' does not exist"),
    ],
)
def test_a_bad_volume_fails_naming_it_and_nothing_is_changed(pve, value, named):
    before = {v: conf(pve, v) for v in (129, 130)}
    for check_mode in (True, False):
        with pytest.raises(container.ContainerFailed, match=named):
            container.converge(params(pve, options={"mp0": value}), container.Host(), check_mode=check_mode)
    assert {v: conf(pve, v) for v in (129, 130)} == before


def test_a_volume_attached_to_another_container_is_refused(pve):
    subprocess.run([str(FIX / "pct"), "set", "130", "--mp0", "local-lvm:vm-129-disk-1,mp=/x"], check=True)
    with pytest.raises(container.ContainerFailed, match=r"attached to container 130 \(mp0\)"):
        container.converge(params(pve, options={"mp0": "local-lvm:vm-129-disk-1,mp=/data"}), container.Host())
    assert "mp0" not in conf(pve)


def test_the_usage_under_the_data_directory_comes_from_its_storage(pve):
    """What eagle3ops_extract_pve_usage reports (run against the stand-ins) for a path on an rbd volume, on a thin
    pool (its metadata% from lvs), and on a bind mount (none: statvfs inside sees it); the preflight then refuses
    bytes the pool cannot take while this filesystem has room."""
    cfg = pve_volumes.parse_storage_cfg(
        "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tcontent rootdir\n"
    )
    keys = {"rootfs": "local-lvm:vm-129-disk-0,size=8G", "mp0": "ceph-rbd:vm-129-disk-2,mp=/data,size=5G",
            "mp1": "/srv/scratch,mp=/scratch"}  # fmt: skip

    def run_(argv):
        p = subprocess.run(argv, capture_output=True, text=True, check=False)
        return p.returncode, p.stdout, p.stderr

    ask = dict(pvesm=str(FIX / "pvesm"), lvs=str(pve / "lvs"), storage_cfg=cfg)
    rbd = pve_volumes.storage_usage(keys, "/data/eagle3", run_, **ask)
    assert rbd["mount"] == "mp0" and rbd["usage"]["avail"] == GiB and rbd["usage"]["type"] == "rbd"
    thin = pve_volumes.storage_usage(keys, "/root", run_, **ask)["usage"]
    assert (
        thin["storage"] == "local-lvm" and thin["metadata_percent"] == 12.5 and thin["avail"] == 450 * 2**20
    )
    assert pve_volumes.storage_usage(keys, "/scratch/x", run_, **ask)["usage"] is None
    from eagle3ops.store import DiskSpaceError, preflight_disk

    assert (
        preflight_disk(pve, GiB // 2, margin_bytes=0, pool=rbd["usage"])["pve_storage"]["storage"]
        == "ceph-rbd"
    )
    with pytest.raises(
        DiskSpaceError, match=r"PVE storage 'ceph-rbd' \(rbd, volume ceph-rbd:vm-129-disk-2\)"
    ):
        preflight_disk(pve, 2 * GiB, margin_bytes=0, pool=rbd["usage"])
    full_meta = pve_volumes.pool_usage("local-lvm:vm-129-disk-0", pve_volumes.StorageStatus(
        "local-lvm", "lvmthin", "active", 100 * GiB, GiB, 99 * GiB), {"metadata_percent": 100.0})  # fmt: skip
    with pytest.raises(DiskSpaceError, match=r"thin-pool metadata 100.0%"):
        preflight_disk(pve, 1, margin_bytes=0, pool=full_meta.to_dict())


def test_the_standin_allocates_as_pve_does_and_the_move_reads_its_line(pve):
    """``pvesm alloc`` prints the one line PVE prints (the record's sample shape); the size is KiB or M/G."""
    out = run(FIX / "pvesm", "alloc", "local-lvm", "129", "vm-129-disk-7", str(3 * 2**20))
    assert out == "successfully created 'local-lvm:vm-129-disk-7'\n"
    assert storage_volume_move.CREATED_RE.search(out).group(1) == "local-lvm:vm-129-disk-7"
    sample = FORMAT["pvesm alloc"]["sample"]
    assert storage_volume_move.CREATED_RE.search(sample).group(1) == "local-lvm:vm-129-disk-2"
    run(FIX / "pvesm", "alloc", "local-lvm", "129", "vm-129-disk-8", "2G")
    listed = {v.volid: v.size for v in pve_volumes.parse_pvesm_list(run(FIX / "pvesm", "list", "local-lvm"))}
    assert (listed["local-lvm:vm-129-disk-7"], listed["local-lvm:vm-129-disk-8"]) == (3 * GiB, 2 * GiB)
    bad = subprocess.run([str(FIX / "pvesm"), "alloc", "local-lvm", "129", "vm-130-disk-9", "1G"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode != 0 and "should be 'vm-129-*'" in bad.stderr


def _move_params(pve: Path, target: str) -> dict:
    return {"vmid": 129, "mount_point": "mp0", "target": target, "state_file": str(pve / "move.json"),
            "source_path": str(pve / "old"), "staging_path": str(pve / "new"), "rsync_opts": [],
            "pvesm": str(FIX / "pvesm"), "pct": str(FIX / "pct"), "config_dir": str(pve / "etc/pve/lxc")}  # fmt: skip


def _sh(argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize(
    ("target", "named"),
    [
        ("local-lvm:vm-129-disk-1", "must be <storage>:<size in GiB> (a new volume)"),
        ("nowhere:10", "storage 'nowhere' does not exist"),
        ("local-lvm:0.001", "local-lvm:0.001 (1073741 bytes) is smaller than the data on "),
        (
            "local-lvm:2",
            "storage local-lvm (lvmthin) has 1048576 bytes available (pvesm status), less than the",
        ),
    ],
)
def test_a_volume_move_is_refused_before_anything_is_allocated(pve, tmp_path, target, named):
    """A target that is no new volume, on no storage, smaller than the data (both sizes named) or bigger than the
    storage's room: refused, nothing allocated, the config and the state file untouched (no root: the old data is
    a host path, measured where it is)."""
    data = tmp_path / "hostdata"
    data.mkdir()
    (data / "rows.pt").write_bytes(os.urandom(2 * 2**20))
    run(FIX / "pct", "set", "129", "--mp0", f"{data},mp=/data")
    storage_json, conf = pve / "var/lib/pct-standin/storage.json", pve / "etc/pve/lxc/129.conf"
    if target == "local-lvm:2":  # a thin pool with 1 MiB left: less than the data's 2 MiB
        st = json.loads(storage_json.read_text())
        st["storages"]["local-lvm"]["used"] = st["storages"]["local-lvm"]["total"] - 2**20
        storage_json.write_text(json.dumps(st))
    before = (storage_json.read_text(), conf.read_text())
    with pytest.raises(PveError, match=re.escape(named)):
        storage_volume_move.move(_move_params(pve, target), _sh, sh=_sh)
    assert (storage_json.read_text(), conf.read_text()) == before and not (pve / "move.json").exists()


def test_a_zfs_subvol_is_a_source_bind_mounted_and_another_guests_is_refused(pve):
    """A container's /data on a zfspool (PVE gives a container there a ``subvol-<vmid>-disk-<n>`` dataset, a
    directory rather than a block device): the storage phase plans a bind mount of the dataset (no blkid, no
    mkfs), refuses another guest's subvol naming its owner, and the usage beneath it is the pool's own line of
    ``pvesm status``. STAND-IN: the dataset is a directory the stand-in's ``pvesm path`` answers."""
    from eagle3ops.host import storage_volume

    dataset = pve / "rpool/data/subvol-129-disk-1"
    (dataset / "rows_0-2000").mkdir(parents=True)
    storage_json = pve / "var/lib/pct-standin/storage.json"
    st = json.loads(storage_json.read_text())
    st["storages"]["local-zfs"] = {"type": "zfspool", "total": 100 * GiB, "used": 100 * GiB - 2**29}
    st["volumes"]["local-zfs"] = [
        {"name": "subvol-129-disk-1", "format": "subvol", "content": "rootdir", "size": 500 * GiB, "vmid": 129,
         "path": str(dataset)},
        {"name": "subvol-130-disk-0", "format": "subvol", "content": "rootdir", "size": 8 * GiB, "vmid": 130},
    ]  # fmt: skip
    storage_json.write_text(json.dumps(st))
    run(FIX / "pct", "set", "129", "--mp0", "local-zfs:subvol-129-disk-1,mp=/data,size=500G")

    def p(volume):
        return {"volume": volume, "vmid": 129, "data_path": str(pve / "mnt/data"), "pvesm": str(FIX / "pvesm"),
                "pct": str(FIX / "pct"), "state_file": str(pve / "storage.json"),
                "config_dir": str(pve / "etc/pve/lxc")}  # fmt: skip

    plan = storage_volume.plan_source_volume(p("local-zfs:subvol-129-disk-1"), _sh, mounts=[])
    assert plan == {"action": "mount", "device": str(dataset), "fstype": "none", "opts": "bind", "why": ""}
    with pytest.raises(PveError, match="belongs to guest 130, not to container 129"):
        storage_volume.plan_source_volume(p("local-zfs:subvol-130-disk-0"), _sh, mounts=[])
    keys = {"mp0": "local-zfs:subvol-129-disk-1,mp=/data,size=500G"}
    ask = dict(pvesm=str(FIX / "pvesm"), lvs=str(pve / "lvs"), storage_cfg={})
    usage = pve_volumes.storage_usage(keys, "/data/eagle3", lambda a: _sh(a), **ask)["usage"]
    assert usage["storage"] == "local-zfs" and usage["type"] == "zfspool" and usage["avail"] == 2**29
    from eagle3ops.store import DiskSpaceError, preflight_disk

    with pytest.raises(DiskSpaceError, match=r"PVE storage 'local-zfs' \(zfspool"):
        preflight_disk(pve, GiB, margin_bytes=0, pool=usage)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mkfs.ext4"), reason="needs root (mounts) and mkfs.ext4"
)
def test_a_full_zfs_subvol_moves_onto_a_new_volume_and_stays_untouched(pve):
    """The move from a container's ZFS subvol (a dataset: a directory, bind-mounted read-only, not a block device
    to mount) onto a new volume: copied, verified by checksum, ``mp0`` switched, the subvol left as it was.
    Real: mkfs.ext4, mount (the new volume is the stand-in's sparse image file, mounted through a loop device), rsync.
    STAND-INS: ``pvesm``/``pct`` (the subvol is a directory their ``pvesm path`` answers)."""
    dataset = pve / "rpool/data/subvol-129-disk-1"
    (dataset / "rows_0-2000").mkdir(parents=True)
    for i in range(3):
        (dataset / "rows_0-2000" / f"data_{i}.ckpt").write_bytes(os.urandom(300_000))
    storage_json = pve / "var/lib/pct-standin/storage.json"
    st = json.loads(storage_json.read_text())
    st["storages"]["local-zfs"] = {"type": "zfspool", "total": 10 * GiB, "used": 10 * GiB - 2**20}
    st["volumes"]["local-zfs"] = [{"name": "subvol-129-disk-1", "format": "subvol", "content": "rootdir",
                                   "size": GiB, "vmid": 129, "path": str(dataset)}]  # fmt: skip
    st["storages"]["local-lvm"]["total"] = 10 * GiB
    storage_json.write_text(json.dumps(st))
    run(FIX / "pct", "set", "129", "--mp0", "local-zfs:subvol-129-disk-1,mp=/data,size=1G")
    before = {p.relative_to(dataset): p.read_bytes() for p in dataset.rglob("*") if p.is_file()}
    res = storage_volume_move.move(_move_params(pve, "local-lvm:1"), _sh, sh=_sh)
    assert res["changed"] and res["old"] == "local-zfs:subvol-129-disk-1,mp=/data,size=1G", res
    assert f"mp0: {res['volume']},mp=/data,size=1G\n" in conf(pve)
    assert {p.relative_to(dataset): p.read_bytes() for p in dataset.rglob("*") if p.is_file()} == before
    new = pve / "check"
    new.mkdir()
    image = run(FIX / "pvesm", "path", res["volume"]).strip()
    subprocess.run(["mount", "-o", "ro", image, str(new)], check=True)
    try:
        assert {p.relative_to(new): p.read_bytes() for p in new.rglob("*") if p.is_file()} == before
    finally:
        subprocess.run(["umount", str(new)], check=True)
    assert not storage_volume_move.move(_move_params(pve, "local-lvm:1"), _sh, sh=_sh)["changed"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bind mounts)")
def test_a_move_onto_a_zfspool_allocates_a_subvol_as_pve_does(pve, tmp_path):
    """Onto a zfspool the new volume is a ``subvol-<vmid>-disk-<n>`` dataset (``pvesm alloc ... --format subvol``,
    ZFSPoolPlugin's name rule), bound rather than formatted; the data copied and verified, ``mp0`` switched.
    STAND-INS: ``pvesm``/``pct`` (the dataset is a directory under the stand-in's images)."""
    bad = subprocess.run([str(FIX / "pvesm"), "alloc", "local-lvm", "129", "subvol-129-disk-5", "1G", "--format",
                          "subvol"], capture_output=True, text=True)  # fmt: skip
    assert bad.returncode != 0 and "unsupported format 'subvol'" in bad.stderr
    data = tmp_path / "hostdata"
    (data / "rows_0-2000").mkdir(parents=True)
    (data / "rows_0-2000" / "data_0.ckpt").write_bytes(os.urandom(200_000))
    storage_json = pve / "var/lib/pct-standin/storage.json"
    st = json.loads(storage_json.read_text())
    st["storages"]["local-zfs"] = {"type": "zfspool", "total": 10 * GiB, "used": 0}
    storage_json.write_text(json.dumps(st))
    run(FIX / "pct", "set", "129", "--mp0", f"{data},mp=/data")
    res = storage_volume_move.move(_move_params(pve, "local-zfs:2"), _sh, sh=_sh)
    assert res["volume"] == "local-zfs:subvol-129-disk-0", res
    assert "mp0: local-zfs:subvol-129-disk-0,mp=/data,size=2G\n" in conf(pve)
    dataset = Path(run(FIX / "pvesm", "path", res["volume"]).strip())
    assert dataset.is_dir() and not (pve / "new").is_mount()
    got = (dataset / "rows_0-2000" / "data_0.ckpt").read_bytes()
    assert got == (data / "rows_0-2000" / "data_0.ckpt").read_bytes()
    listed = pve_volumes.parse_pvesm_list(run(FIX / "pvesm", "list", "local-zfs"))
    assert [(v.volid, v.format) for v in listed] == [("local-zfs:subvol-129-disk-0", "subvol")]
