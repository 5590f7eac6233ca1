"""The conversation files ``prepare`` and ``regenerate`` read: their sources (JSONL, JSON, a directory of them, or
a dataset saved with ``datasets.save_to_disk``) with a content hash, every record by ``file:line`` (a problem in
one record is reported there, never as a traceback: bytes that are not UTF-8, JSON that does not parse), the
check of one record, and the target's tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import jsonl


class InputError(RuntimeError):
    """An input the user must fix; the message says what and where (``problems``: one ``file:line: what`` each)."""

    def __init__(self, message: str, *, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or []


# ---------------------------------------------------------------------------------------------------
# reading inputs
# ---------------------------------------------------------------------------------------------------
@dataclass
class Problem:
    loc: str
    what: str

    def __str__(self) -> str:
        return f"{self.loc}: {self.what}"


@dataclass
class Source:
    """One input file (or HF dataset directory) and the sha256 of its content."""

    path: Path
    kind: str  # jsonl | json | hf
    sha256: str = ""
    files: list[Path] = field(default_factory=list)


def _sha256_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def resolve_sources(inputs: list[str | os.PathLike]) -> list[Source]:
    """The input files behind ``inputs``: JSONL/JSON files, directories of them, or HF dataset dirs."""
    if not inputs:
        raise InputError("no --input given: pass one or more JSONL/JSON files or directories")
    sources: list[Source] = []
    for raw in inputs:
        p = Path(raw)
        if not p.exists():
            raise InputError(f"{p}: input does not exist")
        if p.is_dir():
            if (p / "state.json").exists() or (p / "dataset_dict.json").exists():
                files = sorted(f for f in p.rglob("*") if f.is_file())
                sources.append(Source(p, "hf", files=files))
                continue
            found = sorted(f for f in p.rglob("*") if f.suffix in (".json", ".jsonl") and f.is_file())
            if not found:
                raise InputError(
                    f"{p}: directory holds no .json/.jsonl files and is not a dataset saved with "
                    "datasets.save_to_disk"
                )
            sources += [Source(f, "jsonl" if f.suffix == ".jsonl" else "json", files=[f]) for f in found]
        elif p.suffix in (".jsonl", ".json"):
            sources.append(Source(p, "jsonl" if p.suffix == ".jsonl" else "json", files=[p]))
        else:
            raise InputError(
                f"{p}: unsupported input (expected .jsonl, .json, a directory of them, or a dataset "
                "directory saved with datasets.save_to_disk)"
            )
    for s in sources:
        s.sha256 = _sha256_files(s.files)
    return sources


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # what errors="surrogateescape" makes of a byte that is not UTF-8


def _not_utf8(text: str, m: re.Match) -> str:
    col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    return (
        f"not valid UTF-8 (byte 0x{ord(m.group()) - 0xDC00:02x} at column {col}); re-save the file as UTF-8 "
        "(e.g. iconv -f LATIN1 -t UTF-8)"
    )


def _iter_json_array(path: Path, text: str, bad: bool = False) -> Iterator[tuple[str, object]]:
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    n = len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos < n and text[pos] == "]":
            return
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            yield f"{path}:{e.lineno}", Problem(f"{path}:{e.lineno}", f"not valid JSON ({e.msg})")
            return
        m = _NOT_UTF8.search(text, pos, end) if bad else None
        line = _line_of(text, m.start() if m else pos)
        yield f"{path}:{line}", (Problem(f"{path}:{line}", _not_utf8(text, m)) if m else obj)
        pos = end
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos < n and text[pos] == ",":
            pos += 1
        elif pos < n and text[pos] == "]":
            return
        else:
            line = _line_of(text, pos)
            yield f"{path}:{line}", Problem(f"{path}:{line}", "not valid JSON (expected ',' or ']')")
            return


def iter_records(source: Source) -> Iterator[tuple[str, object]]:
    """(location, record or Problem) for every row of one source; location is ``file:line``."""
    path = source.path
    if source.kind == "hf":
        from datasets import DatasetDict, load_from_disk

        ds = load_from_disk(str(path))
        if isinstance(ds, DatasetDict):
            if "train" not in ds:
                raise InputError(f"{path}: dataset has splits {sorted(ds)}; save the one to use alone")
            ds = ds["train"]
        for i, row in enumerate(ds.with_format(None)):
            yield f"{path}:row {i}", row
        return
    # bytes that are not UTF-8 become lone surrogates here, so the rows around them still parse and the bad
    # ones are reported (and skipped with --on-error skip) by file:line, not as a UnicodeDecodeError
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    bad = _NOT_UTF8.search(text) is not None
    if source.kind == "json":
        stripped = text.lstrip()
        if stripped.startswith("["):
            yield from _iter_json_array(path, text, bad)
            return
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            pass  # not one JSON document: read it as JSON lines
        else:
            m = _NOT_UTF8.search(text) if bad else None
            yield (
                f"{path}:1",
                (Problem(f"{path}:{_line_of(text, m.start())}", _not_utf8(text, m)) if m else obj),
            )
            return
    for lineno, line in jsonl.split_lines(text):  # at "\n" only: str.splitlines() breaks at U+2028 too
        if not line.strip():
            continue
        loc = f"{path}:{lineno}"
        m = _NOT_UTF8.search(line) if bad else None
        if m:
            yield loc, Problem(loc, _not_utf8(line, m))
            continue
        try:
            yield loc, json.loads(line)
        except json.JSONDecodeError as e:
            yield loc, Problem(loc, f"not valid JSON ({e.msg} at column {e.colno})")


# ---------------------------------------------------------------------------------------------------
# checking and rendering one record
# ---------------------------------------------------------------------------------------------------
_ASSISTANT_ROLES = ("gpt", "assistant")


_KNOWN_ROLES = ("human", "user", "system", "tool", *_ASSISTANT_ROLES)


def check_record(rec: object) -> tuple[str, object] | str:
    """("conv", turns) or ("rows", (input_ids, loss_mask)) for a usable record, else what is wrong."""
    if not isinstance(rec, dict):
        return f"expected a JSON object with 'conversations', got {type(rec).__name__}"
    if "input_ids" in rec and "loss_mask" in rec:
        ids, mask = rec["input_ids"], rec["loss_mask"]
        if not isinstance(ids, list) or not isinstance(mask, list):
            return "input_ids and loss_mask must be lists of integers"
        if len(ids) != len(mask):
            return f"input_ids has {len(ids)} tokens but loss_mask {len(mask)}"
        if not ids:
            return "empty input_ids"
        if not all(isinstance(t, int) and t >= 0 for t in ids):
            return "input_ids must be non-negative integers"
        if not all(m in (0, 1) for m in mask):
            return "loss_mask must hold only 0 and 1"
        return "rows", (ids, mask)
    key = "conversations" if "conversations" in rec else "messages" if "messages" in rec else None
    if key is None:
        return f"no 'conversations' field (keys: {', '.join(sorted(rec)) or 'none'})"
    conv = rec[key]
    if not isinstance(conv, list):
        return f"'{key}' must be a list of turns, got {type(conv).__name__}"
    if not conv:
        return "empty conversation"
    for k, turn in enumerate(conv):
        if not isinstance(turn, dict):
            return f"turn {k}: expected an object with from/value or role/content, got {type(turn).__name__}"
        role = turn.get("from", turn.get("role"))
        if not isinstance(role, str) or not role:
            return f"turn {k}: no 'from' or 'role'"
        content = turn.get("value", turn.get("content"))
        if content is not None and not isinstance(content, str):
            return f"turn {k}: content is a {type(content).__name__}, only text is supported"
        if content in (None, "") and not turn.get("tool_calls") and role in _ASSISTANT_ROLES:
            return f"turn {k}: assistant turn without content"
    roles = [t.get("from", t.get("role")) for t in conv]
    if not any(r not in _KNOWN_ROLES or r in _ASSISTANT_ROLES for r in roles[1:]):
        return "no assistant turn after the first message: nothing to supervise"
    return "conv", conv


# ---------------------------------------------------------------------------------------------------
# fingerprints and the existing DATA_DIR
# ---------------------------------------------------------------------------------------------------
def load_tokenizer(model: str | os.PathLike, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise InputError(
            f"{model}: cannot load a tokenizer ({type(e).__name__}: {e}). Point --model at the target "
            "model's directory (it needs tokenizer files and a chat template)."
        ) from e
    if not getattr(tok, "chat_template", None):
        raise InputError(
            f"{model}: the tokenizer has no chat template, so conversations cannot be rendered the way "
            "the target sees them. Use the target's own tokenizer (tokenizer_config.json "
            "'chat_template' or chat_template.jinja)."
        )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def role_of(turn: dict) -> str:
    """speculators' mapping (prepare renders with it): human/user, gpt/assistant, system, tool; others assistant."""
    r = turn.get("from", turn.get("role", ""))
    if r in ("human", "user"):
        return "user"
    if r in ("system", "tool"):
        return r
    return "assistant"


def content_of(turn: dict) -> str:
    return turn.get("value") or turn.get("content") or ""
