"""eagle3ops.runlock: the one-run-per-directory lock, with real processes and the real kernel flock (no mocks).

The CLI-level proofs (two extracts, prepares, trains; workers dying with their parent) are in
tests/reliability/test_run_lock.py; these are the module's own rules, in seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clock import VirtualClock
from eagle3ops import runlock
from eagle3ops.runlock import LockHeld, RunLock, holder, lock_path
from proc_helpers import alive

HOLD = (
    "import sys, time\nfrom eagle3ops.runlock import RunLock\n"
    "with RunLock(sys.argv[1], what='extract'):\n"
    "    print('held', flush=True)\n    time.sleep(float(sys.argv[2]))\n"
)


def _hold(directory: Path, seconds: float = 60) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "held"
    return p


def _end(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()  # our own child
    p.wait()


def test_a_second_holder_fails_at_once_naming_the_first(tmp_path, monkeypatch):
    d = tmp_path / "data"
    first = _hold(d)
    try:
        # "at once": the refusal comes without a single wait (counted on the lock's own clock, not the wall
        # clock, which a loaded machine stretches)
        clock = VirtualClock()
        monkeypatch.setattr(runlock, "time", clock)
        with pytest.raises(LockHeld) as e:
            RunLock(d, what="prepare").acquire()
        assert clock.sleeps == [], "a live holder must fail the second run at once, without waiting"
        monkeypatch.undo()
        msg = str(e.value)
        assert f"{d} is in use by extract PID {first.pid} on " in msg and " since 20" in msg, msg
        assert "from eagle3ops.runlock import RunLock" in msg  # its command line
        assert f"kill {first.pid}" in msg and "this prepare did nothing" in msg, msg
        assert e.value.holder["pid"] == first.pid and e.value.details["running"] is True
        rec = holder(d)  # check mode's view: no lock taken
        assert rec["pid"] == first.pid and rec["what"] == "extract"
        assert lock_path(d) == tmp_path / ".data.lock"
    finally:
        _end(first)
    assert holder(d) is None  # the flock died with its holder


def test_a_dead_holders_record_is_taken_over_and_reported(tmp_path, capsys):
    d = tmp_path / "data"
    first = _hold(d)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert json.loads(lock_path(d).read_text())["pid"] == first.pid  # a kill -9 leaves its record
    assert holder(d) is None
    with RunLock(d, what="extract") as lock:
        assert lock.stale["pid"] == first.pid
        assert lock.result_fields()["stale_lock"]["pid"] == first.pid
        assert json.loads(lock_path(d).read_text())["pid"] == os.getpid()
    assert f"taking over the stale lock {lock_path(d)} of extract PID {first.pid}" in capsys.readouterr().err
    assert lock_path(d).read_text() == ""  # a clean release leaves no record
    with RunLock(d, what="extract") as lock:
        assert lock.stale is None


def test_wait_takes_the_lock_once_the_holder_ends(tmp_path):
    d = tmp_path / "data"
    first = _hold(d, seconds=1.5)
    try:
        t0 = time.monotonic()
        with RunLock(d, what="prepare", wait=30) as lock:
            assert time.monotonic() - t0 >= 0.5 and lock.stale is None  # a clean end: nothing stale
    finally:
        _end(first)


def test_a_child_works_under_its_parents_lock_and_dies_with_it(tmp_path):
    """The parent (a python process holding the lock) starts a child with ``child_env()``: the child's RunLock
    on the same directory is a no-op; SIGKILL of the parent ends the child (PR_SET_PDEATHSIG)."""
    d = tmp_path / "data"
    parent_code = (
        "import os, subprocess, sys, time\nfrom eagle3ops.runlock import RunLock\n"
        "with RunLock(sys.argv[1], what='extract') as lock:\n"
        "    env = dict(os.environ, **lock.child_env())\n"
        "    child = subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1], str(os.getpid())], env=env)\n"
        "    print(child.pid, flush=True)\n    time.sleep(60)\n"
    )
    child_code = (
        "import sys, time\nfrom eagle3ops.runlock import RunLock, die_with_parent\n"
        "die_with_parent(int(sys.argv[2]))\n"
        "with RunLock(sys.argv[1], what='extract worker') as lock:\n"
        "    assert lock.inherited\n    open(sys.argv[1] + '.child-ok', 'w').close()\n    time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, str(d), child_code], stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while not Path(f"{d}.child-ok").exists():
            assert time.monotonic() < deadline, "the child never got past its RunLock"
            time.sleep(0.05)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 60  # a guard: the kernel signals it at once
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the child outlived its parent"
    finally:
        _end(parent)
        if alive(child):
            os.kill(child, signal.SIGKILL)  # this test's own child, by PID


def test_a_run_whose_directory_was_never_made_leaves_nothing(tmp_path):
    """Issue 32: a first run into a new directory that fails before making it (prepare's bad input) left the new
    parent folder and the lock file behind. Released, the lock removes the file and the folders it made; the lock
    of a directory that exists stays, and so does a lock file this run did not create (a killed run's record:
    test_a_dead_holders_record_is_taken_over_and_reported)."""
    target = tmp_path / "new" / "parent" / "data"
    with RunLock(target, what="prepare") as lock:
        assert lock.made == [lock.path, tmp_path / "new" / "parent", tmp_path / "new"]
    assert sorted(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    made = tmp_path / "kept" / "data"
    with RunLock(made, what="prepare") as lock:
        made.mkdir()  # the run made its directory: its lock stays for the next run (empty)
    assert lock.path.exists() and lock.path.read_text() == "" and made.is_dir()


def _open_fds(path: Path) -> int:
    """How many descriptors of this process have ``path`` open."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return n


def test_a_waiter_on_a_lock_file_removed_under_it_takes_the_new_one(tmp_path):
    """The holder that leaves nothing unlinks its file while holding it; a run that was waiting on that file
    gets its flock afterwards and must not hold a lock nobody else can see: it takes the file at the path."""
    import threading

    target = tmp_path / "new" / "data"
    first = RunLock(target, what="prepare").acquire()
    second = RunLock(target, what="prepare", wait=60)
    waiter = threading.Thread(target=second.acquire)
    waiter.start()
    deadline = time.monotonic() + 60
    while _open_fds(first.path) < 2 and time.monotonic() < deadline:  # the waiter has the same file open
        time.sleep(0.01)
    assert _open_fds(first.path) == 2
    first.release()  # the directory was never made: the file is unlinked while held
    waiter.join(60)
    assert not waiter.is_alive() and second.fd is not None
    try:
        assert second.path.exists() and runlock._same_file(second.fd, second.path)
        with pytest.raises(LockHeld):  # a third run sees the second as the holder
            RunLock(target, what="prepare").acquire()
    finally:
        second.release()
    assert not (tmp_path / "new").exists()
