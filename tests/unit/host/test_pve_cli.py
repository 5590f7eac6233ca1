"""``eagle3ops pve show|plan`` on the fixture configs, with the host's /dev given as a `stat` listing."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3ops.cli import main
from eagle3ops.host import pve_devices as pve_pve_devices

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "pve"
LISTING = """/dev/nvidia0 195 0
/dev/nvidia1 195 1
/dev/nvidiactl 195 255
/dev/nvidia-uvm 508 0
/dev/nvidia-uvm-tools 508 1
/dev/nvidia-caps/nvidia-cap1 234 1
stat: cannot statx '/dev/nvidia-caps/*': No such file or directory
"""


def run(capsys, *argv) -> tuple[int, dict]:
    rc = main([*argv, "--json"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    return rc, json.loads(out)


def test_parse_dev_listing():
    devs = pve_pve_devices.parse_dev_listing(LISTING)
    assert [d.path for d in devs[:2]] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert pve_pve_devices.Device("/dev/nvidia-uvm", 508, 0) in devs and len(devs) == 6


def test_plan_raw_from_listing_writes_nothing(tmp_path, capsys):
    conf = tmp_path / "129.conf"
    conf.write_text((FIX / "129.conf").read_text())
    listing = tmp_path / "listing"
    listing.write_text(LISTING)
    rc, res = run(capsys, "pve", "plan", str(conf), "--mode", "raw", "--dev-listing", str(listing),
                  "--proc-devices", str(FIX / "proc-devices.txt"), "--option", "cores=32", "--running")  # fmt: skip
    assert rc == 0 and res["changed"] is True and res["restart_needed"] is True
    assert res["raw_remove"] == ["lxc.cgroup2.devices.allow: c 509:* rwm"]
    assert "+lxc.cgroup2.devices.allow: c 508:* rwm\n" in res["diff"] and "-cores: 64\n" in res["diff"]
    assert res["pct_set"] == ["/usr/sbin/pct", "set", "129", "--cores", "32"]
    assert conf.read_text() == (FIX / "129.conf").read_text()


def test_plan_refuses_stale_node(tmp_path, capsys):
    listing = tmp_path / "listing"
    listing.write_text(LISTING.replace("/dev/nvidia-uvm 508 0", "/dev/nvidia-uvm 509 0"))
    rc, res = run(capsys, "pve", "plan", str(FIX / "129.conf"), "--dev-listing", str(listing),
                  "--proc-devices", str(FIX / "proc-devices.txt"))  # fmt: skip
    assert rc == 2 and res["failed"] and "major 509" in res["msg"]


def test_show(capsys):
    rc, res = run(capsys, "pve", "show", str(FIX / "130-dev.conf"))
    assert (
        rc == 0
        and res["snapshots"] == ["clean"]
        and res["pending"] == {"dev5": "/dev/nvidia1", "delete": "dev4"}
    )
    rc, res = run(capsys, "pve", "show", "/nonexistent/1.conf")
    assert rc == 2 and "does not exist" in res["msg"]


def test_module_documentation_parses_and_matches_its_argument_spec():
    """library/eagle3ops_container_gpu.py: DOCUMENTATION/EXAMPLES/RETURN are YAML and document every option."""
    from library_docs import module_docs

    docs, spec = module_docs(FIX.parents[2] / "library" / "eagle3ops_container_gpu.py")
    assert spec and set(spec) == set(docs["DOCUMENTATION"]["options"])
    assert {"restart_needed", "plan", "devices"} <= set(docs["RETURN"])
