"""Hidden-state extraction, transformers backend (CPU or CUDA).

For every prepared row i, the target's hidden states at the aux layers (input-of-layer convention, the one
SGLang, vLLM and speculators use) plus the **pre-norm** output of the last decoder layer are written as
``hidden_states/hs_{i}.safetensors`` through :mod:`eagle3ops.store` (atomic files + manifest).

Pipeline per batch: rows sorted by length are packed into batches under a padded-token budget; the forward
runs the base model only (no lm_head); forward hooks capture the states; the [B, L, K+1, H] block is cast to
the store dtype on the device, copied to (pinned) CPU memory asynchronously and handed to the writer threads
(:mod:`eagle3ops.extract.writer`) that serialise and write while the next batch computes. What is left to do,
the store's meta and the model check are the session's (:mod:`eagle3ops.extract.session`), shared with the
SGLang backend.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass

from eagle3ops.extract import text_model
from eagle3ops.extract.adoption import commit_dump, survey_dump
from eagle3ops.extract.errors import ExtractError
from eagle3ops.extract.session import (
    ExtractConfig,
    build_meta,
    config_indices,
    damaged_report,
    disk_preflight,
    load_seq_lens,
    model_facts,
    progress_reporter,
    resolve_layer_ids,
    run_result,
)
from eagle3ops.extract.writer import PinnedPool, SampleWriter, WriterJob, release_all
from eagle3ops.store import (
    DTYPE_SIZES,
    FP8_DTYPE,
    DiskSpaceError,
    HiddenStateStore,
    human_bytes,
    quantize_fp8,
)


# ----------------------------------------------------------------------------------------------------------
# batching
# ----------------------------------------------------------------------------------------------------------
def make_batches(
    indices: Sequence[int], seq_lens: Sequence[int], max_batch_tokens: int, max_batch_size: int
) -> list[list[int]]:
    """Length-sorted batches whose padded size (B × longest) stays under ``max_batch_tokens``."""
    order = sorted(indices, key=lambda i: (-seq_lens[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = seq_lens[cur[0]] if cur else seq_lens[i]
        if cur and ((len(cur) + 1) * longest > max_batch_tokens or len(cur) >= max_batch_size):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


# ----------------------------------------------------------------------------------------------------------
# capture
# ----------------------------------------------------------------------------------------------------------
def decoder_layers(model):
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ExtractError(f"{type(model).__name__}: cannot find the decoder layers (model.model.layers)")
    return base, layers


class StateCapture:
    """Forward hooks that capture the inputs of the aux layers and the output of the last layer."""

    def __init__(self, model, layer_ids: Sequence[int]):
        self.base, layers = decoder_layers(model)
        self.layer_ids = list(layer_ids)
        self.captured: dict[int, object] = {}
        self._handles = []
        for lid in self.layer_ids:
            self._handles.append(layers[lid].register_forward_pre_hook(self._pre_hook(lid), with_kwargs=True))
        self._handles.append(layers[len(layers) - 1].register_forward_hook(self._post_hook))

    def _pre_hook(self, lid):
        def hook(_module, args, kwargs):
            self.captured[lid] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _post_hook(self, _module, _args, output):
        self.captured["last"] = output[0] if isinstance(output, (tuple, list)) else output

    def stacked(self):
        """[B, L, K+1, H]: the aux states in layer order, then the pre-norm last state."""
        import torch

        parts = [self.captured[lid] for lid in self.layer_ids] + [self.captured["last"]]
        self.captured = {}
        return torch.stack(parts, dim=2)

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []


def target_limits(model) -> dict:
    """The loaded target's vocabulary size and position limit (None: no limit in its config)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return {
        "vocab": int(model.get_input_embeddings().num_embeddings),
        "max_positions": getattr(cfg, "max_position_embeddings", None),
    }


def load_model(model_path: str, device: str, compute_dtype: str, checkpoint=None):
    """The target in ``compute_dtype`` on ``device``; a multimodal wrapper's text model or INT4 experts through
    :mod:`eagle3ops.extract.text_model` (``checkpoint``: its :func:`~eagle3ops.extract.text_model.describe`)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, compute_dtype)
    if checkpoint is not None and checkpoint.needs_own_loader:
        return text_model.load(checkpoint, device, dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    model.to(device)
    model.eval()
    return model


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ExtractError(
            f"device {device!r} asked for, but torch sees no CUDA device; use device=cpu or auto"
        )
    return device


@dataclass
class _Loop:
    """What the batch loop of :func:`run_extraction` works with."""

    cfg: ExtractConfig
    ds: object
    seq_lens: Sequence[int]
    limits: dict
    capture: StateCapture
    device: str
    fp8: bool
    store_dtype: object
    cuda: bool
    copy_stream: object
    pool: PinnedPool | None
    writer: SampleWriter
    token_cap: int | None = None  # padded tokens a batch may hold after a CUDA out-of-memory error
    oom_splits: int = 0  # batches split in two after one


def run_extraction(cfg: ExtractConfig) -> dict:
    """Extract every remaining row of this rank; resumable; returns counts."""
    t_start = time.perf_counter()
    seq_lens = load_seq_lens(cfg.data_dir)
    facts = model_facts(cfg.model_path, content_hash=cfg.model_hash, trust_remote_code=cfg.trust_remote_code)
    layer_ids = resolve_layer_ids(facts["num_layers"], cfg.layer_ids, cfg.layer_convention)
    # a wrapper's text model, INT4 experts, missing or truncated shards, a checkpoint without decoder layers:
    # settled before anything is written
    checkpoint = text_model.describe(cfg.model_path)
    num_states, hidden = len(layer_ids) + 1, facts["hidden_size"]
    if cfg.dtype not in DTYPE_SIZES:
        raise ExtractError(
            f"store dtype {cfg.dtype!r} is not supported here; use bfloat16, float16, float32 or {FP8_DTYPE}"
        )
    fp8 = cfg.dtype == FP8_DTYPE
    store, plan, result = _plan_store(cfg, seq_lens, facts, layer_ids, num_states, hidden)
    if not plan.remaining:
        result["seconds"] = round(time.perf_counter() - t_start, 3)
        return result
    import torch  # only now: a converged re-run never pays its import (docs/performance.md, "Idempotent re-run")

    result["preflight"] = disk_preflight(store.dir, plan.bytes_needed, cfg)

    from datasets import load_from_disk

    ds = load_from_disk(str(cfg.data_dir)).with_format("numpy", columns=["input_ids"])
    device = resolve_device(cfg.device)
    compute_dtype = (
        cfg.compute_dtype
        if cfg.compute_dtype != "auto"
        else ("bfloat16" if device.startswith("cuda") else "float32")
    )
    model = load_model(cfg.model_path, device, compute_dtype, checkpoint)
    limits = target_limits(model)
    _check_lengths(cfg, plan.remaining, seq_lens, limits)
    capture = StateCapture(model, layer_ids)
    store_dtype = getattr(torch, cfg.dtype)
    cuda = device.startswith("cuda")
    copy_stream = torch.cuda.Stream() if cuda else None

    batches = make_batches(plan.remaining, seq_lens, cfg.max_batch_tokens, cfg.max_batch_size)
    advance, close_progress = progress_reporter(
        len(plan.remaining), plan.tokens_remaining, cfg.progress, cfg.log_path
    )
    writer = SampleWriter(
        store, fsync=cfg.fsync, threads=cfg.writer_threads, checksum=cfg.checksum, on_written=advance
    )
    pool = _pinned_pool(cfg, batches, seq_lens, num_states, hidden, store_dtype, fp8) if cuda else None
    loop = _Loop(
        cfg, ds, seq_lens, limits, capture, device, fp8, store_dtype, cuda, copy_stream, pool, writer
    )
    writer.start()
    ok = False  # the manifest is closed in `finally`; its error must not hide the one that got us there
    t_compute = 0.0
    t_loop = time.perf_counter()
    loop_started_at = time.time()  # wall clock: workers' loops are merged into one span
    try:
        with torch.inference_mode():
            for batch in batches:
                t_compute += _extract_fitting(loop, batch)
        writer.finish()
        ok = True
    except BaseException:
        # stop the writer after what it already has; finished samples stay valid and recorded
        _finish_writer_after_error(writer, store, plan.bytes_needed)
        raise
    finally:
        capture.remove()
        close_progress()
        if ok:
            store.close()
        else:
            with contextlib.suppress(OSError):  # e.g. a second ENOSPC: the first one is the report
                store.close()
    st = writer.stats
    now = time.perf_counter()
    secs, loop_secs = now - t_start, now - t_loop
    result.update(
        written=st.written,
        tokens=st.tokens,
        bytes=st.bytes,
        seconds=round(secs, 3),
        tokens_per_second=round(st.tokens / secs, 1) if secs else None,
        loop_seconds=round(loop_secs, 3),
        loop_tokens_per_second=round(st.tokens / loop_secs, 1) if loop_secs else None,
        loop_started_at=loop_started_at,
        loop_finished_at=time.time(),
        compute_seconds=round(t_compute, 3),
        write_seconds=round(st.write_seconds, 3),
        serialize_seconds=round(st.serialize_seconds, 3),
        device=device,
        compute_dtype=compute_dtype,
        batches=len(batches),
        oom_splits=loop.oom_splits,
        max_batch_tokens_used=loop.token_cap or cfg.max_batch_tokens,
    )
    if loop.oom_splits:
        result["warnings"] = [oom_warning(loop.oom_splits, loop.token_cap, cfg.max_batch_tokens)]
    return result


def oom_warning(splits: int, cap: int, planned: int) -> str:
    """What the report says after batches were split because the GPU ran out of memory."""
    return (
        f"the GPU ran out of memory on {splits} batch(es): each was split in two and the run went on with at "
        f"most {cap} padded tokens a batch (planned: {planned}). Set extract_max_batch_tokens (--max-batch-tokens) "
        f"to {cap} or less to skip the failed tries next time"
    )


def _pinned_pool(cfg: ExtractConfig, batches, seq_lens, num_states: int, hidden: int, store_dtype, fp8: bool):
    """One pinned buffer per batch that can be in flight (queued, being written, being filled), up front."""
    depth = 3
    in_flight = depth + cfg.writer_threads + 1
    max_block = max(len(b) * max(seq_lens[i] for i in b) for b in batches) * num_states * hidden
    pool = PinnedPool(pin=True, keep=2 * in_flight)
    pool.reserve(in_flight, max_block * store_dtype.itemsize)
    if fp8:
        pool.reserve(in_flight, max_block // hidden * 4)  # the float32 scales, one per row
    return pool


def _plan_store(cfg: ExtractConfig, seq_lens, facts: dict, layer_ids, num_states: int, hidden: int):
    """The store opened (meta checked, temp files removed, damage repaired or reported) and what is left
    to do. Returns (store, plan, result so far)."""
    store = HiddenStateStore(cfg.data_dir, rank=cfg.rank)
    # an existing dump (adopt_from): surveyed before anything is written; the parent of --workers N adopts it
    dump = survey_dump(cfg, layer_ids, hidden) if cfg.world_size == 1 else None
    discarded = store.ensure_meta(
        build_meta(cfg, facts, layer_ids, len(seq_lens)), on_model_change=cfg.on_model_change
    )
    adopted_dump = commit_dump(dump)
    removed_tmp = store.clean_temp_files()
    indices = config_indices(cfg, len(seq_lens))  # with a re-assignment: also the lost rows this rank takes
    # damaged files are moved aside and their entries dropped by the one process that owns the directory: a
    # single run, or the parent of --workers N before it starts them (repair_store); a worker only reports
    plan = store.plan(
        seq_lens,
        num_states=num_states,
        hidden_size=hidden,
        dtype=cfg.dtype,
        indices=indices,
        verify=cfg.verify,
        repair=cfg.world_size == 1,
    )
    result = run_result(cfg, indices, plan, layer_ids, facts)
    result.update(
        rank=cfg.rank,
        world_size=cfg.world_size,
        removed_temp_files=len(removed_tmp),
        damaged=len(plan.damaged),
        damaged_files=damaged_report(store, plan.damaged),
        moved_aside=plan.moved_aside,
        duplicate_manifest_lines=plan.duplicates,
        unchecked_files=plan.unchecked,
        verify=cfg.verify,
        discarded_store=discarded,
        **adopted_dump,
    )
    return store, plan, result


def _check_lengths(cfg: ExtractConfig, remaining, seq_lens, limits: dict) -> None:
    """Rows longer than the target's context length are refused before any is extracted."""
    too_long = [i for i in remaining if limits["max_positions"] and seq_lens[i] > limits["max_positions"]]
    if too_long:
        raise ExtractError(
            f"{cfg.data_dir}: {len(too_long)} rows are longer than the target's max_position_embeddings "
            f"{limits['max_positions']} (rows {too_long[:20]}, up to {max(seq_lens[i] for i in too_long)} "
            f"tokens): past its context length the target gives states it was never trained for. Re-run prepare with --max-length "
            f"{limits['max_positions']} or less (prepare_max_length). Nothing was extracted for them."
        )


def _check_rows(cfg: ExtractConfig, batch, rows, lens, limits: dict) -> None:
    """A batch's rows must have their recorded length and token ids inside the target's vocabulary."""
    for i, r, n in zip(batch, rows, lens, strict=True):
        if len(r) != n:
            raise ExtractError(
                f"{cfg.data_dir}: row {i} has {len(r)} input_ids but seq_len {n}; re-run prepare"
            )
    oov = [(i, int(r.max())) for i, r in zip(batch, rows, strict=True) if r.max() >= limits["vocab"]]
    if oov:
        raise ExtractError(
            f"{cfg.data_dir}: rows {[i for i, _ in oov][:20]} hold token ids up to {max(t for _, t in oov)}"
            f" but the target {cfg.model_path} has a vocabulary of {limits['vocab']}: the data was "
            "prepared with another tokenizer. Re-run prepare with this model (prepare_model_path = "
            "extract_model_path). Rows finished before are kept."
        )


def _padded(loop: _Loop, batch: list[int]) -> int:
    return len(batch) * max(loop.seq_lens[i] for i in batch)


def _extract_fitting(loop: _Loop, batch: list[int]) -> float:
    """A planned batch, split in two (by rows, length-sorted) when the GPU runs out of memory on it, and so on
    down to one row; afterwards every batch of the padded size that failed or more is split before it is
    tried, so the run pays for one failed forward a size, not one a batch (users' pain 9). A row that does not
    fit alone fails, naming it. Nothing was handed to the writer for a batch that failed: its rows are simply done again."""
    import torch

    oom_error = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    pending, seconds = [batch], 0.0
    while pending:
        b = pending.pop(0)
        if len(b) > 1 and loop.token_cap is not None and _padded(loop, b) > loop.token_cap:
            pending[:0] = [b[: len(b) // 2], b[len(b) // 2 :]]
            continue
        failed = None
        try:
            seconds += _extract_batch(loop, b)
        except oom_error as e:
            failed = str(e).splitlines()[0][:300]
        if failed is None:
            continue
        # the exception and its frames (the batch's activations) are gone now: give their memory back
        loop.capture.captured = {}
        if loop.cuda:
            torch.cuda.empty_cache()
        if len(b) == 1:
            n = loop.seq_lens[b[0]]
            raise ExtractError(
                f"row {b[0]} ({n} tokens) does not fit in GPU memory even alone ({failed}). Prepare with a "
                f"smaller --max-length (prepare_max_length, now at least {n}), or give the target more GPU "
                "memory (device, compute_dtype); the rows written so far are kept"
            )
        # what failed is too big; anything smaller may fit (a failure there lowers the cap again)
        loop.token_cap = min(loop.token_cap or _padded(loop, b), _padded(loop, b) - 1)
        loop.oom_splits += 1
        pending[:0] = [b[: len(b) // 2], b[len(b) // 2 :]]
    return seconds


def _extract_batch(loop: _Loop, batch: list[int]) -> float:
    """One batch: checked, padded, forwarded, its states handed to the writer. Returns the compute seconds."""
    import torch

    rows = loop.ds[batch]["input_ids"]
    lens = [loop.seq_lens[i] for i in batch]
    _check_rows(loop.cfg, batch, rows, lens, loop.limits)
    longest = max(lens)
    ids = torch.zeros((len(batch), longest), dtype=torch.long)
    mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        mask[b, : len(r)] = 1
    t0 = time.perf_counter()
    loop.capture.base(
        input_ids=ids.to(loop.device, non_blocking=True),
        attention_mask=mask.to(loop.device, non_blocking=True),
        use_cache=False,
    )
    block, scales = _captured_states(loop, batch)
    host, host_scales, event, release = _to_host(loop, block, scales)
    t_compute = time.perf_counter() - t0
    states = [host[b, :n] for b, n in enumerate(lens)]
    toks = [ids[b, :n] for b, n in enumerate(lens)]
    sc = [host_scales[b, :n] for b, n in enumerate(lens)] if loop.fp8 else None
    loop.writer.submit(WriterJob(list(batch), toks, states, event, release, sc))
    return t_compute


def _captured_states(loop: _Loop, batch: list[int]):
    """The captured [B, L, K+1, H] block in the store dtype (fp8: with its scales), checked finite if
    asked."""
    import torch

    scales = None
    if loop.fp8:  # [B, L, K+1, H] e4m3 + [B, L, K+1, 1] float32, on device
        block, scales = quantize_fp8(loop.capture.stacked())
    else:
        block = loop.capture.stacked().to(loop.store_dtype)  # [B, L, K+1, H] on device
    if loop.cfg.check_finite:
        probe = scales if loop.fp8 else block  # a row's scale is finite iff the row is
        finite = (
            torch.isfinite(probe).flatten(1).all(dim=1)
            if len(batch) > 1
            else torch.isfinite(probe).all().reshape(1)
        )
        # padding positions are finite too (masked attention still yields numbers)
        if not bool(finite.all()):
            bad = [batch[b] for b in range(len(batch)) if not bool(finite[b])]
            raise ExtractError(
                f"non-finite hidden states for rows {bad[:20]} (model {loop.cfg.model_path}); "
                "nothing was written for them. Check the model dtype/weights."
            )
    return block, scales


def _to_host(loop: _Loop, block, scales):
    """CUDA: an async copy into pinned buffers of the pool (event, release); CPU: the block itself.
    Returns (host, host_scales, event, release)."""
    import torch

    event = release = None
    host_scales = scales
    if loop.cuda:
        pool, copy_stream = loop.pool, loop.copy_stream
        buf, host = pool.take(tuple(block.shape), loop.store_dtype)
        sbuf = None
        if loop.fp8:
            sbuf, host_scales = pool.take(tuple(scales.shape), torch.float32)
        copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy_stream):
            host.copy_(block, non_blocking=True)
            if loop.fp8:
                host_scales.copy_(scales, non_blocking=True)
            event = torch.cuda.Event()
            event.record(copy_stream)
        block.record_stream(copy_stream)
        if loop.fp8:
            scales.record_stream(copy_stream)
        release = functools.partial(release_all, pool, buf, sbuf)
    else:
        host = block
    return host, host_scales, event, release


def _finish_writer_after_error(writer: SampleWriter, store: HiddenStateStore, bytes_needed: int) -> None:
    """After an error in the loop: the writer finishes what it has; its own error, if any, replaces the one in
    flight (a DiskSpaceError saying how much the rest of the run still needs)."""
    try:
        writer.finish()
    except BaseException as werr:  # the writer's own error is the more useful one
        if isinstance(werr, DiskSpaceError):  # say how much the rest of the run still needs
            left = max(0, bytes_needed - writer.stats.bytes)
            free = shutil.disk_usage(store.dir).free
            werr = DiskSpaceError(
                f"{werr} {human_bytes(left)} of hidden states still to write in {store.dir}, "
                f"{human_bytes(free)} free there now."
            )
        raise werr from None
