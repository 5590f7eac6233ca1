"""The client of the SGLang extraction backend (``eagle3ops extract-sglang``).

It drives a patched SGLang server (:mod:`eagle3ops.sglang.patch` / :mod:`eagle3ops.sglang.hook`) that writes the hidden states itself:

1. works out what is left from the store's manifest (the same store, meta and resume rules as the
   transformers backend; files written by either backend count), checks disk space for exactly that;
2. starts the server's systemd unit (``server_unit``) or attaches to a running server (``url``), waits for
   ``/health``;
3. sends ``/generate`` with the prepared ``input_ids``, ``rid`` = ``e3o-<row>-<seq_len>-<attempt>`` and
   ``max_new_tokens=1``, at most ``concurrency`` requests in flight (a row waiting for its file holds no request
   slot: confirmations overlap the next requests, so the server's queue stays full); 5xx/429/408, connection errors and
   timeouts are retried with exponential backoff and jitter, other 4xx fail the row at once;
4. confirms every row's file landed: a complete safetensors header of the right shape/dtype, and its
   ``token_ids`` equal to the row's ``input_ids`` (an error the server's writer recorded fails the row fast);
5. stops the unit it started and restores the capture patch (``restore_patch``) when every row is done.

Killing the client (even ``kill -9``) loses nothing: rows the server finishes still land with their manifest
lines; the next run resumes from the manifest.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import jsonl
from eagle3ops.http_retry import RETRY_STATUS, RetrySettings
from eagle3ops.sglang import hook as sglang_hook
from eagle3ops.sglang.server import (
    SGLangClientError,
    http_call,
    server_gone,
    systemctl,
    wait_health,
)
from eagle3ops.sglang.versions import DEFAULT_VERSION
from eagle3ops.store import HiddenStateStore, read_safetensors_header


@dataclass
class SGLangExtractConfig(RetrySettings):  # its requests and retries: RetrySettings' defaults
    data_dir: str
    model_path: str  # the target the server serves: its config gives layers/H and the store fingerprint
    # the capture servers of this host: one URL, or several (data parallel: the host's rows split between them)
    url: str | list[str] = field(default_factory=lambda: ["http://127.0.0.1:30000"])
    world_size: int | None = (
        None  # several hosts: capture servers over every host (docs/scale.md); None = one
    )
    first_rank: int | None = (
        None  # with world_size > 1: this host's servers are ranks first_rank..+len(urls)-1
    )
    # on request, lost hosts' ranks whose rows this host's servers take over, and their readable data directories
    # (docs/scale.md, "A host that stays lost"; the transformers backend's ExtractConfig has the same two)
    reassign_ranks: list[int] | None = None
    reassign_from_data: list[str] | None = None
    layer_ids: list[int] | None = None
    layer_convention: str = "input"
    trust_remote_code: bool = False  # the target's config is remote code (eagle3ops.remote_code)
    dtype: str = "bfloat16"
    confirm_timeout: float = 120.0
    limit: int | None = None
    margin_frac: float = 0.05
    margin_bytes: int = 64 * 1024 * 1024
    # the PVE storage underneath the data directory (store.pool); {} = not a PVE storage volume
    pve_storage: dict = field(default_factory=dict)
    # an existing dump adopted where it lies before any row is sent (eagle3ops.extract.adoption; the transformers
    # backend's ExtractConfig has the same six)
    adopt_from: str | None = None
    adopt_layer_ids: list[int] | None = None
    adopt_layer_convention: str | None = None
    adopt_last_state: str | None = None
    adopt_keys: dict = field(default_factory=dict)
    adopt_checksum: bool = True
    # systemd units to start: one, or one per URL in the same order (several servers of one host); None = attach
    server_unit: str | list[str] | None = None
    server_pid: int | None = None  # the attached server's PID: its death ends a wait for /health at once
    stop_server: bool = True  # stop ``server_unit`` at the end (only units this run started)
    restore_patch: str | None = None  # deepseek_v2.py to restore when every row is done
    restore_patch_always: bool = False  # restore even when rows failed
    sglang_version: str = DEFAULT_VERSION  # the server's SGLang version (restore_patch checks against it)
    progress: bool = True
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)  # retry backoff (tests record it)

    @property
    def urls(self) -> list[str]:
        return [self.url] if isinstance(self.url, str) else list(self.url)

    @property
    def units(self) -> list[str]:
        """The servers' systemd units ("" entries dropped: the role's "attach" value)."""
        raw = [self.server_unit] if isinstance(self.server_unit, str) else list(self.server_unit or [])
        return [u for u in raw if u]

    def unit_for(self, url: str) -> str | None:
        """The unit of the server at ``url``: one unit serves every URL; several pair with the URLs in order."""
        units = self.units
        if not units:
            return None
        if len(units) == 1:
            return units[0]
        return units[self.urls.index(url)]

    def store_config(self, ranks: list[int] | None = None):
        """The store's side of this run as the transformers backend's ``ExtractConfig`` (the store is the same
        for both backends): what its meta, its plan and the import of a lost host's rows read. ``ranks``: this
        host's global ranks (several hosts; :func:`routing`)."""
        from eagle3ops.extract.session import ExtractConfig

        return ExtractConfig(
            data_dir=self.data_dir,
            model_path=self.model_path,
            layer_ids=self.layer_ids,
            layer_convention=self.layer_convention,
            trust_remote_code=self.trust_remote_code,
            dtype=self.dtype,
            limit=self.limit,
            margin_frac=self.margin_frac,
            margin_bytes=self.margin_bytes,
            pve_storage=self.pve_storage,
            world_size=self.world_size or 1,
            ranks=ranks,
            reassign_ranks=self.reassign_ranks,
            reassign_from_data=self.reassign_from_data,
            adopt_from=self.adopt_from,
            adopt_layer_ids=self.adopt_layer_ids,
            adopt_layer_convention=self.adopt_layer_convention,
            adopt_last_state=self.adopt_last_state,
            adopt_keys=self.adopt_keys,
            adopt_checksum=self.adopt_checksum,
        )

    def check_units(self) -> None:
        n, m = len(self.units), len(self.urls)
        if n > 1 and n != m:
            raise SGLangClientError(
                f"sglang-extract: {n} server units ({', '.join(self.units)}) for {m} server URLs "
                f"({', '.join(self.urls)}): give one unit, or one per URL in the same order"
            )


def routing(
    cfg: SGLangExtractConfig, num_rows: int
) -> tuple[list[int], list[int] | None, Callable[[int], str]]:
    """The rows this host extracts, the global ranks it covers (None: one host, every row) and each row's server.

    One host: every row; with several servers, row i goes to server ``i mod servers``. Several hosts
    (``world_size`` > 1): this host's servers are the global ranks ``first_rank ..``, one each; rank r takes rows
    r, r+W, r+2W, ... (the transformers backend's strided shares, :mod:`eagle3ops.extract.shards`), so the stores of
    every host together hold every row once, with the bytes a one-host run writes."""
    from eagle3ops.extract.shards import Reassignment, rank_indices, rows_of_ranks

    urls = cfg.urls
    if not urls:
        raise SGLangClientError("sglang-extract: no server URL (--url)")
    world = cfg.world_size or 1
    if world <= 1:
        return rank_indices(num_rows, 1, 0, cfg.limit), None, lambda i: urls[i % len(urls)]
    first = cfg.first_rank or 0
    ranks = list(range(first, first + len(urls)))
    if first < 0 or ranks[-1] >= world:
        raise SGLangClientError(
            f"sglang-extract: this host's {len(urls)} servers would be ranks {ranks[0]}..{ranks[-1]}, outside "
            f"--world-size {world} (--first-rank {first})"
        )
    by_rank = dict(zip(ranks, urls, strict=True))
    plan = Reassignment.of(world, cfg.reassign_ranks)  # a row's rank: its own, or the survivor that took it
    owner = plan.owner if plan else (lambda i: i % world)
    return rows_of_ranks(num_rows, world, ranks, cfg.limit, plan), ranks, lambda i: by_rank[owner(i)]


# -------------------------------------------------------------------------------------------- sample files
def read_token_ids(path: str | os.PathLike) -> list[int]:
    """The ``token_ids`` of a sample file, reading only the header and those bytes (not the states)."""
    h = read_safetensors_header(path)
    t = h["token_ids"]
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        a, b = t["data_offsets"]
        f.seek(8 + hlen + a)
        raw = f.read(b - a)
    return list(struct.unpack(f"<{len(raw) // 8}q", raw))


# -------------------------------------------------------------------------------------------------- the run
@dataclass
class _Outcome:
    index: int
    ok: bool
    tokens: int = 0
    nbytes: int = 0
    attempts: int = 0
    retried: int = 0
    error: str | None = None
    request_s: float = 0.0  # the answered request's round trip (prefill + 1 token on the server)
    confirm_s: float = 0.0  # from the answer until the row's file was confirmed on disk (the hook's write)


class _Runner:
    """The requests of one capture server (``url``)."""

    def __init__(
        self, cfg: SGLangExtractConfig, store: HiddenStateStore, seq_lens, num_states, hidden, url: str
    ):
        self.cfg, self.store, self.seq_lens = cfg, store, seq_lens
        self.num_states, self.hidden = num_states, hidden
        self.url = url
        self.gen_url = url.rstrip("/") + "/generate"
        self.errors_path = store.dir / sglang_hook.ERRORS_NAME
        self._stop = threading.Event()
        self._health_lock = threading.Lock()
        self.health_waits = 0
        # requests in flight: a row's thread gives its slot back when the answer arrives, before it waits for the
        # file, so ``concurrency`` requests keep the server busy while earlier rows are being confirmed
        self.concurrency = max(1, int(cfg.concurrency))
        self._in_flight = threading.BoundedSemaphore(self.concurrency)

    def _wait_until_healthy(self) -> None:
        """The server is down (restarting?): one thread polls /health, the others queue behind it."""
        with self._health_lock:
            self.health_waits += 1
            wait_health(self.url, self.cfg.health_timeout, poll=0.5, gone=self._gone)

    def _gone(self) -> str | None:
        return server_gone(self.cfg.server_pid, self.cfg.unit_for(self.url))

    def _server_error_for(self, index: int, since: float) -> dict | None:
        """The server's newest error line for this row since ``since`` ({"error", "retry"?}), or None."""
        if not self.errors_path.exists():
            return None
        try:
            lines = [
                ln
                for _, ln in jsonl.split_lines(self.errors_path.read_text(encoding="utf-8", errors="replace"))
            ]
        except OSError:
            return None
        for line in reversed(lines[-200:]):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("t", 0) >= since and index in d.get("rows", []):
                return d
        return None

    def _confirm(self, index: int, ids: list[int], since: float) -> tuple[str | None, bool]:
        """(None, _) once the row's file is complete and holds these tokens; else (why not, whether sending the
        row again can help), after the timeout or at once when the server's writer failed it."""
        reason = "file never appeared"
        for _ in _looks(self.cfg.confirm_timeout):
            reason = self.store.validate_header(index, len(ids), self.num_states, self.hidden, self.cfg.dtype)
            if reason is None:
                got = read_token_ids(self.store.path(index))
                if got == ids:
                    return None, False
                reason = f"token_ids in {self.store.path(index)} differ from the row's input_ids"
            err = self._server_error_for(index, since)
            if err:
                return f"the server's writer failed: {err.get('error')}", err.get("retry", True) is not False
        return (
            f"{self.store.path(index)} not confirmed within {self.cfg.confirm_timeout:.0f} s: {reason}",
            True,
        )

    def one(self, index: int, ids: list[int]) -> _Outcome:
        cfg = self.cfg
        n = len(ids)
        out = _Outcome(index, False)
        last = ""
        for attempt in range(cfg.retries + 1):
            if self._stop.is_set():
                out.error = "run aborted"
                return out
            out.attempts = attempt + 1
            if attempt:
                out.retried += 1
                cfg.sleep(cfg.retry_delay(attempt))
            body = {
                "input_ids": ids,
                "rid": sglang_hook.make_rid(index, n, attempt),
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            }
            since = time.time()
            t_req = time.monotonic()
            try:
                with self._in_flight:
                    code, raw = http_call(self.gen_url, body, cfg.request_timeout)
            except (TimeoutError, OSError, urllib.error.URLError) as e:
                reason = getattr(e, "reason", e)
                last = f"{type(e).__name__}: {reason}"
                if isinstance(reason, ConnectionRefusedError) or isinstance(e, ConnectionRefusedError):
                    # nothing listens: the server is (re)starting. Waiting for /health costs no attempt budget
                    # beyond this one; a server that never comes back ends the run with a clear error.
                    self._wait_until_healthy()
                continue
            if code in RETRY_STATUS:
                last = f"HTTP {code}: {raw[:300].decode(errors='replace')}"
                if code == 503:
                    # up but not serving: a restarted server that listens before its model is loaded, or one
                    # that says it is unhealthy. Wait for /health as for a closed port (at once when it is
                    # healthy), so the restart's load time does not use up the row's few retries.
                    self._wait_until_healthy()
                continue
            if code != 200:
                out.error = f"HTTP {code}: {raw[:500].decode(errors='replace')} (not retried)"
                return out
            try:
                meta = json.loads(raw).get("meta_info", {}) or {}
            except (ValueError, AttributeError):
                meta = {}
            if "prompt_tokens" in meta and int(meta["prompt_tokens"]) != n:
                out.error = f"the server counted {meta['prompt_tokens']} prompt tokens, the row has {n}"
                return out
            t_ans = time.monotonic()
            why, retry = self._confirm(index, ids, since)
            if why is None:
                out.request_s, out.confirm_s = t_ans - t_req, time.monotonic() - t_ans
                out.ok, out.tokens = True, n
                out.nbytes = self.store.path(index).stat().st_size
                return out
            if not retry:
                out.error = f"{why} (not retried: the same request gives the same states)"
                return out
            last = why
        out.error = f"gave up after {out.attempts} attempts: {last}"
        return out


def run_sglang_extraction(
    cfg: SGLangExtractConfig, *, on_progress: Callable[[int, int], None] | None = None
) -> dict:
    """Extract every remaining row through the patched server; resumable; returns counts. With ``adopt_from``, an
    existing dump is surveyed before anything is written and adopted where it lies: its rows are not sent."""
    from eagle3ops.extract.adoption import commit_dump, survey_dump
    from eagle3ops.extract.session import (
        build_meta,
        disk_preflight,
        load_seq_lens,
        model_facts,
        resolve_layer_ids,
        run_result,
    )
    from eagle3ops.extract.shards import Reassignment, check_shard

    t_start = time.perf_counter()
    seq_lens = load_seq_lens(cfg.data_dir)
    facts = model_facts(cfg.model_path, trust_remote_code=cfg.trust_remote_code)
    layer_ids = resolve_layer_ids(facts["num_layers"], cfg.layer_ids, cfg.layer_convention)
    num_states, hidden = len(layer_ids) + 1, facts["hidden_size"]
    cfg.check_units()
    indices, ranks, server_for = routing(cfg, len(seq_lens))
    dump = survey_dump(
        cfg.store_config(ranks), layer_ids, hidden
    )  # every refusal before the store is touched
    store = HiddenStateStore(cfg.data_dir, rank=0)
    meta = build_meta(cfg.store_config(), facts, layer_ids, len(seq_lens))
    meta["backend"] = "sglang"
    store.ensure_meta(meta)
    adopted_dump = commit_dump(dump)
    if ranks is not None:  # several hosts: the store records the ranks it covers (refused if they moved)
        from eagle3ops.extract.session import import_from_lost_parts

        reassign = Reassignment.of(cfg.world_size, cfg.reassign_ranks)
        check_shard(cfg.data_dir, cfg.world_size, ranks, write=True, reassign=reassign)
        imported = import_from_lost_parts(cfg.store_config(ranks))
    else:
        imported = {}
    plan = store.plan(seq_lens, num_states=num_states, hidden_size=hidden, dtype=cfg.dtype, indices=indices)
    store.close()
    result = run_result(cfg, indices, plan, layer_ids, facts)
    result.update(
        backend="sglang",
        requests=0,
        retries=0,
        errors=[],
        url=cfg.urls[0],
        urls=cfg.urls,
        world_size=cfg.world_size,
        ranks=ranks,
        **imported,
        **adopted_dump,
        server_env={
            sglang_hook.ENV_DUMP_DIR: str(Path(cfg.data_dir).resolve()),
            sglang_hook.ENV_LAYER_IDS: ",".join(map(str, layer_ids)),
        },
    )
    started: list[str] = []
    try:
        if plan.remaining:
            result["preflight"] = disk_preflight(store.dir, plan.bytes_needed, cfg)
            if cfg.units:
                store.clean_temp_files()  # no server of ours is running yet: temp files are leftovers
                # one call: systemd starts the units in parallel (each loads the model: minutes for a large one)
                systemctl("start", *cfg.units)
                started = cfg.units
            result["health_wait_seconds"] = round(
                sum(
                    wait_health(
                        u,
                        cfg.health_timeout,
                        poll=0.5,
                        gone=lambda u=u: server_gone(cfg.server_pid, cfg.unit_for(u)),
                    )
                    for u in cfg.urls
                ),
                3,
            )
            if on_progress is None and cfg.progress:
                from eagle3ops.extract.session import progress_reporter

                on_progress, close = progress_reporter(len(plan.remaining), plan.tokens_remaining, True)
            else:
                close = None
            try:
                _drive(
                    cfg, store, seq_lens, num_states, hidden, plan.remaining, result, on_progress, server_for
                )
            finally:
                if close:
                    close()
    finally:
        if started and cfg.stop_server:
            systemctl("stop", *started)
            result["server_stopped"] = started[0] if len(started) == 1 else started
        if cfg.restore_patch and (result["failed"] == 0 or cfg.restore_patch_always):
            from eagle3ops.sglang import patch as sglang_patch

            result["patch"] = sglang_patch.restore(cfg.restore_patch, cfg.sglang_version)
    result["seconds"] = round(time.perf_counter() - t_start, 3)
    if result["tokens"] and result["seconds"]:
        result["tokens_per_second"] = round(result["tokens"] / result["seconds"], 1)
    return result


def _drive(cfg, store, seq_lens, num_states, hidden, remaining, result, on_progress, server_for=None) -> None:
    """Send the remaining rows, each to its server (``server_for(row)``; default ``cfg.urls[0]``), at most
    ``concurrency`` requests in flight per server."""
    from datasets import load_from_disk

    ds = load_from_disk(str(cfg.data_dir)).with_format(None, columns=["input_ids"])
    runners = {u: _Runner(cfg, store, seq_lens, num_states, hidden, u) for u in cfg.urls}
    server_for = server_for or (lambda i: cfg.urls[0])
    pending = set()
    todo = iter(remaining)
    conc = sum(r.concurrency for r in runners.values())

    def collect(done):
        for fut in done:
            o: _Outcome = fut.result()
            result["requests"] += o.attempts
            result["retries"] += o.retried
            if o.ok:
                timings["request_s"].append(o.request_s)
                timings["confirm_s"].append(o.confirm_s)
                result["written"] += 1
                confirmed.append(o.index)
                result["tokens"] += o.tokens
                result["bytes"] += o.nbytes
                if on_progress:
                    on_progress(1, o.tokens)
            else:
                result["failed"] += 1
                if len(result["errors"]) < 50:
                    result["errors"].append({"index": o.index, "error": o.error})

    timings: dict[str, list[float]] = {"request_s": [], "confirm_s": []}
    confirmed: list[int] = []
    # twice the request concurrency in threads: ``conc`` requests in flight (the runner's semaphore) while as many
    # answered rows wait for their files
    slots = 2 * conc
    pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="e3o-sglang")
    aborted = False
    loop_t0 = time.perf_counter()
    try:
        for i in todo:
            while len(pending) >= slots:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                collect(done)
            ids = [int(x) for x in ds[int(i)]["input_ids"]]
            if len(ids) != seq_lens[i]:
                raise SGLangClientError(
                    f"{cfg.data_dir}: row {i} has {len(ids)} input_ids but seq_len {seq_lens[i]}; re-run prepare"
                )
            pending.add(pool.submit(runners[server_for(int(i))].one, int(i), ids))
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            collect(done)
        _await_manifest(store, confirmed, cfg.confirm_timeout)
    except BaseException:
        aborted = True
        for r in runners.values():
            r._stop.set()
        raise
    finally:
        # on an abort, do not wait for requests in flight (the server still finishes and writes them)
        pool.shutdown(wait=not aborted, cancel_futures=True)
        result["health_waits"] = sum(r.health_waits for r in runners.values())
        result["row_seconds"] = {k: _spread(v) for k, v in timings.items()}
        # the request loop alone (first request to last confirmed file): the rate the capture overhead is judged
        # by, without the run's setup (manifest plan, dataset load, /health)
        loop_s = time.perf_counter() - loop_t0
        result["loop_seconds"] = round(loop_s, 3)
        if result["tokens"] and loop_s > 0:
            result["loop_tokens_per_second"] = round(result["tokens"] / loop_s, 1)


def _await_manifest(store, rows: list[int], timeout: float) -> None:
    """Return once the store's manifest names every row this run confirmed.

    A row is confirmed by its complete file; the server's writer names it in the manifest just after. Without this
    wait a run could end (and its server be stopped) between the two, reporting a row written that the manifest
    does not record (seen once in CI). Rows still unnamed after ``timeout`` end the run with an error naming them;
    a re-run adopts their complete files.
    """
    if not rows:
        return
    for _ in _looks(timeout):
        missing = set(rows).difference(store.scan_manifest().entries)
        if not missing:
            return
    raise SGLangClientError(
        f"{store.dir}: rows {sorted(missing)[:20]} have complete files, but the server's writer named "
        f"{len(missing)} of them in no manifest within {timeout:.0f} s; re-run extract: it adopts complete files"
    )


def _looks(timeout: float):
    """Paces the looks at what the server's writer leaves: one at once, then one after each sleep (5 ms growing to
    0.25 s: the hook writes within milliseconds of the answer) until a look ends past ``timeout`` s from the first."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        yield
        if time.monotonic() > deadline:
            return
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _spread(xs: list[float]) -> dict | None:
    """Median, p90 and sum of per-row seconds (where a row's time goes: the request, or waiting for its file)."""
    if not xs:
        return None
    xs = sorted(xs)
    return {
        "median": round(xs[len(xs) // 2], 4),
        "p90": round(xs[min(len(xs) - 1, int(len(xs) * 0.9))], 4),
        "sum": round(sum(xs), 2),
    }


def server_args(
    *,
    model_path: str,
    layer_ids,
    tp_size: int = 1,
    host: str = "127.0.0.1",
    port: int = 30000,
    extra: list[str] | None = None,
    sglang_version: str | None = None,
) -> list[str]:
    """The flags a dump server of SGLang ``sglang_version`` needs (see docs/sglang.md for why each one).

    The aux-capture flags depend on the version (:func:`eagle3ops.sglang.versions.dump_capture_args`)."""
    from eagle3ops.sglang.versions import dump_capture_args

    return [
        "--model-path",
        str(model_path),
        "--tp-size",
        str(tp_size),
        "--host",
        host,
        "--port",
        str(port),
        "--disable-radix-cache",
        "--chunked-prefill-size",
        "-1",
        "--disable-prefill-cuda-graph",
        *dump_capture_args(sglang_version, layer_ids),
        *(extra or []),
    ]
