"""Tiny local models and datasets for tests (no downloads)."""

from __future__ import annotations


def build_tiny_target(path, *, num_layers: int = 8, vocab: int = 300, seed: int = 0):
    """A random-init DeepseekV3ForCausalLM small enough for CPU tests (MLA + 4 routed experts), float32, built by
    the one builder (eagle3ops.tinymodel) at compact MLA dims (the demo's servable dims cost more CPU per test)."""
    from eagle3ops import tinymodel

    tinymodel.save(
        tinymodel.build(
            vocab,
            mla=tinymodel.TINY_MLA,
            seed=seed,
            num_hidden_layers=num_layers,
            first_k_dense_replace=1,
            q_lora_rank=None,
            max_position_embeddings=1024,
        ),
        path,
        dtype="float32",
    )
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
