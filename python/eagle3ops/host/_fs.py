"""The file helpers the host wing shares (storage, pve, services): reading a small file or a JSON record,
writing a JSON record durably (:mod:`eagle3ops.durable`), the mount table of a process, a path's identity, the
systemd unit of a process.

Standard library only, like every file of the host wing (``tests/unit/core/test_durable.py`` holds them to it):
shipped as ``module_utils/eagle3ops_fs.py`` to targets where eagle3ops is not installed.
"""

from __future__ import annotations

import json
import os
import re

try:
    from eagle3ops import durable as _durable
except ImportError:  # on a target, as module_utils/eagle3ops_fs.py: eagle3ops is not installed there
    from ansible.module_utils import eagle3ops_durable as _durable


def read_text(path: str, default: str = "") -> str:
    """The file's text, stripped; ``default`` when it cannot be read (sysfs and /proc entries come and go)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return default


def read_json(path: str):
    """The JSON document at ``path``; None when there is no such file. Any other failure (unreadable, not JSON)
    is raised (an OSError or ValueError) for the caller to name in its own message."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def write_json(path: str, obj, *, dir_mode: int = 0o777) -> None:
    """Durably replace ``path`` with ``obj`` as JSON (the project's format; anything not JSON as ``str``),
    creating its directory (``dir_mode``) if needed."""
    os.makedirs(os.path.dirname(path) or ".", mode=dir_mode, exist_ok=True)
    _durable.atomic_write_json(path, obj, default=str)


def unescape_mount(s: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_mountinfo(text: str) -> list[dict]:
    """A ``/proc/PID/mountinfo`` as dicts (devnum, root, target, fstype, source, options), in mount order."""
    mounts = []
    for line in text.splitlines():
        if " - " not in line:
            continue
        left, right = line.split(" - ", 1)
        lf, rf = left.split(), right.split()
        if len(lf) < 6 or len(rf) < 2:
            continue
        mounts.append(
            {
                "devnum": lf[2],
                "root": unescape_mount(lf[3]),
                "target": unescape_mount(lf[4]),
                "options": lf[5],
                "fstype": rf[0],
                "source": unescape_mount(rf[1]),
            }
        )
    return mounts


def read_mounts(pid: int | str = "self", proc: str = "/proc") -> list[dict]:
    """The mounts process ``pid`` sees (its mount namespace); [] when they cannot be read."""
    return parse_mountinfo(read_text(f"{proc}/{pid}/mountinfo"))


def file_id(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of ``path`` (following links), None when it does not exist or cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def unit_of_cgroup(text: str) -> str:
    """The systemd unit (``.service``/``.scope``) a ``/proc/PID/cgroup`` places a process in, or ''."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return ""
