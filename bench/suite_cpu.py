"""Where the suite's CPU goes: every Python process it starts, attributed to its test and its command.

`make test` is CPU-bound on the 2-core box (docs/conventions.md "Test time budget"): its wall time is about
(CPU of all its processes) / 2, so cutting it means finding the CPU. This runs pytest with a ``sitecustomize``
on PYTHONPATH that, when each Python process exits, appends one JSON line: its argv, its own user+sys CPU
(children not included), its wall time and the ``PYTEST_CURRENT_TEST`` it inherited. Then it sums by test file
and by command.

    .venv/bin/python bench/suite_cpu.py run OUT.jsonl -- tests -n 4 -m "not qemu"
    .venv/bin/python bench/suite_cpu.py report OUT.jsonl [--top 30]

Not seen by those records: processes inside nspawn guests (another root), processes that end by a signal or
``os._exit`` (the zygote's forks), programs that are not Python (ssh, rsync, mkfs, debootstrap) and the pytest
workers' own in-process work until they exit. So, where it may (root, a cgroup v1 ``cpuacct`` or v2 ``cpu``
hierarchy), it also runs pytest in a cgroup of its own, each xdist worker in a child cgroup, and records each
test's CPU as the growth of its worker's cgroup over the test (setup, call, teardown): that counts every process
the test caused, detached daemons and nspawn guests included (a leftover of the previous test that still runs
is counted with the next one). The report then sums those by file (``by_file_cgroup``) and gives the whole
run's CPU (``cgroup_cpu_s``). Run it on a quiet box, or compare CPU seconds, not wall seconds.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SITECUSTOMIZE = """
import atexit, json, os, sys, time
_t0 = time.time()
def _e3t_acct():
    path = os.environ.get("E3T_ACCT")
    if not path:
        return
    try:
        t = os.times()
        rec = {"argv": sys.argv[:8], "cpu": round(t.user + t.system, 2), "wall": round(time.time() - _t0, 2),
               "pid": os.getpid(), "test": os.environ.get("PYTEST_CURRENT_TEST", "")[:200]}
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\\n")
    except Exception:
        pass
atexit.register(_e3t_acct)
"""

# pytest plugin (PYTEST_PLUGINS, so every xdist worker loads it too): each worker moves itself into a child of
# the run's cgroup and records each test's CPU as that cgroup's growth
CGPLUGIN = """
import json, os, time
import pytest

_cg = {}

def _usage(d):
    if os.path.exists(os.path.join(d, "cpuacct.usage")):
        with open(os.path.join(d, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9
    with open(os.path.join(d, "cpu.stat")) as f:
        return int(dict(x.split() for x in f)["usage_usec"]) / 1e6

def pytest_configure(config):
    root = os.environ.get("E3T_CGROUP")
    if not root:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    d = os.path.join(root, worker) if worker else root
    try:
        if worker:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        _usage(d)
    except OSError:
        return
    _cg["dir"] = d

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    d = _cg.get("dir")
    u0, t0 = (_usage(d), time.time()) if d else (0, 0)
    yield
    if d:
        rec = {"cg_test": item.nodeid, "cpu": round(_usage(d) - u0, 2), "wall": round(time.time() - t0, 2)}
        with open(os.environ["E3T_ACCT"], "a") as f:
            f.write(json.dumps(rec) + "\\n")
"""


def _make_cgroup() -> Path | None:
    """A fresh cgroup for the run (v1 cpuacct or v2), or None where this process may not make one."""
    name = f"e3t-suite-cpu-{os.getpid()}"
    for base, probe in (
        ("/sys/fs/cgroup/cpuacct", "cpuacct.usage"),
        ("/sys/fs/cgroup", "cgroup.controllers"),
    ):
        if (Path(base) / probe).exists():
            try:
                d = Path(base) / name
                d.mkdir()
                if probe == "cgroup.controllers" and not (d / "cpu.stat").exists():
                    d.rmdir()
                    return None
                return d
            except OSError:
                return None
    return None


def _cg_usage(d: Path) -> float:
    if (d / "cpuacct.usage").exists():
        return int((d / "cpuacct.usage").read_text()) / 1e9
    return int(dict(x.split() for x in (d / "cpu.stat").read_text().splitlines())["usage_usec"]) / 1e6


def _remove_cgroup(d: Path) -> None:
    for sub in sorted((p for p in d.iterdir() if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        d.rmdir()  # a leftover process still in it keeps it (then it is listed under /sys/fs/cgroup)


def run(out: Path, pytest_args: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="e3t-acct-") as d:
        (Path(d) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        (Path(d) / "e3t_cgacct.py").write_text(CGPLUGIN)
        cg = _make_cgroup()
        env = {
            **os.environ,
            "E3T_ACCT": str(out.resolve()),
            "PYTHONPATH": os.pathsep.join(p for p in (d, os.environ.get("PYTHONPATH", "")) if p),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if cg is None:
            print(
                "suite_cpu: no cgroup of its own here (not root?): per-process records only", file=sys.stderr
            )
        else:
            env["E3T_CGROUP"] = str(cg)
            env["PYTEST_PLUGINS"] = ",".join(x for x in (os.environ.get("PYTEST_PLUGINS"), "e3t_cgacct") if x)

        def enter() -> None:
            if cg is not None:
                (cg / "cgroup.procs").write_text(str(os.getpid()))

        wall = time.time()
        rc = subprocess.call(
            [sys.executable, "-m", "pytest", *pytest_args], cwd=root, env=env, preexec_fn=enter
        )
        if cg is not None:
            rec = {"cg_total": True, "cpu": round(_cg_usage(cg), 2), "wall": round(time.time() - wall, 2)}
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"suite_cpu: the run's cgroup used {rec['cpu']} s CPU in {rec['wall']} s", file=sys.stderr)
            _remove_cgroup(cg)
        return rc


def _command(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a.endswith("eagle3ops") or a == "eagle3ops":
            return "eagle3ops " + (argv[i + 1] if i + 1 < len(argv) else "")
        if "AnsiballZ_" in a:
            return "module " + Path(a).name.removeprefix("AnsiballZ_").removesuffix(".py")
    head = Path(argv[0]).name if argv else "?"
    return head + (" " + Path(argv[1]).name if len(argv) > 1 and not argv[1].startswith("-") else "")


def report(path: Path, top: int) -> dict:
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rows = [r for r in records if "argv" in r]
    cg_tests = [r for r in records if "cg_test" in r]
    cg_total = [r for r in records if r.get("cg_total")]
    for r in rows:  # an older record had user and sys apart
        r.setdefault("cpu", r.get("user", 0) + r.get("sys", 0))
    by_file: dict = collections.defaultdict(float)
    by_cmd: dict = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        by_file[r["test"].split("::")[0].split(" ")[0] or "(outside a test)"] += r["cpu"]
        c = by_cmd[_command(r["argv"])]
        c[0] += 1
        c[1] += r["cpu"]
    total = sum(r["cpu"] for r in rows)
    res = {
        "processes": len(rows),
        "cpu_s": round(total, 1),
        "by_file": [[k, round(v, 1)] for k, v in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]],
        "by_command": [
            [k, n, round(v, 1)] for k, (n, v) in sorted(by_cmd.items(), key=lambda kv: -kv[1][1])[:top]
        ],
    }
    if cg_tests:
        by_cg: dict = collections.defaultdict(float)
        for r in cg_tests:
            by_cg[r["cg_test"].split("::")[0]] += r["cpu"]
        res["cgroup_tests_cpu_s"] = round(sum(by_cg.values()), 1)
        res["by_file_cgroup"] = [
            [k, round(v, 1)] for k, v in sorted(by_cg.items(), key=lambda kv: -kv[1])[:top]
        ]
    if cg_total:
        res["cgroup_cpu_s"] = cg_total[-1]["cpu"]
        res["cgroup_wall_s"] = cg_total[-1]["wall"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("pytest_args", nargs=argparse.REMAINDER)
    p = sub.add_parser("report")
    p.add_argument("out", type=Path)
    p.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    if a.cmd == "run":
        args = a.pytest_args[1:] if a.pytest_args[:1] == ["--"] else a.pytest_args
        return run(a.out, args)
    if not a.out.exists():
        print(f"{a.out}: no such file (run `suite_cpu.py run {a.out} -- tests ...` first)", file=sys.stderr)
        return 2
    print(json.dumps(report(a.out, a.top), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
