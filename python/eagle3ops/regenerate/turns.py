"""The conversations to regenerate: which input rows can be (:func:`scan_inputs`), and one conversation turn by turn
(:func:`conversation_steps`: each assistant turn's prompt out, the target's answer in, the record with the new
answers at the end)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from eagle3ops.conversations import (
    Problem,
    check_record,
    content_of,
    iter_records,
    role_of,
)
from eagle3ops.regenerate.config import (
    ASSISTANT,
    RegenerateConfig,
)


# ---------------------------------------------------------------------------------------------------
# the conversations
# ---------------------------------------------------------------------------------------------------
@dataclass
class Item:
    index: int  # position among all input rows (0-based, input order)
    loc: str  # file:line
    record: dict
    key: str  # conversations | messages
    turns: int  # assistant turns to generate


@dataclass
class Scan:
    items: list[Item]
    skipped: list[tuple[int, str, str]]  # (index, loc, reason)
    n_input: int
    n_total: int  # rows in the inputs (beyond the limit too)
    leading_dropped: int = 0


def _usable(rec: object) -> tuple[str, int] | str:
    """(key, assistant turns) of a record that can be regenerated, else why not."""
    checked = check_record(rec)
    if isinstance(checked, str):
        return checked
    kind, conv = checked
    if kind == "rows":
        return "a pre-tokenized row (input_ids/loss_mask): there is no text to regenerate"
    for k, t in enumerate(conv):
        if t.get("tool_calls") or role_of(t) == "tool":
            return f"turn {k}: tool calls and tool results are not regenerated"
    key = "conversations" if "conversations" in rec else "messages"
    n, seen_user = 0, False
    for t in conv:
        r = role_of(t)
        seen_user |= r == "user"
        n += r == ASSISTANT and seen_user
    if not n:
        return "no assistant turn after a user turn: nothing to regenerate"
    return key, n


def scan_inputs(sources, limit: int | None) -> Scan:
    """Every input row, in order: usable items (up to ``limit``) and the skipped rows with their reasons."""
    items: list[Item] = []
    skipped: list[tuple[int, str, str]] = []
    n_input = n_total = 0
    for source in sources:
        for loc, rec in iter_records(source):
            index = n_total
            n_total += 1
            if limit is not None and len(items) >= limit:
                continue  # counted in n_total only
            n_input += 1
            if isinstance(rec, Problem):
                skipped.append((index, rec.loc, rec.what))
                continue
            usable = _usable(rec)
            if isinstance(usable, str):
                skipped.append((index, loc, usable))
                continue
            items.append(Item(index, loc, rec, usable[0], usable[1]))
    return Scan(items, skipped, n_input, n_total)


@dataclass
class Answer:
    text: str
    reasoning: str | None = None  # a server's separate reasoning_content
    tokens: int = 0
    finish: str = "stop"  # stop | length


class TurnError(Exception):
    """This conversation cannot be finished (the reason names the turn)."""

    def __init__(self, reason: str, retryable: bool = False):
        super().__init__(reason)
        self.retryable = retryable


_THINK_RE = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with lone surrogates (half a character: a server's JSON can hold ``"\\ud83d"``) replaced by
    U+FFFD, as a detokenizer does with an incomplete character: no tokenizer accepts them, so ``prepare`` would
    have to drop the conversation."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def strip_think(text: str) -> str:
    """``text`` without reasoning blocks: every ``<think>...</think>``, an unclosed ``<think>...`` at the end
    (the answer ran out of tokens inside it), and everything before a ``</think>`` without its opening tag
    (templates that pre-fill ``<think>`` in the generation prompt)."""
    if "</think>" in text and "<think>" not in text.split("</think>", 1)[0]:
        text = text.split("</think>", 1)[1]
    text = _THINK_RE.sub("", text)
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text.strip()


def conversation_steps(item: Item, cfg: RegenerateConfig):
    """A generator: yields ``(k, messages)`` for each assistant turn k (its index in the input conversation)
    to answer, receives each :class:`Answer` by ``send`` and returns ``(record, tokens, truncated_turns,
    turns)`` at the end. Raises :class:`TurnError` for an answer that cannot be used."""
    rec = dict(item.record)
    out_turns: list[dict] = []
    history: list[dict] = []
    tokens = truncated = turns = 0
    seen_user = False
    for k, turn in enumerate(rec[item.key]):
        role = role_of(turn)
        if role == "system" and cfg.system == "drop":
            continue
        if role != ASSISTANT:
            seen_user |= role == "user"
            out_turns.append(dict(turn))
            history.append({"role": role, "content": content_of(turn)})
            continue
        if not seen_user:
            continue  # an answer to no question (leading assistant turns) is dropped
        answer: Answer = yield k, list(history)
        tokens += answer.tokens
        truncated += answer.finish == "length"
        turns += 1
        text, reasoning = valid_text(answer.text), valid_text(answer.reasoning or "") or None
        if cfg.think == "strip":
            text, reasoning = strip_think(text), None
        if not text.strip():
            why = " after stripping the <think> block" if cfg.think == "strip" and answer.text.strip() else ""
            cut = f" (it hit max_new_tokens {cfg.max_new_tokens})" if answer.finish == "length" else ""
            raise TurnError(f"turn {k}: the target's answer is empty{why}{cut}")
        new = {kk: v for kk, v in turn.items() if kk not in ("thinking", "reasoning_content")}
        if "value" in turn or ("content" not in turn and "from" in turn):
            new["value"] = text
        else:
            new["content"] = text
        if reasoning is not None:
            new["reasoning_content"] = reasoning
        out_turns.append(new)
        history.append({"role": ASSISTANT, "content": text})
    rec[item.key] = out_turns
    return rec, tokens, truncated, turns
