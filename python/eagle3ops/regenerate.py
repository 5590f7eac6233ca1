"""``regenerate``: every assistant turn of the training conversations rewritten by the target itself.

A draft learns the target's distribution, not the one of whoever wrote the dataset's answers (SpecForge#192),
so before ``prepare`` each conversation's assistant turns are replaced, turn by turn, by the target's own
answers: turn k's answer is generated from the conversation up to it, with the earlier assistant turns
already replaced by the target's answers. The user/system turns are kept (the system turns can be dropped).

Backends:

- ``transformers`` (the local default, CPU or one GPU): the model in this process, left-padded batches of up
  to ``concurrency`` conversations (a slot freed by a finished conversation takes the next one), greedy unless
  ``temperature > 0``;
- ``openai``: SGLang's (or any) OpenAI-compatible ``/v1/chat/completions``, ``concurrency`` conversations in
  flight on a thread pool, one keep-alive HTTP connection per thread and server; several servers (``urls``)
  share the conversations round-robin, a conversation stays on its server (its turns share a prefix there).
  408/429/5xx, connection errors and timeouts are retried with exponential backoff and jitter; other 4xx
  fail the conversation at once. A run whose last ``abort_after`` conversations all failed that way stops
  (the server is down) instead of failing the rest one by one.

Inputs: everything ``prepare`` reads (``prepare.resolve_sources`` / ``iter_records`` / ``check_record``):
ShareGPT (``conversations`` of from/value), OpenAI-style ``messages`` (role/content), JSON/JSONL files,
directories of them, local HF dataset directories. The output keeps each record's schema (keys, ShareGPT or
messages) with only the assistant turns' text changed, so ``prepare`` reads it unchanged.

Files (``OUT`` is what prepare reads)::

    OUT                       the regenerated conversations, JSONL, in input order (assembled atomically)
    OUT.failures              one JSON line per input row not in OUT: index, loc (file:line), kind, reason
    OUT.regenerate/meta       JSON: fingerprint (inputs, model, settings), what was assembled
    OUT.regenerate/done.log   append-only, one line per finished conversation: "<crc32 hex> <json>\\n"

(no ``.json``/``.jsonl`` suffix on the side files: a ``prepare`` pointed at OUT's directory reads only OUT).

Crash safety (kill -9 anywhere): a conversation counts as done only when its whole line, CRC included, is in
``done.log``; a torn last line is cut off before the next append, so a killed conversation is regenerated,
never doubled; a corrupt line inside it (not a kill's doing) is moved to ``done.log.unreadable`` and its
conversation redone. ``done.log`` is fsynced after every batch of appended lines. OUT and OUT.failures are
written (``eagle3ops.jsonl``: one record per line for every reader) to a temp file, fsynced, OUT read back,
and renamed (then the directory fsynced); the meta records what OUT holds last. An OUT from before the read-back
is read back on the next run and rewritten if a line is not one record. A
re-run with the same inputs and settings whose OUT is complete does nothing (``changed: false``) without
loading the model; changed inputs or settings are refused (naming what changed) unless ``force``, which
discards the conversations regenerated so far and starts over.

Accounting always adds up: ``num_written + num_failed + num_skipped == num_input`` (the rows read, up to the
``limit``-th usable one). ``skipped``: rows that cannot be regenerated (bad JSON, no assistant turn,
non-text content, tool calls, pre-tokenized rows); ``failed``: conversations whose generation did not give a
usable answer (errors after the retries, an empty answer); failed ones are retried on the next run. With
``on_error: fail`` (default) skipped rows refuse the run before any generation, and failed ones fail it
after the others are done (nothing done is lost; OUT is not assembled); ``skip`` leaves them out of OUT.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import re
import sys
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import jsonl
from eagle3ops.prepare import PrepareError, Problem, check_record, iter_records, resolve_sources
from eagle3ops.store import fsync_dir

REGENERATE_FORMAT = 1
WORK_SUFFIX = ".regenerate"
FAILURES_SUFFIX = ".failures"
META_NAME = "meta"
DONE_NAME = "done.log"
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
MAX_ERRORS_SHOWN = 10
_ASSISTANT = "assistant"


class RegenerateError(RuntimeError):
    """A problem the user must act on; the message says what and where. ``details`` go into the JSON result."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


@dataclass
class RegenerateConfig:
    model: str
    inputs: list[str]
    out: str
    backend: str = "transformers"  # transformers | openai
    urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:30000"])
    served_model: str | None = None  # the request's "model" field (openai); default: model
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0
    system: str = "keep"  # keep | drop
    think: str = "keep"  # keep | strip
    concurrency: int = 8
    retries: int = 3
    backoff: float = 1.0
    backoff_max: float = 30.0
    request_timeout: float = 600.0
    health_timeout: float = 60.0
    abort_after: int = 0  # consecutive retryable conversation failures that stop the run (0: 2*concurrency+8)
    limit: int | None = None
    on_error: str = "fail"  # fail | skip
    force: bool = False
    plan: bool = False
    device: str = "auto"  # transformers: auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # transformers: auto | float32 | bfloat16 | float16
    threads: int = (
        0  # transformers: torch intra-op threads (0: torch's default; 1 is fastest for tiny models)
    )
    trust_remote_code: bool = False
    progress: bool = False
    log: Callable[[str], None] | None = field(default=None, repr=False)
    sleep: Callable[[float], None] = field(
        default=time.sleep, repr=False
    )  # the retry backoff (tests record it)

    def settings(self) -> dict:
        """What the output depends on (the fingerprint); not the backend, servers, concurrency or retries."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "system": self.system,
            "think": self.think,
        }


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


def _role(turn: dict) -> str:
    """speculators' mapping (prepare renders with it): human/user, gpt/assistant, system, tool; others assistant."""
    r = turn.get("from", turn.get("role", ""))
    if r in ("human", "user"):
        return "user"
    if r in ("system", "tool"):
        return r
    return _ASSISTANT


def _content(turn: dict) -> str:
    return turn.get("value") or turn.get("content") or ""


def _usable(rec: object) -> tuple[str, int] | str:
    """(key, assistant turns) of a record that can be regenerated, else why not."""
    checked = check_record(rec)
    if isinstance(checked, str):
        return checked
    kind, conv = checked
    if kind == "rows":
        return "a pre-tokenized row (input_ids/loss_mask): there is no text to regenerate"
    for k, t in enumerate(conv):
        if t.get("tool_calls") or _role(t) == "tool":
            return f"turn {k}: tool calls and tool results are not regenerated"
    key = "conversations" if "conversations" in rec else "messages"
    n, seen_user = 0, False
    for t in conv:
        r = _role(t)
        seen_user |= r == "user"
        n += r == _ASSISTANT and seen_user
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
        role = _role(turn)
        if role == "system" and cfg.system == "drop":
            continue
        if role != _ASSISTANT:
            seen_user |= role == "user"
            out_turns.append(dict(turn))
            history.append({"role": role, "content": _content(turn)})
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
        history.append({"role": _ASSISTANT, "content": text})
    rec[item.key] = out_turns
    return rec, tokens, truncated, turns


# ---------------------------------------------------------------------------------------------------
# the work directory: meta + append-only done.log
# ---------------------------------------------------------------------------------------------------
def paths_for(out: str | os.PathLike) -> tuple[Path, Path, Path, Path, Path]:
    """(OUT, OUT.failures, work dir, meta, done.log)."""
    o = Path(out).absolute()
    work = o.with_name(o.name + WORK_SUFFIX)
    return o, o.with_name(o.name + FAILURES_SUFFIX), work, work / META_NAME, work / DONE_NAME


def _line(obj: dict) -> bytes:
    body = jsonl.dumps(obj, compact=True, default=str).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


@dataclass
class DoneLog:
    """What ``done.log`` holds: index -> the parsed line; ``good_end``: the byte length of its complete lines
    (the unreadable ones included); ``unreadable``: the line numbers of complete lines that do not check out
    (CRC, JSON), before the last one: their conversations are redone, the lines set aside (:func:`set_aside`)."""

    entries: dict[int, dict]
    good_end: int
    size: int
    torn: bool
    duplicates: int = 0
    unreadable: list[int] = field(default_factory=list)


def read_done(path: Path) -> DoneLog:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return DoneLog({}, 0, 0, False)
    entries: dict[int, dict] = {}
    pos = good = 0
    dup = 0
    unreadable: list[int] = []
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, 1):
        last = lineno == len(lines)  # no newline after it: the torn tail (or b"")
        ok = False
        if not last and len(raw) > 9 and raw[8:9] == b" ":
            try:
                crc = int(raw[:8], 16)
                if zlib.crc32(raw[9:]) == crc:
                    d = json.loads(raw[9:])
                    ok = (
                        isinstance(d, dict)
                        and isinstance(d.get("i"), int)
                        and isinstance(d.get("record"), dict)
                    )
            except ValueError:
                ok = False
        if not ok:
            if last or lineno == len(lines) - 1:  # the last line, complete or not: a torn append
                break
            # not a kill's doing (that only tears the last line): a disk or a hand; its conversation is redone
            unreadable.append(lineno)
        elif d["i"] in entries:
            dup += 1  # only a second run without the lock could write one; the first line wins
        else:
            entries[d["i"]] = d
        pos += len(raw) + 1
        good = pos
    return DoneLog(entries, good, len(data), good != len(data), dup, unreadable)


def set_aside(done_path: Path, done: DoneLog) -> Path:
    """Move ``done``'s unreadable lines from ``done_path`` to ``done_path.unreadable`` (appended: nothing is
    dropped) and cut a torn tail; ``done_path`` is rewritten atomically. Call under the run lock."""
    aside = done_path.with_name(done_path.name + ".unreadable")
    lines = done_path.read_bytes()[: done.good_end].split(b"\n")[:-1]
    bad = set(done.unreadable)
    with open(aside, "ab") as f:
        for n in sorted(bad):
            f.write(lines[n - 1] + b"\n")
        f.flush()
        os.fsync(f.fileno())
    _atomic_write(done_path, (ln + b"\n" for n, ln in enumerate(lines, 1) if n not in bad))
    return aside


def _read_meta(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _atomic_write(path: Path, chunks, check: Callable[[Path], None] | None = None) -> str:
    """Write the byte chunks to ``path`` atomically (temp, fsync, rename, directory fsync); returns sha256.
    ``check(temp)`` runs before the rename; what it raises leaves ``path`` as it was."""
    h = hashlib.sha256()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                h.update(c)
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return h.hexdigest()


def _clean_temps(*dirs_names: tuple[Path, str]) -> None:
    for d, name in dirs_names:
        if not d.is_dir():
            continue
        for p in d.glob(f".{name}.*.tmp"):
            pid = p.name[len(name) + 2 :].split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and Path(f"/proc/{pid}").exists():
                continue
            p.unlink(missing_ok=True)


def _sha256_file(path: Path) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def model_identity(model: str) -> dict:
    """The target: its path or served name, plus (a local directory) a hash of its small files (config,
    tokenizer, chat template) and the names and sizes of its weight files (not their bytes: terabytes)."""
    p = Path(model)
    ident: dict = {"model": model}
    if p.is_dir():
        h = hashlib.sha256()
        for f in sorted(p.iterdir()):
            if not f.is_file():
                continue
            size = f.stat().st_size
            h.update(f.name.encode() + b"\0" + str(size).encode() + b"\0")
            if size < 64 << 20 and not f.name.endswith((".safetensors", ".bin", ".pt", ".gguf")):
                h.update(f.read_bytes())
        ident["files"] = h.hexdigest()
    return ident


def _fingerprint(sources, ident: dict, settings: dict) -> str:
    doc = {
        "format": REGENERATE_FORMAT,
        "inputs": [s.sha256 for s in sources],
        "model": ident,
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _what_changed(meta: dict, sources, ident: dict, settings: dict) -> list[str]:
    out = []
    old_inputs = meta.get("inputs") or []
    new_inputs = [{"path": str(s.path), "sha256": s.sha256} for s in sources]
    if old_inputs != new_inputs:
        old = {d["path"]: d["sha256"] for d in old_inputs}
        names = [d["path"] for d in new_inputs if old.get(d["path"]) != d["sha256"]]
        names += [p for p in old if p not in {d["path"] for d in new_inputs}]
        out.append(f"inputs ({', '.join(names[:3]) or 'their order'})")
    if meta.get("model") != ident:
        was = (meta.get("model") or {}).get("model")
        out.append(f"model ({was} -> {ident['model']})" if was != ident["model"] else f"model files ({was})")
    for k, v in settings.items():
        if (meta.get("settings") or {}).get(k) != v:
            out.append(f"{k} {(meta.get('settings') or {}).get(k)!r} -> {v!r}")
    return out or ["format"]


# ---------------------------------------------------------------------------------------------------
# the run lock
# ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _run_lock(work: Path):
    """RUNLOCK: the one place this phase takes its run lock (one run per OUT). Uses integ-lock's
    ``eagle3ops.runlock.RunLock`` where it exists; until it lands, a plain flock on a file beside the work
    directory, which refuses a second concurrent run the same way (exit 2, names the lock)."""
    try:
        from eagle3ops.runlock import RunLock
    except ImportError:
        RunLock = None
    if RunLock is not None:
        with RunLock(work, what="regenerate") as lock:
            yield lock
        return
    import fcntl

    work.parent.mkdir(parents=True, exist_ok=True)
    path = work.with_name(f".{work.name}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RegenerateError(
                f"{work} is in use by another regenerate run (lock {path}); this run did nothing. Wait for it "
                "to finish, or stop it and re-run: finished conversations are kept."
            ) from None
        yield None
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------------
class _Progress:
    """A rich bar on stderr (conversations, tok/s) when enabled; else a log line every 30 s."""

    def __init__(self, total: int, enabled: bool, log: Callable[[str], None]):
        self.total, self.log = total, log
        self.done = self.tokens = 0
        self.t0 = self.last = time.monotonic()
        self._bar = self._task = None
        if enabled and total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("regenerate"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._bar.start()
            self._task = self._bar.add_task("regenerate", total=total, rate="")

    def rate(self) -> float:
        return self.tokens / max(1e-9, time.monotonic() - self.t0)

    def advance(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, rate=f"{self.rate():,.0f} tok/s")
        elif time.monotonic() - self.last > 30:
            self.last = time.monotonic()
            self.log(
                f"regenerate: {self.done}/{self.total} conversations, {self.tokens} tokens, {self.rate():,.0f} tok/s"
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# ---------------------------------------------------------------------------------------------------
# backends
# ---------------------------------------------------------------------------------------------------
class TransformersBackend:
    """The target in this process: left-padded batches, greedy (or sampled with temperature/top_p)."""

    def __init__(self, cfg: RegenerateConfig):
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        from eagle3ops.prepare import load_tokenizer

        self.cfg = cfg
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        try:
            self.tok = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
        except PrepareError as e:
            raise RegenerateError(str(e)) from e
        self.tok.padding_side = "left"
        device = cfg.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = cfg.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                cfg.model, dtype=getattr(torch, dtype), trust_remote_code=cfg.trust_remote_code
            ).to(device)
        except Exception as e:
            raise RegenerateError(
                f"{cfg.model}: cannot load the target with transformers ({type(e).__name__}: {e}). Point --model at "
                "a local model directory, or use --backend openai with a server that serves it."
            ) from e
        self.model.eval()
        self.device = device
        self.torch = torch
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tok.eos_token_id is not None and self.tok.eos_token_id not in eos:
            eos.append(self.tok.eos_token_id)
        self.eos = set(eos)
        self.pad = self.tok.pad_token_id
        self.max_pos = getattr(self.model.config, "max_position_embeddings", None)
        sample = cfg.temperature > 0
        kw = {"temperature": cfg.temperature, "top_p": cfg.top_p} if sample else {}
        self.gen_config = GenerationConfig(
            max_new_tokens=cfg.max_new_tokens,
            do_sample=sample,
            eos_token_id=eos,
            pad_token_id=self.pad,
            **kw,
        )
        if sample:
            torch.manual_seed(cfg.seed)

    def encode(self, messages: list[dict]) -> list[int]:
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tok.encode(text, add_special_tokens=False)

    def generate(self, prompts: list[list[int]]) -> list[Answer]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p) :] = 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=self.gen_config,
            )
        answers = []
        for row in out[:, width:].tolist():
            taken, finish = [], "length"
            for t in row:
                if t in self.eos:
                    finish = "stop"
                    break
                taken.append(t)
            n = len(taken) + (finish == "stop")
            answers.append(Answer(self.tok.decode(taken, skip_special_tokens=False), None, n, finish))
        return answers


class _HTTPError(Exception):
    def __init__(self, reason: str, retryable: bool):
        super().__init__(reason)
        self.retryable = retryable


class OpenAIBackend:
    """``/v1/chat/completions`` on one or more servers; one keep-alive connection per thread and server."""

    def __init__(self, cfg: RegenerateConfig):
        self.cfg = cfg
        self.urls = [u.rstrip("/") for u in cfg.urls]
        if not self.urls:
            raise RegenerateError("the openai backend needs at least one --url (e.g. http://127.0.0.1:30000)")
        for u in self.urls:
            parsed = urllib.parse.urlsplit(u)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise RegenerateError(f"--url {u!r} is not an http(s) URL like http://127.0.0.1:30000")
        self._local = threading.local()
        self.served = {}

    def _conn(self, url: str) -> http.client.HTTPConnection:
        conns = self._local.__dict__.setdefault("conns", {})
        c = conns.get(url)
        if c is None:
            p = urllib.parse.urlsplit(url)
            cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
            c = conns[url] = cls(p.hostname, p.port, timeout=self.cfg.request_timeout)
        return c

    def _drop(self, url: str) -> None:
        c = self._local.__dict__.get("conns", {}).pop(url, None)
        if c is not None:
            c.close()

    def request(self, url: str, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        base = urllib.parse.urlsplit(url).path.rstrip("/")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        c = self._conn(url)
        try:
            c.request(method, base + path, body=data, headers=headers)
            r = c.getresponse()
            payload = r.read()
        except Exception:
            self._drop(url)
            raise
        if r.will_close:
            self._drop(url)
        return r.status, payload

    def check_servers(self) -> None:
        """Every server answers GET /v1/models (waiting up to ``health_timeout`` for one still loading)."""
        for url in self.urls:
            t0 = time.monotonic()
            while True:
                try:
                    code, body = self.request(url, "GET", "/v1/models", None)
                    if code == 200:
                        try:
                            self.served[url] = [m.get("id") for m in json.loads(body).get("data", [])]
                        except (ValueError, AttributeError):
                            self.served[url] = []
                        break
                    last = f"HTTP {code} {body[:200]!r}"
                except (OSError, http.client.HTTPException) as e:
                    last = f"{type(e).__name__}: {e}"
                if time.monotonic() - t0 > self.cfg.health_timeout:
                    raise RegenerateError(
                        f"the server at {url} does not answer GET /v1/models within {self.cfg.health_timeout:.0f} s "
                        f"(last: {last}). Start it (the sglang phase's unit, or sglang.launch_server), fix --url, "
                        "or raise the wait (regenerate_health_timeout)."
                    )
                time.sleep(0.5)

    def answer(self, url: str, messages: list[dict], turn: int) -> Answer:
        cfg = self.cfg
        body = {
            "model": cfg.served_model or cfg.model,
            "messages": messages,
            "max_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "stream": False,
        }
        if cfg.temperature > 0:
            body["seed"] = cfg.seed
        last = ""
        for attempt in range(cfg.retries + 1):
            if attempt:
                cfg.sleep(
                    min(cfg.backoff_max, cfg.backoff * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                )
            try:
                code, payload = self.request(url, "POST", "/v1/chat/completions", body)
            except TimeoutError:
                last = f"no answer within {cfg.request_timeout:g} s (request timeout)"
                continue
            except (OSError, http.client.HTTPException) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if code == 200:
                try:
                    d = json.loads(payload)
                    choice = d["choices"][0]
                    msg = choice["message"]
                    text = msg.get("content") or ""
                    tokens = int((d.get("usage") or {}).get("completion_tokens") or 0)
                    finish = "length" if choice.get("finish_reason") == "length" else "stop"
                    return Answer(text, msg.get("reasoning_content"), tokens, finish)
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    raise _HTTPError(
                        f"turn {turn}: {url} answered 200 without a chat completion ({e})", False
                    ) from e
            last = f"HTTP {code}: {payload[:300].decode('utf-8', 'replace')}"
            if code not in RETRY_STATUS:
                raise _HTTPError(f"turn {turn}: {url} refused the request ({last})", False)
        raise _HTTPError(f"turn {turn}: {url} failed {cfg.retries + 1} attempts (last: {last})", True)


# ---------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------
@dataclass
class _Done:
    item: Item
    record: dict | None = None
    tokens: int = 0
    turns: int = 0
    truncated: int = 0
    error: str | None = None
    retryable: bool = False


def _run_transformers(cfg: RegenerateConfig, items: list[Item], emit: Callable[[_Done], None], stop) -> None:
    import torch

    threads = torch.get_num_threads()
    try:
        _transformers_loop(cfg, TransformersBackend(cfg), items, emit, stop)
    finally:
        torch.set_num_threads(threads)  # --threads is this run's, not the calling process's


def _transformers_loop(
    cfg: RegenerateConfig, be, items: list[Item], emit: Callable[[_Done], None], stop
) -> None:
    queue = iter(items)
    active: list[tuple[Item, object, list[int]]] = []  # (item, generator, the pending prompt's token ids)

    def start(item: Item, gen, value) -> None:
        try:
            k, msgs = next(gen) if value is None else gen.send(value)
        except StopIteration as fin:
            rec, tokens, truncated, turns = fin.value
            emit(_Done(item, rec, tokens, turns, truncated))
            return
        except TurnError as e:
            emit(_Done(item, error=str(e)))
            return
        try:
            ids = be.encode(msgs)
        except Exception as e:  # templates raise anything (jinja errors, raise_exception)
            gen.close()
            emit(_Done(item, error=f"turn {k}: the chat template failed: {type(e).__name__}: {e}"))
            return
        if be.max_pos and len(ids) + cfg.max_new_tokens > be.max_pos:
            gen.close()
            emit(
                _Done(
                    item,
                    error=f"turn {k}: the prompt has {len(ids)} tokens; with max_new_tokens {cfg.max_new_tokens} "
                    f"that is over the target's max_position_embeddings {be.max_pos}",
                )
            )
            return
        active.append((item, gen, ids))

    def refill() -> None:
        while len(active) < cfg.concurrency and not stop():
            item = next(queue, None)
            if item is None:
                return
            start(item, conversation_steps(item, cfg), None)

    refill()
    while active:
        batch = list(active)
        active.clear()
        answers = be.generate([ids for _, _, ids in batch])
        for (item, gen, _), ans in zip(batch, answers, strict=True):
            start(item, gen, ans)
        refill()


def _run_openai(cfg: RegenerateConfig, items: list[Item], emit: Callable[[_Done], None], stop) -> dict:
    be = OpenAIBackend(cfg)
    be.check_servers()

    def one(n: int, item: Item) -> _Done:
        url = be.urls[n % len(be.urls)]
        gen = conversation_steps(item, cfg)
        value = None
        try:
            while True:
                if stop():
                    gen.close()
                    return _Done(item, error="run stopped", retryable=True)
                k, msgs = next(gen) if value is None else gen.send(value)
                try:
                    value = be.answer(url, msgs, k)
                except _HTTPError as e:
                    gen.close()
                    return _Done(item, error=str(e), retryable=e.retryable)
        except StopIteration as fin:
            rec, tokens, truncated, turns = fin.value
            return _Done(item, rec, tokens, turns, truncated)
        except TurnError as e:
            return _Done(item, error=str(e))

    with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="regenerate") as pool:
        it = iter(enumerate(items))
        pending = set()
        while True:
            while len(pending) < cfg.concurrency and not stop():
                nxt = next(it, None)
                if nxt is None:
                    break
                pending.add(pool.submit(one, *nxt))
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                emit(f.result())
    return {"servers": be.served}


def regenerate(cfg: RegenerateConfig) -> dict:
    """Regenerate (or confirm) ``cfg.out``; see the module docstring. Raises RegenerateError."""
    t0 = time.monotonic()
    log = cfg.log or (lambda m: print(m, file=sys.stderr, flush=True))
    _validate(cfg)
    try:
        sources = resolve_sources(cfg.inputs)
    except PrepareError as e:
        raise RegenerateError(str(e)) from e
    out, failures_path, work, meta_path, done_path = paths_for(cfg.out)
    ident = model_identity(cfg.model)
    settings = cfg.settings()
    fingerprint = _fingerprint(sources, ident, settings)
    try:
        scan = scan_inputs(sources, cfg.limit)
    except PrepareError as e:
        raise RegenerateError(str(e)) from e
    skipped = [{"index": i, "loc": loc, "kind": "skipped", "reason": why} for i, loc, why in scan.skipped]

    meta = _read_meta(meta_path)
    discard = False
    if meta is not None and meta.get("fingerprint") != fingerprint:
        changed_what = _what_changed(meta, sources, ident, settings)
        if not cfg.force:
            raise RegenerateError(
                f"{out} was regenerated with other inputs or settings (changed: {'; '.join(changed_what)}); nothing "
                f"was changed. Re-run with --force to discard the conversations regenerated so far ({work}) and "
                "regenerate everything with the new ones, or choose another --out.",
                settings_changed=changed_what,
            )
        discard = True
    elif meta is None and done_path.exists() and done_path.stat().st_size:
        if not cfg.force:
            raise RegenerateError(
                f"{done_path} holds regenerated conversations but {meta_path} is missing or unreadable, so what "
                "they were made with is unknown. Re-run with --force to start over, or restore the meta file."
            )
        discard = True
    done = DoneLog({}, 0, 0, False) if discard or meta is None else read_done(done_path)
    selected = {it.index for it in scan.items}
    left = [it for it in scan.items if it.index not in done.entries]
    base = {
        "out": str(out),
        "failures_file": str(failures_path),
        "num_input": scan.n_input,
        "num_input_total": scan.n_total,
        "fingerprint": fingerprint,
        "backend": cfg.backend,
    }
    if skipped and cfg.on_error == "fail":
        raise _bad_rows(skipped, base)

    out_check = {"readable": None, "unreadable": 0, "first": ""}

    def assembled_ok(m) -> bool:
        a = (m or {}).get("assembled") or {}
        if a.get("indices") != _indices_sha(sorted(selected & set(done.entries))) or a.get("skipped") != len(
            skipped
        ):
            return False
        try:
            if out.stat().st_size != a.get("size"):
                return False
        except OSError:
            return False
        if _sha256_file(out) != a.get("sha256"):
            return False
        if a.get("writer") == jsonl.WRITER_VERSION and isinstance(a.get("readable"), int):
            out_check["readable"] = a["readable"]  # these very bytes were read back when they were written
            return a["readable"] == a.get("conversations")
        # written by an older eagle3ops (raw U+2028 and the like, which str.splitlines() breaks at): not
        # trusted blindly, read back; a file with unreadable lines is rewritten from done.log
        try:
            c = jsonl.check_file(out)
        except OSError:
            return False
        out_check.update(readable=c.records, unreadable=len(c.bad), first=c.first(out))
        return not c.bad and c.records == a.get("conversations")

    if cfg.plan:
        up_to_date = not discard and not left and not done.unreadable and assembled_ok(meta)
        return {
            **base,
            "changed": not up_to_date,
            "up_to_date": up_to_date,
            "plan": True,
            "selected": len(scan.items),
            "done": len(scan.items) - len(left),
            "left": len(left),
            "turns_left": sum(it.turns for it in left),
            "num_skipped": len(skipped),
            "discards": len(done.entries) if discard else 0,
            "unreadable_done_lines": 0 if discard else len(done.unreadable),
            "unreadable_out_lines": out_check["unreadable"],
            "failures": skipped,
        }
    if not left and not discard and not done.unreadable and assembled_ok(meta):
        return {
            **base,
            **_accounting(len(scan.items), 0, skipped, []),
            "num_readable": out_check["readable"],
            "unreadable_done_lines": 0,
            "unreadable_out_lines": 0,
            "warnings": [],
            "changed": False,
            "output_tokens": 0,
            "wall_seconds": round(time.monotonic() - t0, 3),
            "tok_per_s": 0.0,
        }

    with _run_lock(work):
        work.mkdir(parents=True, exist_ok=True)
        _clean_temps((work, META_NAME), (out.parent, out.name), (out.parent, failures_path.name))
        if discard:
            log(
                f"regenerate: --force: discarding {len(read_done(done_path).entries)} conversations in {done_path}"
            )
            done_path.unlink(missing_ok=True)
            done = DoneLog({}, 0, 0, False)
        if meta is None or discard:
            meta = {
                "format": REGENERATE_FORMAT,
                "fingerprint": fingerprint,
                "inputs": [{"path": str(s.path), "sha256": s.sha256} for s in sources],
                "model": ident,
                "settings": settings,
            }
            _atomic_write(meta_path, [(json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()])
        # re-read under the lock (another run may have added lines), set aside unreadable lines, cut a torn tail
        warnings: list[str] = []
        done = read_done(done_path)
        unreadable_done = len(done.unreadable)
        if done.unreadable:
            shown = ", ".join(map(str, done.unreadable[:MAX_ERRORS_SHOWN]))
            aside = set_aside(done_path, done)
            warnings.append(
                f"{done_path}: {unreadable_done} unreadable line(s) (line {shown}: CRC or JSON wrong, not a "
                f"kill's torn tail) moved to {aside}; their conversations are regenerated"
            )
            log(f"regenerate: {warnings[-1]}")
            done = read_done(done_path)
        if done.torn:
            with open(done_path, "r+b") as f:
                f.truncate(done.good_end)
                os.fsync(f.fileno())
            log(f"regenerate: {done_path}: cut a torn last line (a killed run's); its conversation is redone")
        left = [it for it in scan.items if it.index not in done.entries]
        resumed = len(scan.items) - len(left)
        if resumed:
            log(f"regenerate: {resumed} of {len(scan.items)} conversations already done, {len(left)} left")
        run = _execute(cfg, left, done_path, done, log)
        failed = [
            {"index": d.item.index, "loc": d.item.loc, "kind": "failed", "reason": d.error}
            for d in sorted(run["failed"], key=lambda d: d.item.index)
        ]
        written_idx = sorted(selected & set(done.entries))
        failures = sorted(skipped + failed, key=lambda f: f["index"])
        _atomic_write(failures_path, jsonl.lines(failures, default=str))
        acct = _accounting(len(written_idx), len(failed), skipped, failed)
        stats = {
            "changed": run["new"] > 0 or unreadable_done > 0,
            "generated": run["new"],
            "resumed": resumed,
            "turns_generated": run["turns"],
            "truncated_turns": run["truncated"],
            "output_tokens": run["tokens"],
            "wall_seconds": run["seconds"],
            "tok_per_s": round(run["tokens"] / run["seconds"], 1) if run["seconds"] > 0 else 0.0,
            **({"servers": run["servers"]} if run.get("servers") else {}),
        }
        if run["aborted"]:
            raise RegenerateError(
                run["aborted"], **base, **acct, **stats, left=len(left) - run["new"] - len(failed)
            )
        if failed and cfg.on_error == "fail":
            shown = "\n  ".join(f"{f['loc']}: {f['reason']}" for f in failed[:MAX_ERRORS_SHOWN])
            more = (
                f"\n  ... and {len(failed) - MAX_ERRORS_SHOWN} more" if len(failed) > MAX_ERRORS_SHOWN else ""
            )
            raise RegenerateError(
                f"{len(failed)} conversation(s) could not be regenerated ({len(written_idx)} done are kept in "
                f"{done_path}; {out} was not written; the list is in {failures_path}). Re-run to retry them, or "
                f"pass --on-error skip to write {out} without them:\n  {shown}{more}",
                **base,
                **acct,
                **stats,
            )
        out_check.update(readable=None, unreadable=0, first="")
        if stats["changed"] or not assembled_ok(meta):
            if out_check["unreadable"]:
                warnings.append(
                    f"{out}: {out_check['unreadable']} unreadable line(s) (written by an older eagle3ops or "
                    f"damaged; {out_check['first']}); rewritten from {done_path}"
                )
                log(f"regenerate: {warnings[-1]}")
            by_index = {i: done.entries[i]["record"] for i in written_idx}
            readable = [0]

            def read_back(tmp: Path) -> None:  # every record written must read back as exactly one record
                c = jsonl.check_file(tmp)
                if c.bad or c.records != len(written_idx):
                    raise RegenerateError(
                        f"{out}: the file written does not read back as {len(written_idx)} records "
                        f"({c.records} do; {c.first(out)}), so it was not put in place. The conversations are "
                        f"kept in {done_path}. This is a bug in eagle3ops: report it with that line."
                    )
                readable[0] = c.records

            sha = _atomic_write(out, (jsonl.line(by_index[i], default=str) for i in written_idx), read_back)
            meta["assembled"] = {
                "sha256": sha,
                "size": out.stat().st_size,
                "indices": _indices_sha(written_idx),
                "skipped": len(skipped),
                "conversations": len(written_idx),
                "readable": readable[0],
                "writer": jsonl.WRITER_VERSION,
            }
            _atomic_write(meta_path, [(json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()])
            stats["changed"] = True
            out_check["readable"] = readable[0]
        log(
            f"regenerate: {out}: {acct['num_written']} written ({out_check['readable']} read back), "
            f"{acct['num_failed']} failed, {acct['num_skipped']} skipped of {scan.n_input}; {run['tokens']} tokens "
            f"in {run['seconds']} s ({stats['tok_per_s']} tok/s)"
        )
        return {
            **base,
            **acct,
            **stats,
            "num_readable": out_check["readable"],
            "unreadable_done_lines": unreadable_done,
            "unreadable_out_lines": out_check["unreadable"],
            "warnings": warnings,
        }


def _execute(cfg: RegenerateConfig, left: list[Item], done_path: Path, done: DoneLog, log) -> dict:
    """Generate ``left``, appending each finished conversation to done.log (fsynced per batch of lines)."""
    res = {"new": 0, "tokens": 0, "turns": 0, "truncated": 0, "failed": [], "aborted": None, "seconds": 0.0}
    if not left:
        return res
    abort_after = cfg.abort_after or 2 * cfg.concurrency + 8
    streak = [0]
    progress = _Progress(len(left), cfg.progress, log)
    lock = threading.Lock()
    f = open(done_path, "ab")  # noqa: SIM115 - closed in the finally below
    pending_sync = [0]

    def emit(d: _Done) -> None:
        with lock:
            if d.error is not None:
                if d.error == "run stopped":
                    return
                res["failed"].append(d)
                streak[0] = streak[0] + 1 if d.retryable else 0
                if streak[0] >= abort_after and res["aborted"] is None:
                    res["aborted"] = (
                        f"the last {streak[0]} conversations all failed (last: {d.item.loc}: {d.error}): the server "
                        "seems down, so the run stopped instead of failing the rest one by one. Finished "
                        f"conversations are kept in {done_path}; fix the server and re-run to resume."
                    )
                progress.advance(0)
                return
            streak[0] = 0
            line = {
                "i": d.item.index,
                "loc": d.item.loc,
                "tokens": d.tokens,
                "turns": d.turns,
                "truncated": d.truncated,
                "record": d.record,
            }
            try:
                f.write(_line(line))
                f.flush()
            except OSError as e:
                raise RegenerateError(
                    f"{done_path}: cannot append a finished conversation ({e.strerror or e}). Free space (or fix the "
                    "file system) and re-run: the conversations already in it are kept, a torn last line is cut off."
                ) from e
            pending_sync[0] += 1
            done.entries[d.item.index] = line
            res["new"] += 1
            res["tokens"] += d.tokens
            res["turns"] += d.turns
            res["truncated"] += d.truncated
            progress.advance(d.tokens)

    stop = lambda: res["aborted"] is not None  # noqa: E731
    t0 = time.monotonic()
    syncer_stop = threading.Event()

    def syncer() -> None:  # group commit: one fsync for every line appended since the last one
        while not syncer_stop.wait(0.2):
            with lock:
                n = pending_sync[0]
                pending_sync[0] = 0
            if n:
                try:
                    os.fsync(f.fileno())
                except OSError:
                    return  # the final fsync after the run reports it

    th = threading.Thread(target=syncer, name="regenerate-fsync", daemon=True)
    th.start()
    ok = False
    try:
        if cfg.backend == "transformers":
            _run_transformers(cfg, left, emit, stop)
        else:
            res.update(_run_openai(cfg, left, emit, stop))
        ok = True
    finally:
        syncer_stop.set()
        th.join()
        progress.close()
        try:
            f.flush()
            os.fsync(f.fileno())
        except OSError as e:
            if ok:  # else the error in flight (a failed append, an interrupt) is the one to report
                raise RegenerateError(
                    f"{done_path}: cannot flush the finished conversations ({e}); re-run"
                ) from e
        finally:
            with contextlib.suppress(OSError):
                f.close()
    res["seconds"] = round(time.monotonic() - t0, 3)
    return res


def _validate(cfg: RegenerateConfig) -> None:
    checks = [
        (
            cfg.backend in ("transformers", "openai"),
            f"backend must be transformers or openai, not {cfg.backend!r}",
        ),
        (cfg.system in ("keep", "drop"), f"system must be keep or drop, not {cfg.system!r}"),
        (cfg.think in ("keep", "strip"), f"think must be keep or strip, not {cfg.think!r}"),
        (cfg.on_error in ("fail", "skip"), f"on_error must be fail or skip, not {cfg.on_error!r}"),
        (cfg.max_new_tokens >= 1, f"max_new_tokens {cfg.max_new_tokens} must be at least 1"),
        (cfg.concurrency >= 1, f"concurrency {cfg.concurrency} must be at least 1"),
        (cfg.retries >= 0, f"retries {cfg.retries} must be 0 or more"),
        (cfg.temperature >= 0, f"temperature {cfg.temperature} must be 0 (greedy) or more"),
        (0 < cfg.top_p <= 1, f"top_p {cfg.top_p} must be in (0, 1]"),
        (cfg.limit is None or cfg.limit >= 1, f"limit {cfg.limit} must be at least 1"),
        (cfg.request_timeout > 0, f"request_timeout {cfg.request_timeout} must be positive"),
        (cfg.threads >= 0, f"threads {cfg.threads} must be 0 (torch's default) or more"),
    ]
    for ok, msg in checks:
        if not ok:
            raise RegenerateError(msg)
    out = Path(cfg.out)
    if out.is_dir():
        raise RegenerateError(
            f"--out {out} is a directory: give the JSONL file to write (e.g. {out}/regenerated.jsonl)"
        )
    for s in cfg.inputs:
        if Path(s).absolute() == out.absolute():
            raise RegenerateError(
                f"--out {out} is also an --input: write the regenerated conversations elsewhere"
            )


def _indices_sha(indices: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, indices)).encode()).hexdigest()


def _accounting(written: int, failed: int, skipped: list[dict], failed_list: list[dict]) -> dict:
    failures = sorted(skipped + failed_list, key=lambda f: f["index"])
    return {"num_written": written, "num_failed": failed, "num_skipped": len(skipped), "failures": failures}


def _bad_rows(skipped: list[dict], base: dict) -> RegenerateError:
    shown = "\n  ".join(f"{f['loc']}: {f['reason']}" for f in skipped[:MAX_ERRORS_SHOWN])
    more = f"\n  ... and {len(skipped) - MAX_ERRORS_SHOWN} more" if len(skipped) > MAX_ERRORS_SHOWN else ""
    return RegenerateError(
        f"{len(skipped)} input row(s) cannot be regenerated; nothing was generated. Fix them, or pass "
        f"--on-error skip to leave them out:\n  {shown}{more}",
        **base,
        num_written=0,
        num_failed=0,
        num_skipped=len(skipped),
        failures=skipped,
    )


def iter_output(out: str | os.PathLike) -> Iterator[dict]:
    """The records of a regenerated OUT (for tests and tools)."""
    yield from jsonl.read(out)
