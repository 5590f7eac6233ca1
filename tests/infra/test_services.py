"""Phase ``services``: every configured GPU unit is masked and not running.

``services_units`` (names or glob patterns) comes from the host's inventory variables (ansible backend),
else the role default. Explicit names are checked even when no unit file exists (the role masks them so
that a later install cannot start them); patterns are expanded on the host.
"""

from __future__ import annotations

import fnmatch
import re
import shlex

_GLOB = re.compile(r"[*?\[]")


def _normalize(name: str) -> str:
    if _GLOB.search(name) or re.search(r"\.(service|socket|timer|target|path|mount|scope|slice)$", name):
        return name
    return name + ".service"


def _units(host, patterns) -> list[str]:
    names = {p for p in map(_normalize, patterns) if not _GLOB.search(p)}
    globs = [p for p in map(_normalize, patterns) if _GLOB.search(p)]
    if globs:
        q = " ".join(shlex.quote(g) for g in globs)
        out = host.run(
            f"systemctl list-unit-files --no-legend --plain {q}; "
            f"systemctl list-units --all --no-legend --plain {q}"
        ).stdout
        for line in out.splitlines():
            parts = [p for p in line.split() if p not in ("●", "*")]
            if parts and any(fnmatch.fnmatchcase(parts[0], g) for g in globs):
                names.add(parts[0])
    return sorted(n for n in names if not n.endswith("@.service"))


def test_gpu_units_are_masked(host, phase_var):
    units = _units(host, phase_var("services", "services_units"))
    assert units, "services_units names no unit"
    states = {u: host.run(f"systemctl is-enabled {shlex.quote(u)}").stdout.strip() for u in units}
    not_masked = {u: s for u, s in states.items() if s != "masked"}
    assert not not_masked, (
        f"GPU units not masked (systemctl is-enabled): {not_masked}; run the services phase"
    )


def test_gpu_units_are_not_running(host, phase_var):
    units = _units(host, phase_var("services", "services_units"))
    states = {u: host.run(f"systemctl is-active {shlex.quote(u)}").stdout.strip() for u in units}
    running = {u: s for u, s in states.items() if s in ("active", "activating", "reloading", "deactivating")}
    assert not running, f"GPU units running (systemctl is-active): {running}; run the services phase"
