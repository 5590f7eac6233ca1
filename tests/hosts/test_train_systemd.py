"""The train launcher's systemd branch on a host where systemd is PID 1 (a real nspawn Debian host).

Real: systemd (PID 1), ``systemd-run --unit=... --collect`` transient units, MainPID, ``systemctl stop``,
the launcher code of ``eagle3ops.train`` (launch, liveness by PID + command line, run status, stop).
STAND-IN: the trainer. The guest has no torch/speculators, so ``python`` is a small script that runs
``fake_trainer.py`` with the shim's argv (``-m eagle3ops.speculators_shim --config RUN/config.yaml``); it
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
if mode == "sleep":
    time.sleep(600)
with open(os.environ["EAGLE3OPS_EXIT"] + ".tmp", "w") as f:
    json.dump({"status": "finished", "rc": 0}, f)
os.replace(os.environ["EAGLE3OPS_EXIT"] + ".tmp", os.environ["EAGLE3OPS_EXIT"])
"""

GUEST = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, "/opt/e3/python")
from eagle3ops import train

run = Path("/srv/run")
run.mkdir(parents=True, exist_ok=True)
(run / "config.yaml").write_text("train: {}\n")
spec = train.TrainSpec(data_dir="/srv/data", verifier_path="/srv/v", run_dir=str(run), python="/opt/e3/fakepy")
plan = train.Plan(spec=spec, run_dir=run, save_path=run / "checkpoints", config_text="", config_sha256="x",
                  values={}, device="cpu", nproc=1, token_freq={}, target_vocab=0)
out = {"systemd_pid1": train.systemd_is_pid1()}
mode = sys.argv[1]
open("/opt/e3/mode", "w").write(mode)
state = train.launch(plan, 1, "systemd", print)
out["state"] = state
out["alive_after_launch"] = train.is_our_trainer(state["pid"], run / "config.yaml")
if mode == "finish":
    for _ in range(200):
        if not train.is_our_trainer(state["pid"], run / "config.yaml"):
            break
        time.sleep(0.1)
    out["status"] = train.run_status(run, state)[0]
else:
    out["status_running"] = train.run_status(run, state)[0]
    out["stopped"] = train.stop_run(run, state, grace_s=20)
    out["status_after_stop"] = train.run_status(run, state)[0]
out["log"] = (run / "train.log").read_text()
out["metrics"] = train.read_metrics(run)
print("RESULT " + json.dumps(out))
"""


def _result(cp) -> dict:
    line = [x for x in cp.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, cp.stdout + cp.stderr
    return json.loads(line[-1][len("RESULT ") :])


def _module_closure(start: str) -> list[str]:
    """``start`` and every eagle3ops module it imports at module level, transitively (what the guest needs
    to import it; the guest has no torch, so lazy imports inside functions are left out on purpose)."""
    import ast

    pkg = ROOT / "python" / "eagle3ops"
    todo, seen = [start], {"__init__.py"}
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for node in ast.parse((pkg / rel).read_text()).body:
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "eagle3ops":
                sub = node.module.split(".")[1:]
                names = [sub[0]] if sub else [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names if a.name.startswith("eagle3ops.")]
            todo += [f"{n}.py" for n in names if (pkg / f"{n}.py").exists()]
    return sorted(seen)


def test_systemd_transient_unit_launch_liveness_and_stop(nspawn_host):
    h = nspawn_host
    for rel in _module_closure("train.py"):
        h.put(f"/opt/e3/python/eagle3ops/{rel}", (ROOT / "python" / "eagle3ops" / rel).read_text())
    h.put("/opt/e3/fake_trainer.py", FAKE_TRAINER)
    h.put("/opt/e3/fakepy", '#!/bin/sh\nexec python3 /opt/e3/fake_trainer.py "$@"\n', mode="0755")
    h.put("/opt/e3/guest.py", GUEST)

    r = _result(h.ssh("python3 /opt/e3/guest.py finish", timeout=120))
    st = r["state"]
    assert r["systemd_pid1"] is True
    assert st["launcher"] == "systemd" and st["unit"].startswith("eagle3-train-") and st["pid"] > 1
    assert r["status"] == "finished"  # exit record written through the env the unit got
    assert "fake trainer running" in r["log"] and "eagle3ops.speculators_shim" in r["log"]  # appended log
    assert r["metrics"]["attempts"][0]["first_global_step"] == 0
    # --collect: the finished transient unit is gone, so the same name can be launched again
    assert h.ssh(f"systemctl is-active {st['unit']}", check=False).stdout.strip() in ("inactive", "unknown")

    r = _result(h.ssh("python3 /opt/e3/guest.py sleep", timeout=120))
    st = r["state"]
    assert r["alive_after_launch"] is True and r["status_running"] == "running"
    assert r["stopped"] is True and r["status_after_stop"] == "killed"
    assert h.ssh(f"systemctl is-active {st['unit']}", check=False).stdout.strip() != "active"
    assert h.ssh(f"test -d /proc/{st['pid']}", check=False).returncode != 0
