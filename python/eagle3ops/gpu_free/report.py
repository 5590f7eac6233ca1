"""The gpu_free role's words (roles/gpu_free/tasks/main.yml, through the ``eagle3ops_gpu_free_report`` action
plugin): one host's GPUs as a line, and the verdict over every host of the play - one host's GPUs held stops
every host, so the sum-up names each host and GPU that is not free.

**Standard library only** (the action plugin runs it on the controller).
"""

from __future__ import annotations


def gpus_line(result: dict) -> str:
    """The module's message and, when it measured them, each GPU's memory."""
    gpus = result.get("gpus")
    if gpus is None:
        return result.get("msg", "")
    each = "; ".join(
        f"GPU {g['index']} used {g['used_mib']} / {g['total_mib']} MiB (reserved {g['reserved_mib']}, "
        f"{g['memory_source']})"
        for g in gpus
    )
    return f"{result.get('msg', '')}: {each}"


def host_verdict(host: str, result: dict | None) -> tuple:
    """(line, free) of one host's check result (None or empty: the host failed or was unreachable before)."""
    r = result or {}
    if not r or r.get("unreachable"):
        return f"{host}: NOT CHECKED (unreachable or failed before the check)", False
    if r.get("skipped"):
        return f"{host}: skipped - {r.get('msg', '')}", True
    if r.get("free"):
        return f"{host}: {r.get('msg')}", True
    held = [g for g in r.get("gpus") or [] if not g.get("free")]
    if held:
        what = ", ".join(f"GPU {g['index']}" for g in held)
        used = ", ".join(str(g["used_mib"]) for g in held)
        pids = ", ".join(f"PID {h['pid']}" for h in r.get("holders") or [])
        status = f"{what} NOT FREE ({used} MiB used)" + (f": held by {pids}" if pids else "")
    else:
        status = "FAILED"
    return f"{host}: {status} - {r.get('msg', 'no message')}", False


def verdict(results: dict) -> dict:
    """``{"lines": [...], "bad": [host, ...]}`` over every host of the play (``results``: host -> its result),
    the last line the verdict."""
    lines, bad = [], []
    for host, result in results.items():
        line, free = host_verdict(host, result)
        lines.append(line)
        if not free:
            bad.append(host)
    if bad:
        lines.append(
            f"not free on {', '.join(bad)}: nothing trains until every host is free (free them, allow-list our own "
            "runs, or take the host out of the inventory), then re-run"
        )
    else:
        lines.append(f"every host: {len(results)} host(s) checked")
    return {"lines": lines, "bad": bad}
