"""How many bytes the served draft will put on the GPUs, known before ``serve-convert`` writes it, so that the
serve phase's memory preflight (``eagle3ops memory-fit --draft``) refuses a server that cannot fit before
anything is converted or started.

From what is there, in this order: a converted draft (its safetensors files), a SpecForge run (its newest
checkpoint's draft weights, exported in bf16), a speculators checkpoint, save or run directory (its
``model.safetensors`` header: the tensors the converter keeps, floats in bf16, ``d2t`` as int64). With no
checkpoint yet (a first check-mode run of the pipeline) the draft counts 0 bytes, and the reason says so.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from eagle3ops.errors import WithDetails


class DraftBytesError(WithDetails, Exception):
    """The draft's files are there but cannot be read (a truncated header, an unreadable checkpoint)."""


_FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_WRITTEN_AS = {"bfloat16": 2, "float16": 2, "float32": 4}  # the converter's DRAFT_DTYPE, per float


def _speculators(ckpt: Path) -> int:
    from eagle3ops.serve.convert import DRAFT_DTYPE, map_weights
    from eagle3ops.store.sample import read_safetensors_header

    fl = _WRITTEN_AS[DRAFT_DTYPE]
    header = read_safetensors_header(ckpt / "model.safetensors")
    cfg = json.loads((ckpt / "config.json").read_text())
    layers = int((cfg.get("transformer_layer_config") or {}).get("num_hidden_layers", 1))
    names = [k for k in header if k != "__metadata__"]
    total = 0
    for name in map_weights(names, layers):
        h = header[name]
        if (
            name == "d2t" or h["dtype"] in _FLOATS
        ):  # cast by the converter: d2t to int64, floats to DRAFT_DTYPE
            total += math.prod(int(d) for d in h["shape"]) * (8 if name == "d2t" else fl)
        else:  # written as stored
            start, end = h["data_offsets"]
            total += int(end) - int(start)
    return total


def _specforge(run: Path) -> tuple[int, str]:
    import torch

    from eagle3ops.train import specforge

    ckpt = specforge.latest_checkpoint(specforge.output_dir(run))
    if ckpt is None:
        return 0, f"{run}: no SpecForge checkpoint yet; the draft is not counted"
    state = torch.load(ckpt / specforge.STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    sd = state.get("draft_state_dict") or {}
    total = sum(t.numel() * (2 if t.is_floating_point() else t.element_size()) for t in sd.values())
    return total, f"the SpecForge checkpoint {ckpt} (bf16)"


def served_bytes(path: str | os.PathLike | None) -> tuple[int, str]:
    """(bytes on the GPUs, where the figure comes from) of the draft at ``path``: a converted draft, a SpecForge
    run, or a speculators checkpoint / save / run directory."""
    from eagle3ops.checkpoints import CheckpointError, resolve_checkpoint
    from eagle3ops.serve.convert import STAMP, is_specforge_run

    if not path:
        return 0, "no draft"
    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if (p / STAMP).is_file() and files:
        return sum(f.stat().st_size for f in files), f"the converted draft {p}"
    try:
        if is_specforge_run(p):
            return _specforge(p)
        try:
            ckpt = resolve_checkpoint(p)
        except CheckpointError:
            if files:  # a draft directory of another origin: its files as they are
                return sum(f.stat().st_size for f in files), f"the safetensors files in {p}"
            return 0, f"{p}: no checkpoint yet; the draft is not counted"
        return _speculators(ckpt), f"the speculators checkpoint {ckpt} (the converted tensors, bf16)"
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise DraftBytesError(
            f"--draft {p}: cannot read the draft's size ({type(e).__name__}: {e})", draft=str(p)
        ) from None
