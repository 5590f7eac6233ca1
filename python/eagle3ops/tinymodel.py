"""The one builder of the tiny DeepSeek-V3-architecture targets (MLA + MoE, ``DeepseekV3ForCausalLM``, the shape
of Kimi-K2.5's language model) that eagle3ops makes: the demo's target (``eagle3ops demo``), the train fixtures'
verifier and the tests' targets all come from :func:`build` / :func:`save`.

What makes the demo target servable by a real SGLang server (seen on the lent H200 with SGLang 0.5.17,
shared/notes/gpu-box-sglang.md):

- ``config.json`` carries the fields real DeepSeek-V3 / Kimi-K2.5 checkpoints carry and SGLang's
  ``deepseek_v2.py`` reads, which transformers' ``DeepseekV3Config`` does not write by itself
  (:data:`CHECKPOINT_FIELDS`: ``moe_layer_freq``, ``topk_method``, ``scoring_func``, ``ep_size``...), plus
  the ones it does (``n_group``, ``topk_group``, ``first_k_dense_replace``, ``routed_scaling_factor``,
  ``norm_topk_prob``...). ``noaux_tc`` + ``sigmoid`` is what transformers' router computes
  (``e_score_correction_bias``), so both engines run the same model.
- bf16 weights and ``torch_dtype``/``dtype`` ``bfloat16``: a float32 config is served as fp16 by SGLang, against
  a bf16 draft (``mat1 and mat2 ... Half != BFloat16``).
- DeepSeek-V3's own MLA head dims (:data:`SERVABLE_MLA`: ``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64,
  ``qk_nope_head_dim`` 128, ``v_head_dim`` 128): served plain and with an EAGLE-3 draft at hidden 64; smaller
  ones (``kv_lora_rank`` 32 or 64) fail SGLang's Triton MLA decode kernel at compile time.

Training at those dims costs ~4x more per token on a CPU core than the compact dims, so the demo trains a
compact-MLA model (:data:`COMPACT_MLA`) and :func:`widen_mla` then widens it to :data:`SERVABLE_MLA` **exactly**
(function-preserving: the extra latent, nope, rope and value dims carry zeros; RoPE pairs keep their
frequency; the softmax scale and the latent RMSNorm are compensated). The widened model's logits equal the
compact model's within float32 rounding (tests/unit/core/test_tinymodel.py).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

# Fields of a real DeepSeek-V3 / Kimi-K2.5 config.json that SGLang reads (deepseek_v2.py: config.moe_layer_freq,
# config.topk_method, config.scoring_func; ep_size, seq_aux, aux_loss_alpha are in every real checkpoint too).
CHECKPOINT_FIELDS = {
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "ep_size": 1,
    "seq_aux": True,
    "aux_loss_alpha": 0.001,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}
# DeepSeek-V3's MLA head dims: the smallest seen to pass SGLang's MLA kernels (plain and with a draft)
SERVABLE_MLA = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
# cheap on CPU (training, unit tests); widen_mla() turns a compact model into a servable one exactly
COMPACT_MLA = {"kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}
# smaller still: the unit tests' targets and the train fixtures' verifier, where only the shapes matter
TINY_MLA = {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16}

# the experts of every tiny MoE target here (this one, the Kimi fixture's): 4 routed, top-2, 1 shared, one group
TINY_MOE = {
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
}

# the rest of the tiny shape: 8 layers (speculators' default ids [2, N//2, N-3] = [2, 4, 5] are distinct),
# hidden 64, 4 heads, 2 dense first layers then MoE (4 routed experts, top-2, 1 shared)
BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    **TINY_MOE,
    "first_k_dense_replace": 2,
    "q_lora_rank": 48,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "rope_theta": 10000.0,
}


def model_config(mla: dict | None = None, **overrides) -> dict:
    """The config dict (BASE + MLA dims + CHECKPOINT_FIELDS + overrides); ``head_dim`` = the rope dim (RoPE)."""
    cfg = {**BASE, **(SERVABLE_MLA if mla is None else mla), **CHECKPOINT_FIELDS}
    cfg.update(overrides)
    cfg["head_dim"] = cfg["qk_rope_head_dim"]
    return cfg


def hf_config(vocab_size: int, mla: dict | None = None, **overrides):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(vocab_size=vocab_size, **model_config(mla, **overrides))


def build(vocab_size: int, *, mla: dict | None = None, seed: int = 0, **overrides):
    """A random-init ``DeepseekV3ForCausalLM`` (float32, eval mode)."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    return DeepseekV3ForCausalLM(hf_config(vocab_size, mla, **overrides)).eval()


def _mla_dims(cfg) -> dict:
    return {k: int(getattr(cfg, k)) for k in SERVABLE_MLA}


def widen_mla(model, mla: dict | None = None):
    """A new model with wider MLA dims computing the same function as ``model`` (see the module doc).

    Every target dim must be >= the source's and the rope dim a multiple of it (RoPE pair j of a d-dim rope
    turns with base^(-2j/d): pair j of the source is pair j*r of the target, r = d'/d).
    """
    import torch
    from transformers import DeepseekV3ForCausalLM

    src_cfg = model.config
    old = _mla_dims(src_cfg)
    new = dict(SERVABLE_MLA if mla is None else mla)
    if any(new[k] < old[k] for k in new) or new["qk_rope_head_dim"] % old["qk_rope_head_dim"]:
        raise ValueError(f"cannot widen MLA dims {old} to {new}")
    rope = getattr(src_cfg, "rope_parameters", None) or getattr(src_cfg, "rope_scaling", None) or {}
    if (
        rope.get("rope_type", "default") != "default"
        or not getattr(src_cfg, "rope_interleave", True)
        or getattr(src_cfg, "q_lora_rank", None) is None
    ):
        raise ValueError("widen_mla handles plain RoPE and a q_lora_rank (the demo's shape) only")
    cfg_dict = src_cfg.to_dict()
    cfg_dict.update(
        new, head_dim=new["qk_rope_head_dim"], qk_head_dim=new["qk_nope_head_dim"] + new["qk_rope_head_dim"]
    )
    for k in ("architectures", "transformers_version", "model_type", "dtype", "torch_dtype"):
        cfg_dict.pop(k, None)
    dst_cfg = type(src_cfg)(**cfg_dict)
    wide = DeepseekV3ForCausalLM(dst_cfg).eval()
    heads = int(src_cfg.num_attention_heads)
    nope_o, rope_o, v_o, kv_o = (
        old[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")
    )
    nope_n, rope_n, v_n, kv_n = (
        new[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")
    )
    r = rope_n // rope_o
    # rope dim 2j, 2j+1 of the source -> 2jr, 2jr+1 of the target (interleaved pairs, as DeepSeek lays them out)
    rope_map = torch.tensor([2 * (d // 2) * r + d % 2 for d in range(rope_o)])
    q_scale = math.sqrt((nope_n + rope_n) / (nope_o + rope_o))  # the softmax scale is qk_head_dim ** -0.5
    sd_old = model.state_dict()
    sd = {k: v.clone() for k, v in sd_old.items()}  # everything outside attention is copied as is
    with torch.no_grad():
        for i in range(int(src_cfg.num_hidden_layers)):
            p = f"model.layers.{i}.self_attn."
            qb = sd_old[p + "q_b_proj.weight"].view(heads, nope_o + rope_o, -1)
            nqb = qb.new_zeros(heads, nope_n + rope_n, qb.shape[-1])
            nqb[:, :nope_o] = qb[:, :nope_o] * q_scale
            nqb[:, nope_n + rope_map] = qb[:, nope_o:] * q_scale
            sd[p + "q_b_proj.weight"] = nqb.reshape(heads * (nope_n + rope_n), -1)
            kva = sd_old[p + "kv_a_proj_with_mqa.weight"]
            nkva = kva.new_zeros(kv_n + rope_n, kva.shape[-1])
            # the latent RMSNorm now averages over kv_n dims, kv_o of them non-zero: scaling the latent by
            # sqrt(kv_n / kv_o) keeps its mean square (so eps acts as before) and the norm's weight undoes the
            # scale; the output is the source's exactly
            nkva[:kv_o] = kva[:kv_o] * math.sqrt(kv_n / kv_o)
            nkva[kv_n + rope_map] = kva[kv_o:]
            sd[p + "kv_a_proj_with_mqa.weight"] = nkva
            ln = sd_old[p + "kv_a_layernorm.weight"]
            nln = ln.new_ones(kv_n)
            nln[:kv_o] = ln * math.sqrt(kv_o / kv_n)
            sd[p + "kv_a_layernorm.weight"] = nln
            kvb = sd_old[p + "kv_b_proj.weight"].view(heads, nope_o + v_o, kv_o)
            nkvb = kvb.new_zeros(heads, nope_n + v_n, kv_n)
            nkvb[:, :nope_o, :kv_o] = kvb[:, :nope_o]
            nkvb[:, nope_n : nope_n + v_o, :kv_o] = kvb[:, nope_o:]
            sd[p + "kv_b_proj.weight"] = nkvb.reshape(heads * (nope_n + v_n), kv_n)
            o = sd_old[p + "o_proj.weight"].view(-1, heads, v_o)
            no = o.new_zeros(o.shape[0], heads, v_n)
            no[:, :, :v_o] = o
            sd[p + "o_proj.weight"] = no.reshape(o.shape[0], heads * v_n)
    wide.load_state_dict(sd, strict=True)
    wide.generation_config = model.generation_config
    return wide


def save(model, out_dir: str | os.PathLike, *, dtype: str = "bfloat16") -> Path:
    """Save weights in ``dtype`` (the model is cast in place) and a config.json with the checkpoint fields and
    ``torch_dtype``/``dtype``."""
    import torch

    out = Path(out_dir)
    model = model.to(getattr(torch, dtype))
    for k, v in CHECKPOINT_FIELDS.items():
        setattr(model.config, k, v)
    model.save_pretrained(out, safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(CHECKPOINT_FIELDS)
    cfg["dtype"] = dtype
    cfg["torch_dtype"] = dtype  # the key older readers (and real checkpoints) use
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def make_tiny_target(
    out_dir: str | os.PathLike,
    *,
    vocab_size: int,
    mla: dict | None = None,
    dtype: str = "bfloat16",
    seed: int = 0,
    **overrides,
) -> Path:
    """Build (random init) and save a tiny target in one call; an existing one at ``out_dir`` is kept."""
    out = Path(out_dir)
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    return save(build(vocab_size, mla=mla, seed=seed, **overrides), out, dtype=dtype)
