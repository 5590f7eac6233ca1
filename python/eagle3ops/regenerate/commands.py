"""``eagle3ops regenerate``: the assistant turns of the conversations rewritten by the target model itself."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, emit, listing, outcome, pick_taken
from eagle3ops.regenerate.options import REGENERATE


def register(subparsers) -> None:
    REGENERATE.add_parser(subparsers).set_defaults(func=run)


def run(args) -> int:
    from eagle3ops.regenerate.config import RegenerateConfig, RegenerateError
    from eagle3ops.regenerate.run import regenerate

    # every option RegenerateConfig takes by its name (a new one needs no line here), and those it takes otherwise
    cfg = RegenerateConfig(
        **pick_taken(
            args,
            RegenerateConfig,
            REGENERATE,
            inputs="input",
            urls="url",
            served_model="served_model_name",
            plan="check",
        ),
        progress=sys.stderr.isatty() and not args.json,
    )
    try:
        r = regenerate(cfg)
    except RegenerateError as e:
        raise CommandError(str(e), **e.details) from e
    human = outcome("regenerate", r["out"], r["changed"], args.check)
    if args.check:
        human += (
            f": {r['left']} of {r['selected']} conversations left ({r['turns_left']} answers), "
            f"{r['num_skipped']} rows skipped"
        )
    else:
        human += (
            f": {r['num_written']} written, {r['num_failed']} failed, {r['num_skipped']} skipped of "
            f"{r['num_input']} rows; {r['output_tokens']} tokens in {r['wall_seconds']} s ({r['tok_per_s']} tok/s)"
        ) + listing(
            f"not in the output (also in {r.get('failures_file')})",
            (f"{f['loc']}: {f['kind']}: {f['reason']}" for f in r["failures"][:20]),
        )
    emit(args, r, human)
    return 0
