"""One tokenizer everywhere: a sample of the rows prepare renders, against the target's tokenizer loaded the way
SGLang loads it to serve (``AutoTokenizer`` with ``trust_remote_code`` as set, nothing else changed) and fed the
same conversation as a client sends it (OpenAI messages, the record's own keys: ``reasoning_content``,
``tool_calls``, ``tool_call_id``...).

A row is speculators' render of the conversation up to one assistant turn (its boundary rows); the serving side
renders the same prefix with the same chat template and tokenises it. Any difference means a draft trained on
these rows is served on other ids (another tokenizer class or split, a key the renderer dropped): the run stops
naming the row and the first differing token, before anything is written.
"""

from __future__ import annotations

import json
import os

from eagle3ops.conversations import content_of, role_of
from eagle3ops.prepare.errors import PrepareError

_KEPT_KEYS = ("tool_calls", "tool_call_id", "reasoning_content", "reasoning", "thinking", "name")


def serving_tokenizer(model: str | os.PathLike, trust_remote_code: bool):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model), trust_remote_code=trust_remote_code)


def client_messages(conv: list[dict]) -> list[dict]:
    """The conversation as a client sends it to the server: role/content, the other keys as the record has them."""
    return [
        {
            "role": role_of(t),
            "content": content_of(t),
            **{k: t[k] for k in _KEPT_KEYS if t.get(k) is not None},
        }
        for t in conv
    ]


def _first_difference(a, b) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if int(x) != int(y):
            return i
    return None if len(a) <= len(b) else len(b)


def check_conversation(tok, loc: str, conv: list[dict], tools, rows: list) -> str | None:
    """None when every row equals (a prefix of) the serving render of the conversation up to one of its assistant
    turns; else what differs, at the first differing token of the closest such render."""
    messages = client_messages(conv)
    renders = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            text = tok.apply_chat_template(messages[: i + 1], tools=tools or None, tokenize=False)
            renders.append(tok.encode(text, add_special_tokens=False))
    for n, (ids, _mask) in enumerate(rows):
        ids = [int(x) for x in ids]
        diffs = [(_first_difference(ids, r), r) for r in renders]
        if any(d is None for d, _ in diffs):
            continue
        at, closest = max(diffs, key=lambda dr: dr[0])
        ours = ids[at]
        theirs = closest[at] if at < len(closest) else None
        return (
            f"{loc}: row {n} of this conversation differs from the serving tokenizer's ids at token {at}: "
            f"prepare has {ours} ({tok.convert_ids_to_tokens(ours)!r}), the server would see "
            + (f"{theirs} ({tok.convert_ids_to_tokens(theirs)!r})" if theirs is not None else "the end")
            + ". Prepare and SGLang must tokenise the same text to the same ids (same tokenizer class, "
            "trust_remote_code as SGLang serves, every message key the chat template reads)."
        )
    return None


def check_samples(model: str | os.PathLike, trust_remote_code: bool, samples: list) -> int:
    """Check ``samples`` (``(loc, record, rows)`` of conversations) with a fresh serving tokenizer; raise
    :class:`PrepareError` naming the first mismatch. Returns how many conversations were checked."""
    if not samples:
        return 0
    tok = serving_tokenizer(model, trust_remote_code)
    for loc, rec, rows in samples:
        conv = rec.get("conversations", rec.get("messages"))
        tools = rec.get("tools")
        if isinstance(tools, str):  # a tools column as a JSON string, as speculators reads it
            try:
                tools = json.loads(tools)
            except ValueError:
                tools = None
        why = check_conversation(tok, loc, conv, tools, rows)
        if why:
            raise PrepareError(why)
    return len(samples)
