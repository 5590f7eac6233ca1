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
        Option("out", "path", required=True, metavar="DIR", help="directory to build the demo in"),
        count("num_conversations", default=300, metavar="N", help="conversations to write"),
        seed(default=0, help="the seed of everything built"),
        count(
            "train_steps",
            default=120,
            metavar="N",
            why="the target needs at least 1 training step",
            help="optimiser steps of the target's training (fewer: cheaper, less trained)",
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
        Option("out", "path", required=True, metavar="DIR", help="directory to build the fixture in"),
        seed(default=0, help="the seed of everything built"),
    ],
)

LAYER_IDS = Command(
    "layer-ids",
    help="resolve and check a target's aux layer ids (default [2, N//2, N-3] from its config.json)",
    description="Prints the aux layer ids (input-of-layer convention) for the model in --model: the given "
    "--ids, checked against its layer count, or the default [2, N//2, N-3]. Reads config.json only.",
    check=False,  # it only reads
    options=[
        Option("model", "path", required=True, help="the target model directory (its config.json gives N)"),
        Option("ids", "list", elements="int", help="aux layer ids to check (default: [2, N//2, N-3])"),
        Option(
            "convention",
            default="input",
            choices=["input", "output"],
            help="what --ids name: layer inputs (SGLang, speculators) or outputs (SpecForge, ModelOpt)",
        ),
        Option(
            "sglang",
            "bool",
            default=False,
            help="also refuse what SGLang's set_eagle3_layers_to_capture would shift: ids must come distinct "
            "and ascending, the first not 1",
        ),
        Option(
            "sglang_version",
            help="also give the server flags that make this SGLang version capture these ids without a draft "
            "(sglang_capture_args in the JSON result; none for a version whose capture patch turns the capture "
            "on itself); a version eagle3ops has no entry for is refused with the known ones",
        ),
    ],
)

CONFIG = Option("config", "path", positional=True, help="/etc/pve/lxc/<vmid>.conf (or a copy)")

PVE_SHOW = Command(
    "show", help="sections, keys and raw lines of a container config", check=False, options=[CONFIG]
)

PVE_PLAN = Command(
    "plan",
    help="what the container phase would change (writes nothing)",
    check=False,  # it only reads
    options=[
        CONFIG,
        Option("mode", default="dev", choices=["dev", "raw"], help="devN (PVE >= 8.1) or raw lxc lines"),
        Option("gpus", default="all", help="all, none, or indices: 0,1,2"),
        Option("dev_root", "path", default="/dev", help="where the NVIDIA nodes are"),
        Option("dev_listing", "path", help="a file of `stat -c '%n %Hr %Lr'` lines instead of --dev-root"),
        Option("proc_devices", "path", default="/proc/devices", help="the host's /proc/devices (or a copy)"),
        Option(
            "option",
            "list",
            elements="str",
            default=[],
            nargs="append",
            metavar="KEY=VALUE",
            help="a key to enforce, e.g. cores=64 or mp0=/data,mp=/data (repeatable)",
        ),
        Option("running", "bool", default=False, help="plan as for a running container (restart?)"),
    ],
)

PVE = Group(
    "pve",
    [PVE_SHOW, PVE_PLAN],
    help="read a PVE LXC config; preview the GPU passthrough change",
)
