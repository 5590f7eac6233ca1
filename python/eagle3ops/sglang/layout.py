"""Several capture servers on one host (docs/scale.md, "Several capture servers on one host"): what
``sglang_servers`` (default ``eagle3ops_sglang_servers``) asks for - a count (server i on GPUs i*tp .. i*tp+tp-1)
or a list of GPU groups - checked, and each server's unit, port, GPUs and manifest rank. The sglang role
(roles/sglang/tasks/servers.yml) and the shared role's first check (roles/eagle3ops/tasks/main.yml: the shape
alone, before any phase) run it through the ``eagle3ops_sglang_servers`` action plugin.

**Standard library only** (the action plugin runs it on the controller).
"""

from __future__ import annotations

import json
import re


def _index(value) -> int | None:
    """A GPU index or a count (0 or more, an int or its digits), else None."""
    if isinstance(value, bool) or value is None:
        return None
    text = str(value).strip()
    return int(text) if re.fullmatch(r"[0-9]+", text) else None


def server_layout(servers, tp_size: int | None = None, port: int | None = None, environment=None) -> dict:
    """``{"count": N, "groups": [[gpu, ...], ...], "bad": [problem, ...]}``. ``groups`` is empty for one server
    (it takes the host's GPUs as they are). Without ``tp_size`` only the shape is checked (a count of 1 or more,
    or a non-empty list of lists of GPU indices)."""
    groups: list = []
    bad: list = []
    count = 0
    shown = json.dumps(servers, default=str)
    if isinstance(servers, (bool, type(None))):
        bad.append(f"it is {shown}, not a count or a list of GPU groups")
    elif isinstance(servers, (int, float, str)):
        count = _index(servers) or 0
        if count < 1:
            bad.append(f"it is {shown}, not a count of 1 or more or a list of GPU groups")
        elif count > 1 and tp_size:
            groups = [list(range(i * tp_size, (i + 1) * tp_size)) for i in range(count)]
    elif isinstance(servers, dict) or not servers:
        bad.append(f"it is {shown}, not a count or a non-empty list of GPU groups")
    else:
        count = len(servers)
        for i, group in enumerate(servers):
            gpus = [_index(g) for g in group] if isinstance(group, (list, tuple)) else [None]
            if None in gpus or not gpus:
                bad.append(f"group {i} {json.dumps(group, default=str)} is not a list of GPU indices")
                continue
            if tp_size and len(gpus) != tp_size:
                bad.append(
                    f"group {i} {json.dumps(gpus)} has {len(gpus)} GPUs, but each server is sglang_tp_size "
                    f"{tp_size} (TP ranks)"
                )
            if len(set(gpus)) != len(gpus):
                bad.append(f"group {i} {json.dumps(gpus)} names a GPU twice")
            for j, earlier in enumerate(groups):
                shared = [g for g in earlier if g in gpus]
                if shared:
                    bad.append(f"groups {j} and {i} share GPUs {json.dumps(shared)}")
            groups.append(gpus)
    if groups and environment and "CUDA_VISIBLE_DEVICES" in environment:
        bad.append(
            "sglang_environment sets CUDA_VISIBLE_DEVICES, which would give every server the same GPUs: leave it "
            "out, each server gets its group"
        )
    if port is not None and int(port) + count - 1 > 65535:
        bad.append(f"the ports {port} .. {int(port) + count - 1} go past 65535")
    return {"count": count, "groups": groups, "bad": bad}


def servers_of(layout: dict, unit: str, port: int, manifest_rank: int) -> list:
    """Each server of a checked layout: its unit (``unit`` alone for one server, ``unit-i`` for several), port,
    GPUs (empty: the host's) and manifest rank (this host's first, then one each)."""
    many = layout["count"] != 1
    return [
        {
            "unit": f"{unit}-{i}" if many else unit,
            "port": int(port) + i,
            "gpus": layout["groups"][i] if layout["groups"] else [],
            "manifest_rank": int(manifest_rank) + i,
        }
        for i in range(layout["count"])
    ]


def described(servers: list) -> str:
    """The servers in one line, for the phase's report: each unit, its port, GPUs and manifest rank."""
    return ", ".join(
        f"{s['unit']}.service (port {s['port']}{', GPUs ' + ','.join(map(str, s['gpus'])) if s['gpus'] else ''}, "
        f"manifest-rank{s['manifest_rank']})"
        for s in servers
    )
