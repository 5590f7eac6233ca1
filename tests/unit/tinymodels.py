"""Tiny local models and datasets for tests (no downloads)."""

from __future__ import annotations


def build_tiny_target(path, *, num_layers: int = 8, vocab: int = 300, seed: int = 0):
    """A random-init DeepseekV3ForCausalLM small enough for CPU tests (MLA + 4 routed experts)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        max_position_embeddings=1024,
    )
    DeepseekV3ForCausalLM(cfg).save_pretrained(str(path))
    return path


def build_prepared_dataset(path, lengths, *, vocab: int = 300, seed: int = 0):
    """An Arrow dataset in speculators' offline contract (input_ids, loss_mask, seq_len)."""
    import datasets
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    masks = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    ds = datasets.Dataset.from_dict({"input_ids": rows, "loss_mask": masks, "seq_len": list(lengths)})
    ds.save_to_disk(str(path))
    return path
