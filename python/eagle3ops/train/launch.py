"""The detached trainer: launched as a transient systemd unit (where systemd is PID 1) or a ``setsid`` process,
found again by its PID and command line (never a PID alone: it may have been reused), stopped with its whole
process tree."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from eagle3ops.durable import atomic_write_json
from eagle3ops.train.planning import Plan, rdzv_id_for, torchrun_argv
from eagle3ops.train.spec import CONFIG, EXIT, LOG, METRICS, PIDFILE, STATE, TRAINERS, TrainError

TORCHRUN = "torch.distributed.run"  # the agent's module (planning.torchrun_argv), never a training process


# the line the launcher writes into the log before each attempt's output (eagle3ops.train.run.oom_hint reads
# only the last attempt's part)
ATTEMPT_MARK = "===== eagle3ops train: attempt "


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split(" ", 1)[0]


def cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_our_trainer(pid: int | None, config_path: Path) -> bool:
    """PID alive (not a zombie) and its command line runs one of our trainers on this run's config."""
    if not pid or pid <= 0:
        return False
    st = _proc_state(pid)
    if st is None or st in ("Z", "X"):
        return False
    argv = cmdline(pid) or []
    return any(m in argv for m in TRAINERS.values()) and str(config_path) in argv


def systemd_is_pid1() -> bool:
    return os.path.isdir("/run/systemd/system") and shutil.which("systemd-run") is not None


def unit_name_for(run_dir: Path, given: str | None) -> str:
    if given:
        return given if given.endswith(".service") else f"{given}.service"
    return f"eagle3-train-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:10]}.service"


def _systemctl(*args: str) -> str:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False).stdout.strip()


def _unit_procs(unit: str) -> list[int]:
    """The processes in ``unit``'s cgroup (the unified hierarchy, or a hybrid one's ``unified``/``systemd``)."""
    cgroup = _systemctl("show", "-P", "ControlGroup", unit)
    for root in ("", "/unified", "/systemd") if cgroup else ():
        with contextlib.suppress(OSError, ValueError):
            return [int(x) for x in Path(f"/sys/fs/cgroup{root}{cgroup}/cgroup.procs").read_text().split()]
    return []


def free_unit_name(unit: str, log, wait_s: float = 10.0) -> str:
    """Make ``unit`` free for a new ``systemd-run --unit`` of the next attempt; returns its state then.

    A unit whose main process died while its other processes are still being stopped (``deactivating``:
    torchrun's workers outlive an agent killed with SIGKILL; systemd sends them SIGTERM and waits up to the
    unit's TimeoutStopSec) is waited for ``wait_s``, then what is left in its cgroup gets SIGKILL, and it is
    waited for again, instead of failing the launch. A unit that is really running (``active``) is left alone:
    the caller refuses to start a second trainer."""

    def settle() -> str:
        deadline = time.monotonic() + wait_s
        state = _systemctl("is-active", unit)
        while state == "deactivating" and time.monotonic() < deadline:
            time.sleep(0.2)
            state = _systemctl("is-active", unit)
        return state

    _systemctl("reset-failed", unit)
    state = _systemctl("is-active", unit)
    if state == "deactivating":
        state = settle()
        if state == "deactivating":
            pids = _unit_procs(unit)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            state = settle()
            log(
                f"{unit}: killed the previous attempt's leftover processes {pids} (they ignored SIGTERM): now {state}"
            )
        else:
            log(f"{unit}: the previous attempt's leftover processes stopped ({state})")
        _systemctl("reset-failed", unit)
    return state


def build_command(plan_: Plan, python: str) -> list[str]:
    cfg = str(plan_.run_dir / CONFIG)
    spec = plan_.spec
    module = TRAINERS[spec.trainer]
    if plan_.device == "cpu" and spec.nnodes == 1:
        return [python, "-m", module, "--config", cfg]
    return torchrun_argv(
        python,
        ["-m", module, "--config", cfg],
        nproc=plan_.nproc,
        nnodes=spec.nnodes,
        node_rank=spec.node_rank,
        rdzv_endpoint=spec.rdzv_endpoint,
        rdzv_id=rdzv_id_for(spec),
    )


def _env(plan_: Plan) -> dict:
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "EAGLE3OPS_METRICS": str(plan_.run_dir / METRICS),
        "EAGLE3OPS_EXIT": str(plan_.run_dir / EXIT),
        "EAGLE3OPS_RUN_ID": f"train:{plan_.run_dir}",
    }
    if plan_.spec.nic:
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = plan_.spec.nic
    if plan_.device == "cpu":
        env["EAGLE3OPS_FORCE_CPU"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""  # speculators picks its autocast device from the visible accelerator
    if plan_.spec.verify == "overlapped":  # the loader checks each file on its first read (speculators_shim)
        env["EAGLE3OPS_CHECK_ON_READ"] = "1"
    env.update({str(k): str(v) for k, v in (plan_.spec.env or {}).items()})
    return env


def _writes_pid(pidfile: Path, cmd: list[str], *, systemd: bool = False) -> list[str]:
    """``cmd`` behind a shell that writes its PID to ``pidfile`` and then becomes ``cmd`` (exec: the same PID).
    ``systemd``: for an ExecStart line, where systemd itself expands ``$NAME`` and reads ``$$`` as one ``$``."""
    script = 'echo $$ > "$0"; exec "$@"'
    if systemd:
        script = script.replace("$", "$$")
    return ["sh", "-c", script, str(Path(pidfile).absolute()), *cmd]


def _written_pid(pidfile: Path, within: float, who: str, see: str) -> int:
    """The PID ``_writes_pid``'s shell wrote to ``pidfile``, waited for up to ``within`` seconds (20 looks a
    second), else the error naming ``who`` and where to ``see`` why."""
    for _ in range(int(within * 20)):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip() or 0)
            if pid:
                return pid
        time.sleep(0.05)
    raise TrainError(f"{who} did not write its PID to {pidfile} within {within:g} s; see {see}")


def _systemd_run(unit: str, run_dir: Path, log_path: Path, env: dict, cmd: list[str]):
    argv = [
        "systemd-run",
        f"--unit={unit}",
        "--collect",
        "--quiet",
        "--property=Type=exec",
        f"--working-directory={run_dir}",
        f"--property=StandardOutput=append:{log_path}",
        f"--property=StandardError=append:{log_path}",
        "--property=KillMode=control-group",
        "--property=TimeoutStopSec=150",
        *[f"--setenv={k}={v}" for k, v in env.items()],
        "--",
        *cmd,
    ]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def launch(
    plan_: Plan,
    attempt: int,
    launcher: str,
    log,
    resume_from: dict | None = None,
    previous_unit: str | None = None,
) -> dict:
    """Start the trainer detached; return its state record. ``previous_unit``: the last attempt's unit (its
    leftover processes are ended first)."""
    run_dir = plan_.run_dir
    python = plan_.spec.python or sys.executable
    cmd = build_command(plan_, python)
    env = _env(plan_)
    log_path = run_dir / LOG
    pidfile = run_dir / PIDFILE
    (run_dir / EXIT).unlink(missing_ok=True)
    pidfile.unlink(missing_ok=True)
    started = time.time()
    with open(run_dir / METRICS, "a") as f:
        f.write(json.dumps({"kind": "attempt", "attempt": attempt, "time": round(started, 3)}) + "\n")
    with open(log_path, "a") as f:
        f.write(
            f"\n{ATTEMPT_MARK}{attempt} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} "
            f"({launcher}): {' '.join(cmd)}\n"
        )
    unit = None
    if launcher == "systemd":
        unit = unit_name_for(run_dir, plan_.spec.unit_name)
        # the name, and the last attempt's unit (another name when it ran under one of its own)
        for old in dict.fromkeys(u for u in (unit, previous_unit) if u):
            active = free_unit_name(old, log)
            if active in ("active", "activating", "deactivating", "reloading"):
                raise TrainError(
                    f"systemd unit {old} is {active} but {run_dir / STATE} does not know it. Stop it "
                    f"(systemctl stop {old}) or set train_unit_name to another name."
                )
        r = _systemd_run(unit, run_dir, log_path, env, _writes_pid(pidfile, cmd, systemd=True))
        if r.returncode != 0 and "already loaded" in r.stderr:
            # an ended transient unit systemd keeps loaded (seen in containers whose cgroup kill fails with EIO:
            # it is never collected): this attempt runs under a name of its own, recorded in state.json
            stale, unit = unit, f"{unit.removesuffix('.service')}-a{attempt}-{int(started)}.service"
            log(f"{stale} is an ended unit systemd has not collected; this attempt runs as {unit}")
            free_unit_name(unit, log)
            r = _systemd_run(unit, run_dir, log_path, env, _writes_pid(pidfile, cmd, systemd=True))
        if r.returncode != 0:
            shown = _systemctl("show", "-p", "LoadState,ActiveState,SubState,MainPID", unit).replace(
                "\n", ", "
            )
            raise TrainError(
                f"systemd-run could not start {unit} (exit {r.returncode}): {r.stderr.strip()} [{shown}]"
            )
        # the unit's main process writes its own PID (as under setsid): a trainer that has already ended (a
        # collected unit's MainPID reads 0 then; seen on a busy CI box) is still recorded by its PID
        pid = _written_pid(pidfile, 30.0, f"the trainer of unit {unit}", f"{log_path} (journalctl -u {unit})")
    else:
        full_env = {**os.environ, **env}
        argv = ["setsid", "--fork", *_writes_pid(pidfile, cmd)]
        with open(log_path, "ab") as out:
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=run_dir,
                env=full_env,
                check=True,
                close_fds=True,
            )
        pid = _written_pid(pidfile, 5.0, "the trainer", str(log_path))
    state = {
        "version": 1,
        "attempt": attempt,
        "pid": pid,
        "launcher": launcher,
        "unit": unit,
        "command": cmd,
        "config_sha256": plan_.config_sha256,
        "started_at": started,
        "device": plan_.device,
        "nproc": plan_.nproc,
        "nnodes": plan_.spec.nnodes,
        "node_rank": plan_.spec.node_rank,
        # the job this node belongs to (docs/scale.md): the train role restarts every node when they differ
        "rdzv_id": rdzv_id_for(plan_.spec) if plan_.spec.nnodes > 1 else None,
        "trainer": plan_.spec.trainer,
        "save_path": str(plan_.save_path),
        "resume_from": resume_from,
    }
    atomic_write_json(run_dir / STATE, state)
    log(f"launched attempt {attempt}: PID {pid} ({launcher}{' ' + unit if unit else ''}), log {log_path}")
    return state


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Every live descendant of ``pid`` (from /proc's parent links), children first. The links are read one process
    at a time while others end and start: a PID reused during the scan can make two of them each other's parent
    (pid_max is 32768 on some hosts), so each process is visited once."""
    children: dict[int, list[int]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split(" ", 2)[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo, seen = [], [pid], {pid}
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in seen:
                seen.add(c)
                out.append(c)
                todo.append(c)
    return out


def trainer_ranks(pid: int, config_path: Path) -> list[int]:
    """The training processes of the trainer launched as ``pid``: torchrun's workers (each in a session of its
    own), or ``pid`` itself where it runs the trainer without torchrun. Not the agent, not the loader workers (their
    command lines do not name the trainer and the run's config)."""
    return [
        p
        for p in [pid, *descendants(pid)]
        if is_our_trainer(p, config_path) and TORCHRUN not in (cmdline(p) or [])
    ]


def _wait_gone(pid: int, config_path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and is_our_trainer(pid, config_path):
        time.sleep(0.2)
    return not is_our_trainer(pid, config_path)


def stop_run(run_dir: Path, state: dict, grace_s: float = 60, log=lambda s: None) -> bool:
    """Stop the trainer of ``state`` gracefully, then by force. True when something was stopped.

    1. SIGTERM to the training processes themselves, not to their process groups: speculators then saves its
       ``interrupted`` checkpoint while its DataLoader workers still run. Its workers are spawned into the
       rank's session with the default SIGTERM action; signalled with the group (torchrun's own stop does
       ``killpg`` on each worker, ``systemctl stop`` signals the whole cgroup) they die first, and the save fails
       with "DataLoader worker ... is killed by signal: Terminated" (seen on the H200 box, 2026-12-03).
    2. What is still running after ``grace_s``: the launcher's own stop (SIGTERM to the agent's group, or
       ``systemctl stop`` of the unit), 10 s, then SIGKILL to the group and to every descendant found before
       (torchrun starts each worker in a session of its own: an agent killed with SIGKILL leaves them running
       and, on GPUs, holding memory)."""
    pid = state.get("pid")
    cfg = run_dir / CONFIG
    if not is_our_trainer(pid, cfg):
        return False
    ranks = trainer_ranks(pid, cfg)
    for rank in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank, signal.SIGTERM)
    if ranks and _wait_gone(pid, cfg, grace_s):
        log(f"stopped PID {pid}: its training processes {ranks} ended on SIGTERM")
        return True
    if state.get("launcher") == "systemd" and state.get("unit"):
        _systemctl("stop", state["unit"])
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    if not _wait_gone(pid, cfg, min(10.0, grace_s) if ranks else grace_s):
        tree = descendants(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        for child in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        time.sleep(0.5)
    log(f"stopped PID {pid}")
    return True
