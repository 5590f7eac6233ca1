"""The benchmark phase's options, once: ``eagle3ops benchmark-{acceptance,live,contamination,spec-probe,report,
dataset}``, the ``eagle3ops_benchmark`` module (one action per command) and the ``benchmark`` role's variables (the
``serve`` role's for the guard) come from here (eagle3ops.options says how; standard library only, shipped as
module_utils/eagle3ops_benchmark_options.py)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, Module, EXECUTABLE = _o.Option, _o.Command, _o.Module, _o.EXECUTABLE
one_of, target_model = _o.one_of, _o.target_model
count = _o.count

MODULE = "eagle3ops_benchmark"
_EXE = EXECUTABLE.but(role="benchmark_eagle3ops_bin")
# NAME=PATH, repeatable: named prompt files (held-out JSONL, MT-bench question.jsonl)
_SETS = Option(
    "set",
    "dict",
    required=True,
    param="prompt_sets",
    help="a named prompt set (repeatable)",
)
_TURNS = one_of(
    "mtbench_turns",
    ["first", "both"],
    help="MT-bench: first turns only, or both (the second follows the server's own first answer)",
)

ACCEPTANCE = Command(
    "benchmark-acceptance",
    help="offline acceptance length of a draft: greedy chain drafting verified by the target (transformers)",
    description="Written only when its inputs (checkpoint, target, prompts, settings) changed.",
    check_help="only say whether it would run",
    module=MODULE,
    role="benchmark",
    options=[
        Option(
            "checkpoint", "path", required=True, help="speculators checkpoint dir, save path or train run dir"
        ),
        target_model("target", "transformers", role="benchmark_target_path"),
        Option("prompts", "path", required=True, help="held-out prompts JSONL (not used in training)"),
        Option("out", "path", required=True, role=False, help="result JSON file"),
        count("k", default=3, help="draft tokens per verify step (speculative-num-steps)"),
        count("max_new_tokens", default=64, no_log=False, help="tokens generated per prompt"),
        count("limit", help="use only the first N prompts"),
        Option(
            "baseline",
            "bool",
            default=True,
            role="benchmark_random_baseline",
            help="also measure a random-token draft (the floor, about 1)",
        ),
        count("threads", default=1, param=False, help="torch CPU threads (1 is fastest on a busy machine)"),
        one_of(
            "device",
            ["cpu", "cuda"],
            role="benchmark_offline_device",
            help="where the target and the draft run (cuda: the first visible GPU)",
        ),
        one_of(
            "dtype",
            ["float32", "bfloat16"],
            role="benchmark_offline_dtype",
            help="the target's and the draft's dtype (bfloat16: what an SGLang server computes in)",
        ),
        Option(
            "max_target_gb",
            "float",
            above=0,
            role="benchmark_offline_max_target_gb",
            role_default=16,  # the playbook skips what a CPU host cannot hold; a CLI call measures any size
            help="skip (not fail) when the target's weights exceed this size: the target runs in float32 here",
        ),
        _EXE,
    ],
)

# the result files the report reads (each optional; the role passes them itself): option -> what it is
_REPORT_INPUTS = {
    "acceptance": "benchmark-acceptance result JSON",
    "sglang_with": "SGLang bench JSONL of the server with the draft",
    "sglang_without": "SGLang bench JSONL of the server without the draft",
    "spec_probe": "benchmark-spec-probe result JSON (completion tokens / spec_verify_ct)",
    "live_with": "benchmark-live result of the server with the draft",
    "live_without": "benchmark-live result of the server without the draft",
    "contamination": "benchmark-contamination result JSON",
}

REPORT = Command(
    "benchmark-report",
    help="JSON + markdown table + PNG plot of the benchmark results",
    module=MODULE,
    role="benchmark",
    options=[
        Option(
            "out_dir", "path", required=True, param="out", role="benchmark_dir", help="the report's directory"
        ),
        *(Option(name, "path", role=False, help=what) for name, what in _REPORT_INPUTS.items()),
        _EXE,
    ],
)

SPEC_PROBE = Command(
    "benchmark-spec-probe",
    help="acceptance length of a running SGLang EAGLE3 server: completion tokens / spec_verify_ct",
    check=False,
    module=MODULE,  # action guard, from the serve role
    role="serve",
    options=[
        Option("url", required=True, role=False, help="the server's base URL"),
        Option(
            "prompts",
            "path",
            role="serve_probe_prompts",
            help="held-out prompts JSONL (default: eagle3ops' built-in probe prompts)",
        ),
        Option("out", "path", param=False, help="result JSON (default: none written)"),
        count(
            "max_new_tokens",
            default=128,
            module_default=64,  # one module parameter for every action: the acceptance's; the serve role passes its own
            no_log=False,
            role="serve_probe_max_new_tokens",
            help="tokens generated per probe prompt",
        ),
        count("limit", role="serve_probe_count", role_default=4, help="use only the first N prompts"),
        Option(
            "chat_template",
            "path",
            metavar="MODEL_DIR",
            role=False,
            help="render each prompt with this target's chat template (its tokenizer files), as real traffic is: an "
            "instruct model given a raw prompt may answer EOS at once, and such an answer has no verify step",
        ),
        Option(
            "min_accept_length",
            "float",
            minimum=0,
            module_default=1.3,  # the module's guard action always has a floor; the CLI measures without one
            help="the guard: fail (exit 2, with likely causes) when the acceptance length is below this floor",
        ),
        EXECUTABLE.but(role="serve_eagle3ops_bin"),
    ],
)

LIVE = Command(
    "benchmark-live",
    help="measure a running SGLang server: output tok/s and acceptance per prompt set and concurrency",
    description=(
        "Our own load generator (threads over http.client, POST /generate, greedy): for each named prompt set "
        "and each concurrency, a bounded number of requests within a time budget; output tok/s = completion "
        "tokens / wall time; acceptance = completion tokens / spec_verify_ct, per request and overall. "
        "Written only when its inputs (prompt files, settings, --server-key) changed."
    ),
    check_help="only say whether it would measure",
    module=MODULE,
    role="benchmark",
    options=[
        Option("url", required=True, role=False, help="the server's base URL"),
        Option(
            "label", default="with_draft", role=False, help="what this server is (with_draft / without_draft)"
        ),
        _SETS,
        _TURNS,
        Option(
            "concurrency",
            "list",
            elements="int",
            default=[1, 8],
            help="requests in flight, one run per value",
        ),
        count(
            "num_requests",
            role_default=32,  # a bounded run per set in the playbook; a CLI call sends each prompt once
            help="requests per set and concurrency: the first N prompts, repeated when the set is smaller "
            "(default: each once)",
        ),
        count(
            "max_new_tokens",
            default=256,
            module_default=64,  # the module parameter is shared with acceptance; the benchmark role passes its own
            no_log=False,
            role="benchmark_output_len",
            role_default=256,
            help="tokens generated per request (greedy)",
        ),
        Option(
            "time_budget", "float", default=600.0, above=0, help="seconds per run; no new request after it"
        ),
        Option(
            "timeout", "float", default=600.0, param="request_timeout", above=0, help="seconds per request"
        ),
        Option("ignore_eos", "bool", default=False, help="always generate --max-new-tokens tokens"),
        Option(
            "template_model",
            "path",
            role=False,
            help="render prompts with this model's chat template (tokenizer dir)",
        ),
        Option(
            "server_key",
            default="",
            no_log=False,
            role=False,
            help="identity of the server (a new one measures again)",
        ),
        Option("out", "path", required=True, role=False, help="result JSON"),
        _EXE,
    ],
)

CONTAMINATION = Command(
    "benchmark-contamination",
    help="benchmark prompts must never be in the training data: compare them with the training user turns",
    check=False,
    module=MODULE,
    role="benchmark",
    options=[
        _SETS,
        _TURNS.but(default="both", param=False),  # every turn is compared; the module does not choose
        Option(
            "training",
            "list",
            elements="path",
            nargs="append",
            default=[],
            param="training_data",
            help="training conversations (JSONL/dir/HF dataset), repeatable",
        ),
        one_of(
            "mode",
            ["fail", "warn"],
            param="contamination_mode",
            role="benchmark_contamination",
            help="fail (exit 2) or only report",
        ),
        Option("out", "path", role=False, help="result JSON (default: none written)"),
        _EXE,
    ],
)

DATASET = Command(
    "benchmark-dataset",
    help="held-out prompts -> the JSONL SGLang's bench reads (--dataset-name custom)",
    check=False,
    options=[
        Option("prompts", "path", required=True, help="held-out prompts (JSONL)"),
        Option("out", "path", required=True, help="the JSONL to write"),
    ],
)

BENCHMARK = Module(
    MODULE,
    {
        "acceptance": ACCEPTANCE,
        "report": REPORT,
        "guard": SPEC_PROBE,
        "live": LIVE,
        "contamination": CONTAMINATION,
    },
    extra=[
        Option(
            "action",
            required=True,
            choices=["acceptance", "report", "guard", "live", "contamination"],
            cli=False,
        ),
        Option(
            "plan",
            "bool",
            default=False,
            cli=False,
            help="action live: only predict whether it would measure",
        ),
    ],
)
