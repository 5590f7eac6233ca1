#!/usr/bin/env python3
"""GPU proof for the gpu_free checkpoint (issue #3): a real holder, the failure naming it, the allow-listed
stop, and the verdict latency after the memory is released.

Needs only Python + torch (CUDA) + nvidia-ml-py + this repository; no Ansible (it runs the ``eagle3ops
gpu-free`` CLI, which is what the Ansible module runs, and the Python API for the latency loop):

    PYTHONPATH=python python3 bench/gpu_free_release.py            # writes $OUT/gpu_free_release_<date>_<card>.json

Steps (GPU ``--gpu``, default 0):
 1. idle reading: NVML v1 vs v2 memory struct; the CLI on the idle GPU must pass;
 2. a child process allocates ``--gib`` GiB with torch, with ``EAGLE3OPS_RUN_ID=<run id>`` in its
    environment (best effort: moved into a test cgroup ``eagle3ops-bench.slice/holder-standin.service`` so
    the unit attribution shows; skipped where /sys/fs/cgroup is not writable);
 3. the CLI without allow-list must fail (exit 2), naming the PID and its cgroup / unit;
 4. the CLI in check mode with the run id allow-listed must predict the stop and stop nothing;
 5. the CLI with the run id allow-listed must stop it (SIGTERM) and pass;
 6. latency, ``--reps`` times per poll interval in ``--polls``: a holder of ``--gib`` GiB exits by itself
    while ``eagle3ops.gpu_free.check.ensure_free`` waits (not allow-listed, so it only watches); a sampler thread
    reads NVML every millisecond to timestamp the release. Verdict latency = verdict time - the first
    1 ms sample at which NVML showed the GPU free (memory back to the threshold and no process listed).
    Goal: <= 0.5 s.
Exit status 0 when every expectation held and the worst latency met the goal.

``--standin`` replaces NVML and the torch holder by the CPU stand-ins of tests/unit/nvml_standin.py
(a smoke test of this script itself, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from eagle3ops.gpu_free import check as gpu_check
from eagle3ops.gpu_free import holders as gpu_holders
from eagle3ops.gpu_free import nvml as gpu_nvml

HOLDER = r"""
import os, sys, time
gib, exit_after, gpu_index, standin_dev = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if standin_dev:
    keep = open(os.path.join(standin_dev, f"nvidia{gpu_index}"))  # stand-in: hold the device file only
else:
    import torch
    torch.cuda.set_device(gpu_index)
    x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
print("READY", flush=True)
if exit_after > 0:
    time.sleep(exit_after)
    print(f"EXIT {time.time():.6f}", flush=True)
    os._exit(0)
time.sleep(3600)
"""

CGROUP_SLICE = "eagle3ops-bench.slice"
CGROUP_UNIT = "holder-standin.service"


def log(msg: str) -> None:
    print(f"[gpu_free_release {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.run_id = f"bench-{uuid.uuid4().hex[:8]}"
        self.cgroups: list[Path] = []
        self.standin_cfg = None
        if args.standin:
            sys.path.insert(0, str(REPO / "tests" / "unit"))
            import nvml_standin  # the tests' stand-in NVML (no GPU)

            self.tmp = Path(tempfile.mkdtemp(prefix="gpu-free-bench-"))
            self.dev = self.tmp / "dev"
            self.dev.mkdir()
            (self.dev / f"nvidia{args.gpu}").write_text("")
            self.standin_cfg = self.tmp / "nvml.json"
            self.gpus_cfg = [{} for _ in range(args.gpu + 1)]
            self._write_cfg()
            self.nvml = nvml_standin.StandInNVML(self.gpus_cfg)
            launcher = self.tmp / "eagle3ops"
            nvml_standin.write_launcher(
                launcher,
                python=sys.executable,
                paths=[REPO / "python", REPO / "tests" / "unit"],
                config=self.standin_cfg,
                dev=self.dev,
            )
            self.cli_argv = [str(launcher)]
            self.dev_dir = str(self.dev)
        else:
            self.nvml = gpu_nvml.load_nvml()
            self.cli_argv = [sys.executable, "-m", "eagle3ops"]
            self.dev_dir = "/dev"

    def _write_cfg(self):
        self.standin_cfg.write_text(
            json.dumps([{"procs": {str(k): v for k, v in g.get("procs", {}).items()}} for g in self.gpus_cfg])
        )

    # ------------------------------------------------------------------ helpers
    def memory(self) -> dict:
        h = self.nvml.nvmlDeviceGetHandleByIndex(self.args.gpu)
        v1 = self.nvml.nvmlDeviceGetMemoryInfo(h)
        out = {"v1_used_mib": v1.used / 2**20, "v1_total_mib": v1.total / 2**20}
        try:
            v2 = self.nvml.nvmlDeviceGetMemoryInfo(h, version=self.nvml.nvmlMemory_v2)
            out.update(
                v2_used_mib=v2.used / 2**20,
                v2_reserved_mib=v2.reserved / 2**20,
                v2_total_mib=v2.total / 2**20,
            )
        except Exception as e:
            out["v2_error"] = str(e)
        return out

    def cli(self, *argv) -> dict:
        env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
        cmd = [*self.cli_argv, "gpu-free", "--gpus", str(self.args.gpu), *argv, "--json"]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.monotonic() - t0
        try:
            result = json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            result = {"unparsed_stdout": r.stdout[-2000:]}
        return {
            "cmd": cmd[len(self.cli_argv) :],
            "rc": r.returncode,
            "wall_s": round(wall, 3),
            "result": result,
            "stderr_tail": r.stderr[-3000:],
        }

    def spawn_holder(self, exit_after: float = 0) -> subprocess.Popen:
        # PCI bus order, so that torch's device index is NVML's index
        env = {**os.environ, gpu_holders.RUN_ID_VAR: self.run_id, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        p = subprocess.Popen(
            [
                sys.executable,
                "-c",
                HOLDER,
                str(self.args.gib),
                str(exit_after),
                str(self.args.gpu),
                self.dev_dir if self.args.standin else "",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = p.stdout.readline().strip()
        if line != "READY":
            p.kill()
            raise SystemExit(f"holder did not start (said {line!r}, exit {p.wait()}); is CUDA usable?")
        if self.args.standin:
            self.gpus_cfg[self.args.gpu].setdefault("procs", {})[p.pid] = self.args.gib * 1024
            self._write_cfg()
        return p

    def move_to_cgroup(self, pid: int) -> str | None:
        """Best effort: put the holder into eagle3ops-bench.slice/holder-standin.service (cgroup v2 or
        the v1 name=systemd hierarchy) so the unit attribution can be seen; None where not possible."""
        for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup")):
            if not (root / "cgroup.procs").exists():
                continue
            d = root / CGROUP_SLICE / CGROUP_UNIT
            try:
                d.mkdir(parents=True, exist_ok=True)
                self.cgroups.append(d)
                (d / "cgroup.procs").write_text(str(pid))
                return str(d)
            except OSError as e:
                log(f"cannot use cgroup {d}: {e}")
        return None

    def cleanup_cgroups(self):
        for d in self.cgroups:
            for p in (d, d.parent):
                for _ in range(50):
                    try:
                        p.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)

    # ------------------------------------------------------------------ latency
    def latency_rep(self, poll_s: float) -> dict:
        p = self.spawn_holder(exit_after=self.args.exit_after)
        pid = p.pid
        h = self.nvml.nvmlDeviceGetHandleByIndex(self.args.gpu)
        samples = {"mem_released": None, "pid_gone": None, "free": None}
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                t = time.time()
                try:
                    m = self.nvml.nvmlDeviceGetMemoryInfo(h, version=self.nvml.nvmlMemory_v2)
                    used = m.used / 2**20
                except Exception:
                    used = self.nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20 - self.args.v1_allowance
                pids = {x.pid for x in self.nvml.nvmlDeviceGetComputeRunningProcesses(h)}
                if samples["mem_released"] is None and used <= self.args.threshold:
                    samples["mem_released"] = t
                if samples["pid_gone"] is None and pid not in pids:
                    samples["pid_gone"] = t
                if samples["free"] is None and used <= self.args.threshold and not pids:
                    samples["free"] = t
                    return
                time.sleep(0.001)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        try:
            r = gpu_check.ensure_free(
                [str(self.args.gpu)],
                threshold_mib=self.args.threshold,
                timeout_s=self.args.exit_after + 20,
                poll_s=poll_s,
                nvml=self.nvml,
                dev_dir=self.dev_dir,
                v1_allowance_mib=self.args.v1_allowance,
            )
        except gpu_nvml.GpuFreeError as e:  # record it and go on: one bad rep must not lose the run
            stop.set()
            if p.poll() is None:
                p.kill()
            p.wait()
            return {"poll_s": poll_s, "pid": pid, "error": str(e)[:2000], "gpus": e.details.get("gpus")}
        th.join(timeout=5)
        stop.set()
        out_line = p.stdout.readline().strip()
        exit_called = float(out_line.split()[1]) if out_line.startswith("EXIT") else None
        p.wait()
        rep = {
            "poll_s": poll_s,
            "pid": pid,
            "verdict_at": r["verdict_at"],
            "exit_called_at": exit_called,
            **{f"{k}_at": v for k, v in samples.items()},
            "seconds_to_free": r["seconds_to_free"],
        }
        if samples["free"]:
            rep["verdict_latency_s"] = round(r["verdict_at"] - samples["free"], 4)
        if exit_called:
            rep["exit_to_nvml_free_s"] = round((samples["free"] or r["verdict_at"]) - exit_called, 4)
            rep["exit_to_verdict_s"] = round(r["verdict_at"] - exit_called, 4)
        return rep

    # ------------------------------------------------------------------ the run
    def run(self) -> dict:
        a = self.args
        res: dict = {
            "host": socket.gethostname(),
            "python": platform.python_version(),
            "standin": a.standin,
            "gpu": a.gpu,
            "gib": a.gib,
            "run_id": self.run_id,
            "checks": {},
        }
        if not a.standin:
            self.record_driver(res)
        res["idle_memory"] = self.memory()
        log(f"idle: {res['idle_memory']}")

        if not self.idle_step(res):
            # a GPU that is not free to begin with (or reads used > --threshold when idle) makes every
            # later step meaningless: record what it saw and stop here
            res["ok"] = False
            res["stopped_early"] = "the idle GPU did not pass; see idle_cli and idle_memory"
            res["latency_summary"] = {}
            return res
        self.holder_steps(res)
        self.latency_steps(res)
        res["goal_s"] = a.goal
        res["ok"] = all(res["checks"].values())
        return res

    def record_driver(self, res: dict) -> None:
        """The driver, GPU name, torch version and the cost of one NVML reading (memory + processes)."""
        a = self.args
        h = self.nvml.nvmlDeviceGetHandleByIndex(a.gpu)
        res["driver"] = gpu_nvml._text(self.nvml.nvmlSystemGetDriverVersion())
        res["gpu_name"] = gpu_nvml._text(self.nvml.nvmlDeviceGetName(h))
        try:
            import torch

            res["torch"] = torch.__version__
        except ImportError:
            pass
        t0 = time.perf_counter()
        for _ in range(1000):
            self.nvml.nvmlDeviceGetMemoryInfo(h, version=self.nvml.nvmlMemory_v2)
            self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
        res["nvml_reading_us"] = round((time.perf_counter() - t0) * 1000, 2)  # us per (memory+procs)

    def idle_step(self, res: dict) -> bool:
        """Step 1: the CLI on the idle GPU must pass. Returns whether it did."""
        checks = res["checks"]
        idle = self.cli("--timeout", "5")
        res["idle_cli"] = idle
        checks["idle_gpu_passes"] = idle["rc"] == 0 and idle["result"].get("free") is True
        log(f"idle CLI rc={idle['rc']} ({idle['wall_s']} s): {idle['result'].get('msg')}")
        return checks["idle_gpu_passes"]

    def holder_steps(self, res: dict) -> None:
        """Steps 2-5: a holder; the CLI failing on it, predicting its stop in check mode, stopping it."""
        a, checks = self.args, res["checks"]
        holder = self.spawn_holder()
        try:
            cgroup_dir = None if a.no_cgroup else self.move_to_cgroup(holder.pid)
            res["holder"] = {
                "pid": holder.pid,
                "cgroup_dir": cgroup_dir,
                "proc_cgroup": Path(f"/proc/{holder.pid}/cgroup").read_text(),
                "memory": self.memory(),
            }
            log(f"holder PID {holder.pid} holds {a.gib} GiB; cgroup {cgroup_dir}")

            fail = self.cli("--timeout", "2")
            res["fail_cli"] = fail
            holders = fail["result"].get("holders") or []
            named = [x for x in holders if x.get("pid") == holder.pid]
            checks["foreign_holder_fails"] = fail["rc"] == 2 and fail["result"].get("failed") is True
            checks["failure_names_pid"] = bool(named) and f"PID {holder.pid}" in fail["result"].get("msg", "")
            checks["failure_names_cgroup"] = bool(named) and bool(named[0].get("cgroup"))
            if cgroup_dir:
                checks["failure_names_unit"] = bool(named) and named[0].get("unit") == CGROUP_UNIT
            checks["holder_untouched_after_failure"] = holder.poll() is None
            log(f"no allow-list: rc={fail['rc']} msg={fail['result'].get('msg', '')[:400]}")

            check = self.cli("--timeout", "2", "--check", f"--stop-run-id={self.run_id}")
            res["check_cli"] = check
            checks["check_mode_predicts_stop"] = check["rc"] == 0 and [
                x.get("pid") for x in check["result"].get("would_stop", [])
            ] == [holder.pid]
            time.sleep(0.2)
            checks["check_mode_stops_nothing"] = holder.poll() is None

            stop = self.cli("--timeout", "60", "--stop-grace", "15", f"--stop-run-id={self.run_id}")
            res["stop_cli"] = stop
            stopped = stop["result"].get("stopped") or []
            checks["allow_listed_stop_passes"] = stop["rc"] == 0 and stop["result"].get("free") is True
            checks["stopped_the_holder"] = [x.get("pid") for x in stopped] == [holder.pid]
            try:
                res["holder"]["exit"] = holder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                res["holder"]["exit"] = None
            checks["holder_got_sigterm"] = res["holder"]["exit"] == -15
            log(
                f"allow-listed: rc={stop['rc']} wall {stop['wall_s']} s, seconds_to_free "
                f"{stop['result'].get('seconds_to_free')}, from stop to free {stop['result'].get('seconds_from_stop_to_free')}"
            )
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            self.cleanup_cgroups()

    def latency_steps(self, res: dict) -> None:
        """Step 6: the verdict latency, ``--reps`` holders per poll interval, and its summary."""
        a, checks = self.args, res["checks"]
        reps = []
        for poll_s in a.polls:
            for i in range(a.reps):
                rep = self.latency_rep(poll_s)
                reps.append(rep)
                log(
                    f"latency poll {poll_s}s rep {i}: verdict {rep.get('verdict_latency_s')} s after NVML free; "
                    f"exit->free {rep.get('exit_to_nvml_free_s')} s"
                )
        res["latency_reps"] = reps
        lat = [r["verdict_latency_s"] for r in reps if "verdict_latency_s" in r]
        res["latency_summary"] = {}
        for poll_s in a.polls:
            vals = sorted(
                r["verdict_latency_s"] for r in reps if r["poll_s"] == poll_s and "verdict_latency_s" in r
            )
            e2f = sorted(
                r["exit_to_nvml_free_s"] for r in reps if r["poll_s"] == poll_s and "exit_to_nvml_free_s" in r
            )
            if vals:
                res["latency_summary"][str(poll_s)] = {
                    "n": len(vals),
                    "min_s": vals[0],
                    "median_s": vals[len(vals) // 2],
                    "max_s": vals[-1],
                    "exit_to_nvml_free_median_s": e2f[len(e2f) // 2] if e2f else None,
                }
        checks["latency_measured"] = len(lat) == len(reps) and bool(reps)
        checks["verdict_within_goal"] = bool(lat) and max(lat) <= a.goal


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--gib", type=float, default=40)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--polls", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.02])
    ap.add_argument(
        "--exit-after", type=float, default=1.5, help="seconds the latency holders live after READY"
    )
    ap.add_argument("--threshold", type=float, default=0)
    ap.add_argument("--v1-allowance", type=float, default=gpu_nvml.DEFAULT_V1_RESERVED_ALLOWANCE_MIB)
    ap.add_argument("--goal", type=float, default=0.5)
    ap.add_argument("--no-cgroup", action="store_true", help="do not move the holder into a test cgroup")
    ap.add_argument("--standin", action="store_true", help="CPU smoke test of this script (no measurement)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    bench = Bench(args)
    res = bench.run()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / result_name("gpu_free_release")
    path.write_text(json.dumps(res, indent=2, default=str, sort_keys=True))
    print(
        json.dumps(
            {
                "ok": res["ok"],
                "checks": res["checks"],
                "latency_summary": res["latency_summary"],
                "idle_memory": res["idle_memory"],
                "result": str(path),
            },
            indent=2,
        )
    )
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
