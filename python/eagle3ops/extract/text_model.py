"""The text model of a checkpoint transformers cannot load as a plain causal LM: a multimodal wrapper (Kimi-K2.5:
``KimiK25ForConditionalGeneration``, the language model under ``text_config`` and its weights under
``language_model.``) and/or INT4 routed experts in compressed-tensors' ``pack-quantized`` form.

- :func:`describe`: what the directory holds (wrapper prefix, quantised or not), and the refusals that need no
  weights: a checkpoint without a decoder language model (a vision tower or an encoder alone), a shard the index
  lists that is missing or truncated (:mod:`eagle3ops.checkpoint_files`);
- :func:`load`: the text model as transformers' ``DeepseekV3ForCausalLM`` (or the architecture ``text_config``
  names) in ``dtype`` on ``device``: only ``language_model.`` tensors are read (the vision tower's never are), INT4
  experts are dequantised (``q * scale`` per group of the ``group_size`` inputs), per-expert Linear weights are
  stacked into transformers' fused expert tensors, and every parameter must come from the checkpoint.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from eagle3ops import checkpoint_files, layers
from eagle3ops.extract.errors import ExtractError

PREFIX = checkpoint_files.WRAPPER_PREFIX
_INT4 = (".weight_packed", ".weight_scale", ".weight_shape")
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    text_config: dict
    prefix: str  # "language_model." for a wrapper, "" for a plain text model
    quantized: bool  # compressed-tensors INT4 weights present

    @property
    def needs_own_loader(self) -> bool:
        return bool(self.prefix) or self.quantized


def describe(model_path: str | os.PathLike) -> Checkpoint:
    """The checkpoint in ``model_path``, checked before any weight is read (:class:`ExtractError` otherwise)."""
    p = Path(model_path)
    try:
        cfg = json.loads((p / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ExtractError(f"{p / 'config.json'}: cannot be read ({e})") from e
    text = layers.text_config(cfg)
    safetensors = (p / checkpoint_files.INDEX).is_file() or (p / checkpoint_files.SINGLE).is_file()
    try:
        # not safetensors (.bin): the config only; transformers' own loader decides about the weights
        names = [t.name for t in checkpoint_files.tensors(p)] if safetensors else None
        prefix = checkpoint_files.decoder_prefix(p, cfg, names, "extract_model_path")
    except checkpoint_files.CheckpointError as e:
        raise ExtractError(str(e)) from None
    if names is None:
        return Checkpoint(p, text, "", False)
    quantized = any(n.endswith(_INT4[0]) for n in names)
    return Checkpoint(p, text, prefix, quantized)


def _config(ck: Checkpoint):
    from transformers import AutoConfig, DeepseekV3Config

    keep = {k: v for k, v in ck.text_config.items() if k not in ("quantization_config", "auto_map")}
    keep.pop("model_type", None)
    archs = keep.get("architectures") or []
    if not archs or archs[0] == "DeepseekV3ForCausalLM":
        return DeepseekV3Config(**keep)
    return AutoConfig.for_model(ck.text_config.get("model_type", ""), **keep)


def _state_dict(ck: Checkpoint, dtype) -> dict:
    """The text model's tensors, prefix stripped, INT4 dequantised, experts fused as transformers holds them."""
    import torch
    from safetensors import safe_open

    from eagle3ops import int4

    raw = {}
    for shard in checkpoint_files.shard_names(ck.path):
        with safe_open(str(ck.path / shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                if name.startswith(ck.prefix):
                    raw[name[len(ck.prefix) :]] = f.get_tensor(name)
    out, experts = {}, {}
    for name, t in raw.items():
        if name.endswith(_INT4[1:]):
            continue
        if name.endswith(_INT4[0]):
            base = name[: -len(_INT4[0])]
            t = int4.dequantize(t, raw[base + _INT4[1]], raw[base + _INT4[2]].tolist())
            name = base + ".weight"
        m = _EXPERT.match(name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[name] = t
    for base, parts in experts.items():
        n = 1 + max(e for e, _ in parts)
        out[f"{base}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in range(n)]
        )
        out[f"{base}.down_proj"] = torch.stack([parts[(e, "down_proj")] for e in range(n)])
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in out.items()}


def load(ck: Checkpoint, device: str, dtype):
    """The text model of ``ck`` (see the module docstring), in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = _config(ck)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    sd = _state_dict(ck, dtype)
    mine = model.state_dict()
    missing = sorted(set(mine) - set(sd))
    unexpected = sorted(set(sd) - set(mine))
    if missing or unexpected:
        raise ExtractError(
            f"{ck.path}: the {ck.prefix or 'text '}weights do not match {type(model).__name__} built from "
            f"text_config: missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected "
            f"{unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
        )
    sd = {name: t.to(mine[name].dtype) for name, t in sd.items()}  # e.g. the router bias kept in float32
    model.load_state_dict(sd, strict=True)
    model.to(device)
    model.eval()
    return model
