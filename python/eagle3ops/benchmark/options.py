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
count, work_path, seed = _o.count, _o.work_path, _o.seed

MODULE = "eagle3ops_benchmark"
_EXE = EXECUTABLE.but(
    role="benchmark_eagle3ops_bin",
    role_value="{{ eagle3ops_bin }}",
)
# the target's own code (auto_map) may load its tokenizer and config: acceptance, spec-probe and live load them
_TRUST = _o.trust_remote_code("tokenizer (its chat template) and config")
# NAME=PATH, repeatable: named prompt files (held-out JSONL, MT-bench question.jsonl)
_SETS = Option(
    "set",
    "dict",
    required=True,
    param="prompt_sets",
    doc=(
        "Named prompt files C({name - path}) (held-out JSONL, MT-bench question.jsonl); "
        "C(live), C(contamination)."
    ),
    role_value="{{ {'heldout': benchmark_prompts} if benchmark_prompts | length > 0 else {} }}",
)
_TURNS = one_of(
    "mtbench_turns",
    ["first", "both"],
    doc=(
        "MT-bench C(first) turns only, or C(both) as a two-turn conversation (the second turn follows the "
        "server's own first answer); C(live) only."
    ),
)

# the server's tokenizer against the prepared rows first: the guard (SPEC_PROBE, the serve role's) and LIVE
_TOKCHECK = _o.server_tokenizer_check()

ACCEPTANCE = Command(
    "benchmark-acceptance",
    help="offline acceptance length of a draft: greedy chain drafting verified by the target (transformers)",
    description="Written only when its inputs (checkpoint, target, prompts, settings) changed.",
    check_help="only say whether it would run",
    module=MODULE,
    role="benchmark",
    options=[
        Option(
            "checkpoint",
            "path",
            required=True,
            doc=("The speculators checkpoint (dir, save path or train run dir); C(acceptance) only."),
            role_value="{{ eagle3ops_checkpoint }}",
        ),
        target_model(
            "target",
            "transformers",
            role="benchmark_target_path",
            doc="The target model directory; C(acceptance) only.",
            role_value="{{ eagle3ops_model_path }}",
        ),
        Option(
            "prompts",
            "path",
            required=True,
            doc=(
                "Held-out prompts JSONL, not used in training (C(acceptance)); the probe prompts "
                "(C(guard); default eagle3ops' built-in prompts)."
            ),
            role_value="{{ eagle3ops_heldout_prompts }}",
        ),
        Option(
            "out",
            "path",
            required=True,
            role=False,
            doc=(
                "The acceptance result file (C(acceptance)) or the report directory (C(report)); "
                "required there."
            ),
        ),
        count(
            "k",
            default=3,
            doc="Draft tokens per verify step (the server's C(--speculative-num-steps)).",
            role_value="{{ eagle3ops_speculative_num_steps }}",
        ),
        count(
            "max_new_tokens",
            default=64,
            no_log=False,
            doc="tokens generated per prompt",
        ),
        count(
            "limit",
            doc="use only the first N prompts",
        ),
        Option(
            "baseline",
            "bool",
            default=True,
            role="benchmark_random_baseline",
            doc="also measure a random-token draft (the floor, about 1)",
        ),
        count("threads", default=1, param=False, doc="torch CPU threads (1 is fastest on a busy machine)"),
        one_of(
            "device",
            ["cpu", "cuda"],
            role="benchmark_offline_device",
            doc=(
                "Where the offline measurement runs the target and the draft (C(cuda) is the "
                "first visible GPU). C(acceptance) only."
            ),
        ),
        one_of(
            "dtype",
            ["float32", "bfloat16"],
            role="benchmark_offline_dtype",
            doc=(
                "The offline measurement's dtype; C(bfloat16) is what an SGLang server computes "
                "in. Set with I(device), it is recorded in the result's inputs (a change "
                "re-measures). C(acceptance) only."
            ),
        ),
        Option(
            "max_target_gb",
            "float",
            above=0,
            role="benchmark_offline_max_target_gb",
            role_default=16,  # the playbook skips what a CPU host cannot hold; a CLI call measures any size
            doc=(
                "Skip the offline measurement (C(too_large) in the result, not a failure) when "
                "the target's weights exceed this many GiB; it runs the target in float32. "
                "C(acceptance) only."
            ),
        ),
        _TRUST,
        _EXE,
    ],
)

# the result files the report reads (each optional; the role passes them itself): option -> what it is
_REPORT_INPUTS = {  # name: (--help, the module's description)
    "acceptance": ("benchmark-acceptance result JSON", "The acceptance result JSON; C(report) only."),
    "sglang_with": (
        "SGLang bench JSONL of the server with the draft",
        "SGLang bench JSONL of the server with the draft; C(report) only.",
    ),
    "sglang_without": (
        "SGLang bench JSONL of the server without the draft",
        "SGLang bench JSONL of the server without the draft; C(report) only.",
    ),
    "spec_probe": (
        "benchmark-spec-probe result JSON (completion tokens / spec_verify_ct)",
        "C(eagle3ops benchmark-spec-probe) result (completion tokens / spec_verify_ct); C(report) only.",
    ),
    "live_with": (
        "benchmark-live result of the server with the draft",
        "C(benchmark-live) result of the server with the draft; C(report) only.",
    ),
    "live_without": (
        "benchmark-live result of the server without the draft",
        "C(benchmark-live) result of the server without the draft; C(report) only.",
    ),
    "contamination": (
        "benchmark-contamination result JSON",
        "C(benchmark-contamination) result; C(report) only.",
    ),
}

REPORT = Command(
    "benchmark-report",
    help="JSON + markdown table + PNG plot of the benchmark results",
    module=MODULE,
    role="benchmark",
    options=[
        work_path(
            "out_dir",
            "benchmark",
            param="out",
            role="benchmark_dir",
            doc="The report's directory: the acceptance result, the live measurements and C(report.{json,md,png}).",
        ),
        *(
            Option(
                name,
                "path",
                role=False,
                doc=doc,
            )
            for name, (what, doc) in _REPORT_INPUTS.items()
        ),
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
        Option(
            "url",
            required=True,
            role=False,
            doc="The SGLang server's base URL; C(guard) only.",
        ),
        Option(
            "prompts",
            "path",
            role="serve_probe_prompts",
            doc="held-out prompts JSONL (default: eagle3ops' built-in probe prompts)",
            role_value="{{ eagle3ops_heldout_prompts }}",
        ),
        Option("out", "path", param=False, doc="result JSON (default: none written)"),
        count(
            "max_new_tokens",
            default=128,
            module_default=64,  # one module parameter for every action: the acceptance's; the serve role passes its own
            no_log=False,
            role="serve_probe_max_new_tokens",
            doc="tokens generated per probe prompt",
        ),
        count(
            "limit",
            role="serve_probe_count",
            role_default=4,
            doc="Use only the first N probe prompts (sent greedily, one at a time).",
            role_pass="",
        ),
        Option(
            "chat_template",
            "path",
            metavar="MODEL_DIR",
            role=False,
            doc=[
                (
                    "The target's model directory whose chat template formats each probe prompt; "
                    "C(guard) only."
                ),
                (
                    "An instruct model given a raw prompt may answer EOS at once, and such an answer "
                    "carries no acceptance (SGLang reports C(spec_verify_ct) only after a verify "
                    "step). Unset, prompts are sent as they are."
                ),
            ],
        ),
        Option(
            "min_accept_length",
            "float",
            minimum=0,
            module_default=1.3,  # the module's guard action always has a floor; the CLI measures without one
            doc=(
                "The guard's floor for the acceptance length (completion_tokens / spec_verify_ct over the "
                "probe prompts; a misconfigured draft serves at 1.00): below it the guard fails, naming likely "
                "causes; C(guard) only."
            ),
        ),
        *_TOKCHECK,
        _TRUST,
        EXECUTABLE.but(
            role="serve_eagle3ops_bin",
            role_pass=" | default(omit, true)",
            role_value="{{ eagle3ops_bin }}",
        ),
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
        Option("url", required=True, role=False, doc="the server's base URL"),
        Option(
            "label",
            default="with_draft",
            role=False,
            doc="C(with_draft) or C(without_draft); C(live) only.",
        ),
        _SETS,
        _TURNS,
        Option(
            "concurrency",
            "list",
            elements="int",
            default=[1, 4, 16, 64],
            doc=(
                "Requests in flight, one run each with and without the draft (the report's batch curve, its "
                "crossover and the setting to serve per concurrency); C(live) only."
            ),
        ),
        count(
            "num_requests",
            role_default=64,  # a bounded run per set in the playbook (64: concurrency 64 full once); a CLI call sends each prompt once
            doc=(
                "Requests per prompt set and concurrency - the first N prompts, repeated when "
                "the set is smaller; default each prompt once. C(live) only."
            ),
        ),
        count(
            "max_new_tokens",
            default=256,
            module_default=64,  # the module parameter is shared with acceptance; the benchmark role passes its own
            no_log=False,
            role="benchmark_output_len",
            role_default=256,
            doc="tokens generated per request (greedy)",
        ),
        Option(
            "time_budget",
            "float",
            default=600.0,
            above=0,
            doc="Seconds per run after which no new request starts; C(live) only.",
        ),
        Option(
            "timeout",
            "float",
            default=600.0,
            param="request_timeout",
            above=0,
            doc="Seconds per request; C(live) only.",
        ),
        Option(
            "ignore_eos",
            "bool",
            default=False,
            doc="Always generate I(max_new_tokens) tokens; C(live) only.",
        ),
        Option(
            "template_model",
            "path",
            role=False,
            doc="Render prompts with this model's chat template; C(live) only.",
        ),
        count(
            "rounds",
            default=1,
            role_default=3,  # medians and spread in the playbook's report; a CLI call measures once
            doc="Rounds per set and concurrency (interleaved); the report gives medians and spread; C(live) only.",
        ),
        Option(
            "per_category",
            "int",
            default=0,
            minimum=0,
            doc=(
                "MT-bench sets - this many prompts of each category, drawn with I(seed) (0 - every prompt, in file "
                "order); the report gives acceptance and speed-up per category; "
                "C(live) only."
            ),
            role_default=3,  # the playbook's run covers every category (>= 3 each); a CLI call sends the file as is
        ),
        seed(
            default=0,
            doc="Seed of the per-category sample; C(live) only.",
        ),
        Option(
            "lossless_sample",
            "int",
            default=16,
            minimum=0,
            doc=(
                "Prompts answered once more, greedy, with output ids and top log probabilities: the report "
                "compares them between the servers with and without the draft (0 - off); C(live) only."
            ),
        ),
        Option(
            "server_key",
            default="",
            no_log=False,
            role=False,
            doc=(
                "Identity of the measured server (its command line); a new one measures again; C(live) only."
            ),
        ),
        Option("out", "path", required=True, role=False, doc="result JSON"),
        *_TOKCHECK,
        _TRUST,
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
            doc=(
                "Training conversations (JSONL files, directories, saved HF datasets); C(contamination) only."
            ),
            role_value="{{ eagle3ops_conversations }}",
        ),
        one_of(
            "mode",
            ["fail", "warn"],
            param="contamination_mode",
            role="benchmark_contamination",
            role_choices=["fail", "warn", "off"],  # off: the role's task leaves the check out (its when)
            doc=(
                "C(fail) the task when a benchmark prompt is in the training data, or C(warn); "
                "C(contamination) only. The benchmark role also takes C(off): the check is left out."
            ),
        ),
        Option("out", "path", role=False, doc="result JSON (default: none written)"),
        _EXE,
    ],
)

DATASET = Command(
    "benchmark-dataset",
    help="held-out prompts -> the JSONL SGLang's bench reads (--dataset-name custom)",
    check=False,
    options=[
        Option("prompts", "path", required=True, doc="held-out prompts (JSONL)"),
        Option("out", "path", required=True, doc="the JSONL to write"),
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
            doc="What to run.",
        ),
        Option(
            "plan",
            "bool",
            default=False,
            cli=False,
            doc=(
                "Only predict whether I(action=live) would measure (C(changed)); nothing is sent or written."
            ),
        ),
    ],
)
