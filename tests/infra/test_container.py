"""Phase ``container``: checks run *inside* the GPU container (group ``gpu_containers``).

    pytest tests/infra/test_container.py --hosts=ansible://gpu_containers \\
        --ansible-inventory=inventory/production

The container is reached through ``community.proxmox.proxmox_pct_remote`` (testinfra then runs each
check through Ansible's shell module). Checks: the NVIDIA nodes were passed through (character devices
that the container's device cgroup lets it open), ``nvidia-smi`` runs and sees one GPU per
``/dev/nvidiaN`` when the host has GPUs (skipped cleanly where none exists), and /data is a mount point.
"""

from __future__ import annotations

import json

import pytest

# One round trip: every /dev/nvidia* node, its type, and what open(O_RDWR) says (EPERM: the container's
# device cgroup refuses it — the passthrough rule is missing; ENXIO/ENODEV: no driver behind the node).
PROBE = r"""python3 - <<'EOF'
import errno, glob, json, os, stat
out = {}
for p in sorted(glob.glob('/dev/nvidia*') + glob.glob('/dev/nvidia-caps/*')):
    st = os.stat(p)
    if not stat.S_ISCHR(st.st_mode):
        continue
    try:
        os.close(os.open(p, os.O_RDWR))
        res = 'ok'
    except OSError as e:
        res = errno.errorcode.get(e.errno, str(e.errno))
    out[p] = {'major': os.major(st.st_rdev), 'minor': os.minor(st.st_rdev), 'open': res}
gpus = sorted(os.listdir('/proc/driver/nvidia/gpus')) if os.path.isdir('/proc/driver/nvidia/gpus') else []
print(json.dumps({'nodes': out, 'gpus': gpus}))
EOF"""


@pytest.fixture(scope="module")
def probe(host):
    r = host.run(PROBE)
    assert r.rc == 0, f"probe failed in the container (python3 needed): {r.stderr[-1000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_nvidia_device_nodes_present(probe):
    nodes = probe["nodes"]
    gpu_nodes = [p for p in nodes if p[len("/dev/nvidia") :].isdigit()]
    missing = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm") if p not in nodes]
    assert gpu_nodes and not missing, (
        f"NVIDIA device nodes missing in the container (have: {sorted(nodes) or 'none'}; missing: "
        f"{missing or ['/dev/nvidiaN']}): run the container phase on the PVE host, then restart the container"
    )


def test_nvidia_nodes_not_refused_by_device_cgroup(probe):
    denied = {p: n for p, n in probe["nodes"].items() if n["open"] in ("EPERM", "EACCES")}
    assert not denied, (
        f"the container may not open {sorted(denied)} ({next(iter(denied.values()))['open']}): the device rule "
        "for their majors is missing (devN entries, or lxc.cgroup2.devices.allow with the host's current "
        "majors); re-run the container phase and restart the container"
    )


def test_nvidia_smi_runs_when_a_gpu_exists(host, probe):
    if not probe["gpus"]:
        pytest.skip("no NVIDIA GPU behind this container (/proc/driver/nvidia/gpus is empty or absent)")
    r = host.run("nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader")
    assert r.rc == 0, (
        f"nvidia-smi failed in the container (rc {r.rc}): {(r.stdout + r.stderr).strip()[-500:]} — a "
        "'Driver/library version mismatch' means the container's NVIDIA user-space differs from the host driver"
    )
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    gpu_nodes = [p for p in probe["nodes"] if p[len("/dev/nvidia") :].isdigit()]
    assert len(lines) == len(gpu_nodes), f"nvidia-smi sees {len(lines)} GPUs, /dev has {gpu_nodes}"


def test_data_is_a_mount_point(host, phase_var):
    path = phase_var("container", "container_data_path")
    assert host.mount_point(path).exists, (
        f"{path} is not a mount point in the container: set container_data_host_path (mp0) and run "
        "the container phase; after a storage cut-over restart the container"
    )
