"""Rendering conversations into training rows with speculators' own code (pinned to 0.9.0): its boundary rows
per assistant turn through a local stand-in of its ``/render`` call (the target's chat template and tokenizer),
and the read-check-render loop over every source."""

from __future__ import annotations

import contextlib
import os
import time
from unittest import mock

from eagle3ops.conversations import Problem, check_record, iter_records, role_of
from eagle3ops.prepare.errors import PrepareError
from eagle3ops.speculators_pin import PINNED, installed_version

SPECULATORS_VERSION = PINNED  # the release whose preprocessing this calls


# ---------------------------------------------------------------------------------------------------
# speculators
# ---------------------------------------------------------------------------------------------------
def speculators_preprocessing():
    """speculators' preprocessing module, after checking that it is the pinned version."""
    version = installed_version()
    if version is None:
        raise PrepareError(
            f"speculators is not installed; prepare uses its {SPECULATORS_VERSION} data preparation. "
            "Install it: pip install --no-deps -r requirements/speculators.txt"
        )
    if version != SPECULATORS_VERSION:
        raise PrepareError(
            f"speculators {version} is installed but eagle3ops prepare is pinned to speculators "
            f"{SPECULATORS_VERSION} (it calls _render_boundary_rows, _normalize_conversation and "
            "build_speculator_training_dataset of that release). Install speculators=="
            f"{SPECULATORS_VERSION} (requirements/speculators.txt), or update eagle3ops/prepare/render.py and its "
            "tests to the new release's preprocessing before changing the pin."
        )
    from speculators.data_generation import preprocessing

    return preprocessing


def _local_encode_render(tokenizer):
    """A stand-in for speculators' ``_encode_render`` that renders with the local tokenizer.

    vLLM's ``/render`` applies the chat template, tokenizes without adding special tokens and truncates
    on the right to ``truncate_prompt_tokens``; this does the same.
    """

    def encode_render(conv_prefix, render_endpoint, *, add_generation_prompt, max_length, tools=None):
        text = tokenizer.apply_chat_template(
            conv_prefix, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return tokenizer.encode(text, add_special_tokens=False)[:max_length]

    return encode_render


@contextlib.contextmanager
def local_render(pp, tokenizer):
    """Point speculators' renderer at the local tokenizer for the duration of the block."""
    with mock.patch.object(pp, "_encode_render", _local_encode_render(tokenizer)):
        yield


def render_rows(pp, conv: list[dict], tools: object, max_length: int) -> list[dict]:
    """speculators' boundary rows of one conversation (call inside ``local_render``)."""
    normalized = pp._normalize_conversation(conv)
    parsed_tools = pp._parse_conv_tools(tools, 0)
    return pp._render_boundary_rows(normalized, "local", max_length, tools=parsed_tools)


ROWS_CHOICES = ("turn", "conversation")
# what the result's ``dropped`` counts
DROPPED = ("turns_context_over_max_length", "rows_unsupervised_after_truncation")


def merge_turn_rows(rows: list[dict]) -> dict | None:
    """One row for a whole conversation: the longest turn row, with every turn's supervised tokens supervised.

    Valid only where each turn's row is a prefix of the longest one (the template renders history as it
    rendered the turn itself: ChatML, Llama, most templates). None where a template rewrites history (drops
    earlier reasoning, say): that conversation keeps one row per turn.
    """
    base = max(rows, key=lambda r: len(r["input_ids"]))
    ids, mask = base["input_ids"], list(base["loss_mask"])
    for r in rows:
        if r is base:
            continue
        if list(ids[: len(r["input_ids"])]) != list(r["input_ids"]):
            return None
        for j, m in enumerate(r["loss_mask"]):
            if m:
                mask[j] = 1
    return {"input_ids": ids, "loss_mask": mask}


def _one_record(pp, loc, rec, max_length: int, merge: bool):
    """What one input record gives: ("problem", Problem) or ("rows", kept rows, dropped counts, merged?)."""
    from speculators.data_generation.preprocessing import BoundaryUnstableError

    dropped = dict.fromkeys(DROPPED, 0)
    if isinstance(rec, Problem):
        return ("problem", rec)
    checked = check_record(rec)
    if isinstance(checked, str):
        return ("problem", Problem(loc, checked))
    kind, payload = checked
    merged = None
    if kind == "rows":  # already tokenised: one row, as given
        ids, mask = payload
        rows = [{"input_ids": ids, "loss_mask": mask}]
    else:
        n_asst = sum(
            1 for j, t in enumerate(payload) if j > 0 and role_of(t) not in ("user", "system", "tool")
        )
        try:
            rows = render_rows(pp, payload, rec.get("tools"), max_length)
        except BoundaryUnstableError as e:
            return ("problem", Problem(loc, f"the chat template is not prefix-stable here: {e}"))
        except Exception as e:  # templates raise anything (jinja errors, raise_exception)
            return ("problem", Problem(loc, f"the chat template failed: {type(e).__name__}: {e}"))
        dropped["turns_context_over_max_length"] += n_asst - len(rows)
    if merge and len(rows) > 1:
        one = merge_turn_rows(rows)
        merged = one is not None
        if merged:
            rows = [one]
    kept = []
    for r in rows:
        if sum(r["loss_mask"][:max_length]) == 0:
            dropped["rows_unsupervised_after_truncation"] += 1
            continue
        kept.append(_compact(r["input_ids"][:max_length], r["loss_mask"][:max_length]))
    return ("rows", kept, dropped, merged)


# what a forked worker renders with: set in the parent right before the pool forks (inherited, not pickled)
_WORKER: dict = {}


def _worker_init() -> None:
    """A rendering process starts with the default signal dispositions and nothing blocked.

    A forked child inherits its parent's Python signal handlers and signal mask. A handler that only records the
    signal (a trainer's graceful stop, a test harness) would make the pool's SIGTERM a no-op, and the parent's
    join would then wait for ever (seen in CI: a test worker whose earlier test left such a handler). The parent
    alone handles Ctrl-C and ends the pool.
    """
    import signal

    # the dispositions first, the mask after: a SIGTERM sent (pool.terminate) before this ran waits blocked (the
    # parent blocks it around the fork, :func:`_results`) and, unblocked here, meets the default action; unblocked
    # first, it went to the inherited handler, which only recorded it, and the pool's join waited for ever (seen
    # under load: a consumer that failed at once terminated workers that had not reached this line yet)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _render_chunk(chunk):
    w = _WORKER
    return [_one_record(w["pp"], loc, rec, w["max_length"], w["merge"]) for loc, rec in chunk]


def _chunks(records, size: int):
    chunk = []
    for item in records:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _records(sources, log):
    for source in sources:
        log(f"prepare: reading {source.path}")
        yield from iter_records(source)


def collect(
    pp, tokenizer, sources, max_length, log, progress, *, rows: str = "turn", workers: int = 1, sample=None
):
    """Read, check and render every record. Returns (groups, problems, dropped, n_records, merge_counts).

    rows: "turn" (speculators' rows: one per assistant turn, the history repeated in each) or "conversation"
    (one row per conversation with every assistant turn supervised, where the template allows it:
    :func:`merge_turn_rows`). workers > 1 renders in that many forked processes; the result is the same, in
    the same order, as with one (both checked by :func:`eagle3ops.prepare.dataset.prepare`). ``sample``: a list
    that gets ``(loc, record, rows)`` of the first conversations that gave rows (at most ``sample_size``
    of them; eagle3ops.prepare.tokcheck checks them).
    """
    groups: list[list[tuple[list[int], list[int]]]] = []
    problems: list[Problem] = []
    dropped = dict.fromkeys(DROPPED, 0)
    merge_counts = {"conversations_merged": 0, "conversations_kept_per_turn": 0}
    n_records = 0
    merge = rows == "conversation"
    seen: list = []  # the first records read, in input order (the results come in that order)
    records = _remember(_records(sources, log), seen, SAMPLE_SIZE if sample is not None else 0)
    with (
        local_render(pp, tokenizer),
        _progress(progress) as advance,
        _results(pp, records, max_length, merge, workers) as results,
    ):
        for out in results:
            n_records += 1
            advance()
            if out[0] == "problem":
                problems.append(out[1])
                continue
            _, kept, d, merged = out
            for k, v in d.items():
                dropped[k] += v
            if merged is not None:
                merge_counts["conversations_merged" if merged else "conversations_kept_per_turn"] += 1
            if kept:
                groups.append(kept)
                loc, rec = seen[n_records - 1] if n_records <= len(seen) else (None, None)
                if (
                    sample is not None
                    and len(sample) < SAMPLE_SIZE
                    and isinstance(rec, dict)
                    and "input_ids" not in rec
                ):
                    sample.append((loc, rec, kept))
    return groups, problems, dropped, n_records, merge_counts


# conversations collect() hands its caller for the tokenizer check (eagle3ops.prepare.tokcheck)
SAMPLE_SIZE = 8


def _remember(records, seen: list, n: int):
    """``records`` as they are, the first ``n`` of them also appended to ``seen``."""
    for item in records:
        if len(seen) < n:
            seen.append(item)
        yield item


@contextlib.contextmanager
def _results(pp, records, max_length: int, merge: bool, workers: int):
    """Every record's :func:`_one_record`, in input order: here, or in ``workers`` forked processes."""
    if workers == 1:
        yield (_one_record(pp, loc, rec, max_length, merge) for loc, rec in records)
        return
    import multiprocessing
    import os

    # the parent's tokenizer (inside local_render) goes to the children by fork; they must not start the
    # Rust tokenizer's own thread pool on top of the processes (nor warn that it was forked)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import signal

    _WORKER.update(pp=pp, max_length=max_length, merge=merge)
    # the workers are forked with SIGTERM/SIGHUP blocked, so none can reach a handler inherited from this process
    # before _worker_init has put the default one in place
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
    try:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_worker_init)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    procs = list(getattr(pool, "_pool", ()))  # the worker processes (multiprocessing keeps them there)
    done = False
    try:
        results = pool.imap(_render_chunk, _chunks(records, 64))
        yield (out for chunk in results for out in chunk)
        done = True
    finally:
        # all read: the workers end on the pool's sentinel; otherwise (an error, Ctrl-C) pool.terminate ends them
        # with SIGTERM, which _worker_init left at its default. Either way a worker still there after
        # STRAGGLER_GRACE_S is killed (it holds nothing to clean up): one stuck before it took any work (a forked
        # child can be, on a lock another thread held at the fork; SIGTERM then stays blocked in it) made the
        # join wait for ever. Not killed before terminate: a worker waiting for work holds the task queue's read
        # lock, which terminate takes first.
        if done:
            pool.close()
            _end_stragglers(procs, STRAGGLER_GRACE_S)
        else:
            import threading

            watchdog = threading.Timer(STRAGGLER_GRACE_S, _end_stragglers, (procs, 0.0))
            watchdog.daemon = True
            watchdog.start()
            try:
                pool.terminate()
            finally:
                watchdog.cancel()
        pool.join()
        _WORKER.clear()


# how long a rendering worker may take to leave after the pool's sentinel before it is killed
STRAGGLER_GRACE_S = 10.0


def _end_stragglers(procs, grace_s: float) -> None:
    """SIGKILL each of ``procs`` still running ``grace_s`` seconds from now (0: at once)."""
    import signal

    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)


def _compact(ids: list[int], mask: list[int]):
    """A row as numpy arrays (12 bytes a token instead of ~44 as Python ints; the seed had 88M tokens).

    The dtypes are the ones the saved dataset has anyway (``datasets`` stores ``input_ids`` as int32,
    speculators writes ``loss_mask`` as int64), so the Arrow output is the same as from Python lists.
    """
    import numpy as np

    wide = max(ids, default=0) >= 2**31
    return np.asarray(ids, dtype=np.int64 if wide else np.int32), np.asarray(mask, dtype=np.int64)


@contextlib.contextmanager
def _progress(enabled: bool):
    if not enabled:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("prepare: rendering"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task("render", total=None, rate="")
        t0 = time.monotonic()
        n = [0]

        def advance():
            n[0] += 1
            if n[0] % 50 == 0:
                rate = n[0] / max(1e-9, time.monotonic() - t0)
                bar.update(task, completed=n[0], rate=f"{rate:.0f} rows/s")

        yield advance
        bar.update(task, completed=n[0])
