"""Unit tests for eagle3ops.host.pve: PVE LXC config round-trip and edits, NVIDIA device discovery, plans.

The configs under tests/fixtures/pve are written the way PVE 8 writes them (description comments, keys,
raw lxc.* lines, then snapshot sections and a [pve:pending] section); no PVE host runs here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from eagle3ops.host import pve
from eagle3ops.host import pve_container as pve_pve_container
from eagle3ops.host import pve_devices as pve_pve_devices

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "pve"
PROC = (FIX / "proc-devices.txt").read_text()

# the 8-GPU host as /dev shows it (majors from a real H200 host's driver 580 layout)
HOST = [
    *[pve_pve_devices.Device(f"/dev/nvidia{i}", 195, i) for i in range(8)],
    pve_pve_devices.Device("/dev/nvidiactl", 195, 255),
    pve_pve_devices.Device("/dev/nvidia-modeset", 195, 254),
    pve_pve_devices.Device("/dev/nvidia-uvm", 508, 0),
    pve_pve_devices.Device("/dev/nvidia-uvm-tools", 508, 1),
    pve_pve_devices.Device("/dev/nvidia-caps/nvidia-cap1", 234, 1),
    pve_pve_devices.Device("/dev/nvidia-caps/nvidia-cap2", 234, 2),
]


def load(name: str) -> str:
    return (FIX / name).read_bytes().decode()


# ---- parsing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["129.conf", "130-dev.conf"])
def test_round_trip_is_byte_exact(name):
    text = load(name)
    assert pve.PveConfig.parse(text).render() == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "arch: amd64",
        "arch: amd64\r\ncores: 2\r\n\r\n[s1]\r\narch: amd64\r\n",
        "cores: 2\n\n\n[a]\n\n[b]\ncores: 1",
    ],
)
def test_round_trip_edge_cases(text):
    assert pve.PveConfig.parse(text).render() == text


def test_sections_and_keys():
    cfg = pve.PveConfig.parse(load("129.conf"))
    assert [s.name for s in cfg.sections] == [None, "before-upgrade", "pre-driver-580"]
    assert cfg.snapshots() == ["before-upgrade", "pre-driver-580"]
    assert cfg.main.get("cores") == "64"
    assert cfg.section("pre-driver-580").get("cores") == "32"
    assert cfg.main.get("lxc.mount.entry").startswith("/dev/nvidia0 ")
    assert len(cfg.main.raw_lines()) == 7
    assert "description" not in cfg.main.keys()  # noqa: SIM118  # '#' lines are the description, not keys


def test_pending_section_is_part_of_effective_config():
    cfg = pve.PveConfig.parse(load("130-dev.conf"))
    eff = cfg.effective()
    assert eff["dev5"] == "/dev/nvidia1"
    assert "dev4" not in eff
    assert cfg.snapshots() == ["clean"]


# ---- edits stay in the main section ---------------------------------------------------------------
def test_add_raw_goes_into_main_section_not_at_end():
    text = load("129.conf")
    cfg = pve.PveConfig.parse(text)
    snaps_before = [s.render() for s in cfg.sections[1:]]
    cfg.add_raw("lxc.cgroup2.devices.allow: c 508:* rwm")
    out = cfg.render()
    main, rest = out.split("\n[before-upgrade]\n", 1)
    assert "c 508:* rwm" in main
    assert "c 508" not in rest
    assert [s.render() for s in pve.PveConfig.parse(out).sections[1:]] == snaps_before
    # inserted right after the last raw line, separator blank line kept
    assert main.endswith(
        "lxc.mount.entry: /dev/net/tun dev/net/tun none bind,create=file\n"
        "lxc.cgroup2.devices.allow: c 508:* rwm\n"
    )
    assert text.split("[before-upgrade]")[1] == out.split("[before-upgrade]")[1]


def test_set_key_without_raw_lines_and_without_trailing_newline():
    cfg = pve.PveConfig.parse("arch: amd64\ncores: 2")
    cfg.set_key("memory", "4096")
    cfg.set_key("cores", "4")
    assert cfg.render() == "arch: amd64\ncores: 4\nmemory: 4096\n"


def test_set_key_before_raw_lines_and_remove_raw():
    cfg = pve.PveConfig.parse(load("129.conf"))
    cfg.set_key("dev0", "/dev/nvidia0")
    assert cfg.remove_raw("lxc.cgroup2.devices.allow:   c 509:*   rwm")
    assert not cfg.remove_raw("lxc.cgroup2.devices.allow: c 777:* rwm")
    main = cfg.main.render()
    assert "swap: 0\ndev0: /dev/nvidia0\nlxc.cgroup2.devices.allow: c 195:* rwm\n" in main
    assert "509" not in main
    assert "c 509:* rwm" in cfg.section("pre-driver-580").render()


# ---- devices ---------------------------------------------------------------------------------------
def test_parse_proc_devices_char_only():
    majors = pve_pve_devices.parse_proc_devices(PROC)
    assert majors[195] == "nvidia"
    assert majors[508] == "nvidia-uvm"
    assert majors[234] == "nvidia-caps"
    assert 259 not in majors  # a block major


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of character devices needs root")
def test_scan_dev_reads_majors_from_stat(tmp_path):
    """A fake /dev: real character-device nodes (mknod) with the majors of a host whose nvidia-uvm is 508."""
    for d in HOST:
        p = tmp_path / d.path[len("/dev/") :]
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(p, 0o666 | 0o020000, os.makedev(d.major, d.minor))
    (tmp_path / "nvidia-not-a-device").write_text("x")
    (tmp_path / "sda").write_text("x")
    found = pve_pve_devices.scan_dev(str(tmp_path))
    assert found[:8] == HOST[:8]  # GPUs first, by index
    assert sorted(found, key=str) == sorted(
        HOST, key=str
    )  # then the rest, by path; the file and sda are ignored
    assert found[8] == pve_pve_devices.Device("/dev/nvidia-caps/nvidia-cap1", 234, 1)
    assert pve_pve_devices.check_devices(found, pve_pve_devices.parse_proc_devices(PROC), str(tmp_path)) == []


def test_stale_node_after_kernel_change_is_refused():
    stale = [*HOST[:9], pve_pve_devices.Device("/dev/nvidia-uvm", 509, 0)]  # node made under the old kernel
    with pytest.raises(pve.PveError, match=r"nvidia-uvm has major 509.*nvidia-uvm=508.*stale"):
        pve_pve_devices.check_devices(stale, pve_pve_devices.parse_proc_devices(PROC))


def test_missing_uvm_is_refused_with_the_fix():
    with pytest.raises(pve.PveError, match="nvidia-modprobe -u -c=0"):
        pve_pve_devices.check_devices(HOST[:9], pve_pve_devices.parse_proc_devices(PROC))


def test_select_devices():
    assert pve_pve_devices.select_devices(HOST, "all") == HOST
    assert pve_pve_devices.select_devices(HOST, "none") == []
    two = pve_pve_devices.select_devices(HOST, [0, 3])
    assert [d.path for d in two][:2] == ["/dev/nvidia0", "/dev/nvidia3"]
    assert "/dev/nvidia1" not in [d.path for d in two] and "/dev/nvidia-uvm" in [d.path for d in two]
    with pytest.raises(pve.PveError, match=r"GPU\(s\) \[9\]"):
        pve_pve_devices.select_devices(HOST, [9])
    assert pve_pve_devices.select_devices(HOST, "0,3") == two
    # container_gpus is type raw (a string or a list): a value of neither form is refused, named
    for bad in ("gpu0", ["0", "one"], {"gpu": 0}):
        with pytest.raises(pve.PveError, match=r"is not all, none or a list of GPU indices.*container_gpus"):
            pve_pve_devices.select_devices(HOST, bad)


def test_wanted_raw_lines_star_for_full_majors_and_minors_for_subsets():
    lines = pve.wanted_raw_lines(pve_pve_devices.select_devices(HOST, [1]), HOST)
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" in lines
    assert "lxc.cgroup2.devices.allow: c 195:1 rwm" in lines
    assert "lxc.cgroup2.devices.allow: c 195:255 rwm" in lines
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" not in lines
    cap1 = "/dev/nvidia-caps/nvidia-cap1"
    assert f"lxc.mount.entry: {cap1} {cap1[1:]} none bind,optional,create=file" in lines
    full = pve.wanted_raw_lines(HOST, HOST)
    assert full[:3] == [f"lxc.cgroup2.devices.allow: c {m}:* rwm" for m in (195, 234, 508)]


# ---- plans -----------------------------------------------------------------------------------------
MAJ = pve_pve_devices.parse_proc_devices(PROC)


def test_raw_plan_fixes_old_uvm_major_and_keeps_foreign_lines():
    cfg = pve.PveConfig.parse(load("129.conf"))
    p = pve.plan(
        129,
        cfg,
        devices=HOST,
        majors=MAJ,
        mode="raw",
        running=True,
        options={"cores": 64, "features": "nesting=true", "mp0": "/mnt/pve/nvme-data,mp=/data,backup=0"},
    )
    assert p.set == {}  # nesting=true == nesting=1; same mp0
    assert p.raw_remove == ["lxc.cgroup2.devices.allow: c 509:* rwm"]
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" in p.raw_add
    assert "lxc.mount.entry: /dev/nvidia7 dev/nvidia7 none bind,optional,create=file" in p.raw_add
    assert not any("nvidia0 " in x or "10:200" in x or "net/tun" in x for x in p.raw_add + p.raw_remove)
    assert p.restart_needed and any("509" in w for w in p.warnings)
    new = p.apply_to(cfg)
    again = pve.plan(129, new, devices=HOST, majors=MAJ, mode="raw")
    assert not again.changed
    assert [s.render() for s in new.sections[1:]] == [s.render() for s in cfg.sections[1:]]
    assert "lxc.cgroup2.devices.allow: c 10:200 rwm" in new.main.raw_lines()


def test_switch_raw_to_dev_uses_pct_set_and_drops_raw_nvidia_lines():
    cfg = pve.PveConfig.parse(load("129.conf"))
    p = pve.plan(129, cfg, devices=HOST, majors=MAJ, mode="dev")
    assert p.set["dev0"] == "/dev/nvidia0" and p.set["dev13"] == "/dev/nvidia-caps/nvidia-cap2"
    assert len(p.set) == 14 and p.delete == []
    assert p.raw_add == []
    assert set(p.raw_remove) == {
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 509:* rwm",
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
    }
    argv = p.pct_set_argv()
    assert argv[:3] == ["/usr/sbin/pct", "set", "129"] and argv[3:5] == ["--dev0", "/dev/nvidia0"]
    assert not p.restart_needed  # container stopped


def test_dev_plan_reuses_entries_keeps_foreign_and_respects_pending():
    cfg = pve.PveConfig.parse(load("130-dev.conf"))
    # host with 2 GPUs now: nvidia3 gone (pending delete already), nvidia1 pending add
    host = [d for d in HOST if d.gpu_index in (None, 0, 1)]
    p = pve.plan(130, cfg, devices=host, majors=MAJ, mode="dev", running=True, options={"cores": 16})
    assert "dev0" not in p.set and "dev1" not in p.set and "dev3" not in p.set and "dev5" not in p.set
    assert "dev2" not in p.delete and "dev4" not in p.delete  # foreign; already pending-deleted
    assert p.delete == []
    # next free indices: 4 (pending-deleted), 6, 7, ...
    assert p.set["dev4"] == "/dev/nvidia-modeset"
    assert set(p.set.values()) == {
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    }
    assert p.restart_needed  # pending changes exist and devN needs a restart


def test_dev_plan_removes_gone_gpu():
    cfg = pve.PveConfig.parse("cores: 2\ndev0: /dev/nvidia0\ndev1: /dev/nvidia1\ndev2: /dev/nvidiactl\n")
    host = [
        pve_pve_devices.Device("/dev/nvidia0", 195, 0),
        pve_pve_devices.Device("/dev/nvidiactl", 195, 255),
    ]
    p = pve.plan(1, cfg, devices=host, majors=MAJ, mode="dev")
    assert p.set == {} and p.delete == ["dev1"]
    assert p.pct_set_argv("pct") == ["pct", "set", "1", "--delete", "dev1"]


def test_hotplug_only_change_needs_no_restart():
    cfg = pve.PveConfig.parse("cores: 2\nmemory: 1024\n")
    p = pve.plan(1, cfg, options={"cores": 4, "memory": 1024}, running=True)
    assert p.set == {"cores": "4"} and not p.restart_needed
    p2 = pve.plan(1, cfg, options={"features": "nesting=1"}, running=True)
    assert p2.restart_needed


def test_booleans_and_property_strings_compare_like_pve_stores_them():
    cfg = pve.PveConfig.parse("onboot: 1\nprotection: 0\nfeatures: keyctl=1,nesting=1\ncores: 4\n")
    same = {"onboot": True, "protection": "no", "features": "nesting=true,keyctl=1", "cores": 4}
    assert not pve.plan(1, cfg, options=same).changed
    p = pve.plan(1, cfg, options={"onboot": False, "features": "nesting=1", "cores": "8"})
    assert p.set == {"onboot": "0", "features": "nesting=1", "cores": "8"}


def test_locked_container_is_refused():
    with pytest.raises(pve.PveError, match="pct unlock 5"):
        pve.plan(5, pve.PveConfig.parse("cores: 1\nlock: backup\n"))


def test_devn_in_options_is_refused():
    with pytest.raises(pve.PveError, match="computed from the host"):
        pve.plan(5, pve.PveConfig.parse("cores: 1\n"), options={"dev0": "/dev/null"})


def test_write_config_atomic_keeps_mode(tmp_path):
    path = tmp_path / "129.conf"
    path.write_text(load("129.conf"))
    path.chmod(0o640)
    cfg = pve.read_config(str(path))
    cfg.set_key("cores", "8")
    pve.write_config(str(path), cfg)
    assert path.read_text().startswith(
        "#EAGLE-3 GPU container\n#%0Aowner%3A ml-team\narch: amd64\ncores: 8\n"
    )
    assert (path.stat().st_mode & 0o777) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["129.conf"]
    with pytest.raises(pve.PveError, match="does not exist"):
        pve.read_config(str(tmp_path / "1.conf"))


def test_versions_and_status():
    assert pve.parse_pve_version("pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.8-2-pve)") == (8, 2)
    assert pve.mode_for_version((8, 1)) == "dev" and pve.mode_for_version((8, 0)) == "raw"
    assert pve.mode_for_version((7, 4)) == "raw"
    with pytest.raises(pve.PveError, match="set the passthrough mode"):
        pve.mode_for_version(None)
    assert pve.parse_pct_status("status: running\n") == "running"
    ls = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159\n"
    assert pve_pve_devices.container_driver_versions(ls) == ["580.159"]


def _fake_proc(tmp_path, procs: dict[int, tuple[str, str]]):
    """A /proc stand-in: <pid>/ns/mnt (a symlink naming the namespace, as the kernel's reads), <pid>/cmdline."""
    proc = tmp_path / "proc"
    for pid, (ns, cmd) in procs.items():
        (proc / str(pid) / "ns").mkdir(parents=True)
        os.symlink(f"mnt:[{ns}]", proc / str(pid) / "ns" / "mnt")
        (proc / str(pid) / "cmdline").write_bytes(cmd.replace(" ", "\0").encode() + b"\0")
    return proc


def test_stale_bind_mount_found_by_device_and_inode(tmp_path):
    """The container (init 4242) sees at /data the directory that was /data when it started; after the
    cut-over renamed it to data.old and a new data took its place, the host path is another inode: stale.
    /proc/4242/root is a symlink to the container's root here (the kernel's is a magic link to it)."""
    host_data = tmp_path / "data"
    (host_data / "eagle3").mkdir(parents=True)
    proc = _fake_proc(tmp_path, {4242: ("4026532001", "/sbin/init")})
    ct_root = tmp_path / "ctroot"
    ct_root.mkdir()
    os.symlink(host_data, ct_root / "data")  # what the bind mount resolves to: the directory's inode
    os.symlink(ct_root, proc / "4242" / "root")
    keys = {
        "mp0": f"{host_data},mp=/data,backup=0",
        "mp1": "local-lvm:vm-140-disk-1,mp=/scratch",
        "cores": "4",
    }
    assert pve_pve_container.bind_mount_points(keys) == [("mp0", str(host_data), "/data")]
    assert pve_pve_container.stale_bind_mounts(keys, 4242, proc=str(proc)) == []

    host_data.rename(tmp_path / "data.old")  # the cut-over: the container's bind follows the renamed inode
    (ct_root / "data").unlink()
    os.symlink(tmp_path / "data.old", ct_root / "data")
    host_data.mkdir()
    (proc / "4242" / "mountinfo").write_text(
        "22 1 0:21 / / rw - tmpfs ct140 rw\n35 22 254:0 /data.old /data rw,relatime - ext4 /dev/dm-0 rw\n"
    )
    (s,) = pve_pve_container.stale_bind_mounts(keys, 4242, proc=str(proc))
    assert (s.key, s.host_path, s.mount_point, s.container_source) == (
        "mp0",
        str(host_data),
        "/data",
        "254:0 /data.old",
    )
    assert s.host == (host_data.stat().st_dev, host_data.stat().st_ino) != s.container
    text = s.describe(140)
    assert "container 140's /data is device" in text and "mounted from 254:0 /data.old" in text
    assert f"the host path {host_data} is now device" in text and "cut-over" in text
    assert s.to_dict()["container_source"] == "254:0 /data.old"

    (ct_root / "data").unlink()  # a container that has nothing at its mount point is stale too
    (s,) = pve_pve_container.stale_bind_mounts(keys, 4242, proc=str(proc))
    assert s.container is None and "is missing" in s.describe(140)


def test_container_jobs_are_the_namespace_members_running_pipeline_commands(tmp_path):
    proc = _fake_proc(tmp_path, {
        4242: ("4026532001", "/sbin/init"),
        4300: ("4026532001", "/opt/eagle3ops/venv/bin/python /opt/eagle3ops/venv/bin/eagle3ops extract --data /data/x --json"),
        4301: ("4026532001", "/opt/eagle3ops/venv/bin/python -m eagle3ops.train.speculators_shim --config /data/run/config.yaml"),
        4302: ("4026532001", "/usr/bin/python3 -m eagle3ops extract-status --data /data/x"),
        4303: ("4026532001", "/opt/sglang/bin/python -m sglang.launch_server --port 30000"),
        4304: ("4026532001", "/opt/eagle3ops/venv/bin/python -m eagle3ops.train.ddp_probe --config /data/run/c.yaml"),
        4305: ("4026532001", "/usr/bin/eagle3ops train-status --run-dir /data/run --json"),
        4306: ("4026532001", "/usr/bin/eagle3ops extract-verify --data /data/x --level checksum"),
        4307: ("4026532001", "/usr/bin/eagle3ops extract-lengths --data /data/x"),  # read-only
        4308: ("4026532001", "/usr/bin/eagle3ops serve-convert --checkpoint /data/run/checkpoints --out /d"),
        4400: ("4026531840", "/usr/bin/eagle3ops extract --data /srv/other"),  # the host's, not the container's
    })  # fmt: skip
    jobs = pve_pve_container.container_jobs(4242, proc=str(proc))
    assert [j for j, _cmd in jobs] == [4300, 4301, 4304, 4306, 4308], jobs  # not the read-only ones
    assert jobs[0][1].startswith("/opt/eagle3ops/venv/bin/python /opt/eagle3ops/venv/bin/eagle3ops extract")
    assert [
        j for j, _ in pve_pve_container.container_jobs(4242, [r"sglang\.launch_server"], proc=str(proc))
    ] == [4303]
    with pytest.raises(pve.PveError, match="PID 9999"):
        pve_pve_container.container_jobs(9999, proc=str(proc))


def test_pct_status_verbose_pid():
    assert pve.parse_pct_pid("cpus: 96\nname: eagle3\npid: 31337\nstatus: running\nuptime: 12\n") == 31337
    assert pve.parse_pct_pid("status: stopped\n") is None
