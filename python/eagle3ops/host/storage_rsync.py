"""Phase ``storage``: rsync, the copy and the verification of the migration (:mod:`.storage` runs them, each
behind its guards): the command line of each pass (copy, checksum verification, quick check, preview), the
allocated size of a tree, running rsync, and what a failure tells the user to do. The marker's name is here
because no pass may transfer or delete it.

Part of the host wing (:mod:`eagle3ops.host`): standard library only, importing nothing from ``eagle3ops`` but
:mod:`.storage_probe` (the phase's error); shipped to targets as ``module_utils/eagle3ops_storage_rsync.py``
beside ``eagle3ops_storage.py``, which imports it. ``tests/unit/core/test_durable.py`` enforces it.
"""

from __future__ import annotations

import os
import stat
import subprocess

try:
    from eagle3ops.host import storage_probe as _probe
except (
    ImportError
):  # on a target, as module_utils/eagle3ops_storage_rsync.py: eagle3ops is not installed there
    from ansible.module_utils import eagle3ops_storage_probe as _probe

StorageError = _probe.StorageError  # the phase's one error

MARKER_NAME = (
    ".eagle3ops-storage.json"  # the migration's marker on the new filesystem (storage.record writes it)
)
# rsync options shared by the copy and the verification: archive + hard links + ACLs + xattrs, ids as
# numbers (the container's uid map must not be translated through the host's passwd)
RSYNC_BASE = ("-aHAX", "--numeric-ids")
# never transferred nor deleted: our marker, and the filesystem's own lost+found
RSYNC_EXCLUDES = (f"--exclude=/{MARKER_NAME}", "--exclude=/lost+found")
ITEMIZE_FORMAT = "--out-format=%i %n%L"


def rsync_command(src: str, dst: str, *, mode: str, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``mode``: copy (resumable), verify (checksums, dry-run), quick (size+mtime, dry-run), preview."""
    cmd = ["rsync", *RSYNC_BASE, "--delete", *RSYNC_EXCLUDES, ITEMIZE_FORMAT]
    if mode == "copy":
        cmd += ["--partial", "--sparse"]  # sparse files stay sparse: the size check counts allocated bytes
    elif mode == "verify":
        cmd += ["--checksum", "--dry-run"]
    elif mode in ("quick", "preview"):
        cmd += ["--dry-run"]
    else:
        raise ValueError(mode)
    return [*cmd, *extra, src.rstrip("/") + "/", dst.rstrip("/") + "/"]


def tree_size(path: str) -> int:
    """Allocated bytes under ``path`` (like du), hard links counted once."""
    total, seen = 0, set()
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
        except OSError:
            continue
    return total


def run_rsync(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return {"rc": proc.returncode, "changes": lines, "stderr": proc.stderr}


def rsync_failure(res: dict, cmd: list[str], *, src: str, dst: str) -> StorageError:
    rc, err = res["rc"], res["stderr"].strip()
    if rc < 0:
        return StorageError(
            f"rsync {src}/ -> {dst}/ was killed by signal {-rc}; the copy is resumable: re-run the storage phase "
            "(the state file stays at 'copying'; nothing was cut over)",
            rc=rc,
        )
    if "No space left on device" in err or (rc == 12 and "(28)" in err):
        st = os.statvfs(dst)
        return StorageError(
            f"the new filesystem at {dst} is full ({st.f_blocks * st.f_frsize} bytes) while copying {src}: the new "
            f"disk is too small for the data. Use a bigger disk (storage_disk) or free space in {src}; nothing "
            f"was cut over. rsync: {err[-600:]}",
            rc=rc,
        )
    return StorageError(f"rsync failed (exit {rc}): {err[-1500:]}; command: {' '.join(cmd)}", rc=rc)
