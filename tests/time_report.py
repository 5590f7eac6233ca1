"""Per-file test time from a pytest JUnit XML: ``python tests/time_report.py RUN.xml [BEFORE.xml]``.

Prints one row per test file (tests, failures, summed setup+call+teardown seconds; with BEFORE.xml also the
earlier sum and the ratio), heaviest first, and the totals. The sum of test times is what the workers share;
the wall time of ``make test`` is the number the budget (docs/conventions.md, "Test time budget") is about.
Run the suite with ``make test PYTEST_ARGS="--junitxml=/tmp/run.xml"`` to get the XML.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def per_file(path: str) -> dict[str, list]:
    """{file: [tests, failed, seconds]} from a JUnit XML written by pytest."""
    out: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "")
        # classname is the dotted module path (plus a class name for methods): tests.unit.test_x[.Class]
        parts = cls.split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        name = "/".join(parts) + ".py" if parts else cls
        row = out[name]
        row[0] += 1
        row[1] += int(case.find("failure") is not None or case.find("error") is not None)
        row[2] += float(case.get("time", 0) or 0)
    return dict(out)


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    now = per_file(argv[0])
    before = per_file(argv[1]) if len(argv) == 2 else {}
    head = f"{'file':<52} {'tests':>5} {'fail':>4} {'seconds':>8}"
    print(head + (f" {'before':>8} {'ratio':>6}" if before else ""))
    for name, (n, f, s) in sorted(now.items(), key=lambda kv: -kv[1][2]):
        line = f"{name:<52} {n:>5} {f:>4} {s:>8.1f}"
        if before:
            b = before.get(name, [0, 0, 0.0])[2]
            line += f" {b:>8.1f} {(s / b if b else float('nan')):>6.2f}"
        print(line)
    tn, tf, ts = (sum(r[i] for r in now.values()) for i in range(3))
    line = f"{'TOTAL':<52} {tn:>5} {tf:>4} {ts:>8.1f}"
    if before:
        line += f" {sum(r[2] for r in before.values()):>8.1f}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
