"""Named benchmark prompt sets (held-out rows, MT-bench) and the contamination check against the training data.

Formats read:

- MT-bench's ``question.jsonl`` (FastChat ``llm_judge``): ``{"question_id", "category", "turns": [t1, t2]}``.
  ``turns="first"`` uses t1 alone; ``turns="both"`` makes a two-turn conversation whose second user turn follows
  the server's *own* first answer (the load generator sends t1, then t1 + answer + t2).
- Held-out rows as the offline measurement reads them (:func:`eagle3ops.acceptance.load_prompts`): ``prompt``,
  ``conversations`` (ShareGPT ``from``/``value``) or ``messages`` (``role``/``content``): the user turns before the
  first answer, joined. Rows given only as ``input_ids`` cannot be sent as text and are refused.

Training data for the contamination check: JSONL files (or directories of ``*.jsonl``; a ``.json`` file holding
one array, as ShareGPT ships) in ShareGPT
(``conversations``), OpenAI (``messages``) or ``prompt`` form, and saved HF dataset directories with such a
column; every user/human turn counts.
"""

from __future__ import annotations

import json
import os
import random
import re
import unicodedata
from pathlib import Path

from eagle3ops import jsonl

# MT-bench's eight categories (FastChat llm_judge question.jsonl, ten questions each)
MTBENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
MIN_CONTAINED_CHARS = 40  # a benchmark turn this long (normalised) found inside a training turn counts too


class PromptSetError(Exception):
    pass


def parse_set_arg(arg: str) -> tuple[str, str]:
    name, sep, path = arg.partition("=")
    if not sep or not name or not path:
        raise PromptSetError(
            f"--set {arg!r}: expected NAME=PATH (e.g. mtbench=/data/mt_bench/question.jsonl)"
        )
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise PromptSetError(f"--set {arg!r}: the name may hold letters, digits, '_', '-', '.' only")
    return name, path


def load_set(
    path: str | os.PathLike, *, turns: str = "first", limit: int | None = None, skip_ids: bool = False
) -> dict:
    """``{"format": "mtbench"|"heldout", "items": [{"id", "turns": [user texts], "category"}], "skipped": n}``.
    ``skip_ids``: rows given only as ``input_ids`` are counted in ``skipped`` instead of refused (the
    contamination check has no text to compare for them)."""
    p = Path(path)
    if not p.is_file():
        raise PromptSetError(f"{p}: no such prompt set file")
    if turns not in ("first", "both"):
        raise PromptSetError(f"turns {turns!r}: expected 'first' or 'both'")
    items, fmt, skipped = [], None, 0
    for n, row in jsonl.numbered(p, PromptSetError):
        if not isinstance(row, dict):
            raise PromptSetError(f"{p}:{n}: expected a JSON object")
        if "turns" in row:
            fmt = fmt or "mtbench"
            t = row["turns"]
            if not isinstance(t, list) or not t or not all(isinstance(x, str) and x.strip() for x in t):
                raise PromptSetError(
                    f"{p}:{n}: 'turns' must be a non-empty list of strings (MT-bench format)"
                )
            items.append(
                {
                    "id": row.get("question_id", f"row-{n}"),
                    "category": row.get("category"),
                    "turns": list(t) if turns == "both" else [t[0]],
                    "line": n,
                }
            )
        else:
            fmt = fmt or "heldout"
            text = _first_prompt(row)
            if text is None and row.get("input_ids") and skip_ids:
                skipped += 1
                continue
            if text is None:
                if row.get("input_ids"):
                    raise PromptSetError(
                        f"{p}:{n}: only input_ids; a live server needs text (give 'prompt', 'conversations' or "
                        "'messages')"
                    )
                raise PromptSetError(
                    f"{p}:{n}: no 'turns', 'prompt', 'conversations' or 'messages' with a user turn"
                )
            items.append({"id": row.get("id", f"row-{n}"), "category": None, "turns": [text], "line": n})
        if limit and len(items) >= limit:
            break
    if not items and not skipped:
        raise PromptSetError(f"{p}: no prompts")
    return {"format": fmt or "heldout", "items": items, "skipped": skipped}


def stratified(items: list[dict], per_category: int, seed: int = 0) -> dict:
    """``per_category`` items from each category (the ``category`` of MT-bench rows), chosen at random with
    ``seed`` and kept in the file's order: the same items for the same file, count and seed. A category with fewer
    items gives all it has (``short``); MT-bench categories absent from the file are named (``missing``). Items
    without a category are not sampled (a held-out set has none: use it as it is)."""
    if per_category < 1:
        raise PromptSetError(f"per_category {per_category}: must be >= 1")
    groups: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        if it.get("category"):
            groups.setdefault(str(it["category"]), []).append(i)
    if not groups:
        raise PromptSetError("no item has a category: a stratified sample needs MT-bench rows ('category')")
    chosen: list[int] = []
    counts, short = {}, {}
    for cat in sorted(groups):
        idx = groups[cat]
        rng = random.Random(f"{seed}:{cat}")  # one stream per category: adding a category moves no other
        pick = sorted(rng.sample(idx, min(per_category, len(idx))))
        chosen += pick
        counts[cat] = len(pick)
        if len(idx) < per_category:
            short[cat] = len(idx)
    return {
        "items": [items[i] for i in sorted(chosen)],
        "per_category": per_category,
        "seed": seed,
        "counts": counts,
        "short": short,
        "missing": [c for c in MTBENCH_CATEGORIES if c not in groups],
    }


def _turns(row: dict) -> list[tuple[str, str]]:
    """(role, text) of a row in ShareGPT / OpenAI form; roles normalised to user / assistant / system."""
    out = []
    for t in row.get("conversations") or row.get("messages") or []:
        if not isinstance(t, dict):
            continue
        role = t.get("from", t.get("role"))
        role = {"human": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant"}.get(
            role, role
        )
        text = t.get("value", t.get("content"))
        if isinstance(text, str):
            out.append((role, text))
    return out


def _first_prompt(row: dict) -> str | None:
    users = []
    for role, text in _turns(row):
        if role == "assistant":
            break
        if role == "user":
            users.append(text)
    if users:
        return "\n".join(users)
    return row["prompt"] if isinstance(row.get("prompt"), str) and row["prompt"].strip() else None


def normalise(text: str) -> str:
    """Case, accents, punctuation and whitespace removed: what a copy-paste into a chat keeps of a prompt."""
    t = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.findall(r"[^\W_]+", t))


def _training_rows(path: Path):
    """(where, row) of every training conversation under ``path``."""
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        try:
            import datasets
        except ImportError:
            raise PromptSetError(f"{path}: a saved HF dataset, but the datasets package is missing") from None
        ds = datasets.load_from_disk(str(path))
        parts = ds.items() if isinstance(ds, datasets.DatasetDict) else [("", ds)]
        for split, d in parts:
            cols = [c for c in ("conversations", "messages", "prompt") if c in d.column_names]
            if not cols:
                continue
            for i, r in enumerate(d.select_columns(cols)):
                yield f"{path}{'[' + split + ']' if split else ''} row {i}", r
        return
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise PromptSetError(f"{path}: no *.jsonl training files here")
    for f in files:
        if f.suffix == ".json":  # ShareGPT's own files: one JSON array of conversations
            try:
                data = json.loads(f.read_text(encoding="utf-8", errors="replace"))
            except (OSError, ValueError) as e:
                raise PromptSetError(f"{f}: cannot read the training data as a JSON array ({e})") from None
            for i, row in enumerate(data if isinstance(data, list) else []):
                if isinstance(row, dict):
                    yield f"{f}[{i}]", row
            continue
        try:
            # streamed: ShareGPT is hundreds of MB
            for n, line in jsonl.file_lines(f, errors="replace"):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # the prepare phase reports bad rows; here only readable text matters
                if isinstance(row, dict):
                    yield f"{f}:{n}", row
        except OSError as e:
            raise PromptSetError(f"{f}: cannot read the training data ({e.strerror})") from None


def contamination(sets: dict[str, dict], training: list[str | os.PathLike]) -> dict:
    """Which benchmark turns appear in the training data's user turns (normalised: equal, or a benchmark turn of
    at least ``MIN_CONTAINED_CHARS`` characters contained in a training turn). ``sets``: name -> :func:`load_set`."""
    probes: dict[str, list[tuple[str, object, int]]] = {}
    for name, s in sets.items():
        for it in s["items"]:
            for j, t in enumerate(it["turns"]):
                probes.setdefault(normalise(t), []).append((name, it["id"], j + 1))
    long_probes = [k for k in probes if len(k) >= MIN_CONTAINED_CHARS]
    hits: dict[str, list[dict]] = {name: [] for name in sets}
    seen: set = set()
    turns_checked = 0
    missing = []
    for src in training:
        p = Path(src)
        if not p.exists():
            missing.append(str(p))  # e.g. deleted after training: reported, cannot be checked
            continue
        for where, row in _training_rows(p):
            texts = [t for role, t in _turns(row) if role == "user"]
            if isinstance(row.get("prompt"), str):
                texts.append(row["prompt"])
            for text in texts:
                turns_checked += 1
                nt = normalise(text)
                found = [(nt, "exact")] if nt in probes else []
                found += [(k, "contained") for k in long_probes if k != nt and k in nt]
                for k, how in found:
                    for name, qid, turn in probes[k]:
                        if (name, qid, turn) in seen:
                            continue
                        seen.add((name, qid, turn))
                        hits[name].append({"id": qid, "turn": turn, "match": how, "where": where})
    return {
        "training": [str(t) for t in training],
        "training_user_turns": turns_checked,
        "training_missing": missing,
        "contaminated": {k: v for k, v in hits.items() if v},
        "clean": not any(hits.values()),
    }
