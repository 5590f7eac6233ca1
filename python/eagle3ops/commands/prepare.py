"""``eagle3ops prepare``: conversations -> speculators 0.9.0 offline training rows (Arrow + token_freq.pt)."""

from __future__ import annotations

import sys

from eagle3ops.cli import CommandError, add_json_flag, emit


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "prepare",
        help="tokenise conversations into speculators' offline training rows (input_ids, loss_mask)",
        description=(
            "Render conversations with the target's chat template, one row per assistant turn with the "
            "loss mask on that turn (speculators 0.9.0 semantics), and write DATA_DIR as an Arrow dataset "
            "plus token_freq.pt and prepare_meta.json. Idempotent; atomic; refuses to orphan extracted "
            "hidden states."
        ),
    )
    p.add_argument("--model", required=True, metavar="PATH", help="target model directory (its tokenizer)")
    p.add_argument(
        "--input",
        required=True,
        action="append",
        metavar="PATH",
        help="JSONL/JSON file, directory of them, or a datasets.save_to_disk directory (repeatable)",
    )
    p.add_argument("--out", required=True, metavar="DATA_DIR")
    p.add_argument("--max-length", type=int, default=512, help="tokens per row (default 512)")
    p.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="bad input rows: fail (default; nothing is written) or skip (listed in the result)",
    )
    p.add_argument("--max-samples", type=int, default=None, metavar="N", help="keep at most N rows")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.add_argument(
        "--force", action="store_true", help="replace a dataset whose hidden states were already extracted"
    )
    p.add_argument("--check", action="store_true", help="write nothing; report whether it would change")
    p.add_argument(
        "--lock-wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="while another run holds DATA_DIR, wait up to this long for it (default 0: fail at once)",
    )
    p.add_argument("--trust-remote-code", action="store_true", help="allow the tokenizer's own code")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import contextlib

    from eagle3ops.prepare import PrepareError, prepare
    from eagle3ops.runlock import RunLock, holder

    # one run per data directory; check mode takes no lock but says who holds it
    running = holder(args.out) if args.check else None
    lock = contextlib.nullcontext() if args.check else RunLock(args.out, what="prepare", wait=args.lock_wait)
    with lock:
        result = _prepare(args, prepare, PrepareError)
        if not args.check:
            result.update(lock.result_fields())
    if args.check:
        result.update(running=running is not None, holder=running)
    return _emit(args, result)


def _prepare(args, prepare, PrepareError) -> dict:
    try:
        result = prepare(
            args.model,
            args.input,
            args.out,
            max_length=args.max_length,
            on_error=args.on_error,
            max_samples=args.max_samples,
            seed=args.seed,
            force=args.force,
            check=args.check,
            trust_remote_code=args.trust_remote_code,
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
            progress=sys.stderr.isatty() and not args.json,
        )
    except PrepareError as e:
        raise CommandError(str(e), out=args.out, problems=e.problems) from e
    return result


def _emit(args, result) -> int:
    if args.check:
        human = f"prepare: {args.out} {'would change' if result['changed'] else 'is up to date'}"
    else:
        state = "written" if result["changed"] else "up to date"
        human = (
            f"prepare: {result['out']} {state}: {result['num_rows']} rows, {result['num_tokens']} tokens "
            f"({result['num_supervised_tokens']} supervised), {len(result['skipped'])} skipped"
        )
        if result["skipped"]:
            human += "\n  skipped:\n    " + "\n    ".join(result["skipped"])
    emit(args, result, human)
    return 0
