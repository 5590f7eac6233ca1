"""One tokenizer everywhere, at serve time: the running server's tokenizer against the rows the draft was trained on.

Prepare checked its rows against the target's tokenizer loaded as SGLang loads it (``eagle3ops.prepare.tokcheck``);
this asks the server itself, through SGLang's ``POST /v1/tokenize``, on a sample of the prepared data:

- **text**: the exact text prepare tokenised for a row (the conversation up to one assistant turn, rendered with
  the target's chat template), sent as ``prompt`` with ``add_special_tokens`` off, must come back as the row's ids
  (a row prepare cut at ``max_length``: as its first ids);
- **messages**: the conversation up to its first user turn, sent as ``messages`` (the server renders them with its
  chat template and the generation prompt), must come back as our template's render of the same messages.

The sample: the first conversations of the inputs prepare recorded (``prepare_meta.json``) whose renders are rows
of the prepared dataset (found by their length, then compared whole). A difference stops the run naming the
conversation (``file:line``), the row, the position and both tokens: a draft served on other ids than it learnt on
is a silent loss. A server without ``/v1/tokenize`` (404), or no prepared data to sample, is reported as not
checked, with the reason.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from eagle3ops.conversations import InputError, check_record, iter_records, resolve_sources
from eagle3ops.errors import WithDetails
from eagle3ops.prepare import tokcheck as prepared
from eagle3ops.remote_code import require_trusted
from eagle3ops.store.layout import PREPARE_META

SAMPLE = 8  # conversations checked
SCAN = 64  # records read at most to find them (rows cut by max_samples or too long have none)


class TokcheckError(WithDetails, Exception):
    """The server tokenises otherwise than the prepared rows, or cannot be asked; the message names where."""


def server_tokens(url: str, body: dict, timeout: float = 60.0):
    """The server's ``/v1/tokenize`` answer's ``tokens``; None when the server has no such endpoint (404)."""
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/tokenize",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())["tokens"]
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise TokcheckError(f"{url}/v1/tokenize answered {e.code}: {e.read()[:300]!r}", url=url) from None
    except (OSError, ValueError, KeyError) as e:
        raise TokcheckError(f"{url}/v1/tokenize: no usable answer ({e})", url=url) from None


def _sample(data_dir: Path, meta: dict, tok) -> list[dict]:
    """Up to :data:`SAMPLE` conversations of prepare's inputs, each with the renders that are rows of the dataset:
    ``{loc, messages, tools, rows: [(row index, text, ids, cut)]}`` (``cut``: the row is the render's first
    ``max_length`` ids)."""
    from datasets import load_from_disk

    table = load_from_disk(str(data_dir)).data
    max_length = int((meta.get("params") or {}).get("max_length") or 1 << 62)
    by_len: dict[int, list[int]] = {}
    for i, n_ids in enumerate(table.column("seq_len").to_pylist()):
        by_len.setdefault(int(n_ids), []).append(i)
    column = table.column("input_ids")
    sources = resolve_sources([i["path"] for i in meta.get("inputs") or []])
    out: list[dict] = []
    records = (r for s in sources for r in iter_records(s))
    for n, (loc, rec) in enumerate(records):
        if len(out) >= SAMPLE or n >= SCAN:
            break
        usable = check_record(rec)
        if not isinstance(usable, tuple) or usable[0] != "conv":
            continue  # a problem prepare skipped, or a pretokenised row: no text to send
        conv, tools = prepared.conversation_of(rec)
        messages = prepared.client_messages(conv)
        rows = []
        for text, ids in prepared.renders(tok, messages, tools):
            want = ids[:max_length]
            row = next((i for i in by_len.get(len(want), ()) if column[i].as_py() == want), None)
            if row is not None:
                rows.append((row, text, want, len(want) < len(ids)))
        if rows:
            out.append({"loc": loc, "messages": messages, "tools": tools, "rows": rows})
    return out


def _difference(tok, where: str, ours: list[int], theirs: list[int], what: str) -> str | None:
    at = prepared.first_difference(ours, theirs)
    if at is None and len(ours) == len(theirs):
        return None
    at = min(len(ours), len(theirs)) if at is None else at
    return (
        f"{where}: the server tokenises {what} otherwise, first at token {at}: ours "
        f"{prepared.token_text(tok, ours[at] if at < len(ours) else None)}, the server's "
        f"{prepared.token_text(tok, theirs[at] if at < len(theirs) else None)}. SGLang must load the tokenizer "
        "prepare used (--trust-remote-code exactly when eagle3ops_trust_remote_code is on, the same model "
        "directory and chat template); otherwise the draft is served on other ids than it learnt on."
    )


def check(
    url: str,
    data_dir: str | os.PathLike,
    model: str | os.PathLike | None = None,
    *,
    trust_remote_code: bool = False,
    timeout: float = 60.0,
) -> dict:
    """Compare the server at ``url`` with the prepared data in ``data_dir`` (the tokenizer: ``model``, default
    the one prepare recorded). Returns ``{checked, reason | conversations, rows}``; raises
    :class:`TokcheckError` naming the first difference."""
    data = Path(data_dir)
    try:
        meta = json.loads((data / PREPARE_META).read_text())
    except (OSError, ValueError):
        return {"checked": False, "reason": f"{data / PREPARE_META}: no prepared data to compare with"}
    model = model or meta.get("model")
    require_trusted(model, trust_remote_code, TokcheckError)
    tok = prepared.serving_tokenizer(model, trust_remote_code)
    try:
        sample = _sample(data, meta, tok)
    except (InputError, OSError) as e:  # the inputs moved away, the rows removed: nothing to sample
        return {"checked": False, "reason": f"prepare's inputs or rows cannot be read ({e})"}
    if not sample:
        return {
            "checked": False,
            "reason": f"none of the first {SCAN} conversations of prepare's inputs renders to a row of {data} with "
            f"{model}'s tokenizer (inputs changed since prepare, or the rows were made with another tokenizer)",
        }
    texts = [(c, r) for c in sample for r in c["rows"]]
    got = server_tokens(url, {"prompt": [r[1] for _, r in texts], "add_special_tokens": False}, timeout)
    if got is None:
        return {
            "checked": False,
            "reason": f"{url} has no /v1/tokenize (404): the server's tokenizer is unknown",
        }
    for (c, (row, _text, ids, cut)), theirs in zip(texts, got, strict=True):
        theirs = theirs[: len(ids)] if cut else theirs  # a row cut at max_length: its text's first ids
        why = _difference(tok, f"{c['loc']} (row {row} of {data})", ids, theirs, "prepare's text of this row")
        if why:
            raise TokcheckError(why, loc=c["loc"], row=row)
    for c in sample:
        first_user = next((i for i, m in enumerate(c["messages"]) if m["role"] == "user"), None)
        if first_user is None:
            continue
        msgs = c["messages"][: first_user + 1]
        ours = prepared.generation_prompt_ids(tok, msgs, c["tools"])
        theirs = server_tokens(
            url, {"messages": msgs, **({"tools": c["tools"]} if c["tools"] else {})}, timeout
        )
        why = _difference(
            tok, f"{c['loc']} (its first user turn)", ours, theirs or [], "the chat template's render"
        )
        if why:
            raise TokcheckError(why, loc=c["loc"])
    cut = sum(r[3] for _, r in texts)
    return {
        "checked": True,
        "conversations": len(sample),
        "rows": len(texts),
        "rows_cut": cut,
        "model": str(model),
    }
