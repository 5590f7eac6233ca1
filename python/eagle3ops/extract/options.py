"""The extract phase's options, once: ``eagle3ops extract|status|workers|lengths|verify``, the ``eagle3ops_extract``
module and the ``extract`` role's variables come from here (the SGLang backend's own: eagle3ops.sglang.options, which
takes the store options from here)
(eagle3ops.options says how; standard library only, shipped as module_utils/eagle3ops_extract_options.py)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copies Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, Group, EXECUTABLE = _o.Option, _o.Command, _o.Group, _o.EXECUTABLE
data_dir, one_of, target_model = _o.data_dir, _o.one_of, _o.target_model
trust_remote_code = _o.trust_remote_code
count, seconds = _o.count, _o.seconds


def _report(name: str, help: str, options: list) -> Command:
    """The read-only ``extract-<name>`` command: no module, no check mode."""
    return Command(f"extract-{name}", help=help, check=False, options=options)


# ---- shared by both backends -------------------------------------------------------------------------
# several hosts share the rows (docs/scale.md); the extract role computes both from extract_shard_hosts, and
# extract-sglang takes the same two with its servers in place of the workers
WORLD_SIZE = count(
    "world_size",
    role=False,
    doc=[
        (
            "Several hosts share the rows (docs/scale.md) - the number of shards over all of "
            "them, the sum of every host's workers. Needs O(first_rank). Omitted - this host "
            "extracts every row (its O(workers) share them)."
        ),
        "The extract role computes it from the inventory (C(extract_shard_hosts)).",
    ],
)
FIRST_RANK = Option(
    "first_rank",
    "int",
    minimum=0,
    role=False,
    doc=[
        (
            "With O(world_size) - this host's workers take the global ranks O(first_rank) .. "
            "O(first_rank) + workers - 1 (rows C(r), C(r + world_size), ... of each rank "
            "C(r))."
        ),
        (
            "The store records them in C(hidden_states/shard.json); a later run with other "
            "ranks or another world size fails naming both (the shards would move and rows "
            "be extracted twice)."
        ),
    ],
)
REASSIGN_RANKS = Option(
    "reassign_ranks",
    "list",
    elements="int",
    role=False,  # the role computes them from extract_reassign_from (the lost hosts' ranks)
    doc=[
        (
            'On request, the global ranks of lost hosts (docs/scale.md, "A host that stays lost") - their rows '
            "are dealt over the surviving ranks of O(world_size) (the j-th lost row to the j mod S-th survivor), so "
            "every row is still extracted exactly once. Needs O(world_size) and O(first_rank); this host's own "
            "ranks must not be among them."
        ),
        (
            "The store records the re-assignment in C(hidden_states/shard.json); a later run with other lost ranks "
            "or none fails naming them. The extract role computes them from C(extract_reassign_from)."
        ),
    ],
)
REASSIGN_FROM_DATA = Option(
    "reassign_from_data",
    "list",
    elements="path",
    role=False,  # the role passes extract_reassign_data[lost host] when set
    doc=(
        "With O(reassign_ranks) - the lost hosts' data directories as readable on this host (their disk mounted, "
        "a shared path, a copy). The finished rows this host takes over are copied from there into this store, "
        "each checked against its manifest line (size, content checksum, header), instead of extracted again; the "
        "lost part is only read."
    ),
)
DATA = data_dir(
    "data",
    param="data_dir",
    doc="Prepared data directory (output of the C(prepare) phase); C(hidden_states/) is written inside it.",
)
MODEL = target_model(
    "model",
    "transformers format; for sglang, as the server serves it",
    role="extract_model_path",
    doc="Target model directory (transformers format, local).",
    role_value="{{ eagle3ops_model_path }}",
)
TRUST_REMOTE_CODE = trust_remote_code("config")
LAYER_IDS = Option(
    "layer_ids",
    "list",
    elements="int",
    doc=(
        "Aux layer ids. Default C([2, N//2, N-3]) for an N-layer target (Kimi-K2.5 with "
        "61 layers gets C([2, 30, 58]))."
    ),
    role_value="{{ eagle3ops_layer_ids }}",
)
LAYER_CONVENTION = one_of(
    "layer_convention",
    ["input", "output"],
    doc=[
        "C(input) (id i names the input of layer i; SGLang, vLLM, speculators) or C(output) (SpecForge, ModelOpt)."
    ],
)
DTYPE = one_of(
    "dtype",
    ["bfloat16", "float16", "float32", "float8_e4m3fn"],
    doc=[
        "Stored dtype of the hidden states.",
        (
            "C(float8_e4m3fn) halves the bytes; it stores e4m3 plus a float32 scale per "
            "token and state (C(hidden_states_scales)), which speculators 0.9.0 reads with "
            "C(data.hidden_states_backend=fp8)."
        ),
    ],
    role_value="{{ eagle3ops_extract_dtype }}",
)
MARGIN = Option(
    "margin",
    "float",
    default=0.05,
    minimum=0,
    doc="Free-space margin over the exact need, as a fraction.",
)
DISK_MARGIN_MIB = Option(
    "disk_margin_mib",
    "float",
    default=64.0,
    minimum=0,
    doc=["Free space kept on top of the exact need and O(margin), in MiB (the preflight refuses below it)."],
)
PVE_STORAGE = Option(
    "pve_storage",
    "dict",
    as_json=True,
    default={},
    role=False,  # the role passes what eagle3ops_extract_pve_usage found on the PVE host
    doc=[
        "The PVE storage underneath the data directory, as C(eagle3ops_extract_pve_usage) reports it on the PVE "
        "host (C(storage), C(type), C(total), C(used), C(avail) in bytes; C(metadata_percent) for a thin pool).",
        "The disk preflight then also refuses an extraction whose bytes (with the margins) do not fit the "
        "storage's available bytes, naming the storage and the numbers: C(statvfs) inside a container cannot "
        "see an LVM-thin or Ceph pool running out underneath its volume.",
    ],
)
LIMIT = count(
    "limit",
    doc="Only the first N rows (smoke runs).",
    role_value="{{ eagle3ops_extract_limit }}",
)
WAIT_RUNNING = seconds(
    "wait_running",
    default=0,
    metavar="SECONDS",
    role=False,  # the role passes extract_async_timeout when its plan found a run in progress
    doc=[
        "Check mode only; while another run holds O(data_dir) (an interrupted playbook's extraction), wait up to "
        "this many seconds for it to end (its lock to be free) before planning. 0 does not wait."
    ],
)
PROGRESS = Option(
    "progress", "bool", default=True, param=False, module_value=False, doc="a progress bar on stderr"
)
JOB_FILE = Option(
    "job_file",
    "path",
    cli=False,
    role=False,  # the role passes the results file of the async job it started
    doc=[
        "Check mode only; the C(results_file) of the Ansible async job that runs the extraction (the task started "
        "with C(poll=0)). The result's RV(job_finished) says whether that job has ended, and RV(progress) how far "
        "the run is (rows done of this host's, rows/s from the manifests' file times, ETA, the run's log), so a "
        "task that polls with C(until) shows the progress at each poll."
    ],
)
# ---- adopting a dump made by another tool (docs/data-format.md, "Adopting an existing dump") ----------------
ADOPT_FROM = Option(
    "adopt_from",
    "path",
    doc=[
        (
            "An existing hidden-state dump to adopt in place before extracting - C(rows_*/) folders of per-sample "
            "C(torch.save) dicts (C(.pt), C(.ckpt); the SpecForge offline layout) or our own safetensors samples. "
            "Each file is matched to a prepared row by a hash of its token ids, its length and shapes checked from "
            "its metadata (with O(adopt_checksum) every byte, against the zip's own crc32s), and recorded in "
            "C(hidden_states/adopted.jsonl) where it lies; no byte is copied."
        ),
        (
            "Damaged, truncated, duplicated, unmatched and wrong-shaped files are listed in the result and their "
            "rows extracted, as are the rows the dump lacks. What the dump holds is declared by "
            "O(adopt_layer_ids), O(adopt_layer_convention), O(adopt_last_state), O(adopt_keys) or its sidecar "
            "C(eagle3ops-dump.json), never guessed; a dump of other layers or a post-norm last state is refused "
            "naming both."
        ),
    ],
)
ADOPT_LAYER_IDS = Option(
    "adopt_layer_ids",
    "list",
    elements="int",
    doc="The aux layer ids the dump holds (in O(adopt_layer_convention)), unless its C(eagle3ops-dump.json) says.",
)
ADOPT_LAYER_CONVENTION = Option(
    "adopt_layer_convention",
    choices=["input", "output"],
    # the role's "" = not declared here (the sidecar's or the store's own meta then): Ansible refuses a null
    # value against choices, so the role's default is the empty string, which the task omits
    role_default="",
    role_choices=["", "input", "output"],
    doc="The convention of O(adopt_layer_ids) - C(output) for SpecForge/ModelOpt ids (one less than C(input)).",
)
ADOPT_LAST_STATE = Option(
    "adopt_last_state",
    choices=["pre-norm", "post-norm"],
    role_default="",  # not declared here: as adopt_layer_convention
    role_choices=["", "pre-norm", "post-norm"],
    doc=(
        "Whether the dump's last state is the last decoder layer's output before the final norm (C(pre-norm), "
        "what speculators trains on) or after it (C(post-norm), SpecForge's C(hidden_state)): post-norm is "
        "refused, naming both."
    ),
)
ADOPT_KEYS = Option(
    "adopt_keys",
    "dict",
    default={},
    no_log=False,  # the dump's key names, not secrets
    doc=(
        "The dump's dict keys when they differ from SpecForge's (C(input_ids), C(aux_hidden_state) [1, T, K*H], "
        "C(hidden_state) [1, T, H]) - C(input_ids), C(aux), C(last)."
    ),
)
ADOPT_CHECKSUM = Option(
    "adopt_checksum",
    "bool",
    default=True,
    doc=(
        "Read every adopted file once - a C(torch.save) zip's members against the crc32s its writer recorded (bit "
        "flips are found; the file is its own checksum for the train phase's content check), a safetensors "
        "sample's xxh3-64 recorded for it. False checks length and shapes only (no tensor bytes read; "
        "docs/performance.md has both costs)."
    ),
)
ADOPT = [ADOPT_FROM, ADOPT_LAYER_IDS, ADOPT_LAYER_CONVENTION, ADOPT_LAST_STATE, ADOPT_KEYS, ADOPT_CHECKSUM]

# the store options both extract modules document once (doc fragment eagle3ops.extract: make options writes it)
STORE = [
    DATA,
    LAYER_CONVENTION,
    MARGIN,
    DISK_MARGIN_MIB,
    PVE_STORAGE,
    LIMIT,
    WAIT_RUNNING,
    JOB_FILE,
    REASSIGN_RANKS,
    REASSIGN_FROM_DATA,
]

EXTRACT = Command(
    "extract",
    help="extract target hidden states for every prepared row (resumable)",
    check_help="report what would be done (and a run holding the directory); load no weights, write nothing",
    module="eagle3ops_extract",
    role="extract",
    options=[
        DATA,
        MODEL,
        TRUST_REMOTE_CODE,
        LAYER_IDS,
        LAYER_CONVENTION,
        DTYPE,
        Option(
            "compute_dtype",
            default="auto",
            param=False,
            doc="model dtype (auto: bfloat16 on CUDA, float32 on CPU)",
        ),
        Option(
            "device",
            default="auto",
            doc="C(auto) (CUDA when present), C(cpu), C(cuda), C(cuda:N).",
        ),
        count(
            "max_batch_tokens",
            default=16384,
            no_log=False,
            doc="padded tokens per forward batch (one the GPU cannot hold is split, and the report says what fit)",
        ),
        count("max_batch_size", default=64, param=False, doc="rows per forward batch"),
        Option(
            "workers",
            default="1",
            minimum=1,
            words=("auto",),
            role_default="auto",  # the playbook uses every GPU; a plain CLI call one process
            doc=(
                "C(auto) for one worker per visible GPU (1 on the CPU), or a number of workers (disjoint shards)."
            ),
        ),
        WORLD_SIZE,
        Option("rank", "int", param=False, minimum=0, doc="(internal/advanced) this worker's one shard"),
        FIRST_RANK,
        REASSIGN_RANKS,
        REASSIGN_FROM_DATA,
        Option(
            "fsync",
            "bool",
            default=True,
            doc=(
                "C(fsync) every file before its rename (power-loss safe). Kill-safety does not depend on it."
            ),
        ),
        count(
            "writer_threads",
            default=4,
            doc=(
                "Parallel file writers per worker; their fsyncs overlap (4 against 2 - "
                'docs/performance.md, "Extraction throughput"). Each adds one pinned host buffer '
                "of a batch's states."
            ),
        ),
        MARGIN,
        DISK_MARGIN_MIB,
        PVE_STORAGE,
        LIMIT,
        one_of(
            "verify",
            ["size", "checksum"],
            doc=[
                (
                    "How finished files are checked against the disk before resuming. C(size) "
                    "(cheap, no tensor bytes read) checks that each file exists, has the size its "
                    "manifest line recorded and a safetensors header that matches its row. "
                    "C(checksum) also re-reads every file and compares its content checksum "
                    "(xxh3-64, recorded while writing), as many bytes as the store holds; the role's "
                    "read-only plan reads them too."
                ),
                (
                    "Damaged or missing files are reported by row and file (RV(damaged), "
                    "RV(damaged_files)), moved to C(hidden_states/damaged/) (never deleted), their "
                    "manifest entries dropped, and extracted again."
                ),
            ],
        ),
        one_of(
            "on_model_change",
            ["refuse", "discard", "accept"],
            doc=[
                (
                    "What to do when the target's weights changed since the store was started "
                    "(config, file names, sizes, modification times, safetensors headers; or content "
                    "with O(model_hash))."
                ),
                (
                    "C(refuse) fails with what changed. C(discard) moves C(hidden_states/) aside to "
                    "C(hidden_states.old-<time>) (never deleted) and extracts anew. C(accept) "
                    "records the weights as they are now and resumes (only for changed "
                    "timestamps/headers of same-named, same-sized files)."
                ),
            ],
        ),
        Option(
            "model_hash",
            "bool",
            default=False,
            doc=(
                "Compare the target by a hash of every weight byte instead of sizes, mtimes and "
                "headers (reads the whole model once per run, slow for large models). A copy "
                "with new timestamps then resumes."
            ),
        ),
        *ADOPT,
        WAIT_RUNNING,
        JOB_FILE,
        PROGRESS,
        EXECUTABLE,
    ],
)

STATUS = _report(
    "status",
    "extraction progress from the manifests (no tensors loaded)",
    [
        DATA.but(
            type="list",
            elements="path",
            nargs="append",
            doc="prepared data directory; repeat it for the stores of several hosts (one merged view)",
        )
    ],
)

WORKERS = _report(
    "workers",
    "how many extraction workers --workers SPEC means on this host",
    [
        Option(
            "workers",
            default="auto",
            minimum=1,
            words=("auto",),
            doc="'auto' (one per visible GPU, 1 on CPU) or a number",
        )
    ],
)

LENGTHS = _report(
    "lengths",
    "index -> seq_len of finished samples, from the manifests and the adoption record",
    [
        DATA,
        Option("out", "path", doc="also write them as JSON here (the seed's sample_lengths.json)"),
    ],
)

VERIFY = _report(
    "verify",
    "check every finished hidden-state file against its manifest line (size + header, or checksum)",
    [
        Option("data", "path", required=True, doc="data directory (the one `eagle3ops extract` wrote into)"),
        Option(
            "level",
            default="size",
            choices=["size", "checksum"],
            doc="size: exists, recorded size, safetensors header matches the row (cheap, what every extract "
            "plan does); checksum: also re-read every file and compare its content checksum",
        ),
        Option(
            "move_aside",
            "bool",
            default=False,
            doc="move damaged files to hidden_states/damaged/ and drop their manifest entries (and collapse "
            "duplicate lines), so the next `eagle3ops extract` redoes them; nothing is deleted",
        ),
        PROGRESS,
    ],
)

ADOPT_CMD = Command(
    "adopt",
    help="adopt an existing hidden-state dump in place (no byte copied); the extract phase does the rest",
    check_help="survey the dump and report what would be adopted; write nothing",
    options=[DATA, MODEL, LAYER_IDS, LAYER_CONVENTION, DTYPE, ADOPT_FROM.but(required=True), *ADOPT[1:]],
)
STORE_GROUP = Group(
    "store",
    [ADOPT_CMD],
    help="the hidden-state store: adopt an existing dump where it lies",
)
