"""``eagle3ops demo-kimi``: build the Kimi-K2.5-format fixture target (offline, seeded)."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, emit


def register(subparsers) -> None:
    from eagle3ops.tools._options import DEMO_KIMI

    DEMO_KIMI.add_parser(subparsers).set_defaults(func=run)


def run(args) -> int:
    from eagle3ops.kimi_fixture import FixtureError, build

    try:
        result = build(
            args.out,
            seed=args.seed,
            check=args.check,
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
        )
    except FixtureError as e:
        raise CommandError(str(e), out=args.out) from e
    state = ("would build" if args.check else "built") if result["changed"] else "up to date"
    human = (
        f"kimi fixture {state}: {result['out']}\n"
        f"  model:         {result['model_path']} ({result['num_layers']} layers, hidden "
        f"{result['hidden_size']}, vocab {result['vocab_size']})\n"
        f"  conversations: {result['conversations_path']}\n"
        f"  held-out:      {result['heldout_path']}"
    )
    emit(args, result, human)
    return 0
