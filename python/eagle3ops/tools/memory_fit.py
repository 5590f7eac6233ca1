"""``eagle3ops memory-fit``: the memory preflight of :mod:`eagle3ops.memory_fit`, which the sglang role runs
before it installs the capture server's unit and the serve role before it starts the serving server, with the
flags each server gets. Reads config.json and the shards' headers only."""

from __future__ import annotations

import math

from eagle3ops.command import CommandError, emit


def register(sub) -> None:
    from eagle3ops.tools._options import MEMORY_FIT

    MEMORY_FIT.add_parser(sub).set_defaults(func=cmd_memory_fit)


def cmd_memory_fit(args) -> int:
    from eagle3ops import checkpoint_files, memory_fit
    from eagle3ops.serve.draft_bytes import DraftBytesError, served_bytes

    try:
        flags = memory_fit.server_flags(args.server_args)
        gpu = args.gpu_memory_mib or memory_fit.gpu_memory_mib()
        if gpu is None:
            res = {"changed": False, "checked": False, "reason": "no GPU (nvidia-smi answered none)"}
            emit(args, res, "memory-fit: no GPU here (nvidia-smi answered none): nothing to check")
            return 0
        model = memory_fit.model_memory(args.model, memory_fit.VARIABLES[args.phase]["model"])
        draft_bytes, draft_from = served_bytes(args.draft)
        tp = args.tp_size or flags.get("tp_size", 1)
        profile = memory_fit.Profile(
            phase=args.phase,
            gpu_memory_mib=gpu,
            tp_size=tp,
            context_length=flags.get("context_length") or model.max_positions,
            mem_fraction_static=flags.get("mem_fraction_static"),
            chunked_prefill_size=flags.get("chunked_prefill_size", memory_fit.SGLANG_CHUNKED_PREFILL),
            max_prefill_tokens=flags.get("max_prefill_tokens", memory_fit.SGLANG_MAX_PREFILL_TOKENS),
            cuda_graph_max_bs=flags.get("cuda_graph_max_bs", memory_fit.SGLANG_CUDA_GRAPH_MAX_BS),
            speculative=bool(flags.get("speculative_algorithm")),
            aux_layers=args.aux_layers,
            store_dtype=args.dtype,
            kv_cache_dtype=flags.get("kv_cache_dtype", "auto"),
            draft_bytes=draft_bytes,
        )
        res = memory_fit.check(model, profile)
    except (memory_fit.MemoryFitError, checkpoint_files.CheckpointError, DraftBytesError) as e:
        raise CommandError(str(e), model=str(args.model), phase=args.phase, **e.details) from None
    g = memory_fit.GIB
    dnote = f" (the draft {draft_bytes / g:.2f} GiB, from {draft_from})" if draft_bytes else ""
    res.update(
        changed=False, checked=True, model=str(args.model), draft={"bytes": draft_bytes, "from": draft_from}
    )
    emit(
        args,
        res,
        f"memory-fit ({args.phase}): fits {tp} GPUs of {gpu:,} MiB: weights {res['weights'] / g:.1f} GiB{dnote} + KV "
        f"{res['kv'] / g:.1f} GiB ({profile.context_length:,} tokens) in {res['static'] / g:.1f} GiB "
        f"(mem_fraction_static {res['mem_fraction_static']}); reserve {res['reserve'] / g:.1f} GiB + capture "
        f"{res['capture'] / g:.1f} GiB in {res['headroom'] / g:.1f} GiB; up to "
        f"{math.floor(res['max_context_length']):,} tokens of context",
    )
    return 0
