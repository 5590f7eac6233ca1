"""The fixture's non-weight files: config.json, the remote-code tokenizer (tokenizer_config.json with its
``auto_map``, tiktoken.model, tokenization_kimi.py), the chat template, the processor side
(preprocessor_config.json with ``media_proc_cfg`` and its ``auto_map``, the processor and image-processor
classes) and generation_config.json. The remote-code files are the ones in ``remote/`` beside this module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eagle3ops.kimi_fixture import bpe, spec

REMOTE = Path(__file__).parent / "remote"
TOKENIZER_CODE = "tokenization_kimi.py"
PROCESSOR_CODE = "kimi_k25_processor.py"
IMAGE_PROCESSOR_CODE = "kimi_k25_vision_processing.py"
CONFIG_CODE = "configuration_kimi_k25.py"
CHAT_TEMPLATE = "chat_template.jinja"
REMOTE_FILES = (TOKENIZER_CODE, PROCESSOR_CODE, IMAGE_PROCESSOR_CODE, CONFIG_CODE, CHAT_TEMPLATE)


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def added_tokens_decoder() -> dict:
    return {
        str(spec.BPE_RANKS + k): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for k, tok in sorted(spec.SPECIAL_TOKENS.items())
    }


def tokenizer_config() -> dict:
    named = [t for t in spec.SPECIAL_TOKENS.values() if t not in (spec.BOS, spec.EOS, spec.PAD, spec.UNK)]
    return {
        "auto_map": {"AutoTokenizer": [f"{TOKENIZER_CODE[:-3]}.TikTokenTokenizer", None]},
        "tokenizer_class": "TikTokenTokenizer",
        "added_tokens_decoder": added_tokens_decoder(),
        "additional_special_tokens": named,
        "bos_token": spec.BOS,
        "eos_token": spec.EOS,
        "pad_token": spec.PAD,
        "unk_token": spec.UNK,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.TEXT["max_position_embeddings"],
    }


def preprocessor_config() -> dict:
    return {
        "auto_map": {
            "AutoProcessor": f"{PROCESSOR_CODE[:-3]}.KimiK25Processor",
            "AutoImageProcessor": f"{IMAGE_PROCESSOR_CODE[:-3]}.KimiK25VisionProcessor",
        },
        "image_processor_type": "KimiK25VisionProcessor",
        "processor_class": "KimiK25Processor",
        "media_proc_cfg": dict(spec.MEDIA_PROC_CFG),
    }


def write(model_dir: Path, seed: int) -> dict:
    """Write every non-weight file into ``model_dir``; returns what the tokenizer's build measured."""
    _dump(model_dir / "config.json", spec.wrapper_config())
    _dump(
        model_dir / "generation_config.json",
        {
            "bos_token_id": spec.special_id(spec.BOS),
            "eos_token_id": spec.special_id("<|im_end|>"),
            "max_length": spec.TEXT["max_position_embeddings"],
        },
    )
    vocab = bpe.train(bpe.corpus(seed), spec.BPE_RANKS)
    bpe.write_tiktoken_model(vocab, model_dir / "tiktoken.model")
    _dump(model_dir / "tokenizer_config.json", tokenizer_config())
    _dump(
        model_dir / "special_tokens_map.json",
        {
            k: v
            for k, v in tokenizer_config().items()
            if k.endswith("_token") or k == "additional_special_tokens"
        },
    )
    _dump(model_dir / "preprocessor_config.json", preprocessor_config())
    for name in REMOTE_FILES:
        shutil.copyfile(REMOTE / name, model_dir / name)
    return {"bpe_ranks": len(vocab), "vocab_size": len(vocab) + spec.NUM_RESERVED_SPECIAL}
