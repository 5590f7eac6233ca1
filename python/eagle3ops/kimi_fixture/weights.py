"""The fixture's tensors, named and stored as the published Kimi-K2.5 checkpoint stores them.

- Text model: a seeded random ``DeepseekV3ForCausalLM`` (eagle3ops.tinymodel) under ``language_model.``
  (``language_model.model.layers.N...``, ``language_model.lm_head.weight``), bf16; the router's
  ``e_score_correction_bias`` float32. Routed experts one Linear per expert and projection
  (``mlp.experts.E.gate_proj``...), each compressed-tensors INT4 (``weight_packed``/``weight_scale``/
  ``weight_shape``: eagle3ops.int4); dense MLP, shared experts, attention and ``lm_head`` bf16.
- Vision tower (``vision_tower.patch_embed``/``encoder.blocks.N``/``final_layernorm``) and projector
  (``mm_projector.pre_norm``/``proj.0``/``proj.2``), bf16, seeded random.
- Shards: language layers split over the first shards, the vision tensors in the last, every shard named
  ``model-0000K-of-00000N.safetensors``, and ``model.safetensors.index.json`` naming each tensor once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from eagle3ops import int4, tinymodel
from eagle3ops.kimi_fixture import spec

PREFIX = "language_model."
INDEX = "model.safetensors.index.json"
_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"^language_model\.model\.layers\.(\d+)\.")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def text_model(seed: int):
    """The float32 text model (the weights before quantisation)."""
    overrides = {k: v for k, v in spec.TEXT.items() if k not in tinymodel.SERVABLE_MLA}
    return tinymodel.build(spec.VOCAB_SIZE, mla=tinymodel.SERVABLE_MLA, seed=seed, **overrides)


def per_expert(state_dict: dict) -> dict:
    """transformers' fused expert tensors (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]) as one
    ``[out, in]`` weight per expert and projection, named as checkpoints name them."""
    out = {}
    for name, t in state_dict.items():
        m = _EXPERT.fullmatch(name)
        if not m:
            out[name] = t
            continue
        layer, kind = m.groups()
        base = f"model.layers.{layer}.mlp.experts"
        for e in range(t.shape[0]):
            if kind == "gate_up_proj":
                gate, up = t[e].chunk(2, dim=0)
                out[f"{base}.{e}.gate_proj.weight"] = gate
                out[f"{base}.{e}.up_proj.weight"] = up
            else:
                out[f"{base}.{e}.down_proj.weight"] = t[e]
    return out


def is_routed_expert(name: str) -> bool:
    return ".mlp.experts." in name and name.endswith("_proj.weight")


def text_tensors(seed: int) -> dict:
    """Every language-model tensor as stored (prefixed, experts compressed)."""
    import torch

    model = text_model(seed)
    out = {}
    for name, t in per_expert(model.state_dict()).items():
        key = PREFIX + name
        if is_routed_expert(name):
            for suffix, v in int4.compress(t, spec.GROUP_SIZE).items():
                out[key[: -len("weight")] + suffix] = v.contiguous()
        elif name.endswith("e_score_correction_bias"):
            out[key] = t.float().contiguous()
        else:
            out[key] = t.to(torch.bfloat16).contiguous()
    return out


def vision_tensors(seed: int) -> dict:
    """The vision tower's and the projector's tensors (the published names, the fixture's tiny shapes)."""
    import torch

    v = spec.VISION
    d, mlp, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = d * v["merge_kernel_size"][0] * v["merge_kernel_size"][1]
    shapes = {
        "vision_tower.patch_embed.proj.weight": (d, 3, p, p),
        "vision_tower.patch_embed.proj.bias": (d,),
        "vision_tower.patch_embed.pos_emb.weight": (v["init_pos_emb_height"], v["init_pos_emb_width"], d),
        "vision_tower.encoder.final_layernorm.weight": (d,),
        "vision_tower.encoder.final_layernorm.bias": (d,),
        "mm_projector.pre_norm.weight": (d,),
        "mm_projector.pre_norm.bias": (d,),
        "mm_projector.proj.0.weight": (merged, merged),
        "mm_projector.proj.0.bias": (merged,),
        "mm_projector.proj.2.weight": (v["text_hidden_size"], merged),
        "mm_projector.proj.2.bias": (v["text_hidden_size"],),
    }
    for i in range(v["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}."
        shapes.update(
            {
                b + "norm0.weight": (d,),
                b + "norm0.bias": (d,),
                b + "norm1.weight": (d,),
                b + "norm1.bias": (d,),
                b + "wqkv.weight": (3 * d, d),
                b + "wqkv.bias": (3 * d,),
                b + "wo.weight": (d, d),
                b + "wo.bias": (d,),
                b + "mlp.fc0.weight": (mlp, d),
                b + "mlp.fc0.bias": (mlp,),
                b + "mlp.fc1.weight": (d, mlp),
                b + "mlp.fc1.bias": (d,),
            }
        )
    gen = torch.Generator().manual_seed(seed + 1)
    out = {}
    for name, shape in shapes.items():
        if "norm" in name:
            t = torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
        else:
            t = torch.randn(shape, generator=gen) * 0.02
        out[name] = t.to(torch.bfloat16)
    return out


def shard_of(name: str, num_layers: int, text_shards: int) -> int:
    """0-based shard of a tensor: layers spread over the text shards (embeddings with the first, final norm
    and lm_head with the last), vision and projector in the shard after them."""
    if not name.startswith(PREFIX):
        return text_shards
    m = _LAYER.match(name)
    if m:
        return min(int(m.group(1)) * text_shards // num_layers, text_shards - 1)
    return 0 if "embed_tokens" in name else text_shards - 1


def write_shards(tensors: dict, out: Path, text_shards: int = 2) -> dict:
    """The shards and their index (returned); each tensor in exactly one shard."""
    from safetensors.torch import save_file

    num_layers = spec.TEXT["num_hidden_layers"]
    total = text_shards + 1
    names = [f"model-{k + 1:05d}-of-{total:05d}.safetensors" for k in range(total)]
    groups: list[dict] = [{} for _ in names]
    for name in sorted(tensors):
        groups[shard_of(name, num_layers, text_shards)][name] = tensors[name]
    weight_map, size = {}, 0
    for fname, group in zip(names, groups, strict=True):
        save_file(group, str(out / fname), metadata={"format": "pt"})
        for name, t in group.items():
            weight_map[name] = fname
            size += t.numel() * t.element_size()
    index = {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return index


def reference_text_state_dict(model_dir: str | Path) -> dict:
    """The text model's weights as transformers' ``DeepseekV3ForCausalLM`` names them (no ``language_model.``
    prefix, one tensor per expert), the INT4 experts dequantised (float32) with :mod:`int4`: what a reader
    that handles the checkpoint's format must arrive at."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    index = json.loads((model_dir / INDEX).read_text())
    raw = {}
    for fname in sorted(set(index["weight_map"].values())):
        with safe_open(str(model_dir / fname), framework="pt") as f:
            raw.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(PREFIX)})  # noqa: SIM118
    out = {}
    for key, t in raw.items():
        name = key[len(PREFIX) :]
        if name.endswith(".weight_packed"):
            stem = key[: -len("weight_packed")]
            out[name[: -len("_packed")]] = int4.dequantize(
                t, raw[stem + "weight_scale"], raw[stem + "weight_shape"].tolist()
            )
        elif not name.endswith((".weight_scale", ".weight_shape")):
            out[name] = t.float()
    return out
