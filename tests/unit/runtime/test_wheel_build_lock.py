"""The runtime role builds the eagle3ops wheel inside the source tree (setuptools' build/ and egg-info), so its
build task runs pip under ``runtime_locked_call`` (roles/runtime/vars/main.yml): an exclusive lock on the tree's
pyproject.toml held while the command runs. Here the role's own snippet runs for real, as the task runs it
(``python -c SNIPPET LOCKFILE CMD...``): the lock is held while the command runs, released after, and the
command's exit status is the task's."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
SNIPPET = yaml.safe_load((REPO / "roles/runtime/vars/main.yml").read_text())["runtime_locked_call"]


def _locked(path: Path) -> bool:
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    # a hang bound, not a speed limit: the child only has to start python and touch a file
    for _ in range(6000):
        if path.exists() or proc.poll() is not None:
            return
        time.sleep(0.01)
    pytest.fail(f"{path} never appeared")


def test_the_command_runs_under_the_lock_and_the_lock_is_released_after(tmp_path):
    lockfile = tmp_path / "pyproject.toml"
    lockfile.write_text("[project]\n")
    started, release = tmp_path / "started", tmp_path / "release"
    body = (
        "import pathlib, time, sys; pathlib.Path(sys.argv[1]).touch()\n"
        "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.01)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", SNIPPET, str(lockfile), sys.executable, "-c", body, str(started), str(release)]
    )
    try:
        _wait_for(started, proc)
        assert proc.poll() is None, "the locked command ended before it was released"
        assert _locked(lockfile), "the command ran without the lock held"
    finally:
        release.touch()
        assert proc.wait(timeout=60) == 0
    assert not _locked(lockfile)


def test_a_second_build_waits_for_the_first_and_the_exit_status_is_kept(tmp_path):
    lockfile = tmp_path / "pyproject.toml"
    lockfile.write_text("[project]\n")
    with open(lockfile, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            [sys.executable, "-c", SNIPPET, str(lockfile), sys.executable, "-c", "import sys; sys.exit(3)"]
        )
        # while we hold the lock the snippet cannot have run its command: it is still waiting
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    assert proc.wait(timeout=60) == 3
