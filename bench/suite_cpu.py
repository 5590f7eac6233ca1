"""Where the suite's CPU goes: every Python process it starts, attributed to its test and its command.

`make test` is CPU-bound on the 2-core box (docs/conventions.md "Test time budget"): its wall time is about
(CPU of all its processes) / 2, so cutting it means finding the CPU. This runs pytest with a ``sitecustomize``
on PYTHONPATH that, when each Python process exits, appends one JSON line: its argv, its own user+sys CPU
(children not included), its wall time and the ``PYTEST_CURRENT_TEST`` it inherited. Then it sums by test file
and by command.

    .venv/bin/python bench/suite_cpu.py run OUT.jsonl -- tests -n 4 -m "not qemu"
    .venv/bin/python bench/suite_cpu.py report OUT.jsonl [--top 30]

Not seen: processes inside nspawn guests (another root), processes that end by a signal or ``os._exit`` (the
zygote's forks), and the pytest workers' own in-process work until they exit. Run it on a quiet box.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
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


def run(out: Path, pytest_args: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="e3t-acct-") as d:
        (Path(d) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {
            **os.environ,
            "E3T_ACCT": str(out.resolve()),
            "PYTHONPATH": os.pathsep.join(p for p in (d, os.environ.get("PYTHONPATH", "")) if p),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        return subprocess.call([sys.executable, "-m", "pytest", *pytest_args], cwd=root, env=env)


def _command(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a.endswith("eagle3ops") or a == "eagle3ops":
            return "eagle3ops " + (argv[i + 1] if i + 1 < len(argv) else "")
        if "AnsiballZ_" in a:
            return "module " + Path(a).name.removeprefix("AnsiballZ_").removesuffix(".py")
    head = Path(argv[0]).name if argv else "?"
    return head + (" " + Path(argv[1]).name if len(argv) > 1 and not argv[1].startswith("-") else "")


def report(path: Path, top: int) -> dict:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
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
