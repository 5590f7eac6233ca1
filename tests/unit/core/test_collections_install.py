"""collections/install.py: only the pinned collections, at their pinned versions, out of the source wheel.

The source wheel here is a STAND-IN: a zip with the ``ansible`` wheel's layout (``ansible_collections/<ns>/<name>``
with a MANIFEST.json each) holding three small collections, so the test runs in a second and offline; the
real 54 MB wheel is what `make` unpacks (the clean-clone run of `make test` proves that path)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "collections" / "install.py"


def _wheel(path: Path, colls: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, version in colls.items():
            ns, c = name.split(".")
            info = {"collection_info": {"namespace": ns, "name": c, "version": version, "dependencies": {}}}
            z.writestr(f"ansible_collections/{ns}/{c}/MANIFEST.json", json.dumps(info))
            z.writestr(f"ansible_collections/{ns}/{c}/plugins/modules/{c}_mod.py", f"# {name} {version}\n")
        z.writestr("ansible/__init__.py", "")
    return path


def _req(path: Path, colls: dict[str, str]) -> Path:
    path.write_text(
        "collections:\n" + "".join(f'  - name: {n}\n    version: "=={v}"\n' for n, v in colls.items())
    )
    return path


def _run(*args):
    r = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def test_only_the_pinned_ones_then_nothing_to_do(tmp_path):
    wheel = _wheel(
        tmp_path / "ansible-0-py3-none-any.whl", {"a.one": "1.0.0", "b.two": "2.1.0", "c.other": "9.9"}
    )
    req = _req(tmp_path / "req.yml", {"a.one": "1.0.0", "b.two": "2.1.0"})
    dest = tmp_path / "colls"
    rc, res, _ = _run("--requirements", req, "--dest", dest, "--wheel", wheel, "--check")
    assert rc == 0 and res["changed"] is True and not dest.exists()
    rc, res, _ = _run("--requirements", req, "--dest", dest, "--wheel", wheel)
    assert rc == 0 and res["installed"] == ["a.one==1.0.0", "b.two==2.1.0"]
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == [
        "ansible_collections/a/one/MANIFEST.json",
        "ansible_collections/a/one/plugins/modules/one_mod.py",
        "ansible_collections/b/two/MANIFEST.json",
        "ansible_collections/b/two/plugins/modules/two_mod.py",
    ]
    rc, res, _ = _run("--requirements", req, "--dest", dest, "--wheel", wheel)
    assert rc == 0 and res["changed"] is False and res["kept"] == ["a.one", "b.two"]


def test_a_version_the_wheel_does_not_ship_fails_and_leaves_nothing(tmp_path):
    wheel = _wheel(tmp_path / "ansible-0-py3-none-any.whl", {"a.one": "1.0.0"})
    dest = tmp_path / "colls"
    rc, _, err = _run(
        "--requirements", _req(tmp_path / "r.yml", {"a.one": "1.1.0"}), "--dest", dest, "--wheel", wheel
    )
    assert (
        rc == 2
        and "ships a.one 1.0.0, collections/requirements.yml pins 1.1.0" in err
        and "Traceback" not in err
    )
    rc, _, err = _run(
        "--requirements", _req(tmp_path / "r2.yml", {"z.none": "1.0.0"}), "--dest", dest, "--wheel", wheel
    )
    assert rc == 2 and "has no collection z.none" in err
    assert not any(p.is_file() for p in dest.rglob("*")) if dest.exists() else True


def test_the_project_pins_are_what_the_source_wheel_ships():
    """The pins and the installed tree agree (what `make` installed in this checkout's collections path)."""
    import yaml

    want = {
        c["name"]: c["version"].lstrip("=")
        for c in yaml.safe_load((ROOT / "collections/requirements.yml").read_text())["collections"]
    }
    rc, res, err = _run("--dest", ROOT / ".ansible" / "collections", "--check")
    assert rc == 0, err
    assert res["changed"] is False and res["kept"] == sorted(want)
