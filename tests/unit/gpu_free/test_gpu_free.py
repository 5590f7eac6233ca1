"""gpu_free: the free-VRAM checkpoint, driven on a CPU host.

There is no GPU here, so NVML is replaced by ``StandInNVML`` below: a STAND-IN for the ``pynvml``
module with the same functions the checkpoint calls (count, handles, UUID, minor number, v1/v2
memory info, compute/graphics process lists) and pynvml's own error class. Everything around it is
real: the holders are real child processes of this test (``sleep``), their command lines,
environments and users are read from the real ``/proc``, the cgroup attribution tests move them
into real cgroups (``/sys/fs/cgroup``, root only), they are stopped with real signals and the
stand-in GPU's memory is released only when the real process has exited. The "device file" a real
holder keeps open (``/dev/nvidia0``) is a plain file in the test's temp dir, passed as ``dev_dir``.

The cgroup attribution: tests/unit/gpu_free/test_gpu_free_cgroups.py; the CLI, the testinfra check, the proof script
and the module's documentation: tests/unit/gpu_free/test_gpu_free_cli.py; the shared fixtures:
tests/unit/gpu_free_fixtures.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eagle3ops.gpu_free import check as gpu_check
from eagle3ops.gpu_free import holders as gpu_holders
from eagle3ops.gpu_free import nvml as gpu_nvml
from nvml_standin import StandInNVML, alive

REPO = Path(__file__).resolve().parents[3]

from gpu_free_fixtures import free_pid, run

# --------------------------------------------------------------------------- memory rule


def test_idle_gpus_are_free_with_v2_reserved_memory_reported_apart(dev, clock):
    nvml = StandInNVML([{"reserved": 615}, {"reserved": 615}])
    r = run(nvml, dev)
    assert r["free"] is True and r["changed"] is False
    assert [g["used_mib"] for g in r["gpus"]] == [0, 0]
    assert [g["reserved_mib"] for g in r["gpus"]] == [615, 615]
    assert {g["memory_source"] for g in r["gpus"]} == {"v2"}
    assert nvml.calls["v1"] == 0
    assert r["seconds_to_free"] == 0 and clock.sleeps == []  # free at the first look: no poll waited


def test_old_driver_falls_back_to_v1_minus_allowance(dev):
    # v1 says 615 MiB used on an idle GPU: the documented allowance takes it as reserved
    nvml = StandInNVML([{"reserved": 615}], v2=False)
    r = run(nvml, dev)
    g = r["gpus"][0]
    assert r["free"] and g["memory_source"] == "v1-minus-allowance"
    assert g["raw_used_mib"] == 615 and g["used_mib"] == 0 and g["reserved_mib"] == 615
    # the v2 call is given up after its first failure, not retried on every poll
    assert nvml.calls["v1"] == 1


def test_v1_allowance_is_not_a_blank_cheque(dev):
    # 3000 MiB used by nobody NVML lists: above the 1024 MiB allowance, so not free
    nvml = StandInNVML([{"reserved": 615, "other": 3000}], v2=False)
    with pytest.raises(gpu_nvml.GpuFreeError) as e:
        run(nvml, dev, timeout_s=0.2)
    g = e.value.details["gpus"][0]
    assert g["used_mib"] == pytest.approx(3615 - 1024) and not g["free"]
    assert "by no process NVML lists" in str(e.value)


def test_threshold_allows_small_usage(dev):
    nvml = StandInNVML([{"other": 40}])
    assert run(nvml, dev, threshold_mib=64)["free"]
    with pytest.raises(gpu_nvml.GpuFreeError):
        run(nvml, dev, threshold_mib=16, timeout_s=0.1)


def test_gpu_selection_by_index_and_uuid_and_unknown(dev):
    nvml = StandInNVML([{}, {"other": 5000}, {}])
    r = run(nvml, dev, gpus=["0", "GPU-standin-0002"])
    assert [g["index"] for g in r["gpus"]] == [0, 2]
    with pytest.raises(gpu_nvml.GpuFreeError, match=r"GPU '7' is not on .*3 GPU\(s\)"):
        run(nvml, dev, gpus=["7"])


# --------------------------------------------------------------------------- holders


def test_foreign_holder_fails_with_pid_user_cmdline_and_mib(dev, spawn, clock):
    p = spawn(0)
    nvml = StandInNVML([{"procs": {p.pid: 40960}}, {}])
    with pytest.raises(gpu_nvml.GpuFreeError) as e:
        run(nvml, dev, timeout_s=0.5, poll_s=0.02)
    # waited the timeout, not longer: polls of 0.02 s up to the deadline, the last one cut to it
    assert e.value.details["seconds_waited"] == 0.5 and clock.elapsed == pytest.approx(0.5)
    assert max(clock.sleeps) <= 0.02 and len(clock.sleeps) >= 25
    assert alive(p.pid), "a holder that is not allow-listed must never be signalled"
    (h,) = e.value.details["holders"]
    assert h["pid"] == p.pid and h["gpus"] == {0: 40960.0}
    assert h["user"] == "root" or h["user"] == os.environ.get("USER")
    assert h["cmdline"].startswith("sleep 300") and h["verified"] is True and h["allowed_by"] is None
    msg = str(e.value)
    assert f"PID {p.pid}" in msg and "GPU 0: 40960 MiB" in msg and "not allow-listed" in msg
    assert e.value.details["gpus"][1]["free"] is True


def test_holder_exiting_by_itself_within_timeout_passes(dev, spawn, clock):
    p = spawn(0)
    nvml = StandInNVML([{"procs": {p.pid: 1000}}])
    clock.at(0.3, lambda: (os.kill(p.pid, signal.SIGTERM), p.wait()))  # it ends 0.3 s into the wait
    r = run(nvml, dev, timeout_s=5, poll_s=0.02)
    assert r["free"] and r["changed"] is False and r["stopped"] == []
    assert 0.3 <= r["seconds_to_free"] <= 0.32  # the first look after it left, not the timeout


def test_allow_listed_by_run_id_in_environment_is_stopped(dev, spawn, clock):
    mine = spawn(0, env={gpu_holders.RUN_ID_VAR: "extract-42"})
    nvml = StandInNVML([{"procs": {mine.pid: 40960}}])
    r = run(nvml, dev, allow=gpu_holders.AllowList(run_ids=["extract-42"]))
    assert r["free"] and r["changed"]
    (s,) = r["stopped"]
    assert s["pid"] == mine.pid and s["allowed_by"] == "run_id:extract-42" and s["action"] == "stopped"
    assert mine.wait(timeout=60) == -signal.SIGTERM
    assert r["seconds_from_stop_to_free"] == 0  # the stop waited for its exit: free at the next look


def test_run_id_as_command_line_token_and_other_run_ids_untouched(dev, spawn):
    mine = spawn(0, argv0_marker=f"{gpu_holders.RUN_ID_VAR}=train-7")
    other = spawn(1, env={gpu_holders.RUN_ID_VAR: "train-8"})
    nvml = StandInNVML([{"procs": {mine.pid: 100}}, {"procs": {other.pid: 100}}])
    with pytest.raises(gpu_nvml.GpuFreeError) as e:
        run(nvml, dev, allow=gpu_holders.AllowList(run_ids=["train-7"]), timeout_s=0.5)
    assert not alive(mine.pid) and alive(other.pid)
    assert [h["pid"] for h in e.value.details["holders"]] == [other.pid]
    assert "run id train-8 is not allow-listed" in str(e.value)
    assert [s["pid"] for s in e.value.details["stopped"]] == [mine.pid]


def test_cmdline_pattern_and_sigkill_after_grace(dev, spawn):
    stubborn = spawn(0, ignore_term=True, argv0_marker="--eagle3ops-extract")
    nvml = StandInNVML([{"procs": {stubborn.pid: 500}}])
    t0 = time.monotonic()
    r = run(
        nvml,
        dev,
        allow=gpu_holders.AllowList(cmdline_patterns=[r"^sleep --eagle3ops-extract\b"]),
        grace_s=0.5,
    )
    assert r["free"] and r["stopped"][0]["action"] == "killed"
    assert stubborn.wait(timeout=60) == -signal.SIGKILL
    assert time.monotonic() - t0 >= 0.5  # SIGTERM was given its grace period first


def test_pattern_matching_everything_is_refused():
    with pytest.raises(gpu_nvml.GpuFreeError, match="matches an empty command line"):
        gpu_holders.AllowList(cmdline_patterns=[".*"])
    with pytest.raises(gpu_nvml.GpuFreeError, match="not a regular expression"):
        gpu_holders.AllowList(cmdline_patterns=["("])
    for broad in ("python3", "python", "^/usr/bin/python3", "sleep"):
        with pytest.raises(gpu_nvml.GpuFreeError, match="generic command line"):
            gpu_holders.AllowList(cmdline_patterns=[broad])
    for broad in ("*", "*.service", "s*"):
        with pytest.raises(gpu_nvml.GpuFreeError, match="list the GPU services by name"):
            gpu_holders.AllowList(units=[broad])
    # specific entries are fine
    gpu_holders.AllowList(
        cmdline_patterns=[r"python3 -m sglang\.launch_server"], units=["vllm.service", "sglang-*.service"]
    )


def test_check_mode_reports_what_would_be_stopped_and_stops_nothing(dev, spawn):
    mine = spawn(0, env={gpu_holders.RUN_ID_VAR: "r1"})
    nvml = StandInNVML([{"procs": {mine.pid: 4096}}])
    r = run(nvml, dev, allow=gpu_holders.AllowList(run_ids=["r1"]), check_mode=True)
    assert r["changed"] is True and r["check_mode"] is True
    assert [w["pid"] for w in r["would_stop"]] == [mine.pid] and r["would_stop"][0]["action"] == "would_stop"
    assert "stopped" not in r
    time.sleep(0.1)
    assert alive(mine.pid)
    # and without the allow-list, check mode predicts the failure
    with pytest.raises(gpu_nvml.GpuFreeError, match="check mode: 1 GPU"):
        run(nvml, dev, check_mode=True, timeout_s=0.2)
    assert alive(mine.pid)


def test_pid_of_another_namespace_is_reported_with_local_device_users(dev, spawn):
    ghost = free_pid()
    local = spawn(0, env={gpu_holders.RUN_ID_VAR: "not-ours"})  # a process of ours holding /dev/nvidia0
    nvml = StandInNVML([{"procs": {ghost: 30000}}], foreign={ghost})
    with pytest.raises(gpu_nvml.GpuFreeError) as e:
        run(
            nvml,
            dev,
            allow=gpu_holders.AllowList(run_ids=["ours"], cmdline_patterns=["^vllm"]),
            timeout_s=0.3,
        )
    by_pid = {h["pid"]: h for h in e.value.details["holders"]}
    assert set(by_pid) == {ghost, local.pid}
    assert by_pid[ghost]["visible"] is False and by_pid[ghost]["source"] == "nvml"
    assert by_pid[local.pid]["source"] == "device-file" and by_pid[local.pid]["allowed_by"] is None
    msg = str(e.value)
    assert f"PID {ghost} on GPU 0: not in this PID namespace" in msg
    assert f"PID {local.pid} (" in msg and "GPU 0: device file open" in msg and "may be the holder" in msg
    assert e.value.details["gpus"][0]["device_users"] == [local.pid]
    assert alive(local.pid)


def test_inside_a_container_the_allow_listed_local_process_behind_a_host_pid_is_stopped(dev, spawn):
    """NVML reports the host's PID (not in our /proc); our process with /dev/nvidia0 open is found by its
    device file, matched by run id, and stopped; the GPU frees when it exits (stand-in ``aliases``)."""
    host_pid = free_pid()
    local = spawn(0, env={gpu_holders.RUN_ID_VAR: "extract-9"})
    bystander = spawn(1, env={gpu_holders.RUN_ID_VAR: "extract-9"})  # same run id, but on a GPU that is free
    nvml = StandInNVML([{"procs": {host_pid: 50000}}, {}], aliases={host_pid: local.pid})
    allow = gpu_holders.AllowList(run_ids=["extract-9"])
    r = run(nvml, dev, allow=allow, check_mode=True)
    assert r["free"] and [w["pid"] for w in r["would_stop"]] == [local.pid] and alive(local.pid)
    r = run(nvml, dev, allow=allow)
    assert r["free"] and [(x["pid"], x["source"]) for x in r["stopped"]] == [(local.pid, "device-file")]
    assert local.wait(timeout=60) == -signal.SIGTERM and alive(bystander.pid)


def test_memory_used_by_no_listed_process_names_the_device_users(dev, spawn):
    local = spawn(1)
    nvml = StandInNVML([{}, {"other": 2048}])
    with pytest.raises(gpu_nvml.GpuFreeError) as e:
        run(nvml, dev, timeout_s=0.2)
    assert (
        f"GPU 1: 2048 MiB used (> 0) by no process NVML lists; processes here with its device file open: [{local.pid}]"
        in str(e.value)
    )


def test_visible_pid_without_nvidia_device_open_is_unverified_and_not_stopped(dev, spawn):
    # NVML's PID number exists here but that process has no /dev/nvidia* open: it is somebody else
    bystander = spawn(0, hold=False, env={gpu_holders.RUN_ID_VAR: "r9"})
    nvml = StandInNVML([{"procs": {bystander.pid: 1000}}])
    with pytest.raises(gpu_nvml.GpuFreeError) as e:
        run(nvml, dev, allow=gpu_holders.AllowList(run_ids=["r9"]), timeout_s=0.3)
    (h,) = e.value.details["holders"]
    assert h["verified"] is False and h["allowed_by"] is None
    assert "no /dev/nvidia* open here" in h["hint"]
    assert alive(bystander.pid)


def test_no_driver_fails_clearly_or_skips_when_not_required(monkeypatch):
    """Real: this CPU host has no libnvidia-ml, so the real pynvml.nvmlInit fails."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this host has an NVIDIA driver")
    with pytest.raises(gpu_nvml.NoDriver, match=r"NVML could not initialise .*gpu_free_gpu_required: false"):
        gpu_check.ensure_free()
    r = gpu_check.ensure_free(gpu_required=False)
    assert r["skipped"] is True and r["changed"] is False and "gpu_required is false" in r["msg"]


def test_no_usable_nvml_on_a_host_with_nvidia_devices_is_never_skipped(dev):
    """Real pynvml.nvmlInit failing (no driver library here) while ``dev`` (standing in for /dev) has
    nvidiactl: a GPU host with a broken driver must fail even with gpu_required false."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this host has an NVIDIA driver")
    with pytest.raises(gpu_nvml.NoDriver, match="this host has NVIDIA GPUs: not skipping"):
        gpu_check.ensure_free(gpu_required=False, dev_dir=str(dev))


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_unprivileged_run_cannot_verify_a_root_holder_and_never_signals_it(dev, spawn):
    """Run the check as user nobody (setpriv) against a root-owned holder: its open files cannot be read,
    so it is reported as unverified (run as root) and left alone, even though the pattern matches it."""
    p = spawn(0, argv0_marker="--e3t-marker")
    code = f"""
import json, sys
sys.path[:0] = [{str(REPO / "python")!r}, {str(REPO / "tests" / "unit")!r}]
from eagle3ops.gpu_free.check import GpuFreeError, ensure_free
from eagle3ops.gpu_free.holders import AllowList
from nvml_standin import StandInNVML
try:
    ensure_free(nvml=StandInNVML([{{"procs": {{{p.pid}: 512}}}}]), dev_dir={str(dev)!r}, timeout_s=0.3,
                poll_s=0.05, allow=AllowList(cmdline_patterns=["^sleep --e3t-marker"]))
except GpuFreeError as e:
    print(json.dumps(e.details["holders"]))
"""
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    (h,) = json.loads(r.stdout.strip().splitlines()[-1])
    assert h["pid"] == p.pid and h["visible"] is True and h["verified"] is None and h["allowed_by"] is None
    assert "cannot read its open files (run as root)" in h["hint"]
    assert alive(p.pid)
