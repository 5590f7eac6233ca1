"""The extract role asks the PVE host how full the storage under the data directory is and refuses an extraction
that does not fit it, although the filesystem the extraction writes to has room (statvfs cannot see a Ceph or
thin pool running out underneath a container's volume).

Real: the phase playbook (playbooks/extract.yml) through ansible-runner on this machine (inventory/local), the role,
the module eagle3ops_extract_pve_usage delegated to the "PVE host" (localhost here), the extract module and CLI
with a tiny model on the CPU. STAND-INS (no PVE host can run here): ``pvesm`` is tests/fixtures/pvesm (its output
checked against PVE's recorded format in tests/unit/host/test_pve_volumes.py), the container's config a file
under a temporary /etc/pve/lxc whose ``mp0`` is a Ceph RBD volume.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
from extract_local import extract_vars, run_extract_local
from tinymodels import build_prepared_dataset, build_tiny_target

USAGE_TASK = "Extract | Ask the PVE host how full the storage under the data directory is (extract_pve_host)"
PLAN_TASK = "Extract | Work out what is left to extract (reads the manifests only)"


def test_a_full_ceph_pool_under_data_stops_the_extraction_before_it_writes(tmp_path):
    model = build_tiny_target(tmp_path / "model")
    data = build_prepared_dataset(tmp_path / "data", [5, 17, 33, 9])
    root = tmp_path / "pve"
    (root / "etc/pve/lxc").mkdir(parents=True)
    (root / "etc/pve/lxc/129.conf").write_text(
        f"arch: amd64\nmp0: ceph-rbd:vm-129-disk-1,mp={data},backup=0,size=2000G\n"
        "rootfs: local-lvm:vm-129-disk-0,size=64G\n"
    )
    (root / "var/lib/pct-standin").mkdir(parents=True)
    tib = 2**40  # the original run's pool: 11 TiB, a few MiB left
    (root / "var/lib/pct-standin/storage.json").write_text(
        json.dumps({"storages": {"ceph-rbd": {"type": "rbd", "total": 11 * tib, "used": 11 * tib - 2**22}}})
    )
    pvesm = tmp_path / "pvesm"  # the stand-in, with its state under the test's root
    pvesm.write_text(
        f'#!/bin/sh\nPCT_STANDIN_ROOT={root} exec {sys.executable} {REPO}/tests/fixtures/pvesm "$@"\n'
    )
    pvesm.chmod(0o755)
    xv = extract_vars(
        model,
        data,
        extract_pve_host="localhost",
        extract_pve_vmid=129,
        extract_pve_pvesm=str(pvesm),
        extract_pve_config_dir=str(root / "etc/pve/lxc"),
        extract_pve_storage_cfg=str(root / "etc/pve/storage.cfg"),
    )
    r = run_extract_local(xv, tmp_path / "runner")
    assert r.rc != 0, r.summary()
    (usage,) = r.task_results(USAGE_TASK)
    assert usage["mount"] == "mp0" and usage["usage"]["storage"] == "ceph-rbd", usage
    (plan,) = r.task_results(PLAN_TASK)
    msg = plan.get("msg", "")
    assert "not enough space on PVE storage 'ceph-rbd' (rbd, volume ceph-rbd:vm-129-disk-1)" in msg, msg
    assert "4.0 MiB available of 11.0 TiB" in msg, msg
    assert not (data / "hidden_states").exists() or not list((data / "hidden_states").rglob("*.safetensors"))
