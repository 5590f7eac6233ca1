"""``eagle3ops demo``: build the embedded demo target, tokenizer and conversations (offline, seeded)."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, emit


def register(subparsers) -> None:
    from eagle3ops.tools._options import DEMO

    DEMO.add_parser(subparsers).set_defaults(func=run)


def run(args) -> int:
    from eagle3ops.demo import DemoError, build_demo

    try:
        result = build_demo(
            args.out,
            num_conversations=args.num_conversations,
            seed=args.seed,
            train_steps=args.train_steps,
            check=args.check,
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
        )
    except DemoError as e:
        raise CommandError(str(e), out=args.out) from e
    state = "built" if result["changed"] else "up to date"
    if args.check:
        state = "would build" if result["changed"] else "up to date"
    human = (
        f"demo {state}: {result['out']}\n"
        f"  model:         {result['model_path']} ({result['num_layers']} layers, hidden "
        f"{result['hidden_size']}, vocab {result['vocab_size']}, final LM loss {result['final_lm_loss']})\n"
        f"  conversations: {result['conversations_path']} ({result['num_conversations']})\n"
        f"  held-out:      {result['heldout_path']} ({result['num_heldout']})"
    )
    emit(args, result, human)
    return 0
