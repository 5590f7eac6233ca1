"""Phase ``runtime`` on a remote, air-gapped host: eagle3ops installed from a wheelhouse copied from the
controller (the nspawn host has no default route and no resolver: no registry is reachable from it).

The wheelhouse is small on purpose: eagle3ops' own light dependencies (numpy, safetensors, rich and what
rich needs), at the versions of the controller's venv, downloaded once with `pip download` into
/var/cache/eagle3ops-tests and reused; the heavy workload deps are switched off with
``runtime_install_workload: false``. The eagle3ops wheel itself is built on the controller by the role.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hosts import nspawn

pytestmark = [pytest.mark.root, pytest.mark.nspawn, pytest.mark.slow]

LIGHT_DEPS = ("numpy", "safetensors", "rich")
REPO = Path(__file__).resolve().parents[2]


def _wheelhouse() -> Path:
    pins = [f"{p}=={md.version(p)}" for p in LIGHT_DEPS]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    key = hashlib.sha256(("|".join(pins) + tag).encode()).hexdigest()[:10]
    dest = nspawn.CACHE_DIR / f"wheelhouse-{key}"
    if (dest / ".complete").exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    p = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
         f"{sys.version_info.major}.{sys.version_info.minor}", "--platform", "manylinux2014_x86_64",
         "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", "-d", str(tmp), *pins],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        pytest.skip(f"cannot build the test wheelhouse (pip download {' '.join(pins)}): {p.stderr[-500:]}")
    (tmp / ".complete").write_text("\n".join(pins) + "\n")
    tmp.rename(dest)
    return dest


def _source_snapshot(dest: Path) -> Path:
    """A frozen copy of what the wheel is built from: others edit the shared tree while this test runs,
    and a changed source between the two runs would (rightly) make the second one copy a new wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in ("pyproject.toml", "README.md", "requirements", "python"):
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / rel)
    return dest


def test_runtime_installs_eagle3ops_from_wheelhouse_on_air_gapped_host(make_host, run_playbook, tmp_path):
    h = make_host(groups=("gpu_hosts",))
    guest_py = h.ssh("python3 -c 'import sys; print(sys.version_info[:2])'").stdout.strip()
    if guest_py != str(tuple(sys.version_info[:2])):
        pytest.skip(
            f"the wheelhouse is built for the controller's Python {sys.version_info[:2]}, guest has {guest_py}"
        )
    wh = _wheelhouse()
    # really air-gapped: no route, no resolver
    assert "default" not in h.ssh("ip -4 route").stdout
    gap = h.ssh(
        "python3 -c \"import socket; socket.create_connection(('pypi.org', 443), timeout=3)\"", check=False
    )
    assert gap.returncode != 0

    extravars = {
        "runtime_mode": "venv",
        "runtime_wheelhouse": str(wh),
        "runtime_install_workload": False,
        "runtime_install_system_packages": False,  # no Debian mirror either; the rootfs has python3-venv
        "runtime_source_dir": str(_source_snapshot(tmp_path / "src")),
        "runtime_build_dir": str(tmp_path / "build"),
    }
    # check mode first: predicts the install, and writes nothing, not even the controller's wheel build dir
    rc = run_playbook("playbooks/runtime.yml", h.inventory, extravars=extravars, check=True)
    assert rc.rc == 0 and rc.host(h.name)["changed"] > 0, rc.summary()
    assert not (tmp_path / "build").exists(), "check mode built the wheel into runtime_build_dir"
    assert h.ssh("test -e /opt/eagle3ops/venv", check=False).returncode != 0
    r1 = run_playbook("playbooks/runtime.yml", h.inventory, extravars=extravars)
    assert r1.rc == 0, r1.summary()
    out = h.ssh("/opt/eagle3ops/venv/bin/eagle3ops --version").stdout.strip()
    assert out.startswith("eagle3ops "), out
    assert md.version("eagle3ops") in out
    freeze = h.ssh("/opt/eagle3ops/venv/bin/pip freeze").stdout
    assert "torch" not in freeze, "workload deps were installed although runtime_install_workload=false"
    missing = [d for d in LIGHT_DEPS if f"{d}=={md.version(d)}" not in freeze]

    r2 = run_playbook("playbooks/runtime.yml", h.inventory, extravars=extravars)
    assert r2.rc == 0, r2.summary()
    if missing:  # see the xfail below: the second run installs them, the third must then change nothing
        assert r2.host(h.name)["changed"] > 0
        r2 = run_playbook("playbooks/runtime.yml", h.inventory, extravars=extravars)
    assert r2.rc == 0 and r2.host(h.name)["changed"] == 0, r2.changed_tasks(h.name) or r2.summary()

    freeze = h.ssh("/opt/eagle3ops/venv/bin/pip freeze").stdout
    for dep in LIGHT_DEPS:
        assert f"{dep}=={md.version(dep)}" in freeze, freeze
    # the installed package imports its numpy-backed store on the target
    h.ssh("/opt/eagle3ops/venv/bin/python -c 'import eagle3ops.store'")
    if missing:
        # roles/runtime installs the eagle3ops wheel with `--force-reinstall --no-deps` whenever the copied
        # wheel changed (always on the first run), so with runtime_install_workload=false eagle3ops' own
        # dependencies are only installed by the second run. Reported to the lead; passes once fixed.
        pytest.xfail(f"roles/runtime's first run left eagle3ops' own deps {missing} uninstalled")
