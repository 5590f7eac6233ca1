"""A server as a detached process, for hosts where PID 1 is not systemd (containers, the lent GPU box).

One server = one *name* in a run directory: ``NAME.json`` (the spec it was started with: argv, environment,
health URL; plus its PID and the process's start time), ``NAME.pid`` and ``NAME.log`` (stdout + stderr).

- :func:`start` is idempotent: a live process started from the same spec is left alone (``changed`` false,
  only its health is checked); a different spec, or a dead process, is (re)started. The process runs in its
  own session (``setsid``: it outlives the command that started it and is stopped as a group), stdin from
  /dev/null, output appended to the log.
- :func:`wait_healthy` polls ``GET /health`` until 200; a process that exits, or no health within the timeout,
  fails with the last lines of the log.
- :func:`stop`: SIGTERM to the process group, SIGKILL after a grace period.

A PID is only trusted when ``/proc/PID`` still shows the recorded start time and command line and is not a
zombie (containers without an init process leave unreaped zombies behind), so a reused PID is never stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
from pathlib import Path

from eagle3ops.durable import atomic_write_json, atomic_write_text

SPEC_VERSION = 1


class ServeProcessError(Exception):
    pass


def _paths(run_dir: str | os.PathLike, name: str) -> dict[str, Path]:
    d = Path(run_dir)
    return {"state": d / f"{name}.json", "pid": d / f"{name}.pid", "log": d / f"{name}.log"}


def make_spec(
    argv: list[str],
    env: dict[str, str] | None,
    url: str | None,
    cwd: str | None = None,
    stamp: str | None = None,
) -> dict:
    """What identifies a server: its argv, environment, health URL, working directory and a free-form stamp (the
    serve role passes the draft's conversion stamp, so a new draft in the same directory restarts the server)."""
    if not argv:
        raise ServeProcessError("no server command given (--argv-json, or a spec with argv)")
    return {
        "version": SPEC_VERSION,
        "argv": [str(a) for a in argv],
        "env": {str(k): str(v) for k, v in sorted((env or {}).items())},
        "url": url,
        "cwd": cwd,
        "stamp": stamp,
    }


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot); None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2 :].split()  # the comm field may hold spaces and parentheses
    if rest[0] in ("Z", "X"):
        return None
    return rest[19]


def _proc_cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def read_state(run_dir, name) -> dict | None:
    try:
        return json.loads(_paths(run_dir, name)["state"].read_text())
    except (OSError, ValueError):
        return None


def running_pid(state: dict | None) -> int | None:
    """The recorded PID if that very process still runs (same start time, same command line)."""
    if not state or not state.get("pid"):
        return None
    pid = int(state["pid"])
    if _proc_start_time(pid) != state.get("start_time"):
        return None
    cmd = _proc_cmdline(pid)
    if cmd is not None and cmd != state["spec"]["argv"]:
        return None
    return pid


def status(run_dir, name) -> dict:
    st = read_state(run_dir, name)
    pid = running_pid(st)
    p = _paths(run_dir, name)
    return {
        "name": name,
        "running": pid is not None,
        "pid": pid,
        "spec": (st or {}).get("spec"),
        "log": str(p["log"]),
        "pid_file": str(p["pid"]),
        "state_file": str(p["state"]),
    }


START_MARK = "===== eagle3ops serve-process: starting"


def log_tail(path: str | os.PathLike, lines: int = 25) -> str:
    """The last lines the latest start wrote (not the previous runs' lines in the same log)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    if START_MARK in data:
        data = data[data.rindex(START_MARK) :].split("\n", 1)[-1]
    return "\n".join(data.splitlines()[-lines:]) or "(the log is empty)"


def health_ok(url: str, timeout: float = 5.0) -> bool:
    """One ``GET url/health`` (the SGLang client's own call): 200 or not; a URL that cannot be called is not."""
    from eagle3ops.sglang.server import http_call

    try:
        return http_call(url.rstrip("/") + "/health", None, timeout=timeout)[0] == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(
    run_dir, name, url: str, timeout: float, *, interval: float = 2.0, pid: int | None = None
) -> float:
    """Seconds until ``GET url/health`` answered 200 (:func:`eagle3ops.sglang.server.poll_health`); fail (with
    the log's tail) if the process exits first or no health within ``timeout``."""
    from eagle3ops.sglang.server import HealthWaitEnded, poll_health

    log = _paths(run_dir, name)["log"]
    st = read_state(run_dir, name)

    def exited() -> str | None:
        return "exited" if running_pid(st) is None else None

    try:
        waited = poll_health(url, timeout, poll=interval, gone=exited if pid is not None else None, gone_every=0,
                             request_timeout=5.0)  # fmt: skip
    except HealthWaitEnded as e:
        if e.ended == "gone":
            raise ServeProcessError(
                f"server {name!r} (PID {pid}) exited before {url}/health answered; last lines of {log}:\n"
                f"{log_tail(log)}\nFix what the log says (model path, flags, GPU memory), then run again."
            ) from None
        if e.why:
            raise ServeProcessError(f"server {name!r} (PID {pid}): {e.why}") from None
        raise ServeProcessError(
            f"server {name!r} (PID {pid}) gave no 200 on {url}/health within {timeout:g} s; last lines of "
            f"{log}:\n{log_tail(log)}\nA large model may need a longer health timeout "
            "(serve_health_timeout); otherwise fix what the log says."
        ) from None
    return round(waited, 2)


def stop(run_dir, name, *, grace: float = 60.0, check: bool = False) -> dict:
    """Stop the named server (SIGTERM to its process group, SIGKILL after ``grace`` s)."""
    p = _paths(run_dir, name)
    st = read_state(run_dir, name)
    pid = running_pid(st)
    res = {"changed": pid is not None, "name": name, "pid": pid, "log": str(p["log"])}
    if check or pid is None:
        if pid is None and not check:
            with contextlib.suppress(FileNotFoundError):
                p["pid"].unlink()
        return res
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    except PermissionError as e:
        raise ServeProcessError(f"cannot stop server {name!r} (PID {pid}): {e}; run as its user") from None
    deadline = time.monotonic() + grace
    while running_pid(st) is not None and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.2)
    if running_pid(st) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        for _ in range(50):
            _reap(pid)
            if running_pid(st) is None:
                break
            time.sleep(0.1)
        res["killed"] = True
    with contextlib.suppress(FileNotFoundError):
        p["pid"].unlink()
    st["pid"] = None
    st["stopped_at"] = time.time()
    atomic_write_json(p["state"], st)
    return res


def _reap(pid: int) -> None:
    """Collect our own child if it is one (a server started by this same process, e.g. in tests)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def start(
    run_dir,
    name: str,
    spec: dict,
    *,
    health_timeout: float = 600.0,
    interval: float = 2.0,
    check: bool = False,
    stop_grace: float = 60.0,
) -> dict:
    """Start the server described by ``spec`` unless that very server already runs; wait for its health."""
    p = _paths(run_dir, name)
    st = read_state(run_dir, name)
    pid = running_pid(st)
    same = pid is not None and st.get("spec") == spec
    action = "none" if same else ("restart" if pid is not None else "start")
    res = {"changed": not same, "action": action, "name": name, "log": str(p["log"]), "pid": pid}
    if check:
        res["check_mode"] = True
        return res
    if not same:
        if pid is not None:
            res["previous_spec"] = st.get("spec")
            stop(run_dir, name, grace=stop_grace)
        if spec.get("url") and health_ok(spec["url"], timeout=2):
            raise ServeProcessError(
                f"{spec['url']}/health already answers, but not from a server {name!r} started here: another "
                f"process holds the port. Stop it (or pick another port), then run again."
            )
        p["state"].parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec["env"]}
        with open(p["log"], "ab") as log:
            log.write(f"\n{START_MARK} {name} at {time.ctime()} =====\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(
                    spec["argv"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=spec.get("cwd") or None,
                    start_new_session=True,  # setsid: outlives us, stopped as one process group
                    close_fds=True,
                )
            except OSError as e:
                raise ServeProcessError(
                    f"cannot start server {name!r}: {spec['argv'][0]}: {e.strerror}; fix the server command "
                    "(the python of the SGLang install, serve_sglang_python)"
                ) from None
        pid = proc.pid
        start_time = None
        for _ in range(50):  # /proc/PID appears at once; give exec a moment so cmdline is the server's
            start_time = _proc_start_time(pid)
            if start_time and _proc_cmdline(pid) == spec["argv"]:
                break
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        state = {"spec": spec, "pid": pid, "start_time": start_time, "started_at": time.time()}
        atomic_write_json(p["state"], state)
        atomic_write_text(p["pid"], f"{pid}\n")
        res["pid"] = pid
        if proc.poll() is not None:
            raise ServeProcessError(
                f"server {name!r} exited at once (exit {proc.returncode}); last lines of {p['log']}:\n"
                f"{log_tail(p['log'])}"
            )
    if spec.get("url"):
        try:
            res["healthy_after_s"] = wait_healthy(
                run_dir, name, spec["url"], health_timeout, interval=interval, pid=pid
            )
        except ServeProcessError:
            if not same:  # a fresh start that never became healthy is not left half-up
                stop(run_dir, name, grace=min(stop_grace, 10))
            raise
    return res
