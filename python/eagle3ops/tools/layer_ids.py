"""``eagle3ops layer-ids``: a target's aux layer ids, resolved and checked by :mod:`eagle3ops.layers`.

Reads the model directory's ``config.json`` only (no torch, no transformers): what the sglang role calls to
decide ``sglang_resolved_layer_ids``, so the role holds no copy of the rule; with ``--sglang-version`` also the
flags that version's dump server needs for those ids (``sglang_capture_args``, from the version table
:mod:`eagle3ops.sglang.versions`), which the role writes into the server's unit, so it holds no copy of the
table either.
"""

from __future__ import annotations

from eagle3ops.command import CommandError, emit


def register(sub) -> None:
    from eagle3ops.tools._options import LAYER_IDS

    LAYER_IDS.add_parser(sub).set_defaults(func=cmd_layer_ids)


def cmd_layer_ids(args) -> int:
    from eagle3ops import layers
    from eagle3ops.sglang import versions

    given = list(args.ids) if args.ids else None
    n = None
    try:
        n = layers.num_layers_of(args.model)
        ids = layers.resolve(n, given, args.convention, keep_order=args.sglang)
        if args.sglang:
            layers.check_sglang(ids)
        capture_args = None
        if args.sglang_version is not None:
            capture_args = versions.dump_capture_args(args.sglang_version, ids)
    except layers.LayerIdError as e:
        raise CommandError(str(e), layer_ids=given, num_layers=n, model=str(args.model)) from None
    except versions.UnknownVersion as e:
        raise CommandError(str(e), sglang_version=args.sglang_version, known=list(versions.KNOWN)) from None
    res = {
        "layer_ids": ids,
        "num_layers": n,
        "given": given,
        "convention": args.convention,
        "sglang_checked": bool(args.sglang),
        "model": str(args.model),
        "sglang_version": args.sglang_version,
        "sglang_capture_args": capture_args,
        "changed": False,
    }
    source = f"given {given} ({args.convention} convention)" if given else "the default [2, N//2, N-3]"
    emit(args, res, f"aux layer ids {ids} (input of layer i) for {args.model}, {n} layers: {source}")
    return 0
