"""The regenerate phase's options, once: ``eagle3ops regenerate``'s CLI, the ``eagle3ops_regenerate`` module's
parameters and the ``regenerate`` role's variables come from here (eagle3ops.options says how; standard library
only, shipped as module_utils/eagle3ops_regenerate_options.py)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, EXECUTABLE = _o.Option, _o.Command, _o.EXECUTABLE
count, seconds, seed, work_path = _o.count, _o.seconds, _o.seed, _o.work_path
conversation_inputs, one_of = _o.conversation_inputs, _o.one_of

REGENERATE = Command(
    "regenerate",
    help="replace every assistant turn of the conversations by the target's own answer (before prepare)",
    description=(
        "Regenerate each conversation's assistant turns, turn by turn, with the target model (transformers "
        "in this process, or an OpenAI-compatible server such as SGLang), and write OUT as JSONL in the "
        "input's schema and order, for prepare. Resumable after kill -9 (OUT.regenerate/done.log), atomic, "
        "idempotent; every input row not in OUT is listed in OUT.failures with its file:line and reason."
    ),
    check_help="write nothing; predict the work left",
    module="eagle3ops_regenerate",
    role="regenerate",
    options=[
        Option(
            "model",
            required=True,
            metavar="PATH",
            role="regenerate_model_path",
            role_default="",  # the phase is off unless an inventory turns it on and names the target
            help="the target (local directory, or the served name)",
            doc=(
                "The target - a local model directory (C(transformers)), or the path/name the "
                "server serves (C(openai))."
            ),
            role_doc=(
                "The target - a local model directory (transformers) or the path/name the server "
                "serves (openai)."
            ),
        ),
        conversation_inputs(
            "regenerate_inputs",
            role_default=[],
            doc=(
                "Conversation sources (ShareGPT or OpenAI-style messages; JSONL/JSON files, "
                "directories of them, saved HF dataset directories)."
            ),
            role_doc=(
                "The original conversations (ShareGPT, OpenAI messages; JSONL/JSON, directories, "
                "saved HF datasets)."
            ),
        ),
        work_path(
            "out",
            "conversations/regenerated.jsonl",
            metavar="FILE",
            role="regenerate_output",
            help="the regenerated conversations (JSONL)",
            doc="The regenerated conversations (a JSONL file).",
            role_doc="The regenerated conversations (JSONL) that prepare reads.",
        ),
        one_of(
            "backend",
            ["transformers", "openai"],
            help="where the answers come from",
            role_doc=(
                "transformers (in the eagle3ops process) or openai (an OpenAI-compatible server, "
                "e.g. SGLang)."
            ),
        ),
        Option(
            "url",
            "list",
            elements="str",
            nargs="append",
            default=["http://127.0.0.1:30000"],
            metavar="URL",
            param="urls",
            help="openai backend: a server's base URL (repeatable: conversations are spread over them)",
            doc=(
                "C(openai) backend - base URLs of the servers (conversations are spread over "
                "them, round-robin)."
            ),
            role_doc="openai backend - the servers' base URLs (conversations spread over them).",
            role_value="{{ eagle3ops_sglang_urls }}",
        ),
        Option(
            "served_model_name",
            role_default="",  # empty: the request's model is --model
            help="openai backend: the request's model (default --model)",
            doc="C(openai) backend - the request's C(model) field (default I(model)).",
            role_doc="openai backend - the request's model field (empty - regenerate_model_path).",
        ),
        count("max_new_tokens", default=512, no_log=False, help="tokens per answer at most"),
        Option(
            "temperature",
            "float",
            default=0.0,
            minimum=0,
            help="0 = greedy",
            doc="Sampling temperature; C(0) is greedy.",
            role_doc="0 is greedy.",
        ),
        Option(
            "top_p",
            "float",
            default=1.0,
            above=0,
            maximum=1,
            help="nucleus sampling (temperature > 0)",
            doc="Nucleus sampling (with I(temperature) above 0).",
            role_doc="Nucleus sampling (temperature above 0).",
        ),
        seed(
            default=0,
            help="sampling seed (temperature > 0)",
            doc="Sampling seed.",
        ),
        one_of(
            "system",
            ["keep", "drop"],
            help="the system turns",
            doc="Keep the system turns, or drop them (from the prompts and the output).",
            role_doc="Keep or drop the system turns.",
        ),
        one_of(
            "think",
            ["keep", "strip"],
            help="<think> blocks of the answers",
            doc=(
                "Keep the answers' reasoning (C(<think>) blocks, a server's "
                "C(reasoning_content)) or strip it."
            ),
            role_doc="Keep or strip the answers' reasoning (<think> blocks, reasoning_content).",
        ),
        count(
            "concurrency",
            default=8,
            help="conversations in flight: requests (openai) or the batch (transformers)",
            doc=("Conversations in flight - requests (C(openai)) or the generation batch (C(transformers))."),
            role_doc="Conversations in flight (requests, or the transformers batch).",
        ),
        Option(
            "retries",
            "int",
            default=3,
            minimum=0,
            help="openai: retries of a failed request",
            doc=(
                "C(openai) - retries of a request that failed with 408/429/5xx, a connection "
                "error or a timeout."
            ),
            role_doc=(
                "openai - retries of a request that failed with 408/429/5xx, a connection error or a timeout."
            ),
        ),
        seconds(
            "backoff",
            default=1.0,
            help="openai: first retry delay in s, doubled each time",
            doc=("C(openai) - the first retry's delay in seconds (doubled each retry, with jitter)."),
            role_doc="openai - the first retry delay (s), doubled each retry.",
        ),
        seconds(
            "backoff_max",
            default=30.0,
            help="openai: the longest retry delay in s",
            doc="C(openai) - the longest retry delay in seconds.",
            role_doc="openai - the longest retry delay (s).",
        ),
        Option(
            "request_timeout",
            "float",
            default=600.0,
            above=0,
            help="openai: seconds per request",
            doc="C(openai) - seconds a request may take.",
            role_doc="openai - seconds a request may take.",
        ),
        seconds(
            "health_timeout",
            default=60.0,
            help="openai: wait for /v1/models (s)",
            doc="C(openai) - seconds to wait for every server to answer C(GET /v1/models).",
            role_doc="openai - seconds to wait for the servers' GET /v1/models.",
        ),
        count(
            "limit",
            metavar="N",
            help="the first N usable conversations",
            doc="Regenerate only the first this many usable conversations.",
            role_doc="Only the first this many usable conversations.",
        ),
        one_of(
            "on_error",
            ["fail", "skip"],
            help="rows that cannot be regenerated: fail or skip (listed in OUT.failures)",
            doc=[
                (
                    "C(fail) - rows that cannot be regenerated refuse the run before any generation, "
                    "and conversations whose generation failed fail it after the rest are done (kept "
                    "for the re-run; I(out) is not written)."
                ),
                ("C(skip) - both are left out of I(out) and listed in the result and I(out)C(.failures)."),
            ],
            role_doc=(
                "Rows that cannot be regenerated and failed conversations - fail the phase, or "
                "leave them out (listed)."
            ),
        ),
        Option(
            "force",
            "bool",
            default=False,
            help="inputs or settings changed: discard what was regenerated, redo",
            doc=(
                "Inputs or settings changed since the conversations in I(out)C(.regenerate/) "
                "were made - discard them and redo."
            ),
            role_doc=("Inputs or settings changed - discard what was regenerated and redo (else refused)."),
        ),
        Option(
            "device",
            default="auto",
            help="transformers: auto, cpu, cuda, cuda:N",
            doc="C(transformers) - C(auto), C(cpu), C(cuda), C(cuda:N).",
            role_doc="transformers - auto, cpu, cuda, cuda:N.",
        ),
        one_of(
            "dtype",
            ["auto", "float32", "bfloat16", "float16"],
            help="transformers: the model's dtype",
            doc=("C(transformers) - the model's dtype (C(auto) - bfloat16 on a GPU, float32 on the CPU)."),
            role_doc="transformers - the model's dtype.",
        ),
        Option(
            "threads",
            "int",
            default=0,
            minimum=0,
            help="transformers on the CPU: torch threads (0 = torch's default)",
            doc=(
                "C(transformers) on the CPU - torch's intra-op threads (C(0) - torch's default; "
                "C(1) is fastest for tiny models on a shared box)."
            ),
            role_doc="transformers on the CPU - torch's intra-op threads (0 - torch's default).",
        ),
        _o.trust_remote_code("tokenizer and, for the transformers backend, its model"),
        EXECUTABLE,
    ],
)
