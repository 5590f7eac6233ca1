"""The extract role's report lines (roles/extract/tasks/transformers.yml and sglang.yml, printed by
action_plugins/eagle3ops_report.py): what this host's extraction did, or in check mode what it would do, with
either backend. Standard library only: the controller imports it."""

from __future__ import annotations


def size(n) -> str:
    """Bytes in binary units, as Jinja's ``filesizeformat(true)`` writes them (``1.5 GiB``)."""
    n = float(n or 0)
    if n == 1:
        return "1 Byte"
    if n < 1024:
        return f"{int(n)} Bytes"
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
    for i, unit in enumerate(units):
        if n < 1024 ** (i + 2) or i == len(units) - 1:
            return f"{n / 1024 ** (i + 1):.1f} {unit}"
    raise AssertionError("unreachable")


def _stored(result: dict, data_dir: str) -> str:
    return f"layers {result.get('layer_ids')} + pre-norm last -> {data_dir}/hidden_states"


def dump_line(r: dict, check_mode: bool) -> str:
    """What the adoption of an existing dump (``adopt_from``) took, or would take; "" without one."""
    d = r.get("dump") or {}
    if not d:
        return ""
    bad = [
        (len(d.get(k) or ()), k.replace("_", "-"))
        for k in ("damaged", "wrong_shape", "duplicates", "unmatched")
    ]
    left = ", ".join(f"{n} {what}" for n, what in bad if n)
    return (
        f"{'would adopt' if check_mode else 'adopted'} {d.get('adopted')} of the {d.get('files')} files of "
        f"{d.get('dump')} where they lie"
        + (f" ({left}: listed in the result, their rows extracted)" if left else "")
        + "; "
    )


def transformers_line(
    result: dict, check_mode: bool, data_dir: str, reassign_dirs: list | None = None
) -> str:
    """``result``: the eagle3ops_extract module's return (a run's, or the plan's in check mode); ``reassign_dirs``:
    the lost hosts' parts this host copies finished rows from."""
    r, dirs = result, ", ".join(str(d) for d in reassign_dirs or [])
    damaged = ""
    if int(r.get("damaged") or 0) > 0:
        rows = ", ".join(str(k) for k in r.get("damaged_files") or {})
        damaged = f"damaged: {r['damaged']} (rows {rows}; moved to {data_dir}/hidden_states/damaged and extracted again); "
    if check_mode:
        out = (
            f"check mode: would extract {r.get('to_extract', '?')} of {r.get('total', '?')} rows "
            f"({size(r.get('bytes_needed'))}); {r.get('done_before', '?')} already done"
        )
        if int(r.get("adoptable") or 0) > 0:
            out += f" ({r['adoptable']} of them finished files without a manifest line, which a run records)"
        if int(r.get("importable") or 0) > 0:
            out += f"; would copy {r['importable']} rows the lost hosts finished from their parts ({dirs})"
        return damaged + dump_line(r, True) + out
    adopted = int(r.get("adopted") or 0)
    out = (
        f"extracted {r.get('written')} of {r.get('total')} rows ({r.get('tokens')} tokens, {size(r.get('bytes'))}) "
        f"in {r.get('seconds')} s; {int(r.get('done_before') or 0) - adopted} were already in the manifests"
    )
    if adopted > 0:
        out += f", {adopted} finished files without a manifest line adopted"
    if int(r.get("imported") or 0) > 0:
        out += f", of them {r['imported']} rows the lost hosts finished, copied from their parts ({dirs})"
    return damaged + dump_line(r, False) + f"{out}; {_stored(r, data_dir)}"


def patch_line(restore: dict | None, patch: dict | None) -> str:
    """What became of the capture patch: ``restore`` is the restoring task's return (skipped: the patch was left
    alone), ``patch`` the eagle3ops_sglang_patch fact it set."""
    if not restore or restore.get("skipped"):
        return "capture patch left as it is"
    patch = patch or {}
    return f"capture patch {patch.get('state')} ({patch.get('path')})"


def sglang_line(
    result: dict | None,
    check_mode: bool,
    data_dir: str,
    urls: list | None = None,
    plan: dict | None = None,
    patch_restore: dict | None = None,
    patch: dict | None = None,
) -> str:
    """``result``: the eagle3ops_extract_sglang module's return, or None when no run was needed (``plan``: the
    plan that found every row done); ``urls``: the servers the rows went to."""
    tail = patch_line(patch_restore, patch)
    if result is None or result.get("skipped"):
        p = plan or {}
        return (
            f"nothing to extract: {p.get('done_before')} of {p.get('total')} rows already in the manifests (no "
            f"SGLang server started); {_stored(p, data_dir)}; {tail}"
        )
    r = result
    if check_mode:
        return dump_line(r, True) + (
            f"would send {r.get('to_extract', '?')} of {r.get('total', '?')} rows to SGLang at "
            f"{', '.join(str(u) for u in urls or [])} ({size(r.get('bytes_needed'))}); {tail}"
        )
    return dump_line(r, False) + (
        f"SGLang extracted {r.get('written')} rows ({r.get('tokens')} tokens, {size(r.get('bytes'))}) in "
        f"{r.get('seconds')} s with {r.get('retries')} retries; {r.get('done_before')} of {r.get('total')} were "
        f"already done; {_stored(r, data_dir)}; {tail}"
    )
