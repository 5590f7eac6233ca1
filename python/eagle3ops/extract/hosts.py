"""Several hosts share the rows (docs/scale.md): the global ranks are the workers of every host of
``extract_shard_hosts``, in that order, and each host's workers take its run of them. What the extract role
works out from every host's worker count before any host extracts (roles/extract/tasks/shard.yml, through the
``eagle3ops_extract_hosts`` action plugin): the world, a host's first rank, the lost hosts' ranks, a store that
keeps another re-assignment, and the sum-up of every host's result after the run.

**Standard library only** (the action plugin runs it on the controller).
"""

from __future__ import annotations

import re


def worker_count(value) -> int | None:
    """A host's worker count (its probe's answer, or an integer ``extract_workers``), None when not known."""
    text = "" if value is None or isinstance(value, bool) else str(value).strip()
    return int(text) if re.fullmatch(r"[0-9]+", text) else None


def share(hosts: list, counts: list, host: str) -> dict:
    """``{"world_size", "first_rank"}`` of ``host`` among ``hosts`` whose workers are ``counts`` (all known)."""
    return {"world_size": sum(counts), "first_rank": sum(counts[: hosts.index(host)])}


def lost_ranks(hosts: list, counts: list, lost_hosts) -> list:
    """The global ranks of the lost hosts (their rows go to the others' ranks: ``extract.shards.Reassignment``)."""
    out, first = [], 0
    for host, n in zip(hosts, counts, strict=True):
        if host in lost_hosts:
            out += range(first, first + n)
        first += n
    return out


def reassign_conflicts(records: dict, ranks) -> list:
    """The hosts whose store took over other lost ranks' rows than ``ranks`` (``records``: host -> its
    ``hidden_states/shard.json``, None where there is none yet)."""
    out = []
    for host, rec in records.items():
        had = ((rec or {}).get("reassigned") or {}).get("lost_ranks") or []
        if had and had != sorted(ranks or []):
            at = rec["reassigned"].get("at", "?")
            out.append(f"the store of {host} took over the rows of lost rank(s) {had} (re-assigned at {at})")
    return out


def host_summary(host: str, result: dict, plan: dict, world_size, data_dir: str, check_mode: bool) -> tuple:
    """(rows, rows done, the host's line) of one host's extraction result (its module result, or the async
    wait's when that failed) and plan."""
    rows = int(plan.get("total", result.get("total", 0)) or 0)
    unfinished = result.get("ansible_job_id") is not None and not result.get("finished")
    if result.get("failed") or result.get("unreachable") or (not result and not plan) or unfinished:
        done = int(plan.get("done_before", 0) or 0)
        how = f"FAILED or unreachable ({_cut(result.get('msg', 'no result'), 160)})"
    elif "written" in result and not check_mode:
        done = int(result["done_before"]) + int(result["written"])
        how = f"extracted {result['written']}"
    elif "to_extract" in result:
        done = rows - int(result["to_extract"]) - int(result.get("importable", 0) or 0)
        how = f"would extract {result['to_extract']}"
    else:
        done = int(plan.get("done_before", 0) or 0)
        how = "nothing to do"
    took = int((plan.get("importable") if check_mode else result.get("imported")) or 0)
    copied = (
        f"; {'would copy' if check_mode else 'copied'} {took} finished rows of the lost hosts from their parts"
        if took
        else ""
    )
    ranks = plan.get("ranks", result.get("ranks", "?"))
    line = (
        f"{host}: ranks {ranks} of {world_size}, {done}/{rows} rows done, {rows - done} missing; {how}{copied}"
        f" -> {data_dir}"
    )
    return rows, done, line


def run_summary(hosts: list, per_host: dict, lost_hosts, lost: list, reachable, check_mode: bool) -> list:
    """The lines that sum up an extraction over every host that shares the rows (``per_host``: host ->
    ``{"result", "waited", "plan", "world_size", "data_dir"}``: the module's result, the async wait's (taken when
    it failed); ``lost``: the re-assigned ranks)."""
    survivors = ", ".join(h for h in hosts if h not in lost_hosts)
    lines, total, done, open_hosts = [], 0, 0, []
    for host in hosts:
        h = per_host.get(host) or {}
        if host in lost_hosts:
            lines.append(
                f"{host}: share RE-ASSIGNED to {survivors} (extract_reassign_from); its old part "
                f"{h.get('data_dir')}/hidden_states is kept out of the gather, as it is (not deleted)"
                + ("" if host in reachable else "; unreachable now")
            )
            continue
        waited = h.get("waited") or {}
        result = waited if waited.get("failed") else (h.get("result") or {})
        world = h.get("world_size", "?")
        rows, d, line = host_summary(host, result, h.get("plan") or {}, world, h.get("data_dir"), check_mode)
        total, done = total + rows, done + d
        if d < rows:
            open_hosts.append(host)
        lines.append(line)
    last = f"all hosts: {done}/{total} rows done"
    if open_hosts:
        last += f", missing on {', '.join(open_hosts)}: re-run this phase, each host resumes its own rows"
    if lost_hosts:
        last += f" (with the rows of {', '.join(lost_hosts)}, ranks {lost}, dealt over the other hosts)"
    return [*lines, last]


def _cut(text, width: int) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 3] + "..."
