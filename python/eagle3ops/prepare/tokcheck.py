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


def first_difference(a, b) -> int | None:
    """The first position where ``a`` and ``b`` differ, or ``len(b)`` when ``b`` ends first; None when ``a`` is
    (a prefix of) ``b``."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if int(x) != int(y):
            return i
    return None if len(a) <= len(b) else len(b)


def token_text(tok, token_id: int | None) -> str:
    """A token as a message names it: its id and its string (``the end`` past the last one)."""
    return "the end" if token_id is None else f"{token_id} ({tok.convert_ids_to_tokens(int(token_id))!r})"


def conversation_of(rec: dict) -> tuple[list[dict], list | None]:
    """A record's turns and its tools (a tools column given as a JSON string, as speculators reads it, parsed)."""
    tools = rec.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            tools = None
    return rec.get("conversations", rec.get("messages")), tools or None


def renders(tok, messages: list[dict], tools) -> list[tuple[str, list[int]]]:
    """The text and ids of the conversation up to each of its assistant turns, as prepare renders a row (the chat
    template as text, then ``encode`` without special tokens)."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            text = tok.apply_chat_template(messages[: i + 1], tools=tools or None, tokenize=False)
            out.append((text, tok.encode(text, add_special_tokens=False)))
    return out


def generation_prompt_ids(tok, messages: list[dict], tools=None) -> list[int]:
    """The ids of ``messages`` rendered with the generation prompt, encoded as prepare encodes (the template as
    text, then ``encode`` without special tokens): what a server's render of the same messages must equal. Not
    ``apply_chat_template(tokenize=True)``: transformers 5 returns a BatchEncoding there."""
    text = tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def check_conversation(tok, loc: str, conv: list[dict], tools, rows: list) -> str | None:
    """None when every row equals (a prefix of) the serving render of the conversation up to one of its assistant
    turns; else what differs, at the first differing token of the closest such render."""
    rendered = [ids for _text, ids in renders(tok, client_messages(conv), tools)]
    for n, (ids, _mask) in enumerate(rows):
        ids = [int(x) for x in ids]
        diffs = [(first_difference(ids, r), r) for r in rendered]
        if any(d is None for d, _ in diffs):
            continue
        at, closest = max(diffs, key=lambda dr: dr[0])
        ours = ids[at]
        theirs = closest[at] if at < len(closest) else None
        return (
            f"{loc}: row {n} of this conversation differs from the serving tokenizer's ids at token {at}: "
            f"prepare has {token_text(tok, ours)}, the server would see {token_text(tok, theirs)}"
            ". Prepare and SGLang must tokenise the same text to the same ids (same tokenizer class, "
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
        conv, tools = conversation_of(rec)
        why = check_conversation(tok, loc, conv, tools, rows)
        if why:
            raise PrepareError(why)
    return len(samples)
