"""The train launcher's systemd branch on a host where systemd is PID 1 (a real nspawn Debian host).

Real: systemd (PID 1), ``systemd-run --unit=... --collect`` transient units, MainPID, ``systemctl stop``,
the launcher code of ``eagle3ops.train`` (launch, liveness by PID + command line, run status, stop: its
``launch``, ``run`` and ``metrics`` modules).
STAND-IN: the trainer. The guest has no torch/speculators, so ``python`` is a small script that runs
``fake_trainer.py`` with the shim's argv (``-m eagle3ops.train.speculators_shim --config RUN/config.yaml``); it
writes the metric and exit records like the shim does, then exits (or sleeps until stopped).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.nspawn]

ROOT = Path(__file__).resolve().parents[2]

FAKE_TRAINER = r"""
import json, os, sys, time
mode = open("/opt/e3/mode").read().strip()
with open(os.environ["EAGLE3OPS_METRICS"], "a") as f:
    f.write(json.dumps({"kind": "train", "time": time.time(), "step": 0,
                        "data": {"train": {"loss": 1.0}, "global_step": 0, "epoch": 0}}) + "\n")
print("fake trainer running", sys.argv, flush=True)
if mode == "leftover":  # a worker that outlives the trainer and ignores SIGTERM (torchrun's, killed agent)
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); open('/opt/e3/leftover.pid', 'w').write(str(__import__('os')"
                              ".getpid())); time.sleep(600)"])
if mode in ("sleep", "leftover"):
    time.sleep(600)
with open(os.environ["EAGLE3OPS_EXIT"] + ".tmp", "w") as f:
    json.dump({"status": "finished", "rc": 0}, f)
os.replace(os.environ["EAGLE3OPS_EXIT"] + ".tmp", os.environ["EAGLE3OPS_EXIT"])
"""

GUEST = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, "/opt/e3/python")
from eagle3ops.train import launch, metrics, planning, run as train_run, spec as train_spec

run = Path("/srv/run")
run.mkdir(parents=True, exist_ok=True)
(run / "config.yaml").write_text("train: {}\n")
spec = train_spec.TrainSpec(data_dir="/srv/data", verifier_path="/srv/v", run_dir=str(run), python="/opt/e3/fakepy")
plan = planning.Plan(spec=spec, run_dir=run, save_path=run / "checkpoints", config_text="", config_sha256="x",
                  values={}, device="cpu", nproc=1, token_freq={}, target_vocab=0)
out = {"systemd_pid1": launch.systemd_is_pid1()}
mode = sys.argv[1]
open("/opt/e3/mode", "w").write(mode)
state = launch.launch(plan, 1, "systemd", print)
out["state"] = state
out["alive_after_launch"] = launch.is_our_trainer(state["pid"], run / "config.yaml")
if mode == "leftover":
    import os, signal, subprocess
    deadline = time.monotonic() + 60  # guards only: each comes in well under a second on a quiet machine
    while not os.path.exists("/opt/e3/leftover.pid") and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = int(open("/opt/e3/leftover.pid").read())
    os.kill(state["pid"], signal.SIGKILL)  # the trainer dies; its worker does not
    deadline = time.monotonic() + 60
    while True:
        unit_state = subprocess.run(["systemctl", "is-active", state["unit"]], capture_output=True, text=True).stdout.strip()
        if unit_state == "deactivating" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out["unit_before_relaunch"] = unit_state
    out["status_before_relaunch"] = train_run.run_status(run, state)[0]
    open("/opt/e3/mode", "w").write("finish")
    state = launch.launch(plan, 2, "systemd", print, previous_unit=state["unit"])
    out["relaunched"] = state
    out["leftover_alive"] = os.path.exists(f"/proc/{leftover}")
    mode = "finish"
if mode == "finish":
    deadline = time.monotonic() + 60
    while launch.is_our_trainer(state["pid"], run / "config.yaml") and time.monotonic() < deadline:
        time.sleep(0.1)
    out["status"] = train_run.run_status(run, state)[0]
else:
    out["status_running"] = train_run.run_status(run, state)[0]
    out["stopped"] = launch.stop_run(run, state, grace_s=20)
    out["status_after_stop"] = train_run.run_status(run, state)[0]
out["log"] = (run / "train.log").read_text()
out["metrics"] = metrics.read_metrics(run)
print("RESULT " + json.dumps(out))
"""


def _result(cp) -> dict:
    line = [x for x in cp.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, cp.stdout + cp.stderr
    return json.loads(line[-1][len("RESULT ") :])


def _module_closure(*start: str) -> list[str]:
    """The files of the modules ``start`` (dotted) and of every eagle3ops module they import at module level,
    transitively, with their packages' ``__init__.py`` (what the guest needs to import them; the guest has no
    torch, so lazy imports inside functions are left out on purpose). Paths relative to python/eagle3ops."""
    import ast

    pkg = ROOT / "python" / "eagle3ops"

    def files_of(dotted: str) -> list[str]:
        parts = dotted.split(".")[1:]
        inits = [str(Path(*parts[:k], "__init__.py")) for k in range(len(parts))]
        mod = Path(*parts).with_suffix(".py") if parts else None
        if mod is not None and (pkg / mod).is_file():
            return [*inits, str(mod)]
        return (
            [*inits, str(Path(*parts, "__init__.py"))]
            if (pkg / Path(*parts, "__init__.py")).is_file()
            else []
        )

    todo, seen, files = list(start), set(), set()
    while todo:
        dotted = todo.pop()
        if dotted in seen:
            continue
        seen.add(dotted)
        found = files_of(dotted)
        files.update(found)
        if not found or not found[-1].endswith(".py"):
            continue
        for node in ast.parse((pkg / found[-1]).read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "eagle3ops":
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names]  # a submodule, when it is one
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("eagle3ops.")]
            elif isinstance(node, ast.Try):  # the host wing's `try: from eagle3ops... except ImportError:`
                for sub in node.body:
                    if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("eagle3ops"):
                        todo += [sub.module, *(f"{sub.module}.{a.name}" for a in sub.names)]
    return sorted(files)


def test_systemd_transient_unit_launch_liveness_and_stop(nspawn_host):
    h = nspawn_host
    for rel in _module_closure(
        "eagle3ops.train.launch", "eagle3ops.train.metrics", "eagle3ops.train.planning", "eagle3ops.train.run"
    ):
        h.put(f"/opt/e3/python/eagle3ops/{rel}", (ROOT / "python" / "eagle3ops" / rel).read_text())
    h.put("/opt/e3/fake_trainer.py", FAKE_TRAINER)
    h.put("/opt/e3/fakepy", '#!/bin/sh\nexec python3 /opt/e3/fake_trainer.py "$@"\n', mode="0755")
    h.put("/opt/e3/guest.py", GUEST)

    r = _result(h.ssh("python3 /opt/e3/guest.py finish", timeout=300))
    st = r["state"]
    assert r["systemd_pid1"] is True
    assert st["launcher"] == "systemd" and st["unit"].startswith("eagle3-train-") and st["pid"] > 1
    assert r["status"] == "finished"  # exit record written through the env the unit got
    assert (
        "fake trainer running" in r["log"] and "eagle3ops.train.speculators_shim" in r["log"]
    )  # appended log
    assert r["metrics"]["attempts"][0]["first_global_step"] == 0
    # --collect: the finished transient unit is gone, so the same name can be launched again
    assert h.ssh(f"systemctl is-active {st['unit']}", check=False).stdout.strip() in ("inactive", "unknown")

    r = _result(h.ssh("python3 /opt/e3/guest.py sleep", timeout=300))
    st = r["state"]
    assert r["alive_after_launch"] is True and r["status_running"] == "running"
    assert r["stopped"] is True and r["status_after_stop"] == "killed"
    assert h.ssh(f"systemctl is-active {st['unit']}", check=False).stdout.strip() != "active"
    assert h.ssh(f"test -d /proc/{st['pid']}", check=False).returncode != 0

    # the trainer killed, a worker of it left that ignores SIGTERM: the unit is still stopping (deactivating,
    # up to TimeoutStopSec) when the run is relaunched - the launch finishes stopping it instead of failing
    cp = h.ssh("python3 /opt/e3/guest.py leftover", timeout=300)
    r = _result(cp)
    assert r["unit_before_relaunch"] == "deactivating" and r["status_before_relaunch"] == "killed", r
    assert r["relaunched"]["attempt"] == 2 and r["leftover_alive"] is False, r
    assert "killed the previous attempt's leftover processes" in cp.stdout, cp.stdout
    assert r["status"] == "finished", r  # attempt 2 ran in the same unit name and wrote its exit record
