"""One run per directory: an exclusive lock on a data directory or a training run directory.

Usage (the whole API)::

    from eagle3ops.runlock import LockHeld, RunLock, holder

    with RunLock(data_dir, what="extract") as lock:   # raises LockHeld at once if another run holds it
        ...                                            # lock.stale: the dead holder taken over, or None
        lock.result_fields()                           # {"lock": ..., "stale_lock": ...} for a --json result

    holder(data_dir)        # the live holder's record (a dict) or None; takes nothing (check mode)
    wait_free(data_dir, 3600)   # wait until no run holds it (the flock, not the PID); the holder left, or None

Mechanism: ``fcntl.flock(LOCK_EX)`` on the lock file ``PARENT/.NAME.lock`` beside the directory (the
directory itself may not exist yet, and ``prepare`` replaces the whole data directory by a rename, which
would take a lock file inside it along); where the parent is not writable, ``DIR/.eagle3ops.lock``. The
file holds the holder's record as JSON: ``pid``, ``cmdline``, ``host``, ``started_at`` (ISO 8601),
``what``, ``directory``. A kernel flock dies with its holder (kill -9 included), so a lock whose flock is
free is never in force: a record left in such a file is a stale holder, taken over with a line on stderr
and reported as ``stale_lock``. A clean release empties the file; a run that created the lock file and whose
directory does not exist at its end (a first ``prepare`` into a new directory that failed) leaves nothing: it
unlinks the lock file while still holding it and removes the folders it made for it (a run that got the flock on an unlinked file takes the one
at the path instead).

``LockHeld`` (a ``CommandError``: exit code 2 from the CLI) names the holder: PID, command line, host and
since when, and says what to do. Child processes of a holder (``extract --workers N``) get
:func:`child_env`; a ``RunLock`` on the same directory in such a child is then a no-op (the parent's lock
covers it), and :func:`die_with_parent` makes the child end when that parent does.

flock is local to one host (on NFS it is emulated or absent): the lock keeps two runs on one machine apart,
which is what the playbook started twice or an interrupted playbook re-run does.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from eagle3ops.command import CommandError

_ENV = "EAGLE3OPS_RUNLOCK_HELD"  # "<lock path>\t<pid of the holder>" in a holder's children
_INNER = ".eagle3ops.lock"


class LockHeld(CommandError):
    """Another live run holds the directory. ``holder``: its record (pid, cmdline, host, started_at, what)."""

    def __init__(self, directory: str | os.PathLike, path: Path, holder: dict | None, what: str):
        self.directory, self.path, self.holder = str(directory), path, holder or {}
        h = self.holder
        if h.get("pid"):
            who = (
                f"{h.get('what', 'another eagle3ops run')} PID {h['pid']} on {h.get('host', '?')} since "
                f"{h.get('started_at', '?')} ({h.get('cmdline', '?')})"
            )
            todo = (
                f"wait for it to finish, or stop it (kill {h['pid']}) and re-run; "
                "finished work is kept and the next run resumes"
            )
        else:
            who = "another process (it has not written its record yet)"
            todo = "retry in a moment"
        super().__init__(
            f"{self.directory} is in use by {who}: only one run per directory (lock {path}); "
            f"this {what} did nothing. {todo}.",
            running=True,
            holder=self.holder,
            lock=str(path),
        )


def lock_path(directory: str | os.PathLike) -> Path:
    """Where the lock of ``directory`` lives (see the module docstring)."""
    d = Path(os.path.abspath(directory))
    parent = Path(os.path.realpath(d.parent))  # one lock whatever symlinked spelling of the parent is used
    beside = parent / f".{d.name}.lock"
    if beside.exists() or (parent.is_dir() and os.access(parent, os.W_OK)) or not parent.exists():
        return beside
    return d / _INNER


def _now_iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def pid_alive(pid) -> bool:
    """True while process ``pid`` runs (a zombie, exited but not reaped, counts as gone)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")
    except OSError:
        return True


def _read_record(fd: int) -> dict | None:
    try:
        raw = os.pread(fd, 65536, 0)
    except OSError:
        return None
    if not raw.strip():
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return {"unreadable": raw[:200].decode(errors="replace")}
    return rec if isinstance(rec, dict) else None


def _own_record(directory: Path, what: str) -> dict:
    try:
        argv = [a.decode(errors="replace") for a in Path("/proc/self/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        argv = [sys.executable, *sys.argv]
    now = time.time()
    return {
        "pid": os.getpid(),
        "cmdline": " ".join(argv),
        "host": socket.gethostname(),
        "started_at": _now_iso(now),
        "started": round(now, 3),
        "what": what,
        "directory": str(directory),
    }


def _open(path: Path) -> tuple[int, list[Path]]:
    """The lock file opened (created if needed) and what was made for it: the directories, deepest first, then
    the file itself when it was not there."""
    made = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        made.insert(0, path)
    except FileExistsError:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    return fd, made


def _same_file(fd: int, path: Path) -> bool:
    """``path`` is still the file ``fd`` has open (a holder that leaves nothing unlinks it: see release)."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class RunLock:
    """An exclusive, non-blocking lock on ``directory`` for the whole run (see the module docstring).

    ``wait``: seconds to keep retrying while a live holder has it (0: fail at once with :class:`LockHeld`)."""

    def __init__(self, directory: str | os.PathLike, what: str, *, wait: float = 0.0):
        self.directory = Path(os.path.abspath(directory))
        self.what = what
        self.wait = wait
        self.path = lock_path(self.directory)
        self.fd: int | None = None
        self.record: dict | None = None
        self.stale: dict | None = None
        self.inherited = False
        self.made: list[Path] = []  # the file, when this run created it, and the directories made for it

    # -- acquire / release --
    def acquire(self) -> RunLock:
        if self._inherited():
            self.inherited = True
            return self
        fd, self.made = _open(self.path)
        deadline = time.monotonic() + max(self.wait, 1.0)
        said = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if _same_file(fd, self.path):
                        break
                    # the holder before us left nothing (it unlinked the file while holding it): a lock on
                    # that file keeps no one out; take the one at the path now
                    os.close(fd)
                    fd, made = _open(self.path)
                    self.made = list(dict.fromkeys([*made, *(d for d in self.made if d != self.path)]))
                    continue
                except BlockingIOError:
                    rec = _read_record(fd)
                    live = rec is not None and pid_alive(rec.get("pid"))
                    # no record yet (its holder is between flock and the write, or a check-mode probe): retry
                    # for up to a second; a live holder: fail at once unless asked to wait
                    if time.monotonic() >= deadline or (live and self.wait <= 0):
                        raise LockHeld(self.directory, self.path, rec, self.what) from None
                    if live and not said:
                        said = True
                        print(
                            f"eagle3ops {self.what}: waiting up to {self.wait:.0f} s for "
                            f"{rec.get('what', '?')} PID {rec.get('pid')} ({rec.get('cmdline', '?')}), which "
                            f"holds {self.directory}",
                            file=sys.stderr,
                            flush=True,
                        )
                    time.sleep(0.5 if live else 0.05)
            old = _read_record(fd)
            if old is not None:
                self.stale = old
                print(
                    f"eagle3ops {self.what}: taking over the stale lock {self.path} of "
                    f"{old.get('what', '?')} PID {old.get('pid', '?')} (since {old.get('started_at', '?')}: "
                    f"{old.get('cmdline', '?')}); that process is gone",
                    file=sys.stderr,
                    flush=True,
                )
            self.record = _own_record(self.directory, self.what)
            self._write(fd, self.record)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    @staticmethod
    def _write(fd: int, rec: dict) -> None:
        data = (json.dumps(rec, sort_keys=True) + "\n").encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError as e:
            # a full or read-only disk: the flock still keeps other runs out; they just cannot name us
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
                raise

    def _inherited(self) -> bool:
        spec = os.environ.get(_ENV, "")
        path, _, pid = spec.partition("\t")
        return bool(path) and path == str(self.path) and pid.isdigit() and int(pid) == os.getppid()

    def release(self) -> None:
        """Empty the record and unlock. When the directory does not exist (a first run that failed before
        making it), leave nothing: the lock file is unlinked while still held (a run waiting on it sees the
        file is gone and takes the new one, :func:`_same_file`) and the directories made for it are removed
        when empty."""
        if self.fd is None:
            return
        if self.path in self.made and not self.directory.exists() and self.path.parent != self.directory:
            with contextlib.suppress(OSError):
                if _same_file(self.fd, self.path):
                    self.path.unlink()
            dirs = sorted((d for d in self.made if d != self.path), key=lambda d: -len(d.parts))
            for d in dirs:  # deepest first
                with contextlib.suppress(OSError):
                    d.rmdir()  # only when empty: another run's file, or anything else, keeps it
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)  # a clean end leaves no record: the next run takes over nothing
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # -- helpers for the holder --
    def child_env(self) -> dict:
        """Environment entries for a child process that works under this lock (see :func:`die_with_parent`)."""
        if self.inherited:
            return {_ENV: os.environ[_ENV]}
        return {_ENV: f"{self.path}\t{os.getpid()}"}

    def result_fields(self) -> dict:
        """``lock`` (its path) and ``stale_lock`` (the dead holder taken over, or None) for a JSON result."""
        return {"lock": str(self.path), "stale_lock": self.stale}


def holder(directory: str | os.PathLike) -> dict | None:
    """The record of the live run that holds ``directory``, or None; takes no lock (check mode, ``--check``)."""
    path = lock_path(directory)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            rec = _read_record(fd) or {}
            return {**rec, "lock": str(path)}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def wait_free(directory: str | os.PathLike, timeout: float, poll: float = 1.0) -> dict | None:
    """Wait (up to ``timeout`` seconds) until no live run holds ``directory``; takes nothing. Returns the holder
    still there at the timeout, or None. Waits on the flock, not on the PID: a holder that has exited but not
    been reaped yet (a zombie) no longer holds it."""
    deadline = time.monotonic() + timeout
    while True:
        h = holder(directory)
        if h is None or time.monotonic() >= deadline:
            return h
        time.sleep(poll)


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent ends (Linux ``PR_SET_PDEATHSIG``), and
    exit at once if that parent (``parent_pid``) is already gone. Elsewhere only the check is made."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the prctl: it can no longer signal us
        os._exit(128 + int(sig))
