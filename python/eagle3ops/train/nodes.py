"""What the train role works out over every training node (roles/train/tasks/nodes.yml, main.yml, data.yml,
through the ``eagle3ops_train_nodes`` action plugin): the node holding the newest checkpoint, the sum-up of the job
over the nodes, and the words of the gather's reports (the stores kept out; what was, or would be, copied from
each store).

**Standard library only** (the action plugin runs it on the controller).
"""

from __future__ import annotations

import re


def newest_checkpoint(resume_from: dict) -> str:
    """The node whose checkpoint is the newest, by epoch then global step (``resume_from``: node -> its
    ``train-status`` resume point, or None); '' when no node has one. The first node wins a tie."""
    best, key = "", -1
    for host, r in resume_from.items():
        if r:
            k = (int(r["epoch"]), int(r.get("global_step") or 0))
            if best == "" or k > key:
                best, key = host, k
    return best


def node_line(host: str, node: dict, result: dict, check_mode: bool) -> str:
    """One node's line: what it ran before (``train_node``) and what it runs now (the train module's result)."""
    gone = "FAILED or unreachable"
    now = result.get("would", result.get("status", gone)) if check_mode else result.get("status", gone)
    return (
        f"{host}: was {node.get('status', '?')} (job {node.get('job') or '-'}), now {now} "
        f"(job {result.get('job') or '-'}, PID {result.get('pid') or '-'})"
    )


def job_line(job: str, nodes: int, *, restart: bool, start_over: bool, resume, source: str, check_mode: bool):
    """The job's line: kept, or started on every node - over, from a checkpoint (and whose), or from the start."""
    head = f"job {job or '-'} on {nodes} nodes: "
    if not restart:
        return head + "every node runs it (or finished it), nothing to do"
    how = "would start" if check_mode else "started"
    if start_over:
        why = " over, its configuration changed"
    elif resume:
        why = f", resuming from epoch {resume['epoch']} (the checkpoint of {source}, copied to the others)"
    else:
        why = ", from the start (no checkpoint yet)"
    return f"{head}{how} on every node{why}"


def kept_out_line(sources: list, stores: dict) -> str:
    """The stores kept out of the gather (``stores``: host -> its data directory), their rows re-assigned to
    ``sources``."""
    kept = ", ".join(f"{h} ({d}/hidden_states, left as it is)" for h, d in stores.items())
    return f"kept out of the gather (rows re-assigned to {', '.join(sources)}, extract_reassign_from): {kept}"


_TOTAL = re.compile(r"Total transferred file size: ([0-9,]+)")
_RATE = re.compile(r"([0-9,.]+) bytes/sec")


def sync_figures(rsync_msg: str) -> tuple:
    """(bytes, bytes per second) of one rsync --stats run's message (0 for what it does not say)."""
    total = _TOTAL.findall(rsync_msg or "")
    rate = _RATE.findall(rsync_msg or "")
    return int(total[0].replace(",", "")) if total else 0, float(rate[0].replace(",", "")) if rate else 0.0


def _size(n: float) -> str:
    """Bytes in binary units, as Jinja's filesizeformat(true) writes them (``1 Byte``, ``512 Bytes``, ``1.5 MiB``)."""
    if n == 1:
        return "1 Byte"
    if n < 1024:
        return f"{int(n)} Bytes"
    for i, prefix in enumerate(("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")):
        unit = 1024 ** (i + 2)
        if n < unit or prefix == "YiB":
            return f"{1024 * n / unit:.1f} {prefix}"
    return ""  # not reached


def sync_report(names: list, messages: list, data_dir: str, *, check_mode: bool, rate_mbps: float) -> str:
    """What gathering the rows copied (or would copy) into ``data_dir``, per source (``names``, each with its
    rsync run's ``messages``), and in check mode how long it would take at ``rate_mbps``."""
    figures = [sync_figures(m) for m in messages]
    total = sum(b for b, _ in figures)
    each = []
    for name, (nbytes, rate) in zip(names, figures, strict=True):
        at = f" at {round(rate * 8 / 1e6, 1)} Mbit/s" if not check_mode and nbytes > 0 else ""
        each.append(f"{name} {_size(nbytes)}{at}")
    line = f"{'would copy' if check_mode else 'copied'} {_size(total)} ({total} bytes) into {data_dir}: "
    line += ", ".join(each)
    if check_mode:
        line += f"; about {total * 8 / (rate_mbps * 1e6):.3g} s at {rate_mbps:g} Mbit/s (train_data_sync_rate_mbps)"
    return line + "; this host's own rows are hard links, not copies"
