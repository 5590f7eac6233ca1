"""Phase ``services``: keep GPU-grabbing systemd units (the seed's ``vllm.service``, ...) off the GPUs.

Part of the host wing (:mod:`eagle3ops.host`): standard library only, importing nothing from ``eagle3ops`` but
the host wing's :mod:`._fs` (and through it :mod:`eagle3ops.durable`): it is also shipped to targets as
``module_utils/eagle3ops_services.py`` (a symlink to this file, with ``eagle3ops_fs.py`` and
``eagle3ops_durable.py`` beside it), because the phase runs before the ``runtime`` phase installs eagle3ops
there. ``tests/unit/core/test_durable.py`` enforces it.

What ``ansible.builtin.systemd_service`` does (stop, disable, mask, unmask, enable, daemon-reload) stays
with it. This file adds what it lacks:

* :func:`expand_units` — unit names from names and glob patterns (``vllm*.service``);
* :func:`unit_info` — a unit's states and what sits at ``/etc/systemd/system/<unit>``: masking writes a
  symlink to /dev/null exactly there, so ``systemctl mask`` (and the Ansible module) FAILS when a
  hand-installed unit file (or a ``systemctl link`` symlink) occupies that path;
* :func:`record` / :func:`move_aside` / :func:`restore` / :func:`forget` — a backup directory
  (default ``/var/lib/eagle3ops/services``) holding, per unit, ``<unit>.json`` (its state before the
  phase first touched it) and ``<unit>.unit`` (the unit file moved out of /etc/systemd/system, byte-exact,
  mode/owner/mtime kept; or the symlink itself);
* :func:`nvidia_holders` — processes holding ``/dev/nvidia*`` open (from ``/proc/*/fd``) and their units.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import shutil
import subprocess
import time

try:
    from eagle3ops.host import _fs
except ImportError:  # on a target, as module_utils/eagle3ops_services.py: eagle3ops is not installed there
    from ansible.module_utils import eagle3ops_fs as _fs

SYSTEMD_ETC = "/etc/systemd/system"
DEFAULT_BACKUP_DIR = "/var/lib/eagle3ops/services"
RECORD_VERSION = 1
_SHOW_PROPS = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "FragmentPath", "MainPID")
_GLOB = re.compile(r"[*?\[]")


class ServicesError(Exception):
    """An error the user can act on (the message names the unit/path and what to do)."""


# ---------------------------------------------------------------------------------------------------
# systemctl
# ---------------------------------------------------------------------------------------------------
def _systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemctl", *args], capture_output=True, text=True, check=False, env={**os.environ, "LC_ALL": "C"}
    )


def systemd_running(run_dir: str = "/run/systemd/system") -> bool:
    """Whether systemd is the init system here (sd_booted(3): the directory exists)."""
    return os.path.isdir(run_dir)


def is_pattern(name: str) -> bool:
    return bool(_GLOB.search(name))


def normalize(name: str) -> str:
    """``vllm`` -> ``vllm.service`` (systemctl's own rule for names without a type suffix)."""
    if is_pattern(name) or re.search(r"\.(service|socket|timer|target|path|mount|scope|slice)$", name):
        return name
    return name + ".service"


def _names_from_listing(out: str) -> list[str]:
    names = []
    for line in out.splitlines():
        parts = line.split()
        if parts:
            # list-units may prefix a status glyph ("●") for failed units
            names.append(parts[1] if parts[0] in ("●", "*") and len(parts) > 1 else parts[0])
    return names


def expand_units(patterns: list[str], systemctl=_systemctl) -> list[str]:
    """Sorted unit names: explicit names as given (even if not installed: masking those keeps a later
    install from starting), patterns expanded over installed unit files and loaded units."""
    explicit, globs = [], []
    for p in patterns:
        (globs if is_pattern(p) else explicit).append(normalize(p))
    found = set(explicit)
    if globs:
        known = set()
        for args in (
            ("list-unit-files", "--no-legend", "--no-pager", "--plain"),
            ("list-units", "--all", "--no-legend", "--no-pager", "--plain"),
        ):
            known.update(_names_from_listing(systemctl(*args, *globs).stdout))
        # systemctl's own matching already applied; keep only real matches (defensive against headers)
        found.update(n for n in known if any(fnmatch.fnmatchcase(n, g) for g in globs))
    # Template files themselves (vllm@.service) cannot be stopped or masked as such: skip them.
    return sorted(n for n in found if not n.endswith("@.service"))


def etc_entry(unit: str, etc_dir: str = SYSTEMD_ETC) -> str:
    """What occupies ``<etc_dir>/<unit>``: absent | mask (symlink to /dev/null) | file | link | other."""
    path = os.path.join(etc_dir, unit)
    if os.path.islink(path):
        return "mask" if os.readlink(path) == "/dev/null" else "link"
    if not os.path.lexists(path):
        return "absent"
    return "file" if os.path.isfile(path) else "other"


def show(unit: str, systemctl=_systemctl) -> dict:
    p = systemctl("show", "--no-pager", "-p", ",".join(_SHOW_PROPS), unit)
    props = {}
    for line in p.stdout.splitlines():
        k, _, v = line.partition("=")
        props[k] = v
    return {
        "name": unit,
        "load_state": props.get("LoadState", "not-found") or "not-found",
        "active_state": props.get("ActiveState", "inactive") or "inactive",
        "sub_state": props.get("SubState", ""),
        "unit_file_state": props.get("UnitFileState", ""),
        "fragment_path": props.get("FragmentPath", ""),
        "main_pid": int(props.get("MainPID") or 0),
    }


def unit_info(
    unit: str, backup_dir: str = DEFAULT_BACKUP_DIR, etc_dir: str = SYSTEMD_ETC, systemctl=_systemctl
):
    info = show(unit, systemctl)
    info["etc_entry"] = etc_entry(unit, etc_dir)
    info["etc_path"] = os.path.join(etc_dir, unit)
    rec = read_record(unit, backup_dir)
    info["record"] = rec
    bpath = backup_path(unit, backup_dir)
    info["backup"] = bpath if os.path.lexists(bpath) else None
    # the unit is off the GPUs for good when it is masked and not running
    info["masked"] = info["load_state"] == "masked" or info["etc_entry"] == "mask"
    info["running"] = info["active_state"] in ("active", "activating", "reloading", "deactivating")
    return info


# ---------------------------------------------------------------------------------------------------
# Backup directory: <unit>.json (state before), <unit>.unit (moved unit file)
# ---------------------------------------------------------------------------------------------------
def record_path(unit: str, backup_dir: str) -> str:
    return os.path.join(backup_dir, unit + ".json")


def backup_path(unit: str, backup_dir: str) -> str:
    return os.path.join(backup_dir, unit + ".unit")


def read_record(unit: str, backup_dir: str) -> dict | None:
    try:
        return _fs.read_json(record_path(unit, backup_dir))
    except ValueError as e:
        raise ServicesError(
            f"{record_path(unit, backup_dir)} is not valid JSON ({e}); fix or remove it (it records {unit}'s "
            "state before the services phase) and re-run"
        ) from e


def list_records(backup_dir: str) -> list[str]:
    """Units that have a record in ``backup_dir`` (what ``restored`` acts on)."""
    if not os.path.isdir(backup_dir):
        return []
    return sorted(f[: -len(".json")] for f in os.listdir(backup_dir) if f.endswith(".json"))


def record(unit: str, backup_dir: str, *, check: bool = False, systemctl=_systemctl, etc_dir=SYSTEMD_ETC):
    """Write ``<unit>.json`` with the unit's current state unless one exists. Returns (changed, record)."""
    existing = read_record(unit, backup_dir)
    if existing is not None:
        return False, existing
    info = show(unit, systemctl)
    rec = {
        "version": RECORD_VERSION,
        "unit": unit,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_state": info["load_state"],
        "active_state": info["active_state"],
        "unit_file_state": info["unit_file_state"],
        "fragment_path": info["fragment_path"],
        "etc_entry": etc_entry(unit, etc_dir),
        # masked before we came: `restored` leaves it masked
        "was_masked": info["load_state"] == "masked" or etc_entry(unit, etc_dir) == "mask",
        "was_enabled": info["unit_file_state"] in ("enabled", "enabled-runtime"),
        "was_active": info["active_state"] in ("active", "activating", "reloading"),
    }
    if not check:
        # Keep a copy of what is at /etc/systemd/system/<unit> now: `systemctl disable` removes a
        # `systemctl link` symlink before move_aside could take it.
        if rec["etc_entry"] in ("file", "link"):
            _backup_entry(os.path.join(etc_dir, unit), backup_path(unit, backup_dir))
        _fs.write_json(record_path(unit, backup_dir), rec, dir_mode=0o700)
    return True, rec


def _same_file(a: str, b: str) -> bool:
    if os.path.islink(a) or os.path.islink(b):
        return os.path.islink(a) and os.path.islink(b) and os.readlink(a) == os.readlink(b)
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def _copy_exact(src: str, dst: str) -> None:
    """Copy a file (content, mode, owner, times) or a symlink (as a symlink), via a temp name."""
    tmp = f"{dst}.tmp{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    if os.path.islink(src):
        os.symlink(os.readlink(src), tmp)
        st = os.lstat(src)
        with contextlib.suppress(OSError):
            os.lchown(tmp, st.st_uid, st.st_gid)
    else:
        shutil.copy2(src, tmp)
        st = os.stat(src)
        os.chown(tmp, st.st_uid, st.st_gid)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, dst)


def move_aside(unit: str, backup_dir: str, *, etc_dir: str = SYSTEMD_ETC, check: bool = False) -> dict:
    """Move ``<etc_dir>/<unit>`` (a file or a non-mask symlink) to ``<backup_dir>/<unit>.unit``.

    Returns ``{changed, src, backup, kind}``. Nothing to do when the path is absent or already the mask.
    """
    src = os.path.join(etc_dir, unit)
    dst = backup_path(unit, backup_dir)
    kind = etc_entry(unit, etc_dir)
    result = {"changed": False, "src": src, "backup": dst, "kind": kind}
    if kind in ("absent", "mask"):
        return result
    if kind == "other":
        raise ServicesError(
            f"{src} is neither a file nor a symlink; move it away by hand so that {unit} can be masked"
        )
    result["changed"] = True
    if check:
        return result
    _backup_entry(src, dst)
    os.unlink(src)
    return result


def _backup_entry(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` exactly, unless ``dst`` already holds the same; an older, different backup
    is kept under a dated name (never overwritten)."""
    os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
    if os.path.lexists(dst):
        if _same_file(src, dst):
            return
        os.replace(dst, f"{dst}.{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    _copy_exact(src, dst)
    if not _same_file(src, dst):
        raise ServicesError(f"backup {dst} of {src} differs after copying; {src} was left in place")


def restore(unit: str, backup_dir: str, *, etc_dir: str = SYSTEMD_ETC, check: bool = False) -> dict:
    """Put ``<backup_dir>/<unit>.unit`` back to ``<etc_dir>/<unit>`` byte-exact and remove the backup.

    The path must be free (unmask first) or already hold the identical file. Returns ``{changed, dst, backup}``.
    """
    src = backup_path(unit, backup_dir)
    dst = os.path.join(etc_dir, unit)
    result = {"changed": False, "dst": dst, "backup": src}
    if not os.path.lexists(src):
        return result
    kind = etc_entry(unit, etc_dir)
    if kind == "mask":
        if check:  # the role unmasks first; in check mode that did not happen
            result["changed"] = True
            return result
        raise ServicesError(f"{dst} is still the mask symlink; unmask {unit} first (systemctl unmask {unit})")
    if kind != "absent":
        if _same_file(src, dst):
            result["changed"] = True
            if not check:
                os.unlink(src)
            return result
        raise ServicesError(
            f"{dst} exists and differs from the backup {src}; refusing to overwrite it. Compare the two, keep "
            f"the one you want at {dst}, delete {src}, and re-run"
        )
    result["changed"] = True
    if check:
        return result
    _copy_exact(src, dst)
    if not _same_file(src, dst):
        raise ServicesError(f"restored {dst} differs from its backup {src}; the backup was kept")
    os.unlink(src)
    return result


def forget(unit: str, backup_dir: str, *, check: bool = False) -> bool:
    """Remove ``<unit>.json`` (after a completed restore). Refuses while a moved unit file is still there."""
    rp = record_path(unit, backup_dir)
    if not os.path.exists(rp):
        return False
    if os.path.lexists(backup_path(unit, backup_dir)) and not check:  # check mode: restore only predicted
        raise ServicesError(
            f"{backup_path(unit, backup_dir)} (the moved unit file) is still there; restore it before "
            f"forgetting {rp}"
        )
    if not check:
        os.unlink(rp)
    return True


# ---------------------------------------------------------------------------------------------------
# Who holds the GPUs
# ---------------------------------------------------------------------------------------------------
def _unit_of(pid: str, proc: str) -> str:
    """The systemd unit of a process, from its cgroup path (``.../vllm.service``), or ''."""
    return _fs.unit_of_cgroup(_fs.read_text(os.path.join(proc, pid, "cgroup")))


def nvidia_holders(proc: str = "/proc", dev_prefix: str = "/dev/nvidia", exclude_units=()) -> list[dict]:
    """Processes with ``/dev/nvidia*`` open: ``[{pid, comm, cmdline, unit, devices}]`` (sorted by pid).

    Units in ``exclude_units`` (or matching them as globs) are left out. A host without NVIDIA devices
    returns ``[]``. Processes that vanish or cannot be read are skipped.
    """
    out = []
    self_pid = str(os.getpid())
    for pid in os.listdir(proc):
        if not pid.isdigit() or pid == self_pid:
            continue
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        devices = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith(dev_prefix):
                devices.add(target)
        if not devices:
            continue
        unit = _unit_of(pid, proc)
        if unit and any(fnmatch.fnmatchcase(unit, normalize(u)) for u in exclude_units):
            continue
        try:
            with open(os.path.join(proc, pid, "comm")) as fh:
                comm = fh.read().strip()
            with open(os.path.join(proc, pid, "cmdline"), "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            comm, cmdline = "", ""
        out.append(
            {
                "pid": int(pid),
                "comm": comm,
                "cmdline": cmdline[:300],
                "unit": unit,
                "devices": sorted(devices),
            }
        )
    return sorted(out, key=lambda h: h["pid"])


def gather(patterns: list[str], backup_dir: str = DEFAULT_BACKUP_DIR, *, holders: bool = True,
           etc_dir: str = SYSTEMD_ETC, proc: str = "/proc", systemctl=_systemctl,
           run_dir: str = "/run/systemd/system") -> dict:  # fmt: skip
    """Everything the role decides on: the units, their records, and other NVIDIA holders."""
    if not systemd_running(run_dir):
        # nothing can start a unit here (a CI box, a container without systemd): nothing to mask
        result = {
            "systemd_running": False,
            "units": [],
            "records": [],
            "unit_names": [],
            "recorded_names": [],
        }
        if holders:
            result["holders"] = nvidia_holders(proc, exclude_units=[])
        return result
    names = expand_units(patterns, systemctl)
    recorded = list_records(backup_dir)
    units = [unit_info(n, backup_dir, etc_dir, systemctl) for n in names]
    records = [unit_info(n, backup_dir, etc_dir, systemctl) for n in recorded]
    result = {"systemd_running": True, "units": units, "records": records, "unit_names": names,
              "recorded_names": recorded}  # fmt: skip
    if holders:
        result["holders"] = nvidia_holders(proc, exclude_units=names)
    return result


def holders_line(holders: list) -> str:
    """The holders in one line, for the phase's report: ``pid 42 (python, unit x.service: /dev/nvidia0); ...``."""
    return "; ".join(
        f"pid {h['pid']} ({h['comm']}{', unit ' + h['unit'] if h.get('unit') else ''}: {' '.join(h['devices'])})"
        for h in holders
    )
