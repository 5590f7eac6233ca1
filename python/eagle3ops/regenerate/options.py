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
            doc=(
                "The target - a local model directory (C(transformers)), or the path/name the "
                "server serves (C(openai))."
            ),
        ),
        conversation_inputs(
            "regenerate_inputs",
            role_default=[],
            doc=(
                "Conversation sources (ShareGPT or OpenAI-style messages; JSONL/JSON files, "
                "directories of them, saved HF dataset directories)."
            ),
        ),
        work_path(
            "out",
            "conversations/regenerated.jsonl",
            metavar="FILE",
            role="regenerate_output",
            doc="The regenerated conversations (a JSONL file).",
        ),
        one_of(
            "backend",
            ["transformers", "openai"],
            doc="where the answers come from",
        ),
        Option(
            "url",
            "list",
            elements="str",
            nargs="append",
            default=["http://127.0.0.1:30000"],
            metavar="URL",
            param="urls",
            doc=(
                "C(openai) backend - base URLs of the servers (conversations are spread over "
                "them, round-robin)."
            ),
            role_value="{{ eagle3ops_sglang_urls }}",
        ),
        Option(
            "served_model_name",
            role_default="",  # empty: the request's model is --model
            doc="C(openai) backend - the request's C(model) field (default I(model)).",
        ),
        count("max_new_tokens", default=512, no_log=False, doc="tokens per answer at most"),
        Option(
            "temperature",
            "float",
            default=0.0,
            minimum=0,
            doc="Sampling temperature; C(0) is greedy.",
        ),
        Option(
            "top_p",
            "float",
            default=1.0,
            above=0,
            maximum=1,
            doc="Nucleus sampling (with I(temperature) above 0).",
        ),
        seed(
            default=0,
            doc="Sampling seed.",
        ),
        one_of(
            "system",
            ["keep", "drop"],
            doc="Keep the system turns, or drop them (from the prompts and the output).",
        ),
        one_of(
            "think",
            ["keep", "strip"],
            doc=(
                "Keep the answers' reasoning (C(<think>) blocks, a server's "
                "C(reasoning_content)) or strip it."
            ),
        ),
        count(
            "concurrency",
            default=8,
            doc=("Conversations in flight - requests (C(openai)) or the generation batch (C(transformers))."),
        ),
        Option(
            "retries",
            "int",
            default=3,
            minimum=0,
            doc=(
                "C(openai) - retries of a request that failed with 408/429/5xx, a connection "
                "error or a timeout."
            ),
        ),
        seconds(
            "backoff",
            default=1.0,
            doc=("C(openai) - the first retry's delay in seconds (doubled each retry, with jitter)."),
        ),
        seconds(
            "backoff_max",
            default=30.0,
            doc="C(openai) - the longest retry delay in seconds.",
        ),
        Option(
            "request_timeout",
            "float",
            default=600.0,
            above=0,
            doc="C(openai) - seconds a request may take.",
        ),
        seconds(
            "health_timeout",
            default=60.0,
            doc="C(openai) - seconds to wait for every server to answer C(GET /v1/models).",
        ),
        count(
            "limit",
            metavar="N",
            doc="Regenerate only the first this many usable conversations.",
        ),
        one_of(
            "on_error",
            ["fail", "skip"],
            doc=[
                (
                    "C(fail) - rows that cannot be regenerated refuse the run before any generation, "
                    "and conversations whose generation failed fail it after the rest are done (kept "
                    "for the re-run; I(out) is not written)."
                ),
                ("C(skip) - both are left out of I(out) and listed in the result and I(out)C(.failures)."),
            ],
        ),
        Option(
            "force",
            "bool",
            default=False,
            doc=(
                "Inputs or settings changed since the conversations in I(out)C(.regenerate/) "
                "were made - discard them and redo (else the run is refused)."
            ),
        ),
        Option(
            "device",
            default="auto",
            doc="C(transformers) - C(auto), C(cpu), C(cuda), C(cuda:N).",
        ),
        one_of(
            "dtype",
            ["auto", "float32", "bfloat16", "float16"],
            doc=("C(transformers) - the model's dtype (C(auto) - bfloat16 on a GPU, float32 on the CPU)."),
        ),
        Option(
            "threads",
            "int",
            default=0,
            minimum=0,
            doc=(
                "C(transformers) on the CPU - torch's intra-op threads (C(0) - torch's default; "
                "C(1) is fastest for tiny models on a shared box)."
            ),
        ),
        _o.trust_remote_code("tokenizer and, for the transformers backend, its model"),
        EXECUTABLE,
    ],
)
