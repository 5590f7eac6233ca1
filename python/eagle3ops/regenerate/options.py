"""The regenerate phase's options, once: ``eagle3ops regenerate``'s CLI, the ``eagle3ops_regenerate`` module's
parameters and the ``regenerate`` role's variables come from here (eagle3ops.options says how; standard library
only, shipped as module_utils/eagle3ops_regenerate_options.py)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, EXECUTABLE = _o.Option, _o.Command, _o.EXECUTABLE
count, seconds, seed = _o.count, _o.seconds, _o.seed
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
        ),
        conversation_inputs("regenerate_inputs", role_default=[]),
        Option(
            "out",
            "path",
            required=True,
            metavar="FILE",
            role="regenerate_output",
            help="the regenerated conversations (JSONL)",
        ),
        one_of("backend", ["transformers", "openai"], help="where the answers come from"),
        Option(
            "url",
            "list",
            elements="str",
            nargs="append",
            default=["http://127.0.0.1:30000"],
            metavar="URL",
            param="urls",
            help="openai backend: a server's base URL (repeatable: conversations are spread over them)",
        ),
        Option(
            "served_model_name",
            role_default="",  # empty: the request's model is --model
            help="openai backend: the request's model (default --model)",
        ),
        count("max_new_tokens", default=512, no_log=False, help="tokens per answer at most"),
        Option("temperature", "float", default=0.0, minimum=0, help="0 = greedy"),
        Option("top_p", "float", default=1.0, above=0, maximum=1, help="nucleus sampling (temperature > 0)"),
        seed(default=0, help="sampling seed (temperature > 0)"),
        one_of("system", ["keep", "drop"], help="the system turns"),
        one_of("think", ["keep", "strip"], help="<think> blocks of the answers"),
        count(
            "concurrency",
            default=8,
            help="conversations in flight: requests (openai) or the batch (transformers)",
        ),
        Option("retries", "int", default=3, minimum=0, help="openai: retries of a failed request"),
        seconds("backoff", default=1.0, help="openai: first retry delay in s, doubled each time"),
        seconds("backoff_max", default=30.0, help="openai: the longest retry delay in s"),
        Option("request_timeout", "float", default=600.0, above=0, help="openai: seconds per request"),
        seconds("health_timeout", default=60.0, help="openai: wait for /v1/models (s)"),
        count("limit", metavar="N", help="the first N usable conversations"),
        one_of(
            "on_error",
            ["fail", "skip"],
            help="rows that cannot be regenerated: fail or skip (listed in OUT.failures)",
        ),
        Option(
            "force",
            "bool",
            default=False,
            help="inputs or settings changed: discard what was regenerated, redo",
        ),
        Option("device", default="auto", help="transformers: auto, cpu, cuda, cuda:N"),
        one_of("dtype", ["auto", "float32", "bfloat16", "float16"], help="transformers: the model's dtype"),
        Option(
            "threads",
            "int",
            default=0,
            minimum=0,
            help="transformers on the CPU: torch threads (0 = torch's default)",
        ),
        Option("trust_remote_code", "bool", default=False, help="allow the model's own code"),
        EXECUTABLE,
    ],
)
