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

Inputs: everything ``prepare`` reads (:mod:`eagle3ops.conversations`: ``resolve_sources``, ``iter_records``, ``check_record``):
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
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from eagle3ops import jsonl
from eagle3ops.conversations import (
    InputError,
    Source,
    resolve_sources,
)
from eagle3ops.durable import sha256_file
from eagle3ops.regenerate.backends import Done, run_openai, run_transformers
from eagle3ops.regenerate.config import (
    MAX_ERRORS_SHOWN,
    META_NAME,
    REGENERATE_FORMAT,
    RegenerateConfig,
    RegenerateError,
    validate,
)
from eagle3ops.regenerate.turns import Item, Scan, scan_inputs
from eagle3ops.regenerate.workdir import (
    DoneLog,
    atomic_write,
    clean_temps,
    done_line,
    fingerprint_of,
    indices_sha,
    model_identity,
    paths_for,
    read_done,
    read_meta,
    set_aside,
    what_changed,
)
from eagle3ops.runlock import RunLock


# ---------------------------------------------------------------------------------------------------
# the run lock
# ---------------------------------------------------------------------------------------------------
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


@dataclass
class _Start:
    """What :func:`regenerate` knows before it takes the lock: the inputs, the paths, the meta, what is left."""

    t0: float
    log: Callable[[str], None]
    sources: list[Source]
    out: Path
    failures_path: Path
    work: Path
    meta_path: Path
    done_path: Path
    ident: dict
    settings: dict
    fingerprint: str
    scan: Scan
    skipped: list[dict]
    meta: dict | None
    discard: bool
    done: DoneLog
    selected: set[int]
    left: list[Item]
    base: dict


def regenerate(cfg: RegenerateConfig) -> dict:
    """Regenerate (or confirm) ``cfg.out``; see the module docstring. Raises RegenerateError."""
    st = _preflight(cfg)
    out_check = {"readable": None, "unreadable": 0, "first": ""}
    if cfg.plan:
        return _plan_result(st, out_check)
    if (
        not st.left
        and not st.discard
        and not st.done.unreadable
        and _assembled_ok(st, st.done, st.meta, out_check)
    ):
        return {
            **st.base,
            **_accounting(len(st.scan.items), 0, st.skipped, []),
            "num_readable": out_check["readable"],
            "unreadable_done_lines": 0,
            "unreadable_out_lines": 0,
            "warnings": [],
            "changed": False,
            "output_tokens": 0,
            "wall_seconds": round(time.monotonic() - st.t0, 3),
            "tok_per_s": 0.0,
        }

    with RunLock(st.work, what="regenerate"):  # one run per OUT
        done, warnings, unreadable_done = _prepare_work(st)
        left = [it for it in st.scan.items if it.index not in done.entries]
        resumed = len(st.scan.items) - len(left)
        if resumed:
            st.log(
                f"regenerate: {resumed} of {len(st.scan.items)} conversations already done, {len(left)} left"
            )
        run = _execute(cfg, left, st.done_path, done, st.log)
        failed = [
            {"index": d.item.index, "loc": d.item.loc, "kind": "failed", "reason": d.error}
            for d in sorted(run["failed"], key=lambda d: d.item.index)
        ]
        written_idx = sorted(st.selected & set(done.entries))
        failures = sorted(st.skipped + failed, key=lambda f: f["index"])
        atomic_write(st.failures_path, jsonl.lines(failures, default=str))
        acct = _accounting(len(written_idx), len(failed), st.skipped, failed)
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
        _raise_if_run_failed(cfg, st, run, left, failed, written_idx, acct, stats)
        out_check.update(readable=None, unreadable=0, first="")
        if stats["changed"] or not _assembled_ok(st, done, st.meta, out_check):
            _assemble(st, done, written_idx, out_check, warnings)
            stats["changed"] = True
        st.log(
            f"regenerate: {st.out}: {acct['num_written']} written ({out_check['readable']} read back), "
            f"{acct['num_failed']} failed, {acct['num_skipped']} skipped of {st.scan.n_input}; {run['tokens']} "
            f"tokens in {run['seconds']} s ({stats['tok_per_s']} tok/s)"
        )
        return {
            **st.base,
            **acct,
            **stats,
            "num_readable": out_check["readable"],
            "unreadable_done_lines": unreadable_done,
            "unreadable_out_lines": out_check["unreadable"],
            "warnings": warnings,
        }


def _preflight(cfg: RegenerateConfig) -> _Start:
    """Validate, read the inputs and the meta, refuse changed settings without force; nothing is written."""
    t0 = time.monotonic()
    log = cfg.log or (lambda m: print(m, file=sys.stderr, flush=True))
    validate(cfg)
    try:
        sources = resolve_sources(cfg.inputs)
    except InputError as e:
        raise RegenerateError(str(e)) from e
    out, failures_path, work, meta_path, done_path = paths_for(cfg.out)
    ident = model_identity(cfg.model)
    settings = cfg.settings()
    fingerprint = fingerprint_of(sources, ident, settings)
    try:
        scan = scan_inputs(sources, cfg.limit)
    except InputError as e:
        raise RegenerateError(str(e)) from e
    skipped = [{"index": i, "loc": loc, "kind": "skipped", "reason": why} for i, loc, why in scan.skipped]

    meta = read_meta(meta_path)
    discard = False
    if meta is not None and meta.get("fingerprint") != fingerprint:
        changed_what = what_changed(meta, sources, ident, settings)
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
    return _Start(
        t0=t0,
        log=log,
        sources=sources,
        out=out,
        failures_path=failures_path,
        work=work,
        meta_path=meta_path,
        done_path=done_path,
        ident=ident,
        settings=settings,
        fingerprint=fingerprint,
        scan=scan,
        skipped=skipped,
        meta=meta,
        discard=discard,
        done=done,
        selected=selected,
        left=left,
        base=base,
    )


def _assembled_ok(st: _Start, done: DoneLog, m: dict | None, out_check: dict) -> bool:
    """Whether OUT holds exactly the done conversations ``m`` says were assembled (``out_check`` gets what was read)."""
    a = (m or {}).get("assembled") or {}
    if a.get("indices") != indices_sha(sorted(st.selected & set(done.entries))) or a.get("skipped") != len(
        st.skipped
    ):
        return False
    try:
        if st.out.stat().st_size != a.get("size") or sha256_file(st.out) != a.get("sha256"):
            return False
    except OSError:
        return False
    if a.get("writer") == jsonl.WRITER_VERSION and isinstance(a.get("readable"), int):
        out_check["readable"] = a["readable"]  # these very bytes were read back when they were written
        return a["readable"] == a.get("conversations")
    # written by an older eagle3ops (raw U+2028 and the like, which str.splitlines() breaks at): not
    # trusted blindly, read back; a file with unreadable lines is rewritten from done.log
    try:
        c = jsonl.check_file(st.out)
    except OSError:
        return False
    out_check.update(readable=c.records, unreadable=len(c.bad), first=c.first(st.out))
    return not c.bad and c.records == a.get("conversations")


def _plan_result(st: _Start, out_check: dict) -> dict:
    """``plan``: what a run would do, nothing written."""
    up_to_date = (
        not st.discard
        and not st.left
        and not st.done.unreadable
        and _assembled_ok(st, st.done, st.meta, out_check)
    )
    return {
        **st.base,
        "changed": not up_to_date,
        "up_to_date": up_to_date,
        "plan": True,
        "selected": len(st.scan.items),
        "done": len(st.scan.items) - len(st.left),
        "left": len(st.left),
        "turns_left": sum(it.turns for it in st.left),
        "num_skipped": len(st.skipped),
        "discards": len(st.done.entries) if st.discard else 0,
        "unreadable_done_lines": 0 if st.discard else len(st.done.unreadable),
        "unreadable_out_lines": out_check["unreadable"],
        "failures": st.skipped,
    }


def _prepare_work(st: _Start) -> tuple[DoneLog, list[str], int]:
    """Under the lock: the work dir, a forced discard, the meta, done.log re-read with bad lines set aside and a
    torn tail cut. Returns (done, warnings, unreadable done lines); ``st.meta`` is the meta written."""
    st.work.mkdir(parents=True, exist_ok=True)
    clean_temps((st.work, META_NAME), (st.out.parent, st.out.name), (st.out.parent, st.failures_path.name))
    done_path = st.done_path
    if st.discard:
        st.log(
            f"regenerate: --force: discarding {len(read_done(done_path).entries)} conversations in {done_path}"
        )
        done_path.unlink(missing_ok=True)
    if st.meta is None or st.discard:
        st.meta = {
            "format": REGENERATE_FORMAT,
            "fingerprint": st.fingerprint,
            "inputs": [{"path": str(s.path), "sha256": s.sha256} for s in st.sources],
            "model": st.ident,
            "settings": st.settings,
        }
        atomic_write(st.meta_path, [(json.dumps(st.meta, indent=2, sort_keys=True) + "\n").encode()])
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
        st.log(f"regenerate: {warnings[-1]}")
        done = read_done(done_path)
    if done.torn:
        with open(done_path, "r+b") as f:
            f.truncate(done.good_end)
            os.fsync(f.fileno())
        st.log(f"regenerate: {done_path}: cut a torn last line (a killed run's); its conversation is redone")
    return done, warnings, unreadable_done


def _raise_if_run_failed(
    cfg: RegenerateConfig,
    st: _Start,
    run: dict,
    left: list,
    failed: list,
    written_idx: list,
    acct: dict,
    stats: dict,
) -> None:
    """An aborted run, or failed conversations under ``on_error: fail``: RegenerateError (OUT not assembled)."""
    if run["aborted"]:
        raise RegenerateError(
            run["aborted"], **st.base, **acct, **stats, left=len(left) - run["new"] - len(failed)
        )
    if failed and cfg.on_error == "fail":
        shown = "\n  ".join(f"{f['loc']}: {f['reason']}" for f in failed[:MAX_ERRORS_SHOWN])
        more = f"\n  ... and {len(failed) - MAX_ERRORS_SHOWN} more" if len(failed) > MAX_ERRORS_SHOWN else ""
        raise RegenerateError(
            f"{len(failed)} conversation(s) could not be regenerated ({len(written_idx)} done are kept in "
            f"{st.done_path}; {st.out} was not written; the list is in {st.failures_path}). Re-run to retry them, or "
            f"pass --on-error skip to write {st.out} without them:\n  {shown}{more}",
            **st.base,
            **acct,
            **stats,
        )


def _assemble(
    st: _Start, done: DoneLog, written_idx: list[int], out_check: dict, warnings: list[str]
) -> None:
    """Write OUT from done.log (read back before the rename), then the meta saying what it holds."""
    out, done_path = st.out, st.done_path
    if out_check["unreadable"]:
        warnings.append(
            f"{out}: {out_check['unreadable']} unreadable line(s) (written by an older eagle3ops or "
            f"damaged; {out_check['first']}); rewritten from {done_path}"
        )
        st.log(f"regenerate: {warnings[-1]}")
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

    sha = atomic_write(out, (jsonl.line(by_index[i], default=str) for i in written_idx), read_back)
    st.meta["assembled"] = {
        "sha256": sha,
        "size": out.stat().st_size,
        "indices": indices_sha(written_idx),
        "skipped": len(st.skipped),
        "conversations": len(written_idx),
        "readable": readable[0],
        "writer": jsonl.WRITER_VERSION,
    }
    atomic_write(st.meta_path, [(json.dumps(st.meta, indent=2, sort_keys=True) + "\n").encode()])
    out_check["readable"] = readable[0]


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

    def emit(d: Done) -> None:
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
                f.write(done_line(line))
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
            run_transformers(cfg, left, emit, stop)
        else:
            res.update(run_openai(cfg, left, emit, stop))
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
