"""Phase ``storage``: a newly attached disk becomes /data, without ever losing the old data.

(The rsync passes themselves, their command lines and failures, are :mod:`.storage_rsync`'s; what it reads of
the machine is :mod:`.storage_probe`'s.)

Part of the host wing (:mod:`eagle3ops.host`): deliberately **standard library only**, importing nothing from
``eagle3ops`` but the host wing (:mod:`.storage_probe`: what is read of the machine; :mod:`.storage_rsync`: rsync;
:mod:`._fs`; and through it :mod:`eagle3ops.durable`): it is also shipped to targets as
``module_utils/eagle3ops_storage.py`` (a symlink to this file, with ``eagle3ops_storage_probe.py``,
``eagle3ops_storage_rsync.py``, ``eagle3ops_fs.py`` and ``eagle3ops_durable.py`` beside it),
because the phase runs on the machine that owns the disk (the PVE host in production), where eagle3ops is not
installed. ``tests/unit/core/test_durable.py`` enforces it.

The migration is a small state machine, recorded in a JSON *state file* on the disk-owning machine
(default ``/var/lib/eagle3ops/storage-state.json``)::

    (none) -> preparing -> prepared -> copying -> copied -> verified -> cutover_started -> cutover -> cleaned

- ``preparing``: the disk was accepted (blank, or ``force``); written before anything touches the disk.
- ``prepared``: GPT partition + filesystem made, mounted at the staging path, marker written on it.
- ``copying``: an rsync copy started (or a verification found a difference); re-run = rsync again.
- ``copied`` / ``verified``: rsync finished / a checksum dry-run found no difference.
- ``cutover_started`` / ``cutover``: /data is being / has been switched to the new filesystem (fstab by
  UUID, ``nofail``); the old data stays at ``old_path`` (a renamed directory, or the old device mounted
  there) as the rollback.
- ``cleaned``: the rollback copy was removed on request (``cleanup_old``).

Safety rules enforced here (not in YAML, so that no code path can skip them):
- a disk with a partition table, a filesystem/RAID/LVM signature or non-zero data in its first MiB is
  refused unless ``force``; a mounted, in-use (holders) or root disk is refused always;
- rsync never runs unless the *source* is still the one the migration started from: same filesystem
  (UUID / device number), same mount point, not empty, and /data is not listed in fstab while unmounted.
  After a reboot or container restart where /data did not mount, this stops the run with an error
  instead of mirroring an empty directory (``rsync --delete``) over the copied data;
- rsync never writes into a staging path that is not the new filesystem.
"""

from __future__ import annotations

import datetime
import os
import time
import uuid as uuidlib

try:
    from eagle3ops.host import _fs
    from eagle3ops.host import storage_probe as _probe
except ImportError:  # on a target, as module_utils/eagle3ops_storage.py: eagle3ops is not installed there
    from ansible.module_utils import eagle3ops_fs as _fs
    from ansible.module_utils import eagle3ops_storage_probe as _probe
try:
    from eagle3ops.host import storage_rsync as _rsync
except ImportError:  # on a target (or beside an installed eagle3ops older than this file): the shipped copy
    from ansible.module_utils import eagle3ops_storage_rsync as _rsync

# what the phase uses of the rsync passes; the tests reach them through this module too
MARKER_NAME = _rsync.MARKER_NAME
rsync_command = _rsync.rsync_command
rsync_failure = _rsync.rsync_failure
run_rsync = _rsync.run_rsync
tree_size = _rsync.tree_size

StorageError = _probe.StorageError  # the phase's one error, raised by the probes too

STATE_VERSION = 1
STEPS = ("preparing", "prepared", "copying", "copied", "verified", "cutover_started", "cutover", "cleaned")


def step_index(step: str | None) -> int:
    return -1 if step is None else STEPS.index(step)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


# --------------------------------------------------------------------------------------------------
# The source (/data): identity and the guard
# --------------------------------------------------------------------------------------------------


def dir_entries(path: str, ignore: tuple[str, ...] = ("lost+found", MARKER_NAME)) -> list[str]:
    return sorted(n for n in os.listdir(path) if n not in ignore)


def source_identity(data_path: str, *, mounts: list[dict] | None = None, fstab: str = "/etc/fstab") -> dict:
    """Where /data lives now: its mount, filesystem UUID, whether it is a mount point, empty or not."""
    mounts = _fs._fs._fs.read_mounts() if mounts is None else mounts
    data_path = os.path.normpath(data_path)
    ident: dict = {"path": data_path, "exists": os.path.isdir(data_path)}
    if os.path.exists(data_path) and not os.path.isdir(data_path):
        raise StorageError(
            f"{data_path} exists but is not a directory; move it away or fix storage_data_path"
        )
    m = _probe.mount_containing(data_path, mounts)
    ident.update(
        mount_target=m["target"],
        devnum=m["devnum"],
        fstype=m["fstype"],
        source=m["source"],
        fsroot=m["root"],
        is_mountpoint=m["target"] == data_path,
        fs_uuid=_probe.fs_uuid_of(m["devnum"], m["source"]),
    )
    entries = dir_entries(data_path) if ident["exists"] else []
    ident["entries"] = len(entries)
    ident["sample"] = entries[:5]
    ident["empty"] = not entries
    ident["fstab"] = next((e for e in _probe.read_fstab(fstab) if e["path"] == data_path), None)
    return ident


def _describe(ident: dict) -> str:
    where = "its own mount" if ident.get("is_mountpoint") else f"a directory on {ident.get('mount_target')}"
    return (
        f"{ident['path']} is {where} (source {ident.get('source')}, {ident.get('fstype')}, "
        f"UUID={ident.get('fs_uuid') or '?'}, dev {ident.get('devnum')}; {ident.get('entries', 0)} entries)"
    )


def check_source(
    current: dict,
    recorded: dict | None = None,
    *,
    allow_empty: bool = False,
    new_fs_uuid: str | None = None,
) -> None:
    """Raise StorageError unless it is safe to copy *from* ``current`` (see the module docstring)."""
    path = current["path"]
    if not current["exists"]:
        raise StorageError(f"refusing to copy: {path} does not exist on this host; check storage_data_path")
    if new_fs_uuid and current.get("fs_uuid") == new_fs_uuid:
        raise StorageError(
            f"refusing to copy: {path} is already the new filesystem (UUID={new_fs_uuid}) but the state file "
            "says the copy is not finished; inspect `findmnt " + path + "` and the state file"
        )
    fstab = current.get("fstab")
    if fstab and not current["is_mountpoint"] and "noauto" not in fstab["opts"].split(","):
        raise StorageError(
            f"refusing to copy from {path}: /etc/fstab lists it ({fstab['src']} {fstab['fstype']}) but it is NOT "
            f"mounted, so it is an empty stand-in for the real data (after a reboot or container restart the "
            f"mount did not come up). Mount it (`mount {path}`) and re-run; nothing was copied. "
            f"Now: {_describe(current)}"
        )
    if recorded is not None:
        same_fs = (
            current.get("fs_uuid") == recorded.get("fs_uuid")
            if current.get("fs_uuid") and recorded.get("fs_uuid")
            else current.get("devnum") == recorded.get("devnum")
        )
        if (
            not same_fs
            or current["is_mountpoint"] != recorded.get("is_mountpoint")
            or (current.get("mount_target") != recorded.get("mount_target"))
        ):
            raise StorageError(
                f"refusing to copy from {path}: it is not the filesystem the migration started from. "
                f"Then: {_describe(recorded)}. Now: {_describe(current)}. "
                f"The old /data probably did not mount after a reboot or container restart; mount it again "
                f"(e.g. `mount {recorded.get('source')} {path}`) and re-run. Nothing was copied.",
                recorded=recorded,
                current=current,
            )
        if current["empty"] and not recorded.get("empty"):
            raise StorageError(
                f"refusing to copy from {path}: it is empty now but had {recorded.get('entries')} entries "
                f"when the migration started ({', '.join(recorded.get('sample') or [])}...). Restore/mount the "
                f"old data and re-run; nothing was copied (an rsync --delete from here would erase the copy)."
            )
        return
    if current["empty"] and not allow_empty:
        raise StorageError(
            f"refusing to migrate {path}: it is empty ({_describe(current)}). If /data normally lives on "
            f"another disk, it is not mounted: mount it and re-run. If this host really has no data yet, "
            f"set storage_allow_empty_source: true."
        )


# --------------------------------------------------------------------------------------------------
# State file and marker
# --------------------------------------------------------------------------------------------------


atomic_write_json = _fs.write_json  # the state file and the marker


def load_state(path: str) -> dict | None:
    try:
        state = _fs.read_json(path)
    except (OSError, ValueError) as e:
        raise StorageError(f"state file {path} is unreadable ({e}); fix or move it away and re-run") from e
    if state is None:
        return None
    if state.get("version") != STATE_VERSION or state.get("step") not in STEPS:
        raise StorageError(
            f"state file {path} has an unknown version/step ({state.get('version')}, {state.get('step')})"
        )
    return state


def advance(state: dict, step: str, **fields) -> dict:
    """Return ``state`` moved to ``step`` (history appended); fields are merged."""
    new = {**state, **fields, "step": step, "updated": now()}
    new["history"] = [*state.get("history", []), {"step": step, "at": new["updated"]}]
    return new


def new_state(
    disk_info: dict,
    source: dict,
    *,
    data_path: str,
    staging_path: str,
    old_path: str,
    fstype: str,
    fstab: str,
) -> dict:
    base = {
        "version": STATE_VERSION,
        "id": str(uuidlib.uuid4()),
        "disk": disk_info["disk"],
        "disk_realpath": disk_info["realpath"],
        "disk_fingerprint": disk_info["fingerprint"],
        "data_path": os.path.normpath(data_path),
        "staging_path": os.path.normpath(staging_path),
        "old_path": os.path.normpath(old_path),
        "fstype": fstype,
        "fstab": fstab,
        "source": source,
        "created": now(),
        "history": [],
    }
    return advance(base, "preparing")


def same_disk(state: dict, disk_info: dict) -> bool:
    a, b = state.get("disk_fingerprint") or {}, disk_info["fingerprint"]
    for key in ("wwid", "serial", "backing_file"):
        if a.get(key) or b.get(key):
            return a.get(key) == b.get(key) and a.get("size_bytes") == b.get("size_bytes")
    return state.get("disk_realpath") == disk_info["realpath"] and a.get("size_bytes") == b.get("size_bytes")


# --------------------------------------------------------------------------------------------------
# The plan: which steps a run must do, from the state file + what is on the machine
# --------------------------------------------------------------------------------------------------


def _tail(cutover: bool, cleanup_old: bool) -> list[str]:
    if not cutover:  # copy + verify now, cut over in a later run (a maintenance window)
        return []
    return ["cutover", "cleanup"] if cleanup_old else ["cutover"]


def plan(
    *,
    disk: str,
    data_path: str = "/data",
    staging_path: str = "/mnt/eagle3ops-storage-new",
    old_path: str = "/data.old",
    state_file: str = "/var/lib/eagle3ops/storage-state.json",
    fstab: str = "/etc/fstab",
    fstype: str = "xfs",
    force: bool = False,
    allow_empty_source: bool = False,
    cleanup_old: bool = False,
    require_stable_name: bool = True,
    cutover: bool = True,
) -> dict:
    """Read-only: decide the steps of this run. Raises StorageError for every refusal."""
    data_path, staging_path, old_path = (os.path.normpath(p) for p in (data_path, staging_path, old_path))
    mounts = _fs.read_mounts()
    state = load_state(state_file)
    info = _probe.probe_disk(disk, mounts=mounts)
    result: dict = {
        "disk": info,
        "state": state,
        "steps": [],
        "state_file": state_file,
        "fs_uuid": None,
        "partition": None,
        "data_path": data_path,
        "old_path": old_path,
        "staging_path": staging_path,
    }
    if require_stable_name and not disk.startswith("/dev/disk/"):
        hint = ", ".join(info["stable_names"]) or "none found (no udev?)"
        raise StorageError(
            f"storage_disk {disk} is not a stable name (kernel names like nvme1n1/sdb can change between boots); "
            f"use one of: {hint}; or set storage_disk_require_stable_name: false (tests only)"
        )

    if state is not None:
        _check_same_migration(
            state, info, disk=disk, state_file=state_file, data_path=data_path, old_path=old_path
        )

    soft, hard = _probe.blank_problems(info)
    if state is None:
        _refuse_new_disk(info, soft, hard, disk=disk, force=force, old_path=old_path)
        source = source_identity(data_path, mounts=mounts, fstab=fstab)
        check_source(source, None, allow_empty=allow_empty_source)
        result["source"] = source
        result["wipe"] = bool(soft)
        result["steps"] = ["prepare", "copy", "verify", *_tail(cutover, cleanup_old)]
        return result

    step = state["step"]
    result["fs_uuid"] = state.get("fs_uuid")
    result["partition"] = state.get("partition")
    result["source"] = state["source"]
    if hard and step_index(step) < step_index("prepared"):
        raise StorageError(f"refusing disk {disk}: " + "; ".join(hard))
    if step == "preparing":
        # accepted earlier; the preparation was interrupted. Re-doing it is idempotent.
        source = source_identity(data_path, mounts=mounts, fstab=fstab)
        check_source(source, state["source"], allow_empty=allow_empty_source)
        result["wipe"] = False
        result["steps"] = ["prepare", "copy", "verify", *_tail(cutover, cleanup_old)]
        return result

    # from here on the disk carries our filesystem: check that it is still the one in the state file
    result["partition"] = _our_partition(disk, state, state_file)

    if step_index(step) < step_index("cutover_started"):
        source = source_identity(data_path, mounts=mounts, fstab=fstab)
        check_source(
            source, state["source"], allow_empty=allow_empty_source, new_fs_uuid=state.get("fs_uuid")
        )
        todo = {
            "prepared": ["copy", "verify"],
            "copying": ["copy", "verify"],
            "copied": ["verify"],
            "verified": [],
        }[step]
        st = _probe.mount_at(staging_path, mounts)
        result["staging_mounted"] = bool(st) and _probe.fs_uuid_of(st["devnum"], st["source"]) == state.get(
            "fs_uuid"
        )
        result["steps"] = ["mount_staging", *todo, *_tail(cutover, cleanup_old)]
        return result

    # cut over (or in the middle of it): never copy again
    return _plan_cut_over(result, state, step, data_path=data_path, mounts=mounts, cleanup_old=cleanup_old)


def _check_same_migration(
    state: dict, info: dict, *, disk: str, state_file: str, data_path: str, old_path: str
) -> None:
    """The migration in the state file is the one this run asks for: same disk, same data and old paths."""
    if not same_disk(state, info):
        raise StorageError(
            f"state file {state_file} records a migration to {state['disk']} ({state['disk_realpath']}, "
            f"{state.get('disk_fingerprint')}), not {disk} ({info['realpath']}, {info['fingerprint']}). "
            f"Finish or roll back that migration first, or move the state file away if it is stale"
        )
    if (state["data_path"], state["old_path"]) != (data_path, old_path):
        raise StorageError(
            f"state file {state_file} records data_path={state['data_path']} old_path={state['old_path']}, "
            f"this run asks for {data_path} / {old_path}; keep the variables of the migration in progress"
        )


def _refuse_new_disk(info: dict, soft: list, hard: list, *, disk: str, force: bool, old_path: str) -> None:
    """No migration yet: refuse a disk that is not blank (unless ``force``), or an existing ``old_path``."""
    if hard:
        raise StorageError(
            f"refusing disk {disk} ({info['realpath']}): "
            + "; ".join(hard)
            + ". Pick another disk (storage_disk). "
            f"lsblk:\n{_probe.lsblk_text(info['realpath'])}",
            found=hard,
        )
    if soft and not force:
        raise StorageError(
            f"refusing disk {disk} ({info['realpath']}): it is not blank: "
            + "; ".join(soft)
            + ". Everything on it would be lost: if that is intended set storage_force: true, else pick "
            f"another disk (storage_disk). lsblk:\n{_probe.lsblk_text(info['realpath'])}",
            found=soft,
        )
    if os.path.exists(old_path):
        raise StorageError(
            f"{old_path} (the rollback location, storage_old_path) already exists; move it away or choose "
            "another storage_old_path"
        )


def _our_partition(disk: str, state: dict, state_file: str) -> str:
    """Partition 1 of ``disk``, checked to carry the filesystem the state file recorded; its path."""
    part = _probe.partition_path(disk, 1, create=False, timeout=2)
    probe = _probe.probe_devnum(_probe.majmin(part["devnum"]), part["path"])
    if probe.get("UUID") != state.get("fs_uuid"):
        raise StorageError(
            f"{disk} partition 1 has filesystem UUID={probe.get('UUID')} but the state file {state_file} "
            f"recorded UUID={state.get('fs_uuid')}: the disk was changed behind our back; inspect it and move "
            "the state file away to start over"
        )
    return part["path"]


def _plan_cut_over(
    result: dict, state: dict, step: str, *, data_path: str, mounts, cleanup_old: bool
) -> dict:
    """The steps left once the cutover started: finish it, mount /data, clean up; never copy again."""
    cur = _probe.mount_at(data_path, mounts)
    mounted_new = bool(cur) and _probe.fs_uuid_of(cur["devnum"], cur["source"]) == state.get("fs_uuid")
    result["data_mounted_from_new"] = mounted_new
    if step == "cutover_started":
        result["steps"] = ["cutover"] + (["cleanup"] if cleanup_old else [])
        return result
    if not mounted_new:
        if os.path.isdir(data_path) and dir_entries(data_path):
            raise StorageError(
                f"{data_path} should be the new filesystem (UUID={state.get('fs_uuid')}) but it is not mounted and "
                f"holds {len(dir_entries(data_path))} entries ({', '.join(dir_entries(data_path)[:5])}) written "
                f"while it was unmounted; move them away (they would be hidden), then re-run to mount it"
            )
        result["steps"].append("mount")
    if cleanup_old and step != "cleaned":
        result["steps"].append("cleanup")
    return result


# --------------------------------------------------------------------------------------------------
# rsync: copy and verification
# --------------------------------------------------------------------------------------------------


def staging_check(state: dict, mounts: list[dict] | None = None) -> None:
    """The staging path must be the new filesystem, else rsync would fill the root disk."""
    m = _probe.mount_at(state["staging_path"], mounts)
    if not m or _probe.fs_uuid_of(m["devnum"], m["source"]) != state.get("fs_uuid"):
        raise StorageError(
            f"{state['staging_path']} is not the new filesystem (UUID={state.get('fs_uuid')}) "
            f"({'mounted from ' + m['source'] if m else 'not mounted'}); mount it (re-run the storage phase) first"
        )


def sync(
    state_file: str,
    mode: str,
    *,
    check_mode: bool = False,
    allow_empty_source: bool = False,
    extra: list[str] | tuple[str, ...] = (),
) -> dict:
    """Run one rsync step of the migration (copy | verify | quick) with every guard; update the state."""
    state = load_state(state_file)
    if state is None:
        raise StorageError(
            f"no state file {state_file}: the disk was not prepared; run the whole storage phase"
        )
    if step_index(state["step"]) < step_index("prepared") or step_index(state["step"]) >= step_index(
        "cutover_started"
    ):
        raise StorageError(f"cannot {mode} in state '{state['step']}' ({state_file})")
    mounts = _fs.read_mounts()
    src, dst = state["data_path"], state["staging_path"]
    source = source_identity(src, mounts=mounts, fstab=state.get("fstab", "/etc/fstab"))
    check_source(source, state["source"], allow_empty=allow_empty_source, new_fs_uuid=state.get("fs_uuid"))
    staging_check(state, mounts)
    out: dict = {"mode": mode, "src": src, "dst": dst, "changed": False}
    if mode == "copy":
        if check_mode:
            res = run_rsync(rsync_command(src, dst, mode="preview", extra=extra))
            out.update(
                changed=bool(res["changes"]), changes=res["changes"][:200], n_changes=len(res["changes"])
            )
            return out
        need = tree_size(src)
        st = os.statvfs(dst)
        # usable = free now + what an earlier (interrupted) copy already put there
        have = st.f_bavail * st.f_frsize + tree_size(dst)
        if need > have:
            raise StorageError(
                f"the new filesystem ({dst}, {have} bytes usable) is smaller than the data in {src} ({need} "
                f"bytes allocated); use a bigger disk. Nothing was copied.",
                need=need,
                have=have,
            )
        if state["step"] != "copying":
            state = advance(state, "copying")
            atomic_write_json(state_file, state)
        cmd = rsync_command(src, dst, mode="copy", extra=extra)
        t0 = time.monotonic()
        res = run_rsync(cmd)
        if res["rc"] != 0:
            raise rsync_failure(res, cmd, src=src, dst=dst)
        state = advance(state, "copied", copy_seconds=round(time.monotonic() - t0, 1))
        atomic_write_json(state_file, state)
        out.update(
            changed=True,
            n_changes=len(res["changes"]),
            changes=res["changes"][:200],
            seconds=state["copy_seconds"],
        )
        return out
    if mode in ("verify", "quick"):
        needs = "copied" if mode == "verify" else "verified"
        if check_mode and step_index(state["step"]) < step_index(needs):
            # the pass before it was only predicted in this check run: comparing now would report its work
            out.update(
                changed=True, predicted=True, msg=f"check mode: {mode} follows a copy that would run first"
            )
            return out
        cmd = rsync_command(src, dst, mode=mode, extra=[e for e in extra if not e.startswith("--bwlimit")])
        res = run_rsync(cmd)
        if res["rc"] != 0:
            raise rsync_failure(res, cmd, src=src, dst=dst)
        out.update(differences=res["changes"][:200], n_differences=len(res["changes"]))
        if res["changes"]:
            if not check_mode:
                atomic_write_json(state_file, advance(state, "copying", last_differences=res["changes"][:50]))
            raise StorageError(
                f"{'verification' if mode == 'verify' else 'final check'} found {len(res['changes'])} difference(s) "
                f"between {src}/ and {dst}/ (first: {res['changes'][:5]}): something wrote to {src} during the "
                "migration. Stop the writers, then re-run (it copies again and re-verifies); nothing was cut over.",
                differences=res["changes"][:200],
            )
        if mode == "verify" and state["step"] != "verified":
            out["changed"] = True
            if not check_mode:
                atomic_write_json(state_file, advance(state, "verified"))
        return out
    raise ValueError(mode)


def record(
    state_file: str,
    step: str,
    *,
    check_mode: bool = False,
    create: dict | None = None,
    partition: str | None = None,
) -> dict:
    """Move the state file to ``step`` (idempotent). ``create`` = new_state kwargs for 'preparing'.

    For 'prepared', reads the filesystem UUID from ``partition`` and writes the marker into the staging
    root (which must be that filesystem)."""
    state = load_state(state_file)
    if step == "preparing":
        if state is not None:
            return {"changed": False, "state": state}
        if create is None:
            raise StorageError("record(preparing) needs the disk and source description")
        state = new_state(**create)
        if not check_mode:
            atomic_write_json(state_file, state)
        return {"changed": True, "state": state}
    if state is None:
        raise StorageError(f"no state file {state_file}; cannot record '{step}'")
    if step_index(state["step"]) >= step_index(step):
        return {"changed": False, "state": state}
    fields: dict = {}
    if step == "prepared":
        if not partition:
            raise StorageError("record(prepared) needs the partition")
        fs = _probe.blkid_probe(partition)
        if not fs.get("UUID"):
            raise StorageError(f"{partition} has no filesystem; the mkfs step did not run")
        fields = {"partition": partition, "fs_uuid": fs["UUID"], "fstype_found": fs.get("TYPE")}
        marker = {
            "id": state["id"],
            "fs_uuid": fs["UUID"],
            "disk": state["disk"],
            "created": now(),
            "source": {k: state["source"].get(k) for k in ("path", "source", "fs_uuid", "devnum")},
        }
        if not check_mode:
            staging_check({**state, **fields})
            atomic_write_json(os.path.join(state["staging_path"], MARKER_NAME), marker)
    new = advance(state, step, **fields)
    if not check_mode:
        atomic_write_json(state_file, new)
    return {"changed": True, "state": new}
