"""What a prepared dataset's fingerprint is made of: the tokenizer's files and chat template, the inputs' sha256, the
parameters (prepare/dataset.py compares it with the stored one to tell an unchanged dataset)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from eagle3ops.prepare.render import SPECULATORS_VERSION

PREPARE_FORMAT = 1
_TOKENIZER_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json", ".msgpack", ".h5")
_TOKENIZER_SKIP_NAMES = {"config.json", "generation_config.json", "demo.json", "README.md"}


def _hash_tokenizer_files(h, directory: Path) -> None:
    """Feed ``h`` the name and bytes of every tokenizer-relevant file (not weights, not over 64 MiB), sorted."""
    for f in sorted(directory.iterdir()):
        if (
            f.is_file()
            and f.name not in _TOKENIZER_SKIP_NAMES
            and not f.name.endswith(_TOKENIZER_SKIP_SUFFIXES)
            and f.stat().st_size < 64 << 20
        ):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")


def tokenizer_fingerprint(model: str | os.PathLike, tokenizer) -> str:
    h = hashlib.sha256()
    p = Path(model)
    if p.is_dir():
        _hash_tokenizer_files(h, p)
    else:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        h.update((backend.to_str() if backend is not None else repr(tokenizer.get_vocab())).encode())
    h.update(str(tokenizer.chat_template).encode())
    return h.hexdigest()


def fast_tokenizer_fingerprint(model: str | os.PathLike) -> str | None:
    """:func:`tokenizer_fingerprint` without loading the tokenizer (transformers + speculators imports were
    most of a converged re-run's prepare task: docs/performance.md, "Idempotent re-run"): the same file
    hash, with the chat template read the way transformers finds it (chat_template.jinja, else
    tokenizer_config.json's string). Only used to recognise an unchanged dataset: a value that does not match
    the stored fingerprint falls back to the full path, so a wrong guess costs time, never correctness."""
    p = Path(model)
    if not p.is_dir():
        return None
    jinja = p / "chat_template.jinja"
    try:
        if jinja.is_file():
            tmpl = jinja.read_text()
        else:
            tmpl = json.loads((p / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(tmpl, str):
        return None
    h = hashlib.sha256()
    _hash_tokenizer_files(h, p)
    h.update(tmpl.encode())
    return h.hexdigest()


def dataset_fingerprint(sources: list, tok_fp: str, params: dict) -> str:
    doc = {
        "format": PREPARE_FORMAT,
        "speculators": SPECULATORS_VERSION,
        "inputs": [s.sha256 for s in sources],
        "tokenizer": tok_fp,
        "params": params,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
