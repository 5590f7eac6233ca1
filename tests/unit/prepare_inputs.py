"""Shared by tests/unit/prepare/: a quiet log, the rows of a prepared dataset, conversations written as
JSONL (ShareGPT records, a three-turn one mixing both schemas), and a copy of the demo's tokenizer with another
chat template (a Qwen3-like one that pre-fills ``<think>``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def quiet(msg: str) -> None:
    pass


def rows_of(data_dir) -> list[dict]:
    from datasets import load_from_disk

    return list(load_from_disk(str(data_dir)).with_format(None))


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def sharegpt(*pairs: tuple[str, str], system: str | None = None) -> dict:
    """A ShareGPT record: a system turn if given, then a human and a gpt turn per (question, answer) pair."""
    turns = [{"from": "system", "value": system}] if system else []
    for question, answer in pairs:
        turns += [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    return {"conversations": turns}


ADD = ("What is 2 + 3?", "2 + 3 = 5.")
# three assistant turns; the last pair in the OpenAI schema (one record may mix both)
THREE_TURNS = sharegpt(ADD, ("Now add 4 to that.", "5 + 4 = 9."), system="You are a helpful assistant.")
THREE_TURNS["conversations"] += [
    {"role": "user", "content": "Spell the word cat."},
    {"role": "assistant", "content": "c-a-t"},
]


def _tokenizer_variant(src_model: str, dst: Path, template: str) -> Path:
    dst.mkdir()
    for f in Path(src_model).iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, dst / f.name)
    (dst / "chat_template.jinja").write_text(template)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


# A Qwen3-like template: the generation prompt pre-fills "<think>", history reasoning is dropped.
PREFILL_THINK = (
    "{{ bos_token }}{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}"
    "{% endfor %}"
    "{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' }}"
    "{% if m['role'] == 'assistant' and loop.index0 > ns.last_user and m.get('reasoning_content') %}"
    "{{ '<think>' ~ m['reasoning_content'] ~ '</think>' }}{% endif %}"
    "{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|><think>' }}{% endif %}"
)
