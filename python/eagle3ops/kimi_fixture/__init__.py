"""A Kimi-K2.5-format target, tiny and built offline (``eagle3ops demo-kimi --out DIR``): the formats that the
real checkpoint brings and no Llama-shaped target exercises, for CPU tests and a short GPU smoke::

    DIR/model/                  the checkpoint folder (spec: eagle3ops.kimi_fixture.spec)
        config.json             KimiK25ForConditionalGeneration wrapper: text_config (kimi_k2, DeepSeek-V3 MLA
                                + MoE, 4 layers, first dense), vision_config, compressed-tensors INT4 config,
                                auto_map AutoConfig -> configuration_kimi_k25.py
        model-0000K-of-00003.safetensors, model.safetensors.index.json
                                language_model.* (routed experts INT4 pack-quantized, group 32), vision_tower.*,
                                mm_projector.* (eagle3ops.kimi_fixture.weights)
        tiktoken.model, tokenization_kimi.py, tokenizer_config.json (auto_map), special_tokens_map.json
                                the remote-code tiktoken tokenizer: 768 BPE ranks + 256 reserved specials
        chat_template.jinja     system/user/assistant markers, thinking, tool declarations/calls/results
        preprocessor_config.json, kimi_k25_processor.py, kimi_k25_vision_processing.py
                                the processor side (media_proc_cfg) SGLang's wrapper needs at start-up
        generation_config.json
    DIR/conversations.jsonl     seeded chats with thinking and tool calls (eagle3ops.kimi_fixture.chats)
    DIR/heldout.jsonl           benchmark prompts
    DIR/kimi-fixture.json       parameters and the sha256 of every file

Deterministic from the seed, a few seconds on a CPU core, no downloads. Built in a temporary directory beside
DIR and swapped into place; a second run with the same seed changes nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from eagle3ops.durable import tree_sha256
from eagle3ops.target_dir import (  # the demo's layout and build steps
    CONVERSATIONS,
    HELDOUT,
    MODEL_DIR,
    building,
    put_in_place,
    target_paths,
)

FIXTURE_VERSION = 1
META = "kimi-fixture.json"
_ENTRIES = {META, MODEL_DIR, CONVERSATIONS, HELDOUT}
NUM_CONVERSATIONS = 30
NUM_HELDOUT = 8


class FixtureError(RuntimeError):
    """Bad input to the builder (a message for the user, no traceback)."""


def _current(root: Path, params: dict) -> dict | None:
    try:
        meta = json.loads((root / META).read_text())
        return meta if meta.get("params") == params and tree_sha256(root, META) == meta.get("files") else None
    except (OSError, ValueError):
        return None


def _result(root: Path, meta: dict, changed: bool) -> dict:
    return {
        "changed": changed,
        **target_paths(root),  # the demo's layout
        **{k: meta.get(k) for k in ("seed", "num_layers", "hidden_size", "vocab_size", "fingerprint")},
    }


def _write_model(model_dir: Path, seed: int) -> dict:
    from eagle3ops.kimi_fixture import files, weights

    model_dir.mkdir()
    stats = files.write(model_dir, seed)
    tensors = {**weights.text_tensors(seed), **weights.vision_tensors(seed)}
    index = weights.write_shards(tensors, model_dir)
    return {**stats, "num_tensors": len(index["weight_map"]), "total_size": index["metadata"]["total_size"]}


def build(out: str | os.PathLike, seed: int = 0, *, check: bool = False, log=None) -> dict:
    """Build the fixture under ``out`` (see the module docstring); ``check``: write nothing, say whether a
    build would happen."""
    from eagle3ops import jsonl
    from eagle3ops.kimi_fixture import chats, spec

    root = Path(out).absolute()
    params = {"fixture_version": FIXTURE_VERSION, "seed": seed}
    shape = {
        "seed": seed,
        "num_layers": spec.TEXT["num_hidden_layers"],
        "hidden_size": spec.TEXT["hidden_size"],
        "vocab_size": spec.VOCAB_SIZE,
    }
    meta = _current(root, params)
    if meta is not None:
        return _result(root, meta, changed=False)
    if root.exists() and not root.is_dir():
        raise FixtureError(f"{root} exists and is not a directory: choose another --out")
    foreign = sorted(set(os.listdir(root)) - _ENTRIES) if root.is_dir() else []
    if foreign:
        raise FixtureError(
            f"{root} holds {', '.join(foreign[:5])} that the fixture builder did not make; it replaces the whole "
            "directory. Move those aside or choose another --out."
        )
    if check:
        return _result(root, shape, changed=True)
    log = log or (lambda msg: None)
    t0 = time.monotonic()
    with building(root, "kimi") as tmp:
        log(f"kimi fixture: building {root} (seed {seed})")
        stats = _write_model(tmp / MODEL_DIR, seed)
        jsonl.write(tmp / CONVERSATIONS, chats.conversations(NUM_CONVERSATIONS, seed))
        jsonl.write(tmp / HELDOUT, chats.heldout(NUM_HELDOUT, seed))
        meta = {"params": params, **shape, **stats, "files": tree_sha256(tmp, META)}
        put_in_place(tmp, root, META, meta, "kimi-old")
    log(f"kimi fixture: built {root} in {time.monotonic() - t0:.1f} s")
    return _result(root, meta, changed=True)
