"""The options of the tools of no phase, once: ``eagle3ops demo``, ``eagle3ops demo-kimi``, ``eagle3ops layer-ids`` and ``eagle3ops pve
show|plan`` (eagle3ops.options says how). No module runs them, so nothing here is shipped as a module_util; the
leading underscore keeps eagle3ops.cli from taking this file for a command module. Standard library only."""

from __future__ import annotations

from eagle3ops.options import Command, Group, Option, count, seed

DEMO = Command(
    "demo",
    help="build the tiny DeepSeek-V3-shaped demo target, its tokenizer and a conversation set",
    description=(
        "Build DIR/model (DeepseekV3ForCausalLM, 8 layers, hidden 64, briefly trained on CPU), "
        "DIR/conversations.jsonl, DIR/heldout.jsonl and DIR/demo.json, deterministically from the "
        "seed and without downloads. A second run with the same parameters changes nothing."
    ),
    check_help="only report whether a build would happen",
    options=[
        Option("out", "path", required=True, metavar="DIR", doc="directory to build the demo in"),
        count("num_conversations", default=300, metavar="N", doc="conversations to write"),
        seed(default=0, doc="the seed of everything built"),
        count(
            "train_steps",
            default=120,
            metavar="N",
            why="the target needs at least 1 training step",
            doc="optimiser steps of the target's training (fewer: cheaper, less trained)",
        ),
    ],
)

DEMO_KIMI = Command(
    "demo-kimi",
    help="build a tiny Kimi-K2.5-format target (wrapper config, INT4 experts, remote-code tiktoken tokenizer)",
    description=(
        "Build DIR/model (KimiK25ForConditionalGeneration: a 4-layer DeepSeek-V3 text model under "
        "language_model. with compressed-tensors INT4 routed experts, a tiny vision tower, sharded safetensors "
        "+ index, the remote-code tiktoken tokenizer, chat template with thinking and tool calls, processor "
        "files), DIR/conversations.jsonl, DIR/heldout.jsonl and DIR/kimi-fixture.json, deterministically "
        "from the seed and without downloads. A second run with the same seed changes nothing."
    ),
    check_help="only report whether a build would happen",
    options=[
        Option("out", "path", required=True, metavar="DIR", doc="directory to build the fixture in"),
        seed(default=0, doc="the seed of everything built"),
    ],
)

LAYER_IDS = Command(
    "layer-ids",
    help="resolve and check a target's aux layer ids (default [2, N//2, N-3] from its config.json)",
    description="Prints the aux layer ids (input-of-layer convention) for the model in --model: the given "
    "--ids, checked against its layer count, or the default [2, N//2, N-3]. Reads config.json only.",
    check=False,  # it only reads
    options=[
        Option("model", "path", required=True, doc="the target model directory (its config.json gives N)"),
        Option("ids", "list", elements="int", doc="aux layer ids to check (default: [2, N//2, N-3])"),
        Option(
            "convention",
            default="input",
            choices=["input", "output"],
            doc="what --ids name: layer inputs (SGLang, speculators) or outputs (SpecForge, ModelOpt)",
        ),
        Option(
            "sglang",
            "bool",
            default=False,
            doc="also refuse what SGLang's set_eagle3_layers_to_capture would shift: ids must come distinct "
            "and ascending, the first not 1",
        ),
        Option(
            "sglang_version",
            doc="also give the server flags that make this SGLang version capture these ids without a draft "
            "(sglang_capture_args in the JSON result; none for a version whose capture patch turns the capture "
            "on itself); a version eagle3ops has no entry for is refused with the known ones",
        ),
    ],
)

CONFIG = Option("config", "path", positional=True, doc="/etc/pve/lxc/<vmid>.conf (or a copy)")

PVE_SHOW = Command(
    "show", help="sections, keys and raw lines of a container config", check=False, options=[CONFIG]
)

PVE_PLAN = Command(
    "plan",
    help="what the container phase would change (writes nothing)",
    check=False,  # it only reads
    options=[
        CONFIG,
        Option("mode", default="dev", choices=["dev", "raw"], doc="devN (PVE >= 8.1) or raw lxc lines"),
        Option("gpus", default="all", doc="all, none, or indices: 0,1,2"),
        Option("dev_root", "path", default="/dev", doc="where the NVIDIA nodes are"),
        Option("dev_listing", "path", doc="a file of `stat -c '%n %Hr %Lr'` lines instead of --dev-root"),
        Option("proc_devices", "path", default="/proc/devices", doc="the host's /proc/devices (or a copy)"),
        Option(
            "option",
            "list",
            elements="str",
            default=[],
            nargs="append",
            metavar="KEY=VALUE",
            doc="a key to enforce, e.g. cores=64 or mp0=/data,mp=/data (repeatable)",
        ),
        Option("running", "bool", default=False, doc="plan as for a running container (restart?)"),
    ],
)

PVE = Group(
    "pve",
    [PVE_SHOW, PVE_PLAN],
    help="read a PVE LXC config; preview the GPU passthrough change",
)

MEMORY_FIT = Command(
    "memory-fit",
    help="check that the target, its KV cache and the capture's buffers fit the GPUs before a server starts",
    description="Reads the model's config.json and safetensors headers (no weights, no torch) and the SGLang flags "
    "the server will get, and compares weights / TP + replicated tensors + KV cache for --context-length with "
    "mem_fraction_static x GPU memory, and SGLang's activation reserve (+ the dump buffers of one prefill, capture) "
    "with the rest. Refuses (exit 2) a profile that cannot fit, naming the numbers and the variables to change; "
    "without a GPU (and no --gpu-memory-mib) nothing is checked.",
    check=False,  # it only reads
    options=[
        Option("model", "path", required=True, doc="the target model directory (config.json + safetensors)"),
        Option(
            "phase",
            default="capture",
            choices=["capture", "serve"],
            doc="the server checked: the capture server (adds the dump buffers) or the serving one",
        ),
        Option(
            "server_args",
            default="",
            doc="the SGLang flags the server starts with, one string (pass it as --server-args='...'): "
            "--mem-fraction-static, --context-length, --chunked-prefill-size, --max-prefill-tokens, "
            "--cuda-graph-max-bs, --tp-size, --kv-cache-dtype, --speculative-algorithm are read",
        ),
        Option(
            "tp_size",
            "int",
            default=0,
            minimum=0,
            doc="tensor parallel size (0: --tp-size of --server-args)",
        ),
        Option(
            "gpu_memory_mib",
            "int",
            default=0,
            minimum=0,
            doc="memory of one GPU in MiB (0: the smallest GPU nvidia-smi reports)",
        ),
        count(
            "aux_layers", default=3, doc="aux layers captured (the dump buffers hold these + the last state)"
        ),
        Option(
            "dtype",
            default="bfloat16",
            choices=["bfloat16", "float16", "float32", "float8_e4m3fn"],
            doc="the dtype the capture stores the states in",
        ),
        Option(
            "draft",
            "path",
            doc="the served draft: its converted directory, or before conversion the speculators checkpoint, "
            "save or run directory, or the SpecForge run it comes from (its bytes count on every GPU)",
        ),
    ],
)
