"""The gpu_free phase's options, once: ``eagle3ops gpu-free``'s CLI, the ``eagle3ops_gpu_free`` module's parameters
and the ``gpu_free`` role's variables come from here (eagle3ops.options says how; standard library only,
shipped as module_utils/eagle3ops_gpu_free_options.py).
"""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, EXECUTABLE = _o.Option, _o.Command, _o.EXECUTABLE
seconds = _o.seconds


def _allow_list(name, flag, metavar, doc):
    """Who may be stopped, one kind: repeatable, empty by default (nobody)."""
    return Option(
        name,
        "list",
        elements="str",
        nargs="append",
        default=[],
        flag=flag,
        metavar=metavar,
        doc=doc,
    )


GPU_FREE = Command(
    "gpu-free",
    help="assert free VRAM on every (selected) GPU, naming and optionally stopping the holders",
    description=(
        "Wait until the GPUs' memory is free, stopping only allow-listed holders. Exit 0 with free: true (or "
        "skipped: true with --no-gpu-required on a host without the NVIDIA driver); exit 2 with the full holder "
        "list when a GPU is still held after --timeout."
    ),
    check_help="report what would be stopped; stop nothing",
    module="eagle3ops_gpu_free",
    role="gpu_free",
    options=[
        Option(
            "gpus",
            "list",
            elements="str",
            default=["all"],
            doc=(
                "Which GPUs; C(all), or NVML indices and/or GPU UUIDs. NVML ignores C(CUDA_VISIBLE_DEVICES)."
            ),
        ),
        Option(
            "threshold_mib",
            "float",
            default=0,
            minimum=0,
            doc="Used MiB (by the rule above) still counted as free.",
        ),
        seconds(
            "timeout",
            default=60,
            doc=(
                "Seconds to wait for the GPUs to be free (holders that exit by themselves in "
                "that time are fine)."
            ),
        ),
        Option(
            "poll_interval",
            "float",
            default=0.1,
            above=0,
            doc=("Seconds between two NVML readings (one reading of 8 GPUs takes well under a millisecond)."),
        ),
        seconds(
            "stop_grace",
            default=15,
            doc="Seconds between SIGTERM and SIGKILL for an allow-listed holder.",
        ),
        _allow_list(
            "stop_units",
            "--stop-unit",
            "UNIT",
            doc=[
                "The systemd unit names (shell globs such as C(sglang-*.service)) whose processes may be stopped.",
                "A glob that also matches C(sshd.service), C(cron.service) and the like (C(*), "
                "C(*.service)) is refused.",
            ],
        ),
        _allow_list(
            "stop_cmdline_patterns",
            "--stop-cmdline",
            "REGEX",
            doc=[
                "Python regular expressions (searched in the command line) of processes that may be stopped.",
                "A pattern that matches an empty command line (C(.*)) or a generic one "
                "(C(python3), C(bash), C(sleep 1)) is refused. Name the program "
                "(C(sglang\\\\.launch_server), C(speculators.*extract)).",
            ],
        ),
        _allow_list(
            "stop_run_ids",
            "--stop-run-id",
            "ID",
            doc="Our own run ids; a process whose environment holds C(EAGLE3OPS_RUN_ID=<id>), or "
            "whose command line has the token C(EAGLE3OPS_RUN_ID=<id>), may be stopped.",
        ),
        Option(
            "gpu_required",
            "bool",
            default=True,
            role_default=False,  # the local CPU default skips; GPU inventories set gpu_free_gpu_required: true
            doc=[
                ("When false, a host without a usable NVIDIA driver skips the check instead of failing."),
                (
                    "A host that has C(/dev/nvidiactl) (NVIDIA GPUs) but no usable NVML still fails, "
                    "so the checkpoint is never skipped silently on a GPU host."
                ),
            ],
        ),
        Option(
            "v1_reserved_allowance_mib",
            "float",
            default=1024,
            minimum=0,
            doc=("MiB of the v1 struct's C(used) taken as driver-reserved on drivers without the v2 struct."),
        ),
        EXECUTABLE.but(role=False),  # the role passes gpu_free_executable, its "" meaning "beside the Python"
    ],
)
