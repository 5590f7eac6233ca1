"""The ``train`` phase: an EAGLE-3 draft trained by speculators 0.9.0 as an idempotent, detached task.

One **run directory** holds everything about one training run::

    RUN/config.yaml      the rendered speculators config (templates/speculators_train.yaml.j2)
    RUN/state.json       launcher bookkeeping: attempt, PID, launcher (systemd unit or setsid), command
                         line, the config's sha256, launch time
    RUN/train.pid        the PID of the detached trainer (setsid launches; systemd units too)
    RUN/train.log        stdout+stderr of every attempt, appended, one header line per attempt
    RUN/metrics.jsonl    every speculators metric record as JSON (written by eagle3ops.train.speculators_shim),
                         with one ``attempt`` marker line per launch
    RUN/exit.json        written by the shim when the trainer ends: finished | failed | interrupted
    RUN/vocab/           d2t/t2d maps built here from token_freq.pt (never speculators' cache in the data
                         directory, which goes stale when token_freq.pt changes: speculators#1081)
    RUN/checkpoints/     speculators' save_path (default): 0/, 1/, ... checkpoint_best

**The state machine** (``ensure_run``), decided under the run directory's lock (``eagle3ops.runlock``; a
second ``train`` deciding at the same time fails naming the first), never while a prepare/extract run holds
the data directory:

- no state                                       -> launch                         (changed)
- PID alive and its command line is our trainer  -> running, nothing to do         (not changed)
- exit.json says finished for this attempt       -> finished, report metrics       (not changed)
- otherwise (killed, crashed, failed, interrupted) -> relaunch; speculators resumes
  from the newest checkpoint in save_path (an incomplete newest checkpoint, left by a kill during the
  save, is moved aside first so the resume does not crash on it)               (changed)
- the rendered config differs from the run's     -> fail, unless restart_on_change: then stop the
  running trainer, move the old checkpoints aside and start over              (changed)

Inputs are read, not re-typed: the aux layer ids come from ``hidden_states/extract_meta.json`` (a
user-given value must match them), the draft vocabulary from ``token_freq.pt`` (capped at the number
of distinct tokens: a draft vocab larger than that crashed SpecForge, #76).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

from eagle3ops.checkpoints import checkpoint_problem, epoch_dirs, final_checkpoint
from eagle3ops.durable import atomic_write_bytes
from eagle3ops.train.inputs import (
    check_content,
    write_vocab_maps,
)
from eagle3ops.train.launch import (
    ATTEMPT_MARK,
    is_our_trainer,
    launch,
    stop_run,
    systemd_is_pid1,
)
from eagle3ops.train.metrics import progress as train_progress
from eagle3ops.train.metrics import read_metrics
from eagle3ops.train.planning import Plan, plan, rdzv_id_for
from eagle3ops.train.spec import CONFIG, EXIT, LOG, METRICS, PIDFILE, STATE, TrainError, TrainSpec

# ---------------------------------------------------------------- checkpoints: resume ---------------------


def quarantine_incomplete(save_path: Path, scheduler: bool = True) -> list[dict]:
    """Move incomplete newest checkpoints aside so speculators resumes from the last complete one."""
    moved = []
    for epoch in reversed(epoch_dirs(save_path)):
        d = save_path / str(epoch)
        problem = checkpoint_problem(d, scheduler)
        if problem is None:
            break
        dest = save_path / f"incomplete-{epoch}-{int(time.time())}"
        os.replace(d, dest)
        moved.append({"epoch": epoch, "moved_to": str(dest), "reason": problem})
    return moved


def resume_point(save_path: Path) -> dict | None:
    eps = epoch_dirs(save_path)
    if not eps:
        return None
    ts = save_path / str(eps[-1]) / "training_state.json"
    try:
        st = json.loads(ts.read_text())
    except (OSError, ValueError):
        st = {}
    return {"checkpoint": str(save_path / str(eps[-1])), "epoch": eps[-1], **st}


# ---------------------------------------------------------------- the state machine ---------------------


def read_state(run_dir: Path) -> dict | None:
    p = run_dir / STATE
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise TrainError(
            f"{p}: corrupt ({e}); move it aside to let the phase relaunch (checkpoints are kept)."
        ) from e


def read_exit(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / EXIT).read_text())
    except (OSError, ValueError):
        return None


def run_status(run_dir: Path, state: dict | None) -> tuple[str, dict | None]:
    """new | running | finished | failed | interrupted | killed, and the exit record.

    A trainer whose PID is in ``train.pid`` but not (yet) in ``state.json`` (the launcher was killed between
    the two writes) counts as running too, and is adopted into ``state``: never start a second one.
    """
    pid_in_file = None
    with contextlib.suppress(OSError, ValueError):
        pid_in_file = int((run_dir / PIDFILE).read_text().strip() or 0)
    stale = state is None or state.get("pid") != pid_in_file
    if pid_in_file and stale and is_our_trainer(pid_in_file, run_dir / CONFIG):
        if state is not None:
            state["pid"] = pid_in_file
        return "running", None
    if state is None:
        return "new", None
    if is_our_trainer(state.get("pid"), run_dir / CONFIG):
        return "running", None
    ex = read_exit(run_dir)
    if ex is None:
        return "killed", None
    return ex.get("status", "failed"), ex


def log_tail(run_dir: Path, n: int = 40) -> str:
    p = run_dir / LOG
    if not p.exists():
        return ""
    with open(p, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 16384))
        return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])


# what CUDA's caching allocator (and ROCm's) says when a trainer runs out of GPU memory
OOM_MARKERS = ("CUDA out of memory", "HIP out of memory", "OutOfMemoryError")


def oom_hint(run_dir: Path, ex: dict | None) -> str | None:
    """What to change when the last attempt ran out of GPU memory (users' pain 9), from its exit record and its
    own part of the log (another rank's OOM reaches rank 0 only as a torchrun error); None otherwise."""
    text = " ".join(str((ex or {}).get(k, "")) for k in ("error", "traceback"))
    p = run_dir / LOG
    if p.exists():
        with open(p, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text += f.read().decode(errors="replace").rsplit(ATTEMPT_MARK, 1)[-1]
    if not any(m in text for m in OOM_MARKERS):
        return None
    m = re.search(r"^\s*total_seq_len:\s*(\d+)", _read_text(run_dir / CONFIG), re.M)
    now = f", now {m.group(1)}" if m else ""
    return (
        f"the GPU ran out of memory: lower train_total_seq_len (the tokens of one packed batch a GPU{now}), or "
        "train the same batches on more GPUs; a re-run resumes from the last checkpoint"
    )


def _read_text(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """One ``train`` deciding on a run directory at a time (:class:`eagle3ops.runlock.RunLock`: a second one
    fails at once with ``LockHeld``, exit code 2, naming the first's PID and command line). The running
    trainer itself is represented by ``train.pid`` (``run_status``): a later ``train`` adopts it."""
    from eagle3ops.runlock import RunLock

    run_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(run_dir, what="train"):
        yield


def data_dir_writer(data_dir: str | os.PathLike) -> dict | None:
    """The prepare/extract run that holds ``data_dir`` now (its lock record), or None."""
    from eagle3ops.runlock import holder

    return holder(data_dir)


def _refuse_while_written(data_dir: str, check: bool, warnings: list) -> None:
    h = data_dir_writer(data_dir)
    if not h:
        return
    msg = (
        f"{data_dir} is being written by {h.get('what', 'another run')} PID {h.get('pid')} since "
        f"{h.get('started_at')} ({h.get('cmdline')}); training now would read a partial data set. Wait for it "
        "to finish (the extract phase does), then re-run the train phase."
    )
    if check:
        warnings.append(msg)
        return
    raise TrainError(msg, holder=h)


def _config_diff(old: str, new: str) -> str:
    import difflib

    return "".join(
        difflib.unified_diff(old.splitlines(True), new.splitlines(True), "running config.yaml", "requested")
    )


def gpu_free(plan_: Plan, check: bool, log) -> dict | None:
    if plan_.device != "gpu" or not plan_.spec.gpu_free_check:
        return None
    from eagle3ops.gpu_free.check import GpuFreeError, ensure_free  # the gpu_free phase's check, as its API

    try:
        return ensure_free(timeout_s=plan_.spec.gpu_free_timeout, check_mode=check, log=log)
    except GpuFreeError as e:
        raise TrainError(f"GPUs are not free, not launching the trainer: {e}", gpu_free=e.details) from e


def ensure_run(
    spec: TrainSpec,
    *,
    check: bool = False,
    wait: bool = False,
    timeout: float = 3600,
    poll_s: float = 2.0,
    log=lambda s: print(s, file=sys.stderr),
) -> dict:
    if not check:  # before the plan: a data directory being written looks incomplete, not "in use"
        _refuse_while_written(spec.data_dir, check, [])
    try:
        p = plan(spec)
    except TrainError as e:
        if not (check and e.details.get("inputs_pending")):
            raise
        # check mode of a whole site run: the earlier phases have not produced the inputs yet
        return {
            "changed": True,
            "status": "launched",
            "would": "launch",
            "inputs_pending": str(e),
            "run_dir": str(Path(spec.run_dir).resolve()),
            "warnings": [f"inputs not ready: {e}"],
        }
    run_dir = p.run_dir
    cfg_path = run_dir / CONFIG
    if not check:
        run_dir.mkdir(parents=True, exist_ok=True)
    if check:
        _refuse_while_written(spec.data_dir, check, p.warnings)
    base = _base_result(p, cfg_path)
    lock = run_lock(run_dir) if not check else contextlib.nullcontext()
    with lock:
        state = read_state(run_dir) if run_dir.exists() else None
        status, ex = run_status(run_dir, state)
        if status == "running" and state is None:  # adopted from train.pid (see run_status)
            state = {"pid": int((run_dir / PIDFILE).read_text().strip()), "attempt": 1, "launcher": "unknown"}
        before = {
            "status": status,
            "attempt": (state or {}).get("attempt", 0),
            "job": (state or {}).get("rdzv_id"),
        }
        status, restarted = _restart_if_changed(spec, p, cfg_path, state, status, check, log)
        job = rdzv_id_for(spec) if spec.nnodes > 1 else None
        status, other_job = _leave_other_job(run_dir, state, status, job, check, log)
        result = dict(base, before=before, restarted=restarted, job=job, other_job=other_job)
        if status in ("running", "finished"):
            result.update(
                changed=False,
                status=status,
                pid=(state or {}).get("pid"),
                attempt=state.get("attempt"),
                launcher=state.get("launcher"),
                unit=state.get("unit"),
            )
        else:
            action = "launch" if status == "new" else "relaunch"
            result.update(
                changed=True, status="launched" if action == "launch" else "relaunched", previous_exit=ex
            )
            if status != "new":
                result["previous_status"] = status
            if check:
                _predict_launch(spec, p, result, action, status, other_job, log)
                return result
            state = _launch(spec, p, cfg_path, state, result, log)
        result["after"] = {
            "status": "running" if result["status"] != "finished" else "finished",
            "attempt": result.get("attempt"),
        }
    if wait and result["status"] != "finished":
        result.update(wait_for(run_dir, state, timeout=timeout, poll_s=poll_s, log=log))
    if result.get("status") == "finished":
        result["exit"] = read_exit(run_dir)
        if spec.trainer == "specforge":
            from eagle3ops.train import specforge

            ck = specforge.latest_checkpoint(specforge.output_dir(run_dir))
            result["checkpoint"] = str(ck) if ck else None
        else:
            result["checkpoint"] = final_checkpoint(p.save_path)
    result["metrics"] = read_metrics(run_dir)
    return result


def _base_result(p: Plan, cfg_path: Path) -> dict:
    """What every result of :func:`ensure_run` reports about the plan."""
    run_dir = p.run_dir
    return {
        "run_dir": str(run_dir),
        "config_path": str(cfg_path),
        "log_path": str(run_dir / LOG),
        "save_path": str(p.save_path),
        "layer_ids": p.values["layer_ids"],
        "draft_vocab_size": p.values["draft_vocab_size"],
        "draft_vocab_capped": p.values["draft_vocab_capped"],
        "init_from": p.values.get("init_from"),
        "device": p.device,
        "nproc": p.nproc,
        "nnodes": p.spec.nnodes,
        "node_rank": p.spec.node_rank,
        "config_sha256": p.config_sha256,
        "warnings": p.warnings,
        "samples": p.samples,
        "serve_window_size": p.init["window"]
        if p.init
        else (p.spec.sliding_window if p.spec.attention == "sliding" else None),
    }


def _restart_if_changed(
    spec: TrainSpec, p: Plan, cfg_path: Path, state: dict | None, status: str, check: bool, log
) -> tuple[str, dict | None]:
    """A run whose config changed: refused, or (restart_on_change) stopped, its checkpoints moved aside and
    its metrics removed. Returns (status, restarted)."""
    run_dir = p.run_dir
    old_text = cfg_path.read_text() if cfg_path.exists() else None
    restarted = None
    if state is not None and old_text is not None and old_text != p.config_text:
        if not spec.restart_on_change:
            raise TrainError(
                f"the training configuration changed while run {run_dir} exists (status {status}). Set "
                "train_restart_on_change: true to stop it and start over (its checkpoints are moved aside), "
                "or use another train_run_dir. Changes:\n" + _config_diff(old_text, p.config_text)[:4000],
                status=status,
                config_diff=_config_diff(old_text, p.config_text)[:8000],
            )
        restarted = {"previous_status": status}
        if not check:
            if status == "running":
                stop_run(run_dir, state, log=log)
            old_save = Path(state.get("save_path") or p.save_path)
            if old_save.exists():
                dest = old_save.with_name(f"{old_save.name}.superseded-{int(time.time())}")
                os.replace(old_save, dest)
                restarted["old_checkpoints"] = str(dest)
            (run_dir / METRICS).unlink(missing_ok=True)
        status = "new"
    return status, restarted


def _leave_other_job(
    run_dir: Path, state: dict | None, status: str, job: str | None, check: bool, log
) -> tuple[str, dict | None]:
    """Several hosts: a node running (or done with) another job than ``job`` stops it. Returns (status,
    other_job)."""
    other_job = None
    if job and state is not None and status in ("running", "finished") and state.get("rdzv_id") != job:
        # several hosts: this node runs (or finished) another job than the one every node is asked to join
        # now - a node that died meanwhile is being restarted. Stop it (the role stops every node first) and
        # join the new job, resuming from the newest checkpoint, never leaving half a job running.
        other_job = {"previous_status": status, "previous_job": state.get("rdzv_id"), "job": job}
        if status == "running" and not check:
            stop_run(run_dir, state, log=log)
        status = "other-job"
    return status, other_job


def _predict_launch(
    spec: TrainSpec, p: Plan, result: dict, action: str, status: str, other_job: dict | None, log
) -> None:
    """Check mode: what a launch would do, into ``result``; nothing is written or started."""
    result.update(
        would=action,
        after={"status": "running"},
        resume_from=resume_point(p.save_path) if status != "new" else None,
    )
    if spec.verify == "checksum":  # what the launch would read first (nothing is read now)
        result["content_check"] = check_content(spec.data_dir, check=True, log=log)
    held = other_job and other_job["previous_status"] == "running"
    # its own trainer holds this node's GPUs until the stop: nothing to predict from them now
    result["gpu_free"] = (
        {"skipped": "this node's GPUs are held by its own trainer of the previous job until it stops"}
        if held
        else gpu_free(p, True, log)
    )


def _launch(spec: TrainSpec, p: Plan, cfg_path: Path, state: dict | None, result: dict, log) -> dict:
    """Checks, incomplete checkpoints set aside, vocab maps and config written, the trainer launched; what was
    done goes into ``result``. Returns the new state."""
    if spec.verify == "checksum":  # damaged states are refused before a trainer reads them
        result["content_check"] = check_content(spec.data_dir, check=False, log=log)
    result["gpu_free"] = gpu_free(p, False, log)
    scheduler = (spec.extra.get("scheduler") or {}).get("scheduler_type", "linear") != "none"
    result["quarantined_checkpoints"] = quarantine_incomplete(p.save_path, scheduler)
    result["resume_from"] = resume_point(p.save_path)
    if p.init:  # a warm start trains with its draft's own maps (users' pain 14: rebuilt maps misalign it)
        from eagle3ops.train.warm_start import write_init_maps

        write_init_maps(p.init, Path(p.values["d2t_path"]), Path(p.values["t2d_path"]))
    else:
        write_vocab_maps(
            p.token_freq, p.values["draft_vocab_size"], p.target_vocab, Path(p.values["d2t_path"]).parent
        )
    if spec.trainer == "specforge":  # its inputs beside the config: target view, draft config, pointers
        from eagle3ops.train import specforge

        result["specforge_inputs"] = specforge.prepare_inputs(
            p.values, Path(p.values["data_path"]), Path(p.values["verifier_path"]), p.samples["rows"]
        )
    atomic_write_bytes(cfg_path, p.config_text.encode())
    launcher = spec.launcher
    if launcher == "auto":
        launcher = "systemd" if systemd_is_pid1() else "setsid"
    state = launch(
        p,
        int((state or {}).get("attempt", 0)) + 1,
        launcher,
        log,
        result["resume_from"],
        previous_unit=(state or {}).get("unit"),
    )
    result.update(pid=state["pid"], attempt=state["attempt"], launcher=launcher, unit=state["unit"])
    return state


def wait_for(run_dir: Path, state: dict, *, timeout: float, poll_s: float, log) -> dict:
    deadline = time.monotonic() + timeout
    pid = state.get("pid")
    while is_our_trainer(pid, run_dir / CONFIG):
        if time.monotonic() > deadline:
            raise TrainError(
                f"training is still running after {timeout:.0f} s (PID {pid}, log {run_dir / LOG}); it keeps "
                "going. Re-run the phase to keep waiting (it will not start a second trainer), or raise "
                "train_wait_timeout.",
                pid=pid,
                status="running",
            )
        time.sleep(poll_s)
    ex = read_exit(run_dir)
    if not ex or ex.get("status") != "finished":
        why = "was killed (no exit record)" if not ex else f"ended {ex.get('status')}: {ex.get('error', '')}"
        hint = oom_hint(run_dir, ex)
        raise TrainError(
            f"the trainer (PID {pid}) {why}.{f' {hint[0].upper()}{hint[1:]}.' if hint else ''} Log: "
            f"{run_dir / LOG}. Re-running the phase resumes from the last checkpoint. Last log lines:\n"
            f"{log_tail(run_dir, 25)}",
            pid=pid,
            status=(ex or {}).get("status", "killed"),
            exit=ex,
        )
    log(f"training finished (PID {pid})")
    return {"status": "finished", "after": {"status": "finished", "attempt": state.get("attempt")}}


def status(run_dir: str) -> dict:
    rd = Path(run_dir).resolve()
    state = read_state(rd) if rd.exists() else None
    st, ex = run_status(rd, state)
    save = Path((state or {}).get("save_path") or rd / "checkpoints")
    cfg = rd / CONFIG
    return {
        "changed": False,
        "run_dir": str(rd),
        "status": st,
        "state": state,
        "exit": ex,
        "resume_from": resume_point(save),
        "metrics": read_metrics(rd),
        "log_path": str(rd / LOG),
        "hint": oom_hint(rd, ex) if st in ("failed", "killed", "interrupted") else None,
        # what a poll of the train role prints (callback_plugins/eagle3ops_progress.py)
        "progress": train_progress(rd, st, cfg.read_text() if cfg.exists() else None),
    }


def stop(run_dir: str, grace_s: float = 60, check: bool = False) -> dict:
    rd = Path(run_dir).resolve()
    state = read_state(rd) if rd.exists() else None
    st, _ = run_status(rd, state)
    if st != "running":
        return {"changed": False, "status": st, "run_dir": str(rd)}
    if check:
        return {"changed": True, "status": st, "would": "stop", "pid": state.get("pid")}
    stop_run(rd, state, grace_s)
    return {
        "changed": True,
        "status": run_status(rd, state)[0],
        "stopped_pid": state.get("pid"),
        "run_dir": str(rd),
    }
