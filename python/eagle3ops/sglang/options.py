"""The SGLang capture path's options, once: ``eagle3ops extract-sglang`` and ``eagle3ops sglang-patch``, the
``eagle3ops_extract_sglang`` and ``eagle3ops_sglang_patch`` modules and their roles' variables come from here
(eagle3ops.options says how; standard library only, shipped as module_utils/eagle3ops_sglang_options.py). The store
options they share with the transformers backend are extract's (eagle3ops.extract.options)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
    from eagle3ops.extract import options as _x
    from eagle3ops.sglang import versions as _versions
except ImportError:  # on a target without eagle3ops: the copies Ansible ships
    from ansible.module_utils import eagle3ops_extract_options as _x
    from ansible.module_utils import eagle3ops_options as _o
    from ansible.module_utils import eagle3ops_sglang_versions as _versions

Option, Command, EXECUTABLE = _o.Option, _o.Command, _o.EXECUTABLE
count, seconds = _o.count, _o.seconds
DATA, MODEL, LAYER_IDS, LAYER_CONVENTION, DTYPE = (
    _x.DATA,
    _x.MODEL,
    _x.LAYER_IDS,
    _x.LAYER_CONVENTION,
    _x.DTYPE,
)
MARGIN, DISK_MARGIN_MIB, LIMIT, WAIT_RUNNING = _x.MARGIN, _x.DISK_MARGIN_MIB, _x.LIMIT, _x.WAIT_RUNNING
PVE_STORAGE = _x.PVE_STORAGE
TRUST_REMOTE_CODE = _x.TRUST_REMOTE_CODE
JOB_FILE, PROGRESS, REASSIGN_RANKS, REASSIGN_FROM_DATA = (
    _x.JOB_FILE,
    _x.PROGRESS,
    _x.REASSIGN_RANKS,
    _x.REASSIGN_FROM_DATA,
)
# an existing dump adopted before the rows are sent: the transformers backend's options and role variables
ADOPT = [o.but(role=f"extract_{o.name}") for o in _x.ADOPT]

SGLANG_EXTRACT = Command(
    "extract-sglang",
    help="extract hidden states through a patched SGLang server (resumable)",
    check_help="report what would be sent; contact no server, write nothing",
    module="eagle3ops_extract_sglang",
    role="extract",
    role_prefix="extract_sglang",
    options=[
        DATA.but(role="extract_data_dir"),
        MODEL.but(
            doc="The target model directory the server serves (its config gives layers and hidden size)."
        ),
        TRUST_REMOTE_CODE,
        Option(
            "url",
            "list",
            elements="str",
            default=["http://127.0.0.1:30000"],
            doc=(
                "Base URLs of this host's capture servers - one, or several (data parallel, e.g. "
                "two TP-4 servers on an 8-GPU node) - the host's rows are split between them, "
                "each server with its own C(EAGLE3OPS_SGLANG_MANIFEST_RANK) (docs/sglang.md). A "
                "single string is one server."
            ),
            role_value="{{ eagle3ops_sglang_urls }}",
        ),
        _x.WORLD_SIZE.but(  # the role computes it from extract_shard_hosts (each host brings one rank a server)
            doc=[
                (
                    "Several hosts share the rows (docs/scale.md) - the number of capture servers "
                    "over all of them. Needs O(first_rank). Omitted - this host extracts every row "
                    "(its servers share them)."
                ),
                (
                    "The extract role computes it from the inventory (C(extract_shard_hosts), one "
                    "rank per server)."
                ),
            ],
        ),
        _x.FIRST_RANK.but(
            doc=[
                (
                    "With O(world_size) - this host's servers take the global ranks O(first_rank) .. "
                    "O(first_rank) + servers - 1, in O(url) order (rows C(r), C(r + world_size), ... "
                    "of each rank C(r)), the transformers backend's shares."
                ),
                (
                    "The store records them in C(hidden_states/shard.json); a later run with other "
                    "ranks or another world size fails naming both."
                ),
            ],
        ),
        REASSIGN_RANKS,
        REASSIGN_FROM_DATA,
        LAYER_IDS.but(
            role="extract_layer_ids",
            doc=(
                "Aux layer ids (default C([2, N//2, N-3])); must match the server's "
                "C(EAGLE3OPS_SGLANG_LAYER_IDS)."
            ),
        ),
        LAYER_CONVENTION.but(role="extract_layer_convention"),
        DTYPE.but(role="extract_dtype"),
        count(
            "concurrency",
            default=8,
            doc="C(/generate) requests in flight.",
        ),
        Option(
            "request_timeout",
            "float",
            default=600.0,
            above=0,
            doc="Seconds one C(/generate) may take before it is retried.",
        ),
        Option(
            "retries",
            "int",
            default=5,
            minimum=0,
            doc="retries per row (5xx, 408, 429, timeouts, connection errors)",
        ),
        seconds("backoff", default=1.0, param=False, doc="first retry delay (s); doubles, with jitter"),
        seconds("backoff_max", default=60.0, param=False, doc="longest retry delay (s)"),
        seconds(
            "health_timeout",
            default=1800.0,
            doc="Seconds to wait for C(/health) (loading a large model takes minutes).",
        ),
        seconds("confirm_timeout", default=120.0, param=False, doc="wait this long for a row's file"),
        LIMIT.but(role="extract_limit"),
        Option(
            "server_unit",
            "list",
            elements="str",
            doc=(
                "The systemd units to start before and stop after - one, or one per I(url) in the same "
                "order (role C(sglang) installs C(eagle3ops-sglang-extract), or "
                "C(eagle3ops-sglang-extract-0) .. C(-N) for several servers). A single string is one unit; none: "
                "attach to the servers already answering at I(url)."
            ),
            # the sglang phase's unit names, derived in roles/extract/vars/main.yml (one line here is too long)
            role_value="{{ extract_sglang_units }}",
        ),
        count(
            "server_pid",
            param=False,
            doc="the attached server's PID: when it dies, stop waiting for /health at once (exit 2)",
        ),
        Option(
            "keep_server",
            "bool",
            default=False,
            doc="Leave I(server_unit) running at the end.",
        ),
        Option(
            "restore_patch",
            "path",
            metavar="FILE",
            role=False,  # the role restores the patch with eagle3ops_sglang_patch (extract_sglang_restore_patch)
            doc="The patched C(deepseek_v2.py) to restore when every row is done.",
        ),
        Option(
            "restore_patch_always", "bool", default=False, role=False, doc="restore even when rows failed"
        ),
        Option(
            "sglang_version",
            default=_versions.DEFAULT_VERSION,
            role="extract_sglang_version",
            role_choices=list(_versions.KNOWN),
            doc=[
                ("The server's SGLang version; I(restore_patch) is checked against its capture patch."),
                f"One of the versions in C(eagle3ops.sglang.versions) ({', '.join(_versions.KNOWN)}); another "
                "is refused with that list.",
            ],
            role_value="{{ eagle3ops_sglang_version }}",
        ),
        MARGIN.but(role="extract_margin"),
        DISK_MARGIN_MIB.but(role="extract_disk_margin_mib"),
        PVE_STORAGE,
        *ADOPT,
        WAIT_RUNNING,
        JOB_FILE,
        PROGRESS,
        EXECUTABLE.but(
            role="extract_executable",
            role_pass="",
        ),
    ],
)

SGLANG_PATCH = Command(
    "sglang-patch",
    help="the SGLang capture patch: status, apply, restore (byte-exact)",
    check_help="only report what would change",
    module="eagle3ops_sglang_patch",  # the sglang, extract and serve roles each pass their own variables
    exclusive=[("file", "python", "site_packages")],
    options=[
        Option(
            "action",
            positional=True,
            choices=["status", "apply", "restore"],
            param=False,  # the module's state: present -> apply, absent -> restore, query -> status
            doc="what to do",
        ),
        Option(
            "state",
            default="present",
            choices=["present", "absent", "query"],
            cli=False,
            doc=(
                "C(present) applies the patch, C(absent) restores the pristine file, C(query) only reports."
            ),
        ),
        Option(
            "file",
            "path",
            param="path",
            doc="The C(deepseek_v2.py) to manage. Give this, I(python) or I(site_packages).",
        ),
        Option(
            "python",
            "path",
            doc=(
                "The SGLang venv's interpreter; the file is found through it without importing "
                "SGLang (no GPU needed)."
            ),
        ),
        Option(
            "site_packages",
            "path",
            doc="A directory that holds C(sglang/).",
        ),
        Option(
            "sglang_version",
            default=_versions.DEFAULT_VERSION,
            doc="The SGLang version the patch entry is for.",
        ),
        Option("diff", "bool", default=False, param=False, doc="include the unified diff of the change"),
        EXECUTABLE,
    ],
)
