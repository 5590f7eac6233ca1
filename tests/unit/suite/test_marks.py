"""The suite's split (Makefile: `make test` leaves out the tests marked `slow` or `nspawn`, `make test-slow` runs
them, CI runs both): a test file that boots a systemd-nspawn host carries the mark, so it cannot slip into `make
test`'s time budget unnoticed, nor out of both steps."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
BOOTS = re.compile(r"\b(make_host|nspawn_host|NspawnHost)\b")
MARKED = re.compile(r"pytest\.mark\.nspawn|SGLANG_NSPAWN_MARKS")


def test_every_file_that_boots_a_host_is_marked_nspawn():
    files = [p for p in TESTS.rglob("test_*.py") if BOOTS.search(p.read_text())]
    assert len(files) >= 10, files  # the reading finds the host tests
    unmarked = [str(p.relative_to(TESTS)) for p in files if not MARKED.search(p.read_text())]
    assert unmarked == [], f"boot a host without the nspawn mark (they would run in make test): {unmarked}"


def test_make_test_and_make_test_slow_split_on_the_marks():
    makefile = (TESTS.parent / "Makefile").read_text()
    assert re.search(r"^TEST_MARKS \?= not qemu and not slow and not nspawn$", makefile, re.M), "make test"
    assert re.search(r"^SLOW_MARKS \?= \(slow or nspawn\) and not qemu$", makefile, re.M), "make test-slow"
    ci = (TESTS.parent / ".ci" / "run").read_text()
    assert "make test\n" in ci and "make test-slow\n" in ci, ci
