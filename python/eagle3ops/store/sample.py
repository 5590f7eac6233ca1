"""The sample format: one ``hs_{i}.safetensors`` per row, byte-identical whatever wrote it (the transformers
backend, the SGLang hook, the train fixtures).

``token_ids`` [T] int64 first (8-byte aligned), then for fp8 ``hidden_states_scales`` [T, K+1, 1] float32, then
``hidden_states`` [T, K+1, H] (K aux states in layer order, then the pre-norm output of the last decoder layer);
the header JSON is padded with spaces to a multiple of 8, as the safetensors format asks. Any safetensors reader
loads it. fp8 (``float8_e4m3fn``) stores one float32 scale per row (one token's one state): ``scale =
amax(|row|) * float32(1/448)``, what speculators' ``hs_connectors.FP8Transfer`` dequantises as ``fp8.to(bf16) * scale``.

Sizes and headers are computed here without torch (the planner checks 100k files by their first bytes); only
:func:`quantize_fp8`, :func:`sample_parts` and :func:`load_sample` import torch.
"""

from __future__ import annotations

import functools
import json
import os
import struct

FP8_DTYPE = "float8_e4m3fn"
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# the scale is amax times this float32 constant, never amax / FP8_MAX: CUDA divides a tensor by a Python scalar
# as a multiply by its reciprocal, the CPU divides; the two rounded ~45 % of the scales one float32 step apart
# (H100, 2026-12-07), so the same states made other bytes on each device. A multiply by the same float32 is
# rounded the same way by every IEEE device.
FP8_INV_MAX = struct.unpack("<f", struct.pack("<f", 1.0 / FP8_MAX))[0]
# the key hs_connectors 0.9.0 (speculators' loader, `hidden_states_backend: fp8`) dequantises with
FP8_SCALES_KEY = "hidden_states_scales"
# bytes per element for the dtypes we write
DTYPE_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
# safetensors dtype names
ST_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F8_E4M3": "float8_e4m3fn",
    "I64": "int64",
}


def safetensors_layout(path: str | os.PathLike) -> tuple[dict, int, int]:
    """(the JSON header, its length, the file's size) of a safetensors file, no tensor bytes read: the 8-byte
    length and the JSON, checked to fit the file (ValueError otherwise; a missing file: FileNotFoundError). Where
    the tensors end is the caller's check: a sample's must end the file (:func:`read_safetensors_header`), a
    checkpoint shard's must fit in it (eagle3ops.checkpoint_files)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("file shorter than the 8-byte safetensors header length")
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 1024 * 1024 or 8 + n > size:
            raise ValueError(f"header length {n} does not fit in a {size}-byte file")
        return json.loads(f.read(n)), n, size


def read_safetensors_header(path: str | os.PathLike) -> dict:
    """Read only the JSON header of a safetensors file (no tensor bytes). Raises ValueError if invalid."""
    header, n, size = safetensors_layout(path)
    data_len = size - 8 - n
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if end != data_len:
        raise ValueError(f"tensor data covers {end} bytes but the file holds {data_len} (truncated?)")
    return header


@functools.lru_cache(maxsize=4096)
def header_overhead(seq_len: int, num_states: int, hidden_size: int, scales: bool = False) -> int:
    """Upper bound of the safetensors header size for one sample (JSON, padded to 8 bytes)."""
    entries = {
        "hidden_states": {
            "dtype": "BF16",
            "shape": [seq_len, num_states, hidden_size],
            "data_offsets": [0, 10**12],
        },
        "token_ids": {"dtype": "I64", "shape": [seq_len], "data_offsets": [10**12, 10**12]},
    }
    if scales:
        entries[FP8_SCALES_KEY] = {
            "dtype": "F32",
            "shape": [seq_len, num_states, 1],
            "data_offsets": [10**12] * 2,
        }
    return 8 + len(json.dumps(entries)) + 16


ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


def sample_header(seq_len: int, num_states: int, hidden_size: int, dtype: str) -> tuple[bytes, int]:
    """(the first bytes, the total size) of the file our writers (:func:`sample_parts`: the transformers backend,
    the SGLang hook) make for one row: the 8-byte length and the space-padded JSON header. Byte-equal to a file's
    start means its header matches without parsing it (the planner checks 100k files that way)."""
    fp8 = dtype == FP8_DTYPE
    n_tok = 8 * seq_len
    header: dict = {"token_ids": {"dtype": "I64", "shape": [seq_len], "data_offsets": [0, n_tok]}}
    off = n_tok
    if fp8:
        n_sc = 4 * seq_len * num_states
        header[FP8_SCALES_KEY] = {
            "dtype": "F32",
            "shape": [seq_len, num_states, 1],
            "data_offsets": [off, off + n_sc],
        }
        off += n_sc
    n_hs = seq_len * num_states * hidden_size * DTYPE_SIZES[dtype]
    header["hidden_states"] = {
        "dtype": ST_NAMES[dtype],
        "shape": [seq_len, num_states, hidden_size],
        "data_offsets": [off, off + n_hs],
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, 8 + len(text) + off + n_hs


def sample_nbytes(seq_len: int, num_states: int, hidden_size: int, dtype: str) -> int:
    """Bytes one sample takes on disk (tensor bytes + token ids + fp8 scales + header upper bound)."""
    fp8 = dtype == FP8_DTYPE
    return (
        seq_len * num_states * hidden_size * DTYPE_SIZES[dtype]
        + 8 * seq_len
        + (4 * seq_len * num_states if fp8 else 0)
        + header_overhead(seq_len, num_states, hidden_size, fp8)
    )


def load_sample(path: str | os.PathLike, dtype=None) -> dict:
    """``{"token_ids", "hidden_states"}`` of one file; fp8 files (``hidden_states_scales`` present) are
    dequantised as speculators' reader does (``hs_connectors.FP8Transfer``: ``fp8.to(dtype) * scale.to(dtype)``,
    ``dtype`` bfloat16 by default; pass torch.float32 for the exact reconstruction)."""
    import torch
    from safetensors.torch import load_file

    d = load_file(str(path))
    sc = d.pop(FP8_SCALES_KEY, None)
    if sc is not None:
        dt = dtype or torch.bfloat16
        d["hidden_states"] = d["hidden_states"].to(dt) * sc.to(dt)
    elif dtype is not None:
        d["hidden_states"] = d["hidden_states"].to(dtype)
    return d


# ----------------------------------------------------------------------------------------------------------
# serialisation (shared with the SGLang hook: byte-identical files whatever the backend)
# ----------------------------------------------------------------------------------------------------------
def quantize_fp8(states):
    """``states`` [..., K+1, H] (any float dtype, any device) -> (float8_e4m3fn [..., K+1, H], float32 scale
    [..., K+1, 1]) with one scale per row (one token's one state): ``scale = amax(|row|) * float32(1/448)``, the
    same bits on every device (:data:`FP8_INV_MAX`).

    Stored as ``hidden_states`` + ``hidden_states_scales``: exactly what ``hs_connectors.FP8Transfer`` (selected in
    speculators 0.9.0 by ``data.hidden_states_backend: fp8``) reads and dequantises as ``fp8.to(bf16) * scale``
    (its own writer uses one scale per token, shape [T, 1, 1]; a [T, K+1, 1] scale broadcasts the same way and
    keeps early layers, far smaller than the last one, from losing their precision). A non-finite row gives a
    non-finite scale, so checking the scales checks the states."""
    import torch

    x = states.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) * FP8_INV_MAX).clamp(min=1e-12)
    return (x / scale).to(torch.float8_e4m3fn), scale


def sample_parts(token_ids, hidden_states, scales=None) -> list:
    """One sample as safetensors, without copying the tensors: [header, token_ids bytes, (scales bytes,)
    hidden_states bytes].

    ``token_ids`` [T] int64 first (8-byte aligned), then for fp8 ``hidden_states_scales`` [T, K+1, 1] float32,
    then ``hidden_states`` [T, K+1, H]; the header JSON is padded with spaces to a multiple of 8, as the
    safetensors format asks. Any safetensors reader loads it.
    """
    import torch

    if token_ids.dtype != torch.int64:
        token_ids = token_ids.to(torch.int64)
    if token_ids.shape[0] != hidden_states.shape[0]:
        raise ValueError(
            f"token_ids has {token_ids.shape[0]} tokens but hidden_states {hidden_states.shape[0]}"
        )
    tok = token_ids.contiguous().view(torch.uint8).numpy()
    hs = hidden_states.contiguous().view(torch.uint8).numpy()
    n_tok, n_hs = tok.nbytes, hs.nbytes
    header = {"token_ids": {"dtype": "I64", "shape": list(token_ids.shape), "data_offsets": [0, n_tok]}}
    bufs = [memoryview(tok).cast("B")]
    off = n_tok
    if scales is not None:
        sc = scales.to(torch.float32).contiguous().view(torch.uint8).numpy()
        header[FP8_SCALES_KEY] = {
            "dtype": "F32",
            "shape": list(scales.shape),
            "data_offsets": [off, off + sc.nbytes],
        }
        bufs.append(memoryview(sc.reshape(-1)).cast("B"))
        off += sc.nbytes
    header["hidden_states"] = {
        "dtype": ST_NAMES[str(hidden_states.dtype).removeprefix("torch.")],
        "shape": list(hidden_states.shape),
        "data_offsets": [off, off + n_hs],
    }
    bufs.append(memoryview(hs.reshape(-1)).cast("B"))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little") + text, *bufs]


def serialize_sample(token_ids, hidden_states, scales=None) -> bytes:
    """safetensors bytes of one sample (``token_ids`` [T] int64, ``hidden_states`` [T, K+1, H], for fp8 also
    ``hidden_states_scales`` [T, K+1, 1]).

    The same bytes every backend writes (transformers, the SGLang hook): see :func:`sample_parts`.
    """
    return b"".join(bytes(p) for p in sample_parts(token_ids, hidden_states, scales))
