"""gpu_free from the outside (tests/unit/gpu_free/test_gpu_free.py has the checkpoint itself): the ``eagle3ops gpu-free``
CLI without a driver; the testinfra check (tests/infra/test_gpu_free.py) failing on a held GPU and passing on a
free one, with a STAND-IN nvidia-smi; bench/gpu_free_release.py's GPU proof end to end on the stand-ins; the
module's documentation against its options.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from proc_helpers import run_infra

REPO = Path(__file__).resolve().parents[3]
MIB = 1024 * 1024

# --------------------------------------------------------------------------- the CLI


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    r = subprocess.run(
        [sys.executable, "-m", "eagle3ops", "gpu-free", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this host has an NVIDIA driver")
def test_cli_without_driver_fails_with_what_to_do_or_skips_when_optional():
    rc, out, err = _cli("--timeout", "1")
    assert rc == 2 and out["failed"] and "gpu_free_gpu_required: false" in out["msg"]
    assert "NVML could not initialise" in err
    rc, out, _ = _cli("--no-gpu-required", "--check")
    assert rc == 0 and out["skipped"] is True and out["changed"] is False


# --------------------------------------------------------------------------- the testinfra check can fail

NVIDIA_SMI = """#!/bin/bash
# STAND-IN nvidia-smi (no GPU here): answers the two CSV queries tests/infra/test_gpu_free.py makes.
case "$*" in
  *--query-gpu=*) printf '0, GPU-a, %s, 143771\\n1, GPU-b, 0, 143771\\n' "$USED0" ;;
  *--query-compute-apps=*) [ "$USED0" != 0 ] && echo "GPU-a, 4242, $USED0, python3" ;;
esac
exit 0
"""


def test_infra_check_fails_on_held_gpu_and_passes_on_free(tmp_path):
    """Runs tests/infra/test_gpu_free.py on this machine (local://) with a STAND-IN nvidia-smi on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bindir / "nvidia-smi").chmod(0o755)
    outcomes = {}
    for used in ("40960", "0"):
        env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "USED0": used}
        env.pop("EAGLE3OPS_GPU_FREE_THRESHOLD_MIB", None)
        r = run_infra(
            "--hosts=local://",
            str(REPO / "tests/infra/test_gpu_free.py::test_every_gpu_has_free_memory_and_no_process"),
            env=env,
        )
        outcomes[used] = (r.returncode, r.stdout)
    rc, out = outcomes["40960"]
    assert rc == 1 and "GPU 0: 40960 / 143771 MiB used" in out and "PID 4242 python3" in out, out
    rc, out = outcomes["0"]
    assert rc == 0 and "1 passed" in out, out


def test_gpu_proof_script_runs_end_to_end_on_the_standins(tmp_path):
    """bench/gpu_free_release.py --standin: the GPU proof's own flow (CLI failure naming the holder, check
    mode, allow-listed stop, latency loop) on StandInNVML and a holder that only keeps the stand-in device
    file open: a smoke test of the script, not a measurement."""
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/gpu_free_release.py"),
            "--standin",
            "--reps",
            "1",
            "--polls",
            "0.05",
            "--exit-after",
            "0.3",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (written,) = tmp_path.glob("gpu_free_release_*.json")  # named by bench/result_name.py
    res = json.loads(written.read_text())
    assert res["ok"] and res["checks"]["failure_names_pid"] and res["checks"]["holder_got_sigterm"]
    assert (
        res["fail_cli"]["rc"] == 2 and res["stop_cli"]["result"]["stopped"][0]["pid"] == res["holder"]["pid"]
    )
    assert res["latency_summary"]["0.05"]["max_s"] <= 0.5
    assert not list(Path("/sys/fs/cgroup").glob("*/eagle3ops-bench.slice")), "bench left a cgroup behind"


def test_module_documentation_parses_and_matches_its_options():
    import yaml
    from library_docs import module_docs

    docs, spec = module_docs(REPO / "library/eagle3ops_gpu_free.py")
    assert spec and set(docs["DOCUMENTATION"]["options"]) == set(spec)
    role_defaults = yaml.safe_load((REPO / "roles/gpu_free/defaults/main.yml").read_text())
    assert all(k.startswith("gpu_free_") for k in role_defaults)
    assert role_defaults["gpu_free_gpu_required"] is False  # the local CPU default skips
