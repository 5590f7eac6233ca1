"""The device side of one prefill batch the SGLang dump hook takes (:mod:`eagle3ops.sglang.hook`).

:func:`device_block` packs the batch's states ``[N, K+1, H]`` on the GPU in the store dtype (fp8: quantised
there, a state at a time, with :func:`eagle3ops.store.sample.quantize_fp8`, the transformers backend's function,
so both backends write the same bytes) and reduces one "all finite" flag a token beside them.
:func:`copy_to_host` lays the states, the fp8 scales, the token ids and the flags out in one reused pinned buffer
and copies them there on a side stream. Nothing here waits for the GPU: the hook's dispatcher thread waits on the
returned event, so the forward thread pays only for launching the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3ops.store.sample import quantize_fp8


@dataclass
class HostBatch:
    """A batch's CPU views into its pinned buffer; valid once ``event`` completed (None: already copied)."""

    states: object  # [N, K+1, H] in the store dtype
    token_ids: object  # int64 [N]
    finite: object  # bool [N]: the token's K+1 states are all finite
    scales: object | None  # fp8: float32 [N, K+1, 1], one scale a token and state
    event: object | None
    buffer: object  # the pool's buffer, to give back once the batch is written


def device_block(aux, last, *, k: int, hidden: int, dtype, fp8: bool):
    """``(block [N, K+1, H], fp8 scales [N, K+1, 1] or None, finite flags [N])`` on the device: ``aux``
    ``[N, K*H]`` (SGLang's packed aux states, layers in order) then ``last`` ``[N, H]``, in ``dtype`` (ignored
    for fp8, which quantises from the model's own dtype, as the transformers backend does)."""
    import torch

    n_rows = last.shape[0]
    src = aux.view(n_rows, k, hidden)
    if not fp8:
        block = torch.empty((n_rows, k + 1, hidden), dtype=dtype, device=last.device)
        block[:, :k].copy_(src)
        block[:, k].copy_(last)
        return block, None, rows_finite(block)
    # a state at a time, so the float32 temporaries are one state's size, not the block's
    block = torch.empty((n_rows, k + 1, hidden), dtype=torch.float8_e4m3fn, device=last.device)
    scales = torch.empty((n_rows, k + 1, 1), dtype=torch.float32, device=last.device)
    for j in range(k + 1):
        block[:, j], scales[:, j] = quantize_fp8(src[:, j] if j < k else last)
    # a row's scale is finite exactly when the row is (quantize_fp8), and the scales are 1/H of the states
    return block, scales, torch.isfinite(scales).flatten(1).all(dim=1)


def rows_finite(block):
    """bool [N]: row ``n`` of ``block`` [N, ...] holds no NaN or +-Inf. Its smallest and largest values are both
    finite exactly then (a NaN anywhere makes both NaN), read in one pass with no temporary of the block's size:
    ``isfinite(block).all`` wrote a bool copy first and cost 1.7-2.0x the block build it guards at 16k tokens on
    an H100, this 0.35-0.83x (bench/hook_finite_gpu.py, 2026-12-07)."""
    import torch

    lo, hi = torch.aminmax(block.flatten(1), dim=1)
    return torch.isfinite(lo) & torch.isfinite(hi)


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8


def copy_to_host(pool, copy_stream, block, scales, ids, finite) -> HostBatch:
    """One buffer of ``pool`` holding the states, (fp8) the scales, the ids and the flags, each view 8-byte
    aligned; copied asynchronously on ``copy_stream`` after the compute stream's work so far (``None``: no CUDA,
    copied now). The device tensors are recorded on the copy stream, so their memory is not reused before the
    copy has read them."""
    import torch

    n_rows = block.shape[0]
    nbytes = block.numel() * block.element_size()
    scales_at = _align8(nbytes)
    scale_bytes = 0 if scales is None else 4 * scales.numel()
    ids_at = _align8(scales_at + scale_bytes)
    finite_at = ids_at + 8 * n_rows
    buf = pool.acquire(finite_at + n_rows)
    host = buf[:nbytes].view(block.dtype).view(block.shape)
    host_scales = None
    if scales is not None:
        host_scales = buf[scales_at : scales_at + scale_bytes].view(torch.float32).view(scales.shape)
    host_ids = buf[ids_at:finite_at].view(torch.int64)
    host_finite = buf[finite_at : finite_at + n_rows].view(torch.bool)
    pairs = [(host, block), (host_ids, ids), (host_finite, finite)]
    if scales is not None:
        pairs.append((host_scales, scales))
    event = None
    if copy_stream is not None:
        copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy_stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(copy_stream)
        for _, src in pairs:
            src.record_stream(copy_stream)
    else:
        for dst, src in pairs:
            dst.copy_(src)
    return HostBatch(host, host_ids, host_finite, host_scales, event, buf)
