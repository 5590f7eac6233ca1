"""A speculators 0.9.0 EAGLE-3 checkpoint made by speculators' own code, without a training run.

The draft is built exactly as ``speculators train`` builds it (``create_transformer_layer_config`` from the
verifier, ``Eagle3DraftModel.from_training_args``: vocab maps, the verifier's embedding and lm_head rows) and
written with ``save_pretrained`` - what the trainer's checkpointer calls - so the directory has the trainer's
layout (config.json + model.safetensors). Only its decoder weights are random instead of trained (a training
run costs a minute of CPU; ``make run`` converts and measures a really trained draft).
"""

from __future__ import annotations

import json
from pathlib import Path


def make_draft_checkpoint(
    out: Path,
    verifier: Path,
    *,
    layer_ids=(2, 4, 5),
    num_layers: int = 1,
    draft_vocab: int = 200,
    seed: int = 0,
    **overrides,
) -> Path:
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config

    torch.manual_seed(seed)
    tl = create_transformer_layer_config(
        str(verifier), num_layers, "llama", None, 2048, list(range(num_layers))
    )
    vocab = tl.vocab_size
    chosen = torch.randperm(vocab - 3)[:draft_vocab].sort().values + 3
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    d2t = chosen - torch.arange(draft_vocab)
    kwargs = {
        "target_layer_ids": list(layer_ids),
        "verifier_name_or_path": str(verifier),
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
        "norm_before_fc": True,
        "norm_output": True,
        "ttt_steps": 3,
        "draft_attn_impl": "sdpa",
    }
    kwargs.update(overrides)
    model = Eagle3DraftModel.from_training_args(tl, t2d=t2d, d2t=d2t, **kwargs)
    with torch.no_grad():  # the decoder is randomly initialised; make the norms non-trivial too
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") and not n.startswith("verifier"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    return out


def edit_config(ckpt: Path, dest: Path, **changes) -> Path:
    """A copy of a checkpoint with config.json keys changed (``transformer_layer_config`` keys via tl_*)."""
    import shutil

    shutil.copytree(ckpt, dest)
    cfg = json.loads((dest / "config.json").read_text())
    for k, v in changes.items():
        if k.startswith("tl_"):
            cfg["transformer_layer_config"][k[3:]] = v
        else:
            cfg[k] = v
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest
