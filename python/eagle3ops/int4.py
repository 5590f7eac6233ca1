"""INT4 weight-only, symmetric, group-wise quantisation in compressed-tensors' ``pack-quantized`` form (the
form of Kimi-K2.5's routed experts; the extract phase dequantises them with it, the fixture builder writes them
with it): per Linear weight ``[out, in]``

- ``weight_packed`` int32 ``[out, in / 8]``: each value q in [-8, 7] is stored as q + 8 in one nibble, eight per
  int32 along the input dim, element ``i`` of a word at bits ``4 * i`` (the least significant nibble first);
- ``weight_scale`` bf16 ``[out, in / group]``: one scale per group of ``group`` inputs (no zero point:
  symmetric), the weight being ``q * scale``;
- ``weight_shape`` int32 ``[2]``: ``[out, in]``.

The layout is compressed-tensors' (``pack_to_int32`` / ``unpack_from_int32``, 0.20); tests/unit/core/
test_kimi_fixture.py checks this module against the package itself.
"""

from __future__ import annotations

NUM_BITS = 4
PER_WORD = 32 // NUM_BITS
QMIN, QMAX = -8, 7


def quantize(weight, group: int):
    """(q int8 ``[out, in]``, scale bf16 ``[out, in / group]``) of a float weight: scale = absmax / 7 of its
    group, rounded to bf16 first so that ``q * scale`` is what a reader dequantises."""
    import torch

    out_dim, in_dim = weight.shape
    if in_dim % group or group % PER_WORD:
        raise ValueError(f"input dim {in_dim} is not a multiple of the group {group} (itself of {PER_WORD})")
    w = weight.float().reshape(out_dim, in_dim // group, group)
    scale = (w.abs().amax(dim=-1) / QMAX).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.round(w / scale.float().unsqueeze(-1)).clamp(QMIN, QMAX).to(torch.int8)
    return q.reshape(out_dim, in_dim), scale


def pack(q):
    """int8 ``[out, in]`` with values in [-8, 7] -> int32 ``[out, in / 8]``."""
    import torch

    out_dim, in_dim = q.shape
    if in_dim % PER_WORD:
        raise ValueError(f"input dim {in_dim} is not a multiple of {PER_WORD}")
    nibbles = (q.to(torch.int64) - QMIN).reshape(out_dim, in_dim // PER_WORD, PER_WORD)
    shifts = torch.arange(PER_WORD, dtype=torch.int64) * NUM_BITS
    words = (nibbles << shifts).sum(dim=-1)  # < 2**32: fits int64, then wraps into int32's range
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack(packed, shape):
    """int32 ``[out, in / 8]`` -> int8 ``[out, in]`` (``shape`` = ``weight_shape``)."""
    import torch

    out_dim, in_dim = (int(x) for x in shape)
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(PER_WORD, dtype=torch.int64) * NUM_BITS
    nibbles = (words.unsqueeze(-1) >> shifts) & 0xF
    return (nibbles.reshape(out_dim, -1)[:, :in_dim] + QMIN).to(torch.int8)


def dequantize(packed, scale, shape, dtype=None):
    """The weight ``q * scale`` (float32 unless ``dtype``) from the three stored tensors."""
    q = unpack(packed, shape).float()
    out_dim, in_dim = q.shape
    group = in_dim // scale.shape[1]
    w = (q.reshape(out_dim, -1, group) * scale.float().unsqueeze(-1)).reshape(out_dim, in_dim)
    return w if dtype is None else w.to(dtype)


def compress(weight, group: int) -> dict:
    """The three stored tensors of one Linear weight (suffixes ``weight_packed``, ``weight_scale``,
    ``weight_shape``)."""
    import torch

    q, scale = quantize(weight, group)
    return {
        "weight_packed": pack(q),
        "weight_scale": scale,
        "weight_shape": torch.tensor(list(weight.shape), dtype=torch.int32),
    }
