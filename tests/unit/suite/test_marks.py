"""The suite's split (Makefile: `make test` leaves out the tests marked `nspawn`, `make test-hosts` runs them, CI
runs both): a test file that boots a systemd-nspawn host carries the mark, so it cannot slip into `make test`'s
time budget unnoticed, nor out of both steps."""

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


def test_make_test_and_make_test_hosts_split_on_the_mark():
    makefile = (TESTS.parent / "Makefile").read_text()
    assert re.search(r"^TEST_MARKS \?= not qemu and not nspawn$", makefile, re.M), (
        "make test leaves nspawn out"
    )
    assert re.search(r"^HOST_MARKS \?= nspawn and not qemu$", makefile, re.M), "make test-hosts runs them"
    ci = (TESTS.parent / ".ci" / "run").read_text()
    assert "make test\n" in ci and "make test-hosts\n" in ci, ci
