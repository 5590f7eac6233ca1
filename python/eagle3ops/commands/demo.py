"""``eagle3ops demo``: build the embedded demo target, tokenizer and conversations (offline, seeded)."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, add_json_flag, emit


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="build the tiny DeepSeek-V3-shaped demo target, its tokenizer and a conversation set",
        description=(
            "Build DIR/model (DeepseekV3ForCausalLM, 8 layers, hidden 64, briefly trained on CPU), "
            "DIR/conversations.jsonl, DIR/heldout.jsonl and DIR/demo.json, deterministically from the "
            "seed and without downloads. A second run with the same parameters changes nothing."
        ),
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to build the demo in")
    p.add_argument("--num-conversations", type=int, default=300, metavar="N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--train-steps",
        type=int,
        default=120,
        metavar="N",
        help="optimiser steps of the target's training (default 120; fewer: cheaper, less trained)",
    )
    p.add_argument("--check", action="store_true", help="only report whether a build would happen")
    add_json_flag(p)
    p.set_defaults(func=run)


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
