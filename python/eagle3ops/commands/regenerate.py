"""``eagle3ops regenerate``: the assistant turns of the conversations rewritten by the target model itself."""

from __future__ import annotations

import sys

from eagle3ops.cli import CommandError, add_json_flag, emit


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "regenerate",
        help="replace every assistant turn of the conversations by the target's own answer (before prepare)",
        description=(
            "Regenerate each conversation's assistant turns, turn by turn, with the target model (transformers "
            "in this process, or an OpenAI-compatible server such as SGLang), and write OUT as JSONL in the "
            "input's schema and order, for prepare. Resumable after kill -9 (OUT.regenerate/done.log), atomic, "
            "idempotent; every input row not in OUT is listed in OUT.failures with its file:line and reason."
        ),
    )
    p.add_argument(
        "--model", required=True, metavar="PATH", help="the target (local directory, or the served name)"
    )
    p.add_argument(
        "--input",
        required=True,
        action="append",
        metavar="PATH",
        help="JSONL/JSON file, directory of them, or a datasets.save_to_disk directory (repeatable)",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the regenerated conversations (JSONL)")
    p.add_argument("--backend", choices=["transformers", "openai"], default="transformers")
    p.add_argument(
        "--url",
        action="append",
        default=None,
        metavar="URL",
        help="openai backend: a server's base URL (repeatable: conversations are spread over them; "
        "default http://127.0.0.1:30000)",
    )
    p.add_argument(
        "--served-model-name", default=None, help="openai backend: the request's model (default --model)"
    )
    p.add_argument("--max-new-tokens", type=int, default=512, help="per answer (default 512)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    p.add_argument(
        "--system", choices=["keep", "drop"], default="keep", help="the system turns (default keep)"
    )
    p.add_argument(
        "--think",
        choices=["keep", "strip"],
        default="keep",
        help="<think> blocks of the answers (default keep)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="conversations in flight: requests (openai) or the batch (transformers); default 8",
    )
    p.add_argument("--retries", type=int, default=3, help="openai: retries of a failed request (default 3)")
    p.add_argument(
        "--backoff", type=float, default=1.0, help="openai: first retry delay in s, doubled each time"
    )
    p.add_argument("--backoff-max", type=float, default=30.0)
    p.add_argument("--request-timeout", type=float, default=600.0, help="openai: seconds per request")
    p.add_argument("--health-timeout", type=float, default=60.0, help="openai: wait for /v1/models (s)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="the first N usable conversations")
    p.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="rows that cannot be regenerated: fail (default) or skip (listed in OUT.failures)",
    )
    p.add_argument(
        "--force", action="store_true", help="inputs or settings changed: discard what was regenerated, redo"
    )
    p.add_argument("--plan", action="store_true", help="write nothing; predict the work left")
    p.add_argument("--device", default="auto", help="transformers: auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument(
        "--threads", type=int, default=0, help="transformers on the CPU: torch threads (0 = torch's default)"
    )
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from eagle3ops.regenerate import RegenerateConfig, RegenerateError, regenerate

    cfg = RegenerateConfig(
        model=args.model,
        inputs=args.input,
        out=args.out,
        backend=args.backend,
        urls=args.url or ["http://127.0.0.1:30000"],
        served_model=args.served_model_name,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        system=args.system,
        think=args.think,
        concurrency=args.concurrency,
        retries=args.retries,
        backoff=args.backoff,
        backoff_max=args.backoff_max,
        request_timeout=args.request_timeout,
        health_timeout=args.health_timeout,
        limit=args.limit,
        on_error=args.on_error,
        force=args.force,
        plan=args.plan,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        trust_remote_code=args.trust_remote_code,
        progress=sys.stderr.isatty() and not args.json,
    )
    try:
        r = regenerate(cfg)
    except RegenerateError as e:
        raise CommandError(str(e), **e.details) from e
    if args.plan:
        human = (
            f"regenerate: {r['out']} {'would change' if r['changed'] else 'is up to date'}: {r['left']} of "
            f"{r['selected']} conversations left ({r['turns_left']} answers), {r['num_skipped']} rows skipped"
        )
    else:
        state = "written" if r["changed"] else "up to date"
        human = (
            f"regenerate: {r['out']} {state}: {r['num_written']} written, {r['num_failed']} failed, "
            f"{r['num_skipped']} skipped of {r['num_input']} rows; {r['output_tokens']} tokens in {r['wall_seconds']} s ({r['tok_per_s']} tok/s)"
        )
        if r["failures"]:
            human += f"\n  not in the output (also in {r['failures_file']}):\n    " + "\n    ".join(
                f"{f['loc']}: {f['kind']}: {f['reason']}" for f in r["failures"][:20]
            )
    emit(args, r, human)
    return 0
