"""A Hugging Face checkpoint's safetensors files, read without torch (standard library only).

- :func:`shard_names`: the shards the checkpoint consists of: those ``model.safetensors.index.json`` lists, or
  the single ``model.safetensors``;
- :func:`read_header`: one shard's header (a little-endian u64 length, then JSON: per tensor its dtype, shape
  and byte range), refused when the file is shorter than the header says (a copy cut off);
- :func:`tensors`: every tensor of the checkpoint with its byte size and shard, the index checked against the
  shards (a shard it lists is there and whole; a tensor it maps is in that shard);
- :func:`decoder_prefix`: where the decoder language model's tensors are (``language_model.`` in a multimodal
  wrapper), refusing a checkpoint that holds none (a vision tower or an encoder alone).

What the memory preflight (:mod:`eagle3ops.memory_fit`) counts, and what a loader checks before it reads a byte
of weights. Errors are :class:`CheckpointError` naming the file and what to do.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.errors import WithDetails
from eagle3ops.store.sample import safetensors_layout

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
WRAPPER_PREFIX = "language_model."
# what a decoder language model's config.json names (text_config's or its own architectures)
DECODER_ARCHITECTURES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


class CheckpointError(WithDetails, ValueError):
    """A checkpoint whose files cannot be used as they are; the message names the file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    shard: str


def _index(model_dir: Path) -> dict | None:
    path = model_dir / INDEX
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: cannot be read as JSON ({e}); re-copy the file", path=str(path)
        ) from e
    if (
        not isinstance(index, dict)
        or not isinstance(index.get("weight_map"), dict)
        or not index["weight_map"]
    ):
        raise CheckpointError(
            f"{path}: no weight_map (tensor -> shard file); re-copy the file", path=str(path)
        )
    return index


def shard_names(model_dir: str | os.PathLike) -> list[str]:
    """The checkpoint's shard file names (relative to ``model_dir``), sorted."""
    d = Path(model_dir)
    index = _index(d)
    if index is not None:
        return sorted(set(index["weight_map"].values()))
    if (d / SINGLE).is_file():
        return [SINGLE]
    raise CheckpointError(
        f"{d}: neither {INDEX} nor {SINGLE}: point the model path at a Hugging Face safetensors checkpoint",
        path=str(d),
    )


def read_header(path: str | os.PathLike) -> dict:
    """The JSON header of the safetensors file ``path`` (``__metadata__`` dropped), checked against its size."""
    p = Path(path)
    try:
        header, n, size = safetensors_layout(p)
    except FileNotFoundError:
        raise CheckpointError(f"{p} does not exist", path=str(p)) from None
    except ValueError as e:  # too short, a length that does not fit, a header that is not JSON
        raise CheckpointError(
            f"{p}: {e}: truncated or not safetensors; re-copy the shard", path=str(p)
        ) from e
    header.pop("__metadata__", None)
    end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    if 8 + n + end > size:
        raise CheckpointError(
            f"{p}: {size:,} bytes but its tensors end at byte {8 + n + end:,}: the shard is truncated (a copy cut "
            "off?); re-copy it from the source",
            path=str(p),
            size=size,
            expected=8 + n + end,
        )
    return header


def tensors(model_dir: str | os.PathLike) -> list[TensorInfo]:
    """Every tensor of the checkpoint in ``model_dir``, shard by shard; refuses a shard the index lists that is
    missing or truncated, and a tensor the index maps to a shard that does not hold it."""
    d = Path(model_dir)
    index = _index(d)
    names = shard_names(d)
    missing = [s for s in names if not (d / s).is_file()]
    if missing:
        raise CheckpointError(
            f"{d / INDEX}: lists {len(names)} shards but {len(missing)} are missing ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}): copy the whole checkpoint (rsync the model directory again)",
            path=str(d),
            missing=missing,
        )
    out: list[TensorInfo] = []
    held: dict[str, str] = {}
    for shard in names:
        for name, t in read_header(d / shard).items():
            start, end = (int(x) for x in t["data_offsets"])
            out.append(TensorInfo(name, t["dtype"], tuple(t["shape"]), end - start, shard))
            held[name] = shard
    if index is not None:
        wrong = [(k, v) for k, v in index["weight_map"].items() if held.get(k) != v]
        if wrong:
            k, v = wrong[0]
            raise CheckpointError(
                f"{d / INDEX}: maps {len(wrong)} tensors to shards that do not hold them (first: {k} -> {v}): the "
                "index and the shards come from different copies; re-copy the checkpoint",
                path=str(d / INDEX),
                tensor=k,
                shard=v,
            )
    return out


def decoder_prefix(model_dir: str | os.PathLike, cfg: dict, names: list[str] | None, setting: str) -> str:
    """The prefix of the decoder's tensor names (:data:`WRAPPER_PREFIX` for a multimodal wrapper, else ``""``) in
    the checkpoint ``model_dir`` whose ``config.json`` is ``cfg`` and whose tensors are ``names`` (None: not
    safetensors, only the config is looked at). Refused (:class:`CheckpointError`, naming ``setting``, the
    variable that points at the model): a config whose architectures name no decoder language model (an
    encoder, an encoder-decoder, a vision model), and tensors without the decoder's layer 0 (a vision tower or an
    encoder alone beside a decoder's config)."""
    d = Path(model_dir)
    sub = cfg.get("text_config")
    text = sub if isinstance(sub, dict) else cfg
    archs = list(text.get("architectures") or cfg.get("architectures") or [])
    if cfg.get("is_encoder_decoder") or (archs and not any(a.endswith(DECODER_ARCHITECTURES) for a in archs)):
        raise CheckpointError(
            f"{d}: config.json names {archs or 'no architectures'}"
            f"{' (an encoder-decoder)' if cfg.get('is_encoder_decoder') else ''}: not a decoder language model, so "
            f"there are no hidden states of one to capture or serve; point {setting} at the target LLM (a "
            "multimodal wrapper is fine: its text_config is used)",
            path=str(d),
            architectures=archs,
        )
    if names is None:
        return ""
    prefix = WRAPPER_PREFIX if any(n.startswith(WRAPPER_PREFIX) for n in names) else ""
    if not any(n.startswith(f"{prefix}model.layers.0.") for n in names):
        raise CheckpointError(
            f"{d}: no {prefix}model.layers.0.* tensors in the checkpoint (its tensors start "
            f"{sorted({n.split('.')[0] for n in names})[:5]}): a vision tower or an encoder alone, not the decoder "
            f"layers config.json describes; copy the whole checkpoint ({setting})",
            path=str(d),
        )
    return prefix
