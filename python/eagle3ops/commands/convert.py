"""``eagle3ops convert``: a speculators EAGLE-3 checkpoint -> the draft directory SGLang serves."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, emit
from eagle3ops.serve_options import CONVERT
from eagle3ops.sglang_versions import KNOWN


def register(sub) -> None:
    CONVERT.add_parser(sub).set_defaults(func=cmd_convert)


def cmd_convert(args) -> int:
    from eagle3ops import convert as cv

    try:
        res = cv.convert(
            args.checkpoint,
            args.out,
            serve_window=args.serve_window,
            target_arch=args.target_arch,
            sglang_ids=args.sglang_layer_ids,
            check=args.check,
            sglang_version=args.sglang_version,
        )
    except cv.ConvertError as e:
        if args.check and e.details.get("missing") and args.sglang_version in KNOWN:
            # check mode before training wrote a checkpoint (e.g. a first --check run of the whole pipeline)
            res = {
                "changed": True,
                "check_mode": True,
                "out": args.out,
                "checkpoint": args.checkpoint,
                "would": "convert the checkpoint once training has written it",
                "layer_ids": None,
                "sglang_layer_ids": None,
                "serve_args": [],
                "draft_window_size": None,
                "config": {},
            }
            print(
                f"convert: {args.checkpoint} has no checkpoint yet; would convert it after training",
                file=sys.stderr,
            )
            emit(args, res)
            return 0
        raise CommandError(str(e), **e.details) from None
    verb = ("would write" if args.check else "wrote") if res["changed"] else "up to date:"
    print(
        f"convert: {verb} {res['out']} from {res['checkpoint']} (target {res['target_arch']}, layer ids "
        f"{res['layer_ids']} -> SGLang {res['sglang_layer_ids']})",
        file=sys.stderr,
    )
    emit(args, res, f"{res['out']}: serve with {' '.join(res['serve_args'])}")
    return 0
