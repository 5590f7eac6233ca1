"""``hidden_states/extract_meta.json``: what a store's samples are (model, layer ids, hidden size, dtype), and the
decision whether a run may resume into a store whose meta it finds (:func:`meta_decision`)."""

from __future__ import annotations

import time
from pathlib import Path

from eagle3ops.store.errors import ModelChangedError, StoreError

META_KEYS = ("layer_ids", "hidden_size", "dtype", "num_layers", "model_fingerprint", "dataset_fingerprint")


MODEL_CHANGE_ACTIONS = ("refuse", "discard", "accept")


def weight_changes(old: dict, new: dict) -> list[str]:
    """What changed in the target's weight files between two metas (``model_weights``: name -> [size, mtime_ns,
    header digest]; ``model_content_hash``: name -> full-content digest, only when asked for). Only what both
    metas record is compared (a meta from before these facts compares by ``model_fingerprint`` alone). Matching
    content hashes win over changed timestamps (a copy with new mtimes is the same model)."""
    ow, nw = old.get("model_weights"), new.get("model_weights")
    oc, nc = old.get("model_content_hash"), new.get("model_content_hash")
    if isinstance(oc, dict) and isinstance(nc, dict) and oc.get("algo") == nc.get("algo"):
        of, nf = oc.get("files") or {}, nc.get("files") or {}
        return [f"{n}: content differs" for n in sorted(set(of) | set(nf)) if of.get(n) != nf.get(n)]
    if not isinstance(ow, dict) or not isinstance(nw, dict):
        return []
    out = []
    for name in sorted(set(ow) | set(nw)):
        a, b = ow.get(name), nw.get(name)
        if a is None or b is None:
            out.append(f"{name}: {'added' if a is None else 'removed'}")
            continue
        what = []
        if a[0] != b[0]:
            what.append(f"size {a[0]} -> {b[0]}")
        if a[2] != b[2]:
            what.append("safetensors header differs")
        if a[1] != b[1]:
            what.append(
                f"modified {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(b[1] / 1e9))}, recorded "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(a[1] / 1e9))}"
            )
        if what:
            out.append(f"{name}: {', '.join(what)}")
    return out


def meta_decision(
    old: dict, new: dict, meta_path, on_model_change: str = "refuse"
) -> tuple[str, dict | None]:
    """Compare a store's recorded meta with a run's: ``("ok", None)``, ``("update", meta to write)`` (migration
    of an older meta, new weight facts the user accepted or a content hash proved the same) or ``("discard",
    None)``; raises StoreError (ModelChangedError for the model) when the run must not resume into the store."""
    if on_model_change not in MODEL_CHANGE_ACTIONS:
        raise StoreError(f"on_model_change {on_model_change!r}: use one of {', '.join(MODEL_CHANGE_ACTIONS)}")
    diff = {k: (old.get(k), new.get(k)) for k in META_KEYS if old.get(k) != new.get(k)}
    model_diff = diff.pop("model_fingerprint", None)
    weights = weight_changes(old, new)
    if diff:
        details = ", ".join(f"{k}: stored {a!r} vs requested {b!r}" for k, (a, b) in diff.items())
        raise StoreError(
            f"{meta_path}: this store holds hidden states made with different settings ({details}). "
            "Resuming would mix incompatible samples. Use a new data directory, or move "
            f"{Path(meta_path).parent} aside to start over."
        )
    if model_diff or weights:
        if on_model_change == "discard":
            return "discard", None
        if on_model_change == "accept" and not model_diff:
            return "update", _merged_meta(old, new)
        what = "; ".join(weights) if weights else "config.json or the weight files' names/sizes differ"
        raise ModelChangedError(
            f"{meta_path}: the target model changed since these hidden states were extracted from "
            f"{old.get('model_path') or 'it'} ({what}). Resuming would mix two models' states. To start over, "
            "use a fresh data directory (--data / extract_data_dir) or --on-model-change discard "
            "(extract_on_model_change: discard; the old states are moved aside to hidden_states.old-<time>). "
            "To keep the old store, put the old weights back"
            + (
                ""
                if model_diff
                else "; if the weights are the same files copied with new timestamps, "
                "--model-hash (extract_model_hash: true) compares their content, or --on-model-change accept "
                "records them as they are now"
            )
            + "."
        )
    merged = _merged_meta(old, new)
    return ("update", merged) if merged != old else ("ok", None)


def _merged_meta(old: dict, new: dict) -> dict:
    """``old`` with the weight facts of ``new`` (what a migrated or accepted meta records)."""
    merged = dict(old)
    for k in ("model_weights", "model_content_hash"):
        if new.get(k) is not None:
            merged[k] = new[k]
    return merged
