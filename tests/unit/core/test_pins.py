"""The pins hold: every control dependency is ``==``, every installed package is in the constraints with its
installed version, the Ansible collections found are exactly collections/requirements.yml's, and every role
declares the one ``min_ansible_version`` that the suite runs (the installed ansible-core's minor)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
_LINE = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)\s*==\s*([^\s;#]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            m = _LINE.match(line)
            assert m, f"{path.name}: '{raw}' is not pinned with =="
            out[_norm(m.group(1).split("[")[0])] = m.group(2)
    return out


def test_control_requirements_are_pinned():
    pins = _pins(ROOT / "requirements" / "control.txt")
    assert {"ansible-core", "ansible-runner", "ansible-lint", "pytest", "pytest-testinfra"} <= set(pins)


def test_installed_packages_match_the_constraints():
    pins = _pins(ROOT / "requirements" / "constraints.txt")
    wrong = []
    # the venv's own site-packages, not sys.path: once a test in this worker has imported setuptools, its
    # setuptools/_vendor (jaraco.*, zipp, tomli, wheel, ...) is on sys.path and would count as installed
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in importlib.metadata.distributions(path=site):
        name = _norm(dist.metadata["Name"])
        if name in ("eagle3ops", "pip"):
            continue
        have = dist.version.split("+")[0]
        if name not in pins:
            wrong.append(
                f"{name}=={have} is installed but not in requirements/constraints.txt (run make lock)"
            )
        elif pins[name] != have:
            wrong.append(f"{name}: installed {have}, constraints say {pins[name]}")
    assert not wrong, "\n".join(wrong)


def test_collections_are_exactly_the_pinned_versions():
    req = yaml.safe_load((ROOT / "collections" / "requirements.yml").read_text())
    want = {c["name"]: c["version"].lstrip("=") for c in req["collections"]}
    galaxy = shutil.which("ansible-galaxy", path=str(Path(sys.executable).parent))
    out = subprocess.run(
        [galaxy, "collection", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    found: dict[str, str] = {}
    for _path, colls in json.loads(out).items():  # search-path order: the first one found is the one used
        for name, info in colls.items():
            found.setdefault(name, info["version"])
    assert {n: found.get(n) for n in want} == want


def test_one_min_ansible_version_the_suite_runs():
    import ansible.release

    core = ".".join(ansible.release.__version__.split(".")[:2])
    versions = {
        p.parent.parent.name: yaml.safe_load(p.read_text())["galaxy_info"]["min_ansible_version"]
        for p in sorted((ROOT / "roles").glob("*/meta/main.yml"))
    }
    assert set(versions.values()) == {core}, versions
