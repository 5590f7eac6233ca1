"""The suite's own guard against a hung test (tests/conftest.py, pyproject.toml ``timeout``): CI of 2026-12-03 ran
901 of 903 tests, then nothing until its 90 min were up, and said not which test it was.

Real: a child pytest with this repository's configuration and conftest, one xdist worker, a test stuck where
pytest-timeout's SIGALRM cannot reach it (the signal blocked), beside a second test of the same group; a third test
leaves a SIGTERM handler set."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

PROBE = """
import signal, time, pytest

@pytest.fixture(scope="module")
def shared():  # one group: both tests go to one worker, in this order
    return 1

@pytest.mark.timeout(1)
def test_stuck(shared):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(100000)

def test_after(shared):
    assert shared == 1

def test_leaves_a_sigterm_handler():
    signal.signal(signal.SIGTERM, lambda *a: None)
"""


def test_a_test_stuck_past_its_limit_is_named_and_the_rest_of_its_group_runs():
    """...the worker that replaces the crashed one runs the two groups left (given one group of one test, it
    waited for ever for a second: a worker holds its last test until it has a next one or is told to stop), and a
    test that leaves a signal handler set fails in its teardown, named (every process the worker forks later
    inherits the handler)."""
    # under tests/: the suite's conftest applies
    probe = REPO / "tests" / "unit" / f".hang-probe-{os.getpid()}"
    probe.mkdir()
    try:
        (probe / "test_probe.py").write_text(PROBE)
        env = {**os.environ, "E3T_HARD_STOP_GRACE": "1"}
        # the stuck test sleeps 100000 s: a run that ends at all was cut short. 600 s is only a guard, far above
        # what the child run costs even on a loaded machine (two pytest workers starting, ~10 s quiet)
        try:
            r = subprocess.run(
                [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", str(probe)],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            pytest.fail(
                f"the stuck test was not cut short: the run still went on after 600 s: {e.stdout!r:.3000}"
            )
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "crashed while running" in out and "test_probe.py::test_stuck" in out, out[-3000:]
    # test_after ran on the new worker; test_stuck not again
    assert "1 failed, 2 passed, 1 error" in out, out[-3000:]
    assert "ERROR tests/unit/.hang-probe" in out and "::test_leaves_a_sigterm_handler" in out, out[-3000:]
    assert "this test left changed: SIGTERM (restored now)" in out, out[-3000:]
