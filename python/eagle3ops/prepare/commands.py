"""``eagle3ops prepare``: conversations -> speculators 0.9.0 offline training rows (Arrow + token_freq.pt)."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, emit, listing, outcome, pick_taken
from eagle3ops.prepare.options import PREPARE


def register(subparsers) -> None:
    PREPARE.add_parser(subparsers).set_defaults(func=run)


def run(args) -> int:
    import contextlib

    from eagle3ops.prepare.dataset import check_model, prepare
    from eagle3ops.prepare.errors import PrepareError
    from eagle3ops.runlock import RunLock, holder

    try:  # before the lock: a wrong --model leaves nothing behind
        check_model(args.model, args.trust_remote_code)
    except PrepareError as e:
        raise CommandError(str(e), out=args.out) from e
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
            # every option prepare() takes by its name but the three above (a new one needs no line here)
            **pick_taken(args, prepare, PREPARE, "model", "out", check="check"),
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
            progress=sys.stderr.isatty() and not args.json,
        )
    except PrepareError as e:
        raise CommandError(str(e), out=args.out, problems=e.problems) from e
    return result


def _emit(args, result) -> int:
    human = outcome("prepare", args.out if args.check else result["out"], result["changed"], args.check)
    if not args.check:
        human += f": {result['summary']}" + listing("skipped", result["skipped"])
    emit(args, result, human)
    return 0
