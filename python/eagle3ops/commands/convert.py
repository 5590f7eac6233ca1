"""``eagle3ops convert``: a speculators EAGLE-3 checkpoint -> the draft directory SGLang serves."""

from __future__ import annotations

import sys

from eagle3ops.cli import CommandError, add_json_flag, emit
from eagle3ops.sglang_versions import DEFAULT_VERSION, KNOWN


def register(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a speculators eagle3 checkpoint for SGLang (LlamaForCausalLMEagle3)",
        description="Refuses drafts SGLang cannot serve as trained (norm_before_residual, a sliding window "
        "the server would not match, trained embeddings...). Idempotent: an up-to-date output is left alone.",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint dir, a speculators save path (checkpoint_best / newest epoch) or a train run dir",
    )
    p.add_argument("--out", required=True, help="output directory (--speculative-draft-model-path)")
    p.add_argument(
        "--serve-window",
        type=int,
        help="the --speculative-draft-window-size the server will use (needed for a sliding-window draft)",
    )
    p.add_argument("--target-arch", help="the target's architecture (default: the checkpoint's verifier's)")
    p.add_argument(
        "--sglang-layer-ids",
        type=int,
        nargs="+",
        help="write these ids into eagle_config as is (for a target outside eagle3ops' convention table)",
    )
    p.add_argument(
        "--sglang-version",
        default=DEFAULT_VERSION,
        help=f"the SGLang version that serves the draft, one of {', '.join(KNOWN)} (default {DEFAULT_VERSION})",
    )
    p.add_argument("--check", action="store_true", help="check and predict; write nothing")
    add_json_flag(p)
    p.set_defaults(func=cmd_convert)


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
