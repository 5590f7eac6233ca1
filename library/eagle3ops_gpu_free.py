#!/usr/bin/python
# Thin wrapper over `eagle3ops gpu-free --json` (logic: python/eagle3ops/gpu.py).
from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3ops_gpu_free
short_description: Assert that every (selected) GPU's memory is free; name and optionally stop the holders
description:
  - Reads NVIDIA's management library (NVML, through C(nvidia-ml-py)), never C(nvidia-smi) output, and waits
    until every selected GPU is free, polling every O(poll_interval) seconds for at most O(timeout) seconds.
  - B(Free) means NVML lists no running compute or graphics process on the GPU and its B(used) memory is at most
    O(threshold_mib).
  - B(Used memory rule.) Where the driver has NVML's v2 memory struct, its C(used) is taken as is; the v2 struct
    reports the memory the driver reserves for itself apart, as C(reserved) (an idle H200 reads used 0 MiB,
    reserved 615 MiB, which is what C(nvidia-smi) shows as 0 MiB). Drivers without the v2 struct only have the v1
    struct, whose C(used) B(includes) that reservation (615 MiB on the idle H200); there, used = v1 used minus
    O(v1_reserved_allowance_mib) (floored at 0) and the allowance is reported as C(reserved).
    RV(gpus[].memory_source) says which rule gave each figure.
  - Every holder is named with PID, user, command line, MiB per GPU, and the systemd unit and/or container it runs in
    (read from C(/proc/PID/cgroup)); a holder inside a system service gets the hint to add that service to the
    C(services) phase. NVML reports PIDs as the driver sees them (the host's PID namespace); a PID absent from this
    host's C(/proc), or present but without any C(/dev/nvidia*) file open, is reported as belonging to another PID
    namespace and is never signalled. The processes here that have that GPU's C(/dev/nvidiaN) open are then taken
    as its holders (C(source=device-file)), named, and stopped when allow-listed (the LXC container case).
  - Stopping is opt-in and narrow. Only verified holders matched by O(stop_units), O(stop_cmdline_patterns) or
    O(stop_run_ids) are stopped (C(systemctl stop) for an allow-listed service when systemd runs, else SIGTERM, then
    SIGKILL after O(stop_grace) seconds); everything else holding memory fails the task with the full list.
  - Check mode reads the GPUs, reports in RV(would_stop) what would be stopped, and stops nothing.
  - Without an NVIDIA driver the task fails with what to do, or is skipped when O(gpu_required=false).
version_added: "0.1.0"
extends_documentation_fragment:
  - eagle3ops
options:
  gpus:
    description: Which GPUs; C(all), or NVML indices and/or GPU UUIDs. NVML ignores C(CUDA_VISIBLE_DEVICES).
    type: list
    elements: str
    default: [all]
  threshold_mib:
    description: Used MiB (by the rule above) still counted as free.
    type: float
    default: 0
  timeout:
    description: Seconds to wait for the GPUs to be free (holders that exit by themselves in that time are fine).
    type: float
    default: 60
  poll_interval:
    description: Seconds between two NVML readings (one reading of 8 GPUs takes well under a millisecond).
    type: float
    default: 0.1
  stop_grace:
    description: Seconds between SIGTERM and SIGKILL for an allow-listed holder.
    type: float
    default: 15
  stop_units:
    description:
      - systemd unit names (shell globs such as C(sglang-*.service)) whose processes may be stopped.
      - A glob that also matches C(sshd.service), C(cron.service) and the like (C(*), C(*.service)) is refused.
    type: list
    elements: str
    default: []
  stop_cmdline_patterns:
    description:
      - Python regular expressions (searched in the command line) of processes that may be stopped.
      - A pattern that matches an empty command line (C(.*)) or a generic one (C(python3), C(bash), C(sleep 1))
        is refused. Name the program (C(sglang\\.launch_server), C(speculators.*extract)).
    type: list
    elements: str
    default: []
  stop_run_ids:
    description:
      - Our own run ids; a process whose environment holds C(EAGLE3OPS_RUN_ID=<id>), or whose command line has the
        token C(EAGLE3OPS_RUN_ID=<id>), may be stopped.
    type: list
    elements: str
    default: []
  gpu_required:
    description:
      - When false, a host without a usable NVIDIA driver skips the check instead of failing.
      - A host that has C(/dev/nvidiactl) (NVIDIA GPUs) but no usable NVML still fails, so the checkpoint is never
        skipped silently on a GPU host.
    type: bool
    default: true
  v1_reserved_allowance_mib:
    description: MiB of the v1 struct's C(used) taken as driver-reserved on drivers without the v2 struct.
    type: float
    default: 1024
notes:
  - Supports check mode (predicts C(changed=true) when an allow-listed holder would be stopped) and diff mode
    (the holders before, what is left after).
author: eagle3ops developers (@eagle3ops)
"""

EXAMPLES = r"""
- name: All eight GPUs must be free before training; our own extraction run may be stopped
  eagle3ops_gpu_free:
    gpus: [all]
    timeout: 120
    stop_run_ids: ["{{ extract_run_id }}"]
    stop_units: [sglang-extract.service]

- name: CPU-only local default - skip cleanly
  eagle3ops_gpu_free:
    gpu_required: false
"""

RETURN = r"""
free:
  description:
    - True when every selected GPU was free (null when skipped).
    - In check mode, whether they would be free once the holders in RV(would_stop) were stopped.
  returned: always
  type: bool
gpus:
  description: One entry per selected GPU as last read.
  returned: unless skipped
  type: list
  elements: dict
  contains:
    index: {description: NVML index, type: int}
    uuid: {description: GPU UUID, type: str}
    total_mib: {description: Total memory in MiB, type: float}
    used_mib: {description: Used MiB by the rule in the description, type: float}
    reserved_mib: {description: Driver-reserved MiB (v2) or the v1 allowance applied, type: float}
    memory_source: {description: C(v2) or C(v1-minus-allowance), type: str}
    pids: {description: PIDs NVML lists on this GPU, type: list}
    free: {description: Whether this GPU is free, type: bool}
initial:
  description: The GPUs as first read, before anything was stopped.
  returned: unless skipped
  type: list
seconds_to_free:
  description: Seconds from the start of the task until every selected GPU read free.
  returned: when free
  type: float
seconds_from_stop_to_free:
  description: Seconds from the end of the last stop action until every GPU read free.
  returned: when something was stopped
  type: float
stopped:
  description: The holders stopped (pid, user, cmdline, gpus, unit, container, allowed_by, action).
  returned: unless check mode or skipped
  type: list
would_stop:
  description: In check mode, the holders that would be stopped.
  returned: in check mode
  type: list
holders:
  description: The holders still blocking (on failure; each with a C(hint) saying what to do).
  returned: always
  type: list
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner
from ansible.module_utils.eagle3ops_gpu_free_options import GPU_FREE


def _holder_line(h):
    gpus = ",".join(str(g) for g in sorted(h.get("gpus") or {}, key=str))
    owner = h.get("unit") or h.get("container") or "-"
    return f"PID {h.get('pid')} GPU {gpus} {owner} {h.get('cmdline') or '(not visible here)'}\n"


def main():
    module = AnsibleModule(argument_spec=GPU_FREE.argument_spec(), supports_check_mode=True)
    result = CliRunner(module, GPU_FREE).run()
    result.pop("failed", None)
    if result.get("skipped"):
        module.exit_json(**result)
    acted = result.get("would_stop") or result.get("stopped") or []
    if acted and module._diff:
        before = "".join(_holder_line(h) for h in acted)
        result["diff"] = {
            "before_header": "GPU holders",
            "before": before,
            "after_header": "GPU holders",
            "after": "",
        }
    result["changed"] = bool(acted)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
