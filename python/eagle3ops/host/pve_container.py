"""A running container seen from the PVE host: do its bind mounts still show what its ``mpN`` host paths are now
(the storage phase's cut-over can change a path under a running container), and which pipeline jobs run in it
(a restart would kill them). Part of the host wing (:mod:`eagle3ops.host`, standard library only); shipped as
``module_utils/eagle3ops_pve_container.py``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

try:
    from eagle3ops.host import _fs
    from eagle3ops.host.pve import MP_KEY_RE, PveError, parse_property_string
except (
    ImportError
):  # on a target, as module_utils/eagle3ops_pve_container.py: eagle3ops is not installed there
    from ansible.module_utils import eagle3ops_fs as _fs
    from ansible.module_utils.eagle3ops_pve import MP_KEY_RE, PveError, parse_property_string


# --------------------------------------------------------------------------------------------------
# A running container's bind mounts: does it still see what its mpN host path is now?
# --------------------------------------------------------------------------------------------------


# Command lines of pipeline jobs that a container restart would kill (they resume, but the run is lost):
# the CLI's data-writing commands (console script or ``python -m eagle3ops``) and the detached trainers.
# the commands that work on /data for long; not the read-only ones (extract-status, train-status,
# extract-lengths, ...): a whole word, so "extract" does not take "extract-status" along
DEFAULT_BUSY_PATTERNS = (
    r"\beagle3ops(\.cli)?\s+(prepare|regenerate|extract|extract-sglang|extract-verify|train"
    r"|serve-convert|benchmark-[\w-]+)(?![\w-])",
    r"\beagle3ops\.train\.(speculators_shim|specforge_shim|ddp_probe)\b",
)


@dataclass
class StaleMount:
    """A bind mount point whose host path is no longer what the running container has mounted."""

    key: str
    host_path: str
    mount_point: str
    host: tuple[int, int] | None  # (st_dev, st_ino) of the host path now; None: it does not exist
    container: tuple[int, int] | None  # what the container sees at mount_point; None: nothing there
    container_source: str = ""  # "major:minor path-in-that-filesystem" from the container's mountinfo

    def describe(self, vmid: int) -> str:
        def ident(x):
            return f"device {os.major(x[0])}:{os.minor(x[0])} inode {x[1]}" if x else "missing"

        seen = ident(self.container)
        if self.container_source:
            seen += f", mounted from {self.container_source}"
        return (
            f"{self.key}: container {vmid}'s {self.mount_point} is {seen} but the host path {self.host_path} "
            f"is now {ident(self.host)} (it changed underneath the running container: e.g. the storage "
            f"phase's cut-over moved the old directory to its rollback path and mounted the new disk there)"
        )

    def to_dict(self) -> dict:
        return {"key": self.key, "host_path": self.host_path, "mount_point": self.mount_point,
                "host": list(self.host) if self.host else None,
                "container": list(self.container) if self.container else None,
                "container_source": self.container_source}  # fmt: skip


def bind_mount_points(keys: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, host path, mount point) of every ``mpN`` whose volume is a host path (a bind mount)."""
    out = []
    for key, value in sorted(keys.items()):
        if MP_KEY_RE.match(key):
            props = parse_property_string(value)
            vol, mp = props.get("_", ""), props.get("mp", "")
            if vol.startswith("/") and mp.startswith("/"):
                out.append((key, vol, mp))
    return out


def _mountinfo_source(pid: int, mount_point: str, proc: str = "/proc") -> str:
    """``major:minor root`` of the mount at ``mount_point`` in the process's mount namespace (last wins)."""
    found = [m for m in _fs.read_mounts(pid, proc) if m["target"] == mount_point]
    return f"{found[-1]['devnum']} {found[-1]['root']}" if found else ""


def stale_bind_mounts(keys: dict[str, str], pid: int, proc: str = "/proc") -> list[StaleMount]:
    """The bind mount points (of the config the container runs with, ``keys``) whose host path is no
    longer the directory the running container (init ``pid``) sees there: compared by device and inode,
    the container's side through ``/proc/<pid>/root``."""
    stale = []
    for key, host_path, mp in bind_mount_points(keys):
        host = _fs.file_id(host_path)
        container = _fs.file_id(f"{proc}/{pid}/root{mp}")
        if host != container or host is None:
            stale.append(StaleMount(key, host_path, mp, host, container, _mountinfo_source(pid, mp, proc)))
    return stale


def container_jobs(pid: int, patterns=DEFAULT_BUSY_PATTERNS, proc: str = "/proc") -> list[tuple[int, str]]:
    """(PID, command line) of the processes in the container's mount namespace (that of its init ``pid``)
    whose command line matches one of ``patterns``."""
    try:
        ns = os.readlink(f"{proc}/{pid}/ns/mnt")
    except OSError as e:
        raise PveError(f"cannot read the mount namespace of the container's init (PID {pid}): {e}") from None
    regexes = [re.compile(p) for p in patterns]
    found = []
    for entry in sorted(os.listdir(proc), key=lambda x: (len(x), x)):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"{proc}/{entry}/ns/mnt") != ns:
                continue
            with open(f"{proc}/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        if cmd and any(r.search(cmd) for r in regexes):
            found.append((int(entry), cmd))
    return found
