"""What the Kimi-K2.5-format fixture is made of: the wrapper config (``text_config`` DeepSeek-V3 style, a tiny
``vision_config``, compressed-tensors INT4 on the routed experts), the special tokens and their ids.

Shapes follow the published checkpoint's structure scaled down, with the constraints of SGLang's kernels kept:
DeepSeek-V3's own MLA head dims (smaller ones fail SGLang's MLA decode kernel), ``hidden_size`` a multiple of
128 and ``moe_intermediate_size`` of 64 (Marlin's INT4 MoE), group size 32. Standard library only.
"""

from __future__ import annotations

from eagle3ops import tinymodel

GROUP_SIZE = 32
NUM_RESERVED_SPECIAL = 256  # ids after the BPE ranks: vocab = ranks + 256, as the published tokenizer's
BPE_RANKS = 768  # 256 bytes + 512 merges: vocab 1024
VOCAB_SIZE = BPE_RANKS + NUM_RESERVED_SPECIAL

# (offset after the BPE ranks, token): the published tokenizer's special tokens at its offsets (163,584 + k);
# every other reserved id is "<|reserved_token_{id}|>"
SPECIAL_TOKENS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}
BOS, EOS, PAD, UNK = "[BOS]", "[EOS]", "[PAD]", "[UNK]"
MEDIA_PAD = "<|media_pad|>"


def special_id(token: str) -> int:
    """The id of one of :data:`SPECIAL_TOKENS`."""
    return BPE_RANKS + next(k for k, v in SPECIAL_TOKENS.items() if v == token)


# DeepSeek-V3 / Kimi-K2 text model, scaled down: 4 layers (the first dense), 4 routed experts (top 2) + 1 shared
TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    **tinymodel.TINY_MOE,
    "first_k_dense_replace": 1,
    "q_lora_rank": 64,
    **tinymodel.SERVABLE_MLA,
    "max_position_embeddings": 4096,
    "rope_theta": 50000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    **tinymodel.CHECKPOINT_FIELDS,
    "routed_scaling_factor": 2.827,  # Kimi-K2's
}

# compressed-tensors INT4 weight-only on the routed experts (targets Linear, everything else on the ignore list)
QUANTIZATION_CONFIG = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": GROUP_SIZE,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}

# MoonViT-style tower + patch-merger projector, tiny. SGLang builds the tower from hidden_size /
# num_hidden_layers / num_attention_heads / intermediate_size and the projector from vt_hidden_size; the
# published config spells the tower's as vt_*: both are written. Head dim 16 (2-D RoPE needs a multiple of 4).
VISION = {
    "patch_size": 14,
    "init_pos_emb_height": 8,
    "init_pos_emb_width": 8,
    "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vt_hidden_size": 32,
    "vt_num_hidden_layers": 2,
    "vt_num_attention_heads": 2,
    "vt_intermediate_size": 64,
    "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool",
    "video_attn_type": "spatial_temporal",
    "mm_projector_type": "patchmerger",
    "mm_hidden_size": 32,
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5,
    "text_hidden_size": TEXT["hidden_size"],
}

# the processor's image settings (preprocessor_config.json media_proc_cfg): the published keys, small limits
MEDIA_PROC_CFG = {
    "patch_size": VISION["patch_size"],
    "merge_kernel_size": 2,
    "in_patch_limit": 256,
    "patch_limit_on_one_side": 32,
    "in_patch_limit_each_frame": 64,
    "fixed_output_tokens": None,
    "temporal_merge_kernel_size": 4,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def text_config() -> dict:
    ids = {"bos_token_id": special_id(BOS), "eos_token_id": special_id(EOS), "pad_token_id": special_id(PAD)}
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        **TEXT,
        **ids,
        "vocab_size": VOCAB_SIZE,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "quantization_config": QUANTIZATION_CONFIG,
    }


def wrapper_config() -> dict:
    """config.json: the multimodal wrapper (its config class is remote code, as the published one's)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "model_type": "kimi_k25",
        "bos_token_id": special_id(BOS),
        "eos_token_id": special_id(EOS),
        "pad_token_id": special_id(PAD),
        "media_placeholder_token_id": special_id(MEDIA_PAD),
        "ignore_index": -100,
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "quantization_config": QUANTIZATION_CONFIG,
        "text_config": text_config(),
        "vision_config": dict(VISION),
    }
