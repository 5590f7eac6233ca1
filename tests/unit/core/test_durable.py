"""eagle3ops.durable: the one sha256 / atomic-write / directory-swap implementation, and the rule that the host
wing (eagle3ops.host: storage, pve, services and their helpers; durable) and every other file shipped as a module_util
(the option definitions: options.py, <phase>/options.py) need only the standard library.

Real files in tmp_path throughout. Faults are real where the OS can make them cheaply: a write that exceeds
RLIMIT_FSIZE (EFBIG from the kernel, mid-write), a rename onto a directory, a missing parent. The fsync test wraps
the real ``os.fsync``/``os.replace`` to record which path each was called on and in what order (a spy that still
does the real call, not a stand-in).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from eagle3ops import durable

REPO = Path(__file__).resolve().parents[3]
PKG = REPO / "python" / "eagle3ops"


def _shipped(repo: Path, pkg: Path) -> dict[str, str]:
    """``module_utils/eagle3ops_<name>.py`` symlink name -> the dotted module it ships (``eagle3ops.host.storage``)."""
    out = {}
    for p in sorted((repo / "module_utils").glob("eagle3ops_*.py")):
        if p.is_symlink() and p.resolve().is_relative_to(pkg.resolve()):
            rel = p.resolve().relative_to(pkg.resolve()).with_suffix("")
            out[p.stem] = ".".join(("eagle3ops", *rel.parts))
    return out


# Every file shipped as a module_util (what Ansible copies to targets where eagle3ops is not installed): the host
# wing (eagle3ops.host: storage, pve, services and their helpers; durable, which they import), the option
# definitions the modules import (options.py and each phase's <phase>/options.py; tests/unit/core/test_options.py)
SHIPPED = _shipped(REPO, PKG)
HOST_MODULES = tuple(sorted(SHIPPED.values()))
# The host wing: every file of eagle3ops/host/ (and durable) runs on targets without eagle3ops
HOST_WING = (
    "eagle3ops.durable",
    *sorted(f"eagle3ops.host.{p.stem}" for p in (PKG / "host").glob("*.py") if p.stem != "__init__"),
)
assert "eagle3ops.options" in HOST_MODULES and "eagle3ops.host.storage" in HOST_MODULES, HOST_MODULES


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


# --------------------------------------------------------------------------------------------------
# sha256
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("file_digest", [True, False], ids=["hashlib.file_digest", "python-3.10-loop"])
def test_sha256_file_matches_hashlib(tmp_path, monkeypatch, file_digest):
    if not file_digest:
        monkeypatch.delattr(hashlib, "file_digest", raising=False)
    f = tmp_path / "blob"
    data = os.urandom((1 << 22) + 12_345)  # more than one block of the loop
    f.write_bytes(data)
    assert durable.sha256_file(f) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert durable.sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


# --------------------------------------------------------------------------------------------------
# atomic writes
# --------------------------------------------------------------------------------------------------


def test_new_file_gets_the_bytes_open_w_would_give_and_leaves_no_temp(tmp_path):
    target = tmp_path / "a.bin"
    assert durable.atomic_write_bytes(target, [b"ab", bytearray(b"cd"), memoryview(b"ef")]) == 6
    assert target.read_bytes() == b"abcdef"
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()
    durable.atomic_write_text(tmp_path / "b.txt", "héllo\n", mode=0o600)
    assert (tmp_path / "b.txt").read_bytes() == "héllo\n".encode()
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o600 & ~_umask()
    assert _leftovers(tmp_path) == []


def test_json_format_is_the_projects_one(tmp_path):
    obj = {"b": 1, "a": [1, 2], "p": Path("/x")}
    with pytest.raises(TypeError):
        durable.atomic_write_json(tmp_path / "s.json", obj)
    assert not (tmp_path / "s.json").exists() and _leftovers(tmp_path) == []
    durable.atomic_write_json(tmp_path / "s.json", obj, default=str)
    text = (tmp_path / "s.json").read_text()
    assert text == json.dumps({**obj, "p": "/x"}, indent=2, sort_keys=True) + "\n"


def test_a_failure_mid_write_keeps_the_old_file_and_removes_the_temp(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old\n")

    class Boom:  # not a buffer: fails after the first part is already in the temp file
        pass

    with pytest.raises(TypeError):
        durable.atomic_write_bytes(target, [b"new data, half of it", Boom()])
    assert target.read_text() == "old\n" and _leftovers(tmp_path) == []


def test_a_kernel_write_error_mid_file_keeps_the_old_file_and_names_the_target(tmp_path):
    """EFBIG from a real write(2): the process's RLIMIT_FSIZE is below the payload (a child process, so the
    limit does not touch pytest)."""
    target = tmp_path / "big.bin"
    target.write_bytes(b"old")
    code = f"""
import errno, resource, signal, sys
sys.path.insert(0, {str(PKG.parent)!r})
from eagle3ops import durable
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    durable.atomic_write_bytes({str(target)!r}, b"x" * 100_000)
except OSError as e:
    print(e.errno == errno.EFBIG, e.filename)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", str(target)]
    assert target.read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_a_failed_rename_or_open_names_the_target_and_leaves_nothing(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "keep").write_text("x")  # a non-empty directory: os.replace onto it must fail
    with pytest.raises(OSError) as e:
        durable.atomic_write_bytes(tmp_path / "adir", b"data")
    assert e.value.filename == str(tmp_path / "adir") and e.value.filename2 is None
    assert (tmp_path / "adir" / "keep").read_text() == "x" and _leftovers(tmp_path) == []
    with pytest.raises(FileNotFoundError) as e:
        durable.atomic_write_json(tmp_path / "missing" / "x.json", {})
    assert e.value.filename == str(tmp_path / "missing" / "x.json")


def test_the_file_is_fsynced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "f.json"
    durable.atomic_write_json(target, {"a": 1})
    assert len(events) == 3, events
    (k0, p0), (k1, p1), (k2, p2) = events
    assert k0 == "fsync" and Path(p0).parent == tmp_path and Path(p0).name.startswith(".f.json.")
    assert (
        p0.endswith(".tmp") and (k1, p1) == ("replace", str(target)) and (k2, p2) == ("fsync", str(tmp_path))
    )
    events.clear()
    durable.atomic_write_json(target, {"a": 2}, fsync=False)
    assert [k for k, _ in events] == ["replace"] and json.loads(target.read_text()) == {"a": 2}


def test_mode_owner_and_mtime_are_taken_from_a_reference_file(tmp_path):
    target = tmp_path / "mod.py"
    target.write_text("old")
    target.chmod(0o751)
    ref = tmp_path / "ref"
    ref.write_text("r")
    os.utime(ref, ns=(1_600_000_000_123_456_789, 1_600_000_000_987_654_321))
    durable.atomic_write_bytes(target, b"new", mode_from=target)
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o7777 == 0o751
    backup = tmp_path / "mod.py.orig"
    durable.atomic_write_bytes(backup, b"new", mode_from=target, mtime_from=ref)
    st = backup.stat()
    assert st.st_mode & 0o7777 == 0o751 and st.st_mtime_ns == 1_600_000_000_987_654_321
    assert (st.st_uid, st.st_gid) == (target.stat().st_uid, target.stat().st_gid)
    durable.atomic_write_bytes(tmp_path / "new", b"n", mode_from=tmp_path / "absent", mode=0o640)
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o640 & ~_umask()


def test_concurrent_writers_of_one_path_never_leave_a_torn_file(tmp_path):
    target = tmp_path / "shared.json"
    payloads = [{"writer": i, "pad": "x" * (1000 * (i + 1))} for i in range(6)]
    errors = []

    def run(obj):
        try:
            for _ in range(15):
                durable.atomic_write_json(target, obj, fsync=False)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and json.loads(target.read_text()) in payloads and _leftovers(tmp_path) == []


def test_swap_dir_into_place_replaces_a_whole_directory(tmp_path):
    dest, new = tmp_path / "out", tmp_path / ".out.new"
    for d, name in ((dest, "old"), (new, "fresh")):
        d.mkdir()
        (d / name).write_text(name)
    durable.fsync_tree(new)
    durable.swap_dir_into_place(new, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["fresh"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old copy is gone, nothing left aside


# --------------------------------------------------------------------------------------------------
# the host wing is standard library only
# --------------------------------------------------------------------------------------------------


def _fallbacks(tree: ast.AST) -> dict[int, set[str]]:
    """id(import node in a try body) -> the modules its ``except ImportError`` handler imports."""
    out: dict[int, set[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        handled = set()
        for h in node.handlers:
            if isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError"):
                for stmt in h.body:
                    handled |= {m for m, _ in _walk_imports(stmt)}
        for stmt in node.body:
            for _, n in _walk_imports(stmt):
                out[id(n)] = handled
    return out


def _walk_imports(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """Every module imported anywhere under ``tree`` (top level, functions, try blocks), with its node;
    ``from eagle3ops.host import _fs`` also counts as ``eagle3ops.host._fs`` (a name of a package is counted
    as its submodule too: ``from eagle3ops import durable``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, node))
            if node.module.split(".")[0] == "eagle3ops" or node.module == "ansible.module_utils":
                out += [(f"{node.module}.{a.name}", node) for a in node.names]
    return out


def _module_file(dotted: str, pkg: Path) -> Path | None:
    """The file of an eagle3ops module (``eagle3ops.host.storage`` -> .../host/storage.py), None for a package
    or a name that is no module (``from eagle3ops.store import HiddenStateStore``)."""
    if dotted == "eagle3ops":
        return None
    f = pkg / Path(*dotted.split(".")[1:]).with_suffix(".py")
    return f if f.is_file() else None


def _violations(dotted: str) -> list[str]:
    """What in the file of ``dotted`` would fail on a host with only the standard library and the shipped
    module_utils files."""
    shipped = _shipped(REPO, PKG)  # read here (not the constant): the self-test below swaps REPO and PKG
    path = _module_file(dotted, PKG)
    tree = ast.parse(path.read_text())
    fallbacks = _fallbacks(tree)  # keyed by node identity: the same parse as below
    by_module = {m: name for name, m in shipped.items()}
    bad = []
    for mod, node in _walk_imports(tree):
        top = mod.split(".")[0]
        where = f"{path.relative_to(REPO)}:{node.lineno}"
        if top in sys.stdlib_module_names or mod in ("ansible", "ansible.module_utils"):
            continue
        if mod.startswith("ansible.module_utils."):
            name = mod.rsplit(".", 1)[1]
            if name not in shipped:
                bad.append(f"{where}: {mod} is not a file shipped as module_utils/{name}.py")
            continue
        if top == "eagle3ops":
            if _module_file(mod, PKG) is None:
                if (PKG / Path(*mod.split(".")[1:]) / "__init__.py").is_file() or mod == "eagle3ops":
                    continue  # a package (its __init__ is a docstring): the name imported from it is checked
                parent = mod.rsplit(".", 1)[0]
                if _module_file(parent, PKG) is not None:
                    continue  # a name imported from a module: the module is checked as its own entry
            if mod not in by_module:
                bad.append(f"{where}: imports {mod}, which is not shipped as a module_util (the host wing)")
            elif f"ansible.module_utils.{by_module[mod]}" not in fallbacks.get(id(node), set()):
                bad.append(
                    f"{where}: imports {mod} without the `except ImportError:` fallback to "
                    f"ansible.module_utils.{by_module[mod]} (what a target without eagle3ops has)"
                )
            continue
        bad.append(f"{where}: imports {mod}, not in the standard library")
    return bad


@pytest.mark.parametrize("dotted", HOST_MODULES)
def test_host_wing_imports_only_the_stdlib_and_shipped_host_files(dotted):
    """Every import in the file, including ones inside functions (which a blocker at import time cannot see)."""
    assert _violations(dotted) == []


def test_every_host_wing_file_is_shipped():
    """A file added to eagle3ops/host/ runs on targets too: it must be shipped (and so held to the rule above)."""
    assert set(HOST_WING) <= set(HOST_MODULES), sorted(set(HOST_WING) - set(HOST_MODULES))


def test_the_import_check_catches_a_third_party_and_an_unshipped_import(tmp_path, monkeypatch):
    """The check above can fail: a copy of storage.py with a lazy `import yaml`, a bare `eagle3ops.store` and a
    host-wing import without its fallback."""
    fake = tmp_path / "python" / "eagle3ops"
    (fake / "host").mkdir(parents=True)
    src = (PKG / "host" / "storage.py").read_text()
    (fake / "host" / "storage.py").write_text(
        src + "\n\ndef _later():\n    import yaml\n    from eagle3ops import store\n"
        "    from eagle3ops.host import _fs\n    return yaml, store, _fs\n"
    )
    for rel in (
        "durable.py",
        "host/_fs.py",
        "host/storage_probe.py",
        "host/storage_rsync.py",
        "host/__init__.py",
    ):
        shutil.copy(PKG / rel, fake / rel)
    (tmp_path / "module_utils").mkdir()
    for name, rel in (
        ("durable", "durable.py"),
        ("fs", "host/_fs.py"),
        ("storage_probe", "host/storage_probe.py"),
        ("storage_rsync", "host/storage_rsync.py"),
    ):
        (tmp_path / "module_utils" / f"eagle3ops_{name}.py").symlink_to(fake / rel)
    monkeypatch.setattr(sys.modules[__name__], "PKG", fake)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    bad = _violations("eagle3ops.host.storage")
    assert any("imports yaml, not in the standard library" in b for b in bad), bad
    assert any("eagle3ops.store, which is not shipped" in b for b in bad), bad
    assert any("eagle3ops.host._fs without the `except ImportError:` fallback" in b for b in bad), bad
    assert len(bad) == 3, bad


_BLOCKER = """
import importlib.abc, sys
ALLOWED = set(sys.stdlib_module_names) | set(sys.argv[2:])
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in ALLOWED:
            raise ImportError(f"blocked non-stdlib import {name!r}")
        return None
sys.meta_path.insert(0, Blocker())
import importlib
importlib.import_module(sys.argv[1])
print("imported", sys.argv[1])
"""


def _import_blocked(module: str, *allowed: str, path: list[str], isolated: bool = False):
    flags = ["-I", "-S"] if isolated else []
    code = f"import sys; sys.path[:0] = {path!r}\n" + _BLOCKER
    return subprocess.run(
        [sys.executable, *flags, "-c", code, module, *allowed],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize("dotted", HOST_MODULES)
def test_host_wing_imports_with_every_non_stdlib_package_blocked(dotted):
    """Import the module in a fresh interpreter whose meta path refuses anything outside the standard library
    except eagle3ops itself (its package __init__ files included)."""
    r = _import_blocked(dotted, "eagle3ops", path=[str(PKG.parent)])
    assert r.returncode == 0 and f"imported {dotted}" in r.stdout, r.stderr


def test_the_blocker_refuses_a_third_party_package():
    r = _import_blocked("yaml", "eagle3ops", path=[str(PKG.parent)])
    assert r.returncode != 0 and "blocked non-stdlib import 'yaml'" in r.stderr


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_module_utils_import_on_a_host_without_eagle3ops(tmp_path, name):
    """What Ansible ships: the module_utils files as ``ansible.module_utils.eagle3ops_*`` in an interpreter with
    no site-packages at all (-I -S), eagle3ops blocked as well. The ``ansible`` package here is the smallest
    honest stand-in for Ansiballz's: empty ``__init__`` files around copies of the shipped files."""
    mu = tmp_path / "ansible" / "module_utils"
    mu.mkdir(parents=True)
    (tmp_path / "ansible" / "__init__.py").write_text("")
    (mu / "__init__.py").write_text("")
    for shipped in SHIPPED:
        shutil.copy((REPO / "module_utils" / f"{shipped}.py").resolve(), mu / f"{shipped}.py")
    r = _import_blocked(f"ansible.module_utils.{name}", "ansible", path=[str(tmp_path)], isolated=True)
    assert r.returncode == 0 and "imported" in r.stdout, r.stderr


def test_storage_state_file_written_through_the_shipped_copy(tmp_path):
    """storage.atomic_write_json on the target path (durable from ansible.module_utils, through _fs), same bytes
    as here."""
    mu = tmp_path / "ansible" / "module_utils"
    mu.mkdir(parents=True)
    (tmp_path / "ansible" / "__init__.py").write_text("")
    (mu / "__init__.py").write_text("")
    for n, rel in (("storage", "host/storage.py"), ("storage_probe", "host/storage_probe.py"), ("fs", "host/_fs.py"),
                   ("storage_rsync", "host/storage_rsync.py"), ("durable", "durable.py")):  # fmt: skip
        shutil.copy(PKG / rel, mu / f"eagle3ops_{n}.py")
    out = tmp_path / "state" / "s.json"
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from ansible.module_utils import eagle3ops_storage as s\n"
        "assert s._fs._durable.__name__ == 'ansible.module_utils.eagle3ops_durable', s._fs._durable.__name__\n"
        f"s.atomic_write_json({str(out)!r}, {{'step': 'copied', 'when': object}})\n"
    )
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert (
        out.read_text()
        == json.dumps({"step": "copied", "when": str(object)}, indent=2, sort_keys=True) + "\n"
    )
    assert _leftovers(out.parent) == []
