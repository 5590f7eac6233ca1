"""Small, self-made training inputs for the ``train`` phase's tests and GPU benchmark.

STAND-IN: these build what ``eagle3ops demo`` / ``prepare`` / ``extract`` produce (a tiny
DeepseekV3ForCausalLM verifier and a data directory in the speculators 0.9.0 offline layout), so the
trainer can be exercised before / without the rest of the pipeline. The data directory is written
through the real :class:`eagle3ops.store.HiddenStateStore` (atomic files, manifest, extract_meta.json).

Hidden states come either from a real forward pass of the verifier (``real=True``: the input of
layers ``layer_ids`` plus the pre-norm output of the last layer, the convention of ``extract``) or,
for large synthetic sets where only the trainer's speed matters, from a seeded random generator.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

DEFAULT_LAYER_IDS = (2, 4, 5)


def make_tiny_verifier(
    out_dir: str | os.PathLike,
    *,
    num_layers: int = 8,
    hidden_size: int = 64,
    vocab_size: int = 512,
    seed: int = 0,
) -> Path:
    """Save a random-init tiny DeepseekV3ForCausalLM (MLA + 4 routed experts) to ``out_dir`` (float32; built by
    :mod:`eagle3ops.tinymodel`, compact MLA dims: only the trainer's inputs matter here, not SGLang)."""
    from eagle3ops import tinymodel

    return tinymodel.make_tiny_target(
        out_dir,
        vocab_size=vocab_size,
        mla=tinymodel.TINY_MLA,
        dtype="float32",
        seed=seed,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        moe_intermediate_size=hidden_size,
        num_hidden_layers=num_layers,
        first_k_dense_replace=1,
        q_lora_rank=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def write_verifier_config(
    out_dir: str | os.PathLike, *, num_layers: int = 8, hidden_size: int = 64, vocab_size: int = 512
) -> Path:
    """A verifier directory holding only ``config.json``, the shapes of :func:`make_tiny_verifier`'s model: all the
    train phase's plan reads of a verifier, and all ``eagle3ops.train.ddp_probe`` needs (it loads no model)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": num_layers, "hidden_size": hidden_size,
           "vocab_size": vocab_size, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def make_data_dir(
    data_dir: str | os.PathLike,
    verifier_dir: str | os.PathLike,
    *,
    num_samples: int = 40,
    min_len: int = 24,
    max_len: int = 64,
    layer_ids=DEFAULT_LAYER_IDS,
    real: bool = True,
    dtype: str = "bfloat16",
    seed: int = 0,
    vocab_limit: int | None = None,
) -> Path:
    """Write an Arrow dataset + hidden_states/ + token_freq.pt in the layout ``extract`` produces."""
    import torch
    from datasets import Dataset

    from eagle3ops.store import TOKEN_FREQ, HiddenStateStore, sample_parts

    data = Path(data_dir)
    if (data / TOKEN_FREQ).exists() and (data / "dataset_info.json").exists():
        return data
    vcfg = json.loads((Path(verifier_dir) / "config.json").read_text())
    vocab, hidden, n_layers = vcfg["vocab_size"], vcfg["hidden_size"], vcfg["num_hidden_layers"]
    vocab_limit = min(vocab_limit or vocab, vocab)
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (num_samples,), generator=gen).tolist()
    input_ids, loss_masks = [], []
    for n in lens:
        ids = torch.randint(3, vocab_limit, (n,), generator=gen, dtype=torch.long)
        mask = torch.zeros(n, dtype=torch.long)
        mask[n // 3 :] = 1  # a "prompt" third, then the "response"
        input_ids.append(ids)
        loss_masks.append(mask)
    ds = Dataset.from_dict(
        {
            "input_ids": [t.tolist() for t in input_ids],
            "loss_mask": [m.tolist() for m in loss_masks],
            "seq_len": lens,
        }
    )
    data.mkdir(parents=True, exist_ok=True)
    ds.with_format("torch").save_to_disk(str(data))

    tdtype = getattr(torch, dtype)
    store = HiddenStateStore(data)
    store.ensure_meta(
        {
            "layer_ids": list(layer_ids),
            "num_layers": n_layers,
            "num_states": len(layer_ids) + 1,  # as extract records it: the aux layers + the pre-norm last
            "hidden_size": hidden,
            "dtype": dtype,
            "model_path": str(Path(verifier_dir).resolve()),
            "synthetic": not real,
        }
    )
    model = None
    if real:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(verifier_dir), dtype=torch.float32).eval()
    captured: dict = {}
    handle = None
    if model is not None:
        handle = model.model.layers[-1].register_forward_hook(
            lambda _m, _a, out: captured.__setitem__("h", out[0] if isinstance(out, tuple) else out)
        )
    entries = []
    for i, ids in enumerate(input_ids):
        if model is not None:
            with torch.no_grad():
                out = model(ids[None], output_hidden_states=True)
            states = [out.hidden_states[k][0] for k in layer_ids] + [captured["h"][0]]
            hs = torch.stack(states, dim=1).to(tdtype)
        else:
            hs = torch.randn((len(ids), len(layer_ids) + 1, hidden), generator=gen).to(tdtype)
        payload = sample_parts(ids, hs)  # the format extract writes (eagle3ops.store.sample)
        entries.append(store.write_sample(i, payload, len(ids), fsync=False))
    if handle is not None:
        handle.remove()
    store.append_manifest(entries, fsync=True)
    store.close()
    freq: Counter[int] = Counter()
    for ids, mask in zip(input_ids, loss_masks, strict=True):
        freq.update(ids[mask.bool()].tolist())
    torch.save(dict(freq), data / TOKEN_FREQ)
    return data
