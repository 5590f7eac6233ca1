"""A warm start: fine-tune an existing speculators EAGLE-3 draft on this store instead of a new one (``init_from``).

What goes wrong with a warm start elsewhere (users' pain 14): the vocabulary maps are rebuilt from the new data's
token counts, so the draft's ``lm_head`` row i no longer means the token it was trained for; training loss looks
normal and the served draft accepts ~1 token a step. Here the pretrained draft's own ``d2t``/``t2d`` (stored in
its ``model.safetensors``) are the run's maps, unchanged, and its shape (layers, attention, vocabulary size) is
kept: the rendered config hands speculators ``draft.from_pretrained`` and none of the decoder-shaping keys, which
speculators 0.9.0 refuses beside it. Before any launch the draft is checked against the store and the verifier:
its aux layer ids against the ids the states were extracted at, its hidden size and its target vocabulary
against the verifier's; a mismatch is refused naming both values. The config records the draft's path and the
sha256 of its weights, so pointing ``init_from`` at another draft (or changing the file) is a configuration change
that resume refuses unless ``restart_on_change``.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle3ops.checkpoints import CheckpointError, resolve_checkpoint
from eagle3ops.durable import sha256_file
from eagle3ops.train.inputs import write_npy
from eagle3ops.train.spec import TrainError

WEIGHTS = "model.safetensors"


def _refuse(ckpt: Path, what: str) -> TrainError:
    return TrainError(f"train init_from {ckpt}: {what}. Nothing was launched.", path=str(ckpt))


def read_init(path: str, layer_ids: list[int], facts: dict) -> dict:
    """The pretrained draft at ``path`` (a checkpoint, a speculators save directory or a train run directory),
    checked against the store's ``layer_ids`` and the verifier's ``facts``: ``{"checkpoint", "window", "sha256",
    "draft_vocab_size", "num_layers", "d2t", "t2d"}`` (the maps as numpy arrays)."""
    from safetensors import safe_open

    try:
        ckpt = resolve_checkpoint(path)
    except CheckpointError as e:
        raise TrainError(f"train init_from: {e}", path=str(path)) from None
    try:
        cfg = json.loads((ckpt / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise _refuse(ckpt, f"config.json is unreadable ({e})") from None
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise _refuse(
            ckpt,
            f"speculators_model_type is {kind!r}, not 'eagle3': a warm start takes a speculators EAGLE-3 draft "
            "(a SpecForge or SGLang-format draft is not read here)",
        )
    ids = list(cfg.get("eagle_aux_hidden_state_layer_ids") or [])
    if ids != list(layer_ids):
        raise _refuse(
            ckpt,
            f"the draft was trained on the aux states of layers {ids}, but this store's hidden states come from "
            f"layers {list(layer_ids)} (extract_meta.json). Extract at the draft's layers (eagle3ops_layer_ids: "
            f"{ids}) or train a new draft (empty train_init_from)",
        )
    layer_cfg = cfg.get("transformer_layer_config") or {}
    for key in ("hidden_size", "vocab_size"):
        if layer_cfg.get(key) != facts.get(key):
            raise _refuse(
                ckpt,
                f"its {key} is {layer_cfg.get(key)}, the verifier's is {facts.get(key)}: the draft was made for "
                "another target model",
            )
    try:
        with safe_open(str(ckpt / WEIGHTS), "np") as f:
            names = set(f.keys())
            if not {"d2t", "t2d"} <= names:
                raise _refuse(
                    ckpt, f"{WEIGHTS} holds no d2t/t2d vocabulary maps (a speculators draft has both)"
                )
            d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    except (
        OSError,
        ValueError,
    ) as e:  # safetensors raises its own errors as ValueError subclasses or OSError
        raise _refuse(ckpt, f"{WEIGHTS} is unreadable ({e})") from None
    n = int(cfg.get("draft_vocab_size") or 0)
    if d2t.shape != (n,) or t2d.shape != (facts.get("vocab_size"),) or int(t2d.sum()) != n:
        raise _refuse(
            ckpt,
            f"its maps disagree with its config: d2t {list(d2t.shape)}, t2d {list(t2d.shape)} with {int(t2d.sum())} "
            f"tokens set, draft_vocab_size {n}",
        )
    types = layer_cfg.get("layer_types") or []
    return {
        "checkpoint": str(ckpt),
        # its attention, for serving (a draft trained sliding is served with that window)
        "window": int(layer_cfg.get("sliding_window") or 0) or None if "sliding_attention" in types else None,
        "sha256": sha256_file(ckpt / WEIGHTS),
        "draft_vocab_size": n,
        "num_layers": int(layer_cfg.get("num_hidden_layers") or 0),
        "d2t": d2t,
        "t2d": t2d,
    }


def write_init_maps(init: dict, d2t_path: Path, t2d_path: Path) -> None:
    """The pretrained draft's own maps, as the .npy files the config names (atomic writes)."""
    write_npy(d2t_path, init["d2t"])
    write_npy(t2d_path, init["t2d"])
