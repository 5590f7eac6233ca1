"""The in-server side of the SGLang extraction backend (called by the capture patch, :mod:`eagle3ops.sglang.patch`;
the patched file imports it under the kept name ``eagle3ops.sglang_hook``).

Inside the patched ``deepseek_v2.py`` two calls reach this module on every forward:

1. ``DeepseekV2Model.forward``: the final norm gets the callback ``hook.capture_last(forward_batch)`` and calls it
   with the updated residual, i.e. the **pre-norm** output of the last decoder layer (borrowed storage). SGLang
   0.5.23 passes it as the final norm's ``capture=``; 0.5.17 has no such argument, so its patch calls it with the
   residual its ``self.norm(hidden_states, residual)`` returns (the same tensor).
2. ``DeepseekV2ForCausalLM.forward`` calls ``hook.on_forward(model, forward_batch, aux_hidden_states)`` with the
   aux states SGLang packed for EAGLE-3 (``[tokens, K*H]``, layers in ascending order, input-of-layer ids).

SGLang 0.5.17 has no flag that captures aux states without a draft, so its patch also calls
``hook.enable_capture(model)`` from ``DeepseekV2ForCausalLM.__init__`` (what 0.5.23's
``--enable-return-aux-hidden-states`` does, with the ids taken as given: no +1 shift).

For a batch carrying our requests (``rid`` = ``e3o-<row index>-<seq_len>[-<attempt>]``, see :func:`make_rid`)
the hook packs ``[tokens, K+1, H]`` on the device in the store dtype (fp8: quantised there, a state at a time,
with one float32 scale a token and state, as the transformers backend stores it), copies it GPU→CPU asynchronously on a side
stream into a reused pinned buffer (the extraction's :class:`eagle3ops.extract.writer.PinnedPool`), and queues it. A dispatcher thread waits for the copy, splits the batch per
request by ``extend_seq_lens``/``rids`` and stitches chunked prefills (in batch order); a pool of writer threads
then writes whole batches in parallel with the transformers backend's batch step
(:func:`eagle3ops.extract.writer.write_batch`): each sample as :func:`eagle3ops.store.sample_parts` (identical
bytes whatever the backend) through :class:`eagle3ops.store.HiddenStateStore` (temp file + fsync + ``os.replace``,
one directory fsync per batch, then the batch's manifest lines). The
forward thread only blocks when ``max_pending`` batches are already queued. A row with a NaN/Inf state is not
written: the device reduces one finite flag a token beside the copy, the dispatcher reads it, and the row is
failed in the errors file as not to be retried (the transformers backend's ``check_finite`` refuses the same rows).

Configuration comes from the server's environment (the role's systemd unit sets it):

- ``EAGLE3OPS_SGLANG_DUMP_DIR``: the prepared data directory (``hidden_states/`` goes under it). Unset: the
  patch does nothing (``active_hook()`` returns None) and SGLang runs as shipped.
- ``EAGLE3OPS_SGLANG_LAYER_IDS``: the aux layer ids (input-of-layer convention, e.g. ``2,30,58``). The hook
  refuses to dump when SGLang captures other layers (e.g. its +1 shift of ids starting at 1).
- ``EAGLE3OPS_SGLANG_MAX_PENDING`` (default 4), ``EAGLE3OPS_SGLANG_WRITERS`` (writer threads, default 4),
  ``EAGLE3OPS_SGLANG_FSYNC`` (default 1).
- ``EAGLE3OPS_SGLANG_MANIFEST_RANK`` (default 0): the manifest this server appends to (``manifest-rank<N>.jsonl``);
  several capture servers writing one store (data parallel on one host) each need their own.

Server flags it needs, and why (docs/sglang.md): ``--disable-radix-cache`` (a cached prefix is never computed,
so its states would be missing: a first chunk with a prefix is refused), chunked prefill off
(``--chunked-prefill-size -1``) or chunks stitched here, ``--disable-prefill-cuda-graph`` (a captured graph
would replay without calling Python), only TP rank 0 writes, ``max_new_tokens=1``, no DP attention,
``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids ...``
(0.5.23; 0.5.17 needs none of the three: :mod:`eagle3ops.sglang.versions`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import layers
from eagle3ops.extract.writer import PinnedPool, write_batch
from eagle3ops.sglang.hook_copy import copy_to_host, device_block
from eagle3ops.sglang.versions import KNOWN, VERSIONS
from eagle3ops.store import HiddenStateStore
from eagle3ops.store.layout import HS_DIR, SGLANG_ERRORS
from eagle3ops.store.sample import FP8_DTYPE

log = logging.getLogger("eagle3ops.sglang_hook")

ENV_DUMP_DIR = "EAGLE3OPS_SGLANG_DUMP_DIR"
ENV_LAYER_IDS = "EAGLE3OPS_SGLANG_LAYER_IDS"
ENV_MAX_PENDING = "EAGLE3OPS_SGLANG_MAX_PENDING"
ENV_FSYNC = "EAGLE3OPS_SGLANG_FSYNC"
ENV_WRITERS = "EAGLE3OPS_SGLANG_WRITERS"
# which manifest (manifest-rank<N>.jsonl) this server appends to: one per capture server of a store, so that several
# servers of one host (data parallel, docs/sglang.md) never append to one file; the client sets it per server
ENV_MANIFEST_RANK = "EAGLE3OPS_SGLANG_MANIFEST_RANK"
ERRORS_NAME = SGLANG_ERRORS
RID_PREFIX = "e3o-"
_RID_RE = re.compile(r"^e3o-(\d+)-(\d+)(?:-\d+)?$")


def _capture_versions() -> tuple[str, str]:
    """(the versions whose dump server turns the capture on with a flag, those whose patch does it), as text."""
    flag = [v for v in KNOWN if VERSIONS[v].capture_only_flag]
    return ", ".join(flag) or "none", ", ".join(v for v in KNOWN if v not in flag) or "none"


class HookError(RuntimeError):
    """The server is not set up the way the dump needs; the message says which flag to change."""


def make_rid(index: int, seq_len: int, attempt: int = 0) -> str:
    """The request id the client sends: row index, expected length, attempt (unique per attempt)."""
    return f"{RID_PREFIX}{index}-{seq_len}-{attempt}"


def parse_rid(rid) -> tuple[int, int] | None:
    """(row index, seq_len) for one of our rids, None for any other request (warmup, health checks...)."""
    if not isinstance(rid, str):
        return None
    m = _RID_RE.match(rid)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _tp_rank() -> int:
    try:
        from sglang.srt.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # not inside SGLang (tests) or before distributed init
        return 0


def _is_prefill(forward_batch) -> bool:
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None:
        return False
    if hasattr(mode, "is_target_verify") and mode.is_target_verify():
        return False
    return bool(mode.is_extend())


@dataclass
class _Piece:
    index: int
    seq_len: int
    prefix: int
    offset: int  # row offset in the batch
    length: int  # extend length


@dataclass
class _Job:
    pieces: list[_Piece]
    host: object  # CPU tensor [N, K+1, H] (view of a pinned buffer when CUDA)
    token_ids: object  # CPU int64 tensor [N]
    event: object | None
    buffer: object | None  # pinned buffer to give back after the write
    finite: object  # CPU bool tensor [N]: the token's K+1 states are all finite (read after the copy's event)
    scales: object | None = None  # fp8 stores: CPU float32 tensor [N, K+1, 1], one scale a token and state


@dataclass
class HookStats:
    batches: int = 0
    samples: int = 0
    tokens: int = 0
    bytes: int = 0
    errors: int = 0
    wait_seconds: float = 0.0  # forward thread blocked on a full queue
    last_error: str | None = None
    partial: dict = field(default_factory=dict)


class DumpHook:
    """One per server process; see the module docstring."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        layer_ids,
        *,
        max_pending: int = 4,
        fsync: bool = True,
        writers: int = 4,
        rank_fn=_tp_rank,
        manifest_rank: int = 0,
    ):
        self.data_dir = Path(data_dir)
        self.manifest_rank = int(manifest_rank)
        try:  # SGLang packs the aux states in layer order (eagle3ops.layers)
            self.layer_ids = layers.check_ascending(layer_ids)
        except layers.LayerIdError as e:
            raise HookError(f"{ENV_LAYER_IDS}: {e}") from None
        self.max_pending = max(1, int(max_pending))
        self.fsync = fsync
        self.writers = max(1, int(writers))
        self._rank_fn = rank_fn
        self._rank: int | None = None
        self._store: HiddenStateStore | None = None
        self._meta: dict | None = None
        self._dtype = None  # the store dtype (torch)
        # what the device block is built in: the store dtype, or for fp8 the model's own
        self._work_dtype = None
        self._fp8 = False
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None  # the dispatcher: waits for copies, splits, stitches
        self._units: queue.Queue | None = None  # dispatcher -> writer threads: (job, complete samples)
        self._writer_threads: list[threading.Thread] = []
        self._inflight = 0  # batches queued and not yet written
        self._cond = threading.Condition()
        self._copy_stream = None
        self._pool: PinnedPool | None = None
        self._last: tuple | None = None  # (forward_batch, device tensor [N, H] in store dtype)
        self._checked_model = False
        self._partial: dict[int, list] = {}  # writer thread: index -> [(prefix, tokens, states)] of chunks
        self._progress: dict[int, int] = {}  # forward thread: index -> tokens seen of a chunked prefill
        self._nonfinite: set[int] = set()  # dispatcher: rows already failed whose later chunks are dropped
        self.stats = HookStats()

    # ------------------------------------------------------------------ set-up (lazy: first real batch)
    @classmethod
    def from_env(cls, environ=os.environ) -> DumpHook:
        d = environ[ENV_DUMP_DIR]
        raw = environ.get(ENV_LAYER_IDS, "")
        try:
            ids = [int(x) for x in re.split(r"[,\s]+", raw.strip()) if x]
        except ValueError:
            raise HookError(
                f"{ENV_LAYER_IDS}={raw!r}: expected comma-separated layer ids like 2,30,58"
            ) from None
        if not ids:
            raise HookError(
                f"{ENV_DUMP_DIR} is set but {ENV_LAYER_IDS} is empty: set the aux layer ids "
                "(input-of-layer convention) in the server's environment"
            )
        return cls(
            d,
            ids,
            max_pending=int(environ.get(ENV_MAX_PENDING, "4")),
            fsync=environ.get(ENV_FSYNC, "1") not in ("0", "false", "no"),
            writers=int(environ.get(ENV_WRITERS, "4")),
            manifest_rank=int(environ.get(ENV_MANIFEST_RANK, "0")),
        )

    def _writes(self) -> bool:
        if self._rank is None:
            self._rank = int(self._rank_fn())
        return self._rank == 0

    def _start(self) -> None:
        import torch

        self._store = HiddenStateStore(self.data_dir, rank=self.manifest_rank)
        meta = self._store.read_meta()
        if meta is None:
            raise HookError(
                f"{self._store.meta_path} is missing: the eagle3ops client writes it before it sends "
                "requests (eagle3ops extract-sglang); do not send e3o-* requests by hand"
            )
        if list(meta.get("layer_ids", [])) != self.layer_ids:
            raise HookError(
                f"{self._store.meta_path} records layer_ids {meta.get('layer_ids')} but the server was "
                f"started with {ENV_LAYER_IDS}={self.layer_ids}; restart the server with the store's ids"
            )
        self._meta = meta
        self._dtype = getattr(torch, meta["dtype"])
        # fp8: quantised on the device from the model's own states, as the transformers backend does, so both
        # backends write the same bytes (store.sample.quantize_fp8: e4m3 + one float32 scale a token and state)
        self._fp8 = meta["dtype"] == FP8_DTYPE
        self._work_dtype = None if self._fp8 else self._dtype
        cuda = torch.cuda.is_available()
        self._pool = PinnedPool(pin=cuda)
        self._copy_stream = torch.cuda.Stream() if cuda else None
        self._queue = queue.Queue(maxsize=self.max_pending)
        self._units = queue.Queue(maxsize=self.max_pending)
        self._thread = threading.Thread(target=self._dispatch, name="eagle3ops-sglang-dispatch", daemon=True)
        self._thread.start()
        self._writer_threads = [
            threading.Thread(target=self._write_units, name=f"eagle3ops-sglang-writer-{i}", daemon=True)
            for i in range(self.writers)
        ]
        for t in self._writer_threads:
            t.start()

    # ------------------------------------------------------------------ called from the patched forward
    def _ours(self, forward_batch) -> bool:
        rids = getattr(forward_batch, "rids", None)
        return bool(rids) and any(parse_rid(r) is not None for r in rids)

    def capture_last(self, forward_batch):
        """The ``capture=`` callback for the final norm, or None when this batch is not ours."""
        if not _is_prefill(forward_batch) or not self._ours(forward_batch) or not self._writes():
            return None
        import torch

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise HookError(
                "an extraction prefill is being captured into a CUDA graph: start the server with "
                "--disable-prefill-cuda-graph (the dump needs the Python hook on every prefill)"
            )
        if self._queue is None:
            self._start()

        def capture(residual):
            # borrowed storage: take an owned copy in the store dtype now (device-side, stream-ordered); fp8 keeps
            # the model's dtype until the block is quantised
            self._last = (forward_batch, residual.to(self._work_dtype or residual.dtype, copy=True))

        return capture

    def enable_capture(self, model) -> None:
        """Turn SGLang's aux-state capture on for :attr:`layer_ids` (0.5.17 patch, ``DeepseekV2ForCausalLM.__init__``).

        The same two attributes ``set_eagle3_layers_to_capture`` sets, but the ids as given (input of layer i, no
        +1 shift). Refuses ids past the model's layers, so the server fails at start, not at the first row.
        """
        pp = getattr(model, "pp_group", None)
        if pp is not None and not getattr(pp, "is_last_rank", True):
            return  # only the last pipeline rank captures (the dump needs pp_size 1 anyway: on_forward says so)
        n_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
        if n_layers is not None and max(self.layer_ids) >= int(n_layers):
            raise HookError(
                f"{ENV_LAYER_IDS}={self.layer_ids} reaches past the model's {n_layers} layers; set ids below "
                f"{n_layers} (input-of-layer convention, the store's extract_meta.json layer_ids)"
            )
        model.capture_aux_hidden_states = True
        model.model.layers_to_capture = list(self.layer_ids)

    def on_forward(self, model, forward_batch, aux_hidden_states) -> None:
        """After the model forward: pack aux + last, start the async copy, queue the write."""
        if not _is_prefill(forward_batch) or not self._ours(forward_batch) or not self._writes():
            return
        import torch

        last = self._last
        self._last = None
        if last is None or last[0] is not forward_batch:
            raise HookError(
                "the final-norm capture did not run for this batch: the prefill was replayed from a CUDA graph "
                "(start the server with --disable-prefill-cuda-graph), the server runs with pipeline parallelism "
                "(the dump needs pp_size 1), or the capture patch is incomplete (eagle3ops sglang-patch status)"
            )
        last = last[1]
        if not self._checked_model:
            self._check_model(model, aux_hidden_states)
        if isinstance(aux_hidden_states, (list, tuple)):
            aux = torch.cat(list(aux_hidden_states), dim=-1)
        else:
            aux = aux_hidden_states
        n_rows, hidden = last.shape[0], last.shape[-1]
        k = len(self.layer_ids)
        if aux.shape[0] != n_rows or aux.shape[-1] != k * hidden:
            raise HookError(
                f"aux states {tuple(aux.shape)} do not match {k} layers × hidden {hidden} for "
                f"{n_rows} tokens; check --return-aux-hidden-state-layer-ids"
            )
        pieces = self._pieces(forward_batch, n_rows)
        if not pieces:
            return
        try:
            self._queue_batch(forward_batch, pieces, aux, last, n_rows, k, hidden)
        except HookError:
            raise
        except Exception as e:  # a fault of ours must not take the server down: fail these rows, go on
            self._record_error([p.index for p in pieces], e)

    def _queue_batch(self, forward_batch, pieces, aux, last, n_rows: int, k: int, hidden: int) -> None:
        import torch

        # one flag a token is reduced on the device and copied with the states: checking it costs the forward
        # thread no synchronisation (the dispatcher reads it after the copy's event)
        block, scales, finite = device_block(aux, last, k=k, hidden=hidden, dtype=self._dtype, fp8=self._fp8)
        # an owned copy, made on the compute stream: SGLang reuses input_ids' buffer for the next batch
        ids = forward_batch.input_ids[:n_rows].to(torch.int64, copy=True)
        hb = copy_to_host(self._pool, self._copy_stream, block, scales, ids, finite)
        job = _Job(pieces, hb.states, hb.token_ids, hb.event, hb.buffer, hb.finite, hb.scales)
        t0 = time.perf_counter()
        with self._cond:
            self._inflight += 1
        self._queue.put(job)  # blocks only when max_pending batches are still being written
        self.stats.wait_seconds += time.perf_counter() - t0
        self.stats.batches += 1

    def _check_model(self, model, aux) -> None:
        inner = getattr(model, "model", None)
        captured = list(getattr(inner, "layers_to_capture", []) or [])
        flag, own = _capture_versions()
        if aux is None or not getattr(model, "capture_aux_hidden_states", True):
            raise HookError(
                "SGLang returned no aux hidden states: start the server with "
                "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 "
                f"--return-aux-hidden-state-layer-ids {' '.join(map(str, self.layer_ids))} (SGLang {flag}); "
                f"on {own} the capture patch turns the capture on itself: check it is complete "
                "(eagle3ops sglang-patch status --sglang-version VERSION)"
            )
        if captured and captured != self.layer_ids:
            raise HookError(
                f"SGLang captures layers {captured} but the dump needs {self.layer_ids} (input-of-layer). SGLang "
                "adds 1 to every id when the first is 1 (set_eagle3_layers_to_capture); pass ids that do not "
                f"start at 1, fix --return-aux-hidden-state-layer-ids ({flag}), or do not load a draft ({own})"
            )
        self._checked_model = True

    def _pieces(self, forward_batch, n_rows: int) -> list[_Piece]:
        rids = list(forward_batch.rids)
        lens = getattr(forward_batch, "extend_seq_lens_cpu", None)
        prefixes = getattr(forward_batch, "extend_prefix_lens_cpu", None)
        if lens is None or len(lens) != len(rids):
            raise HookError(f"forward batch has {len(rids)} requests but extend_seq_lens_cpu {lens}")
        prefixes = list(prefixes) if prefixes is not None else [0] * len(rids)
        total = sum(int(x) for x in lens)
        if total > n_rows:
            raise HookError(
                f"the batch's extend lengths add up to {total} tokens but the model returned {n_rows} "
                "rows: DP attention / scattered inputs are not supported by the dump; run plain TP"
            )
        out, offset = [], 0
        for rid, n, p in zip(rids, lens, prefixes, strict=True):
            n, p = int(n), int(p)
            parsed = parse_rid(rid)
            if parsed is not None and n > 0:
                index, seq_len = parsed
                if p != self._progress.get(index, 0):
                    self._progress.pop(index, None)
                    raise HookError(
                        f"request {rid} starts at a cached prefix of {p} tokens, so its states are "
                        "never computed: start the server with --disable-radix-cache"
                    )
                if p + n < seq_len:
                    self._progress[index] = p + n
                else:
                    self._progress.pop(index, None)
                out.append(_Piece(index, seq_len, p, offset, n))
            offset += n
        return out

    # ------------------------------------------------------------------ the writer side
    def _done(self) -> None:
        with self._cond:
            self._inflight -= 1
            self._cond.notify_all()

    def _dispatch(self) -> None:
        """One thread, in batch order: wait for the copy, split per request, stitch chunks; the writer threads
        then write whole batches in parallel (disk writes release the GIL)."""
        while True:
            job = self._queue.get()
            if job is None:
                for _ in self._writer_threads:
                    self._units.put(None)
                return
            try:
                samples = self._split(job)
            except BaseException as e:  # never kill the server: record, and the client reports the rows
                self._record_error([p.index for p in job.pieces], e)
                self._pool.release(job.buffer)
                self._done()
                continue
            self._units.put((job, samples))

    def _split(self, job: _Job) -> list:
        """[(index, seq_len, token_ids, states, fp8 scales or None)] of the requests this batch completes."""
        import torch

        if job.event is not None:
            job.event.synchronize()
        out = []
        for pc in job.pieces:
            if not self._finite_piece(job, pc):
                continue
            rows = slice(pc.offset, pc.offset + pc.length)
            states, tokens = job.host[rows], job.token_ids[rows]
            scales = None if job.scales is None else job.scales[rows]
            if pc.prefix == 0 and pc.length == pc.seq_len:
                tok, hs, sc = tokens, states, scales  # views of the pinned buffer, released after the write
            else:  # a chunk of a chunked prefill: keep an owned copy until the request is complete
                parts = self._partial.setdefault(pc.index, [])
                have = sum(int(p[1].shape[0]) for p in parts)
                if pc.prefix != have:
                    self._partial.pop(pc.index, None)
                    raise HookError(
                        f"row {pc.index}: chunk at prefix {pc.prefix} but {have} tokens were seen "
                        "before (out-of-order or cached prefix); use --disable-radix-cache"
                    )
                parts.append(
                    (pc.prefix, tokens.clone(), states.clone(), None if scales is None else scales.clone())
                )
                if have + pc.length < pc.seq_len:
                    continue
                self._partial.pop(pc.index)
                tok, hs = torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
                sc = None if scales is None else torch.cat([p[3] for p in parts])
            if int(tok.shape[0]) != pc.seq_len:
                raise HookError(
                    f"row {pc.index}: the server computed {tok.shape[0]} tokens, the client sent {pc.seq_len}"
                )
            out.append((pc.index, pc.seq_len, tok, hs, sc))
        self.stats.partial = {i: sum(int(p[1].shape[0]) for p in v) for i, v in self._partial.items()}
        return out

    def _finite_piece(self, job: _Job, pc: _Piece) -> bool:
        """False when the piece's row must not be written: a token of this piece has a NaN/Inf state (the row
        is failed here, not retried: the same input gives the same states), or an earlier chunk of it had one."""
        last_chunk = pc.prefix + pc.length >= pc.seq_len
        if pc.prefix == 0:
            self._nonfinite.discard(pc.index)  # a new request for the row
        elif pc.index in self._nonfinite:
            if last_chunk:
                self._nonfinite.discard(pc.index)
            return False
        flags = job.finite[pc.offset : pc.offset + pc.length]
        bad = int(flags.numel() - int(flags.sum()))
        if not bad:
            return True
        self._partial.pop(pc.index, None)
        if not last_chunk:
            self._nonfinite.add(pc.index)
        first = pc.prefix + int((~flags).nonzero()[0])
        self._record_error(
            [pc.index],
            HookError(
                f"row {pc.index}: non-finite hidden states (NaN/Inf) at {bad} of its tokens {pc.prefix}.."
                f"{pc.prefix + pc.length - 1} (first at token {first}); nothing was written for it. Check the "
                "served model's dtype and weights (the transformers backend refuses the same rows)"
            ),
            retry=False,
        )
        return False

    def _write_units(self) -> None:
        while True:
            item = self._units.get()
            if item is None:
                return
            job, samples = item
            try:
                # the transformers backend's writer step (eagle3ops.extract.writer.write_batch): one file at a
                # time, no checksum, one directory fsync per batch before the manifest names the files
                entries, _, _ = write_batch(
                    self._store,
                    [(index, tok, hs, sc) for index, _seq_len, tok, hs, sc in samples],
                    fsync=self.fsync,
                    checksum=False,
                    batch_sync=False,
                    batch_dir_sync=True,
                )
                if entries:
                    self._store.append_manifest(entries, fsync=self.fsync)
                with self._cond:
                    self.stats.samples += len(entries)
                    self.stats.tokens += sum(e.seq_len for e in entries)
                    self.stats.bytes += sum(e.nbytes for e in entries)
            except BaseException as e:  # never kill the server: record, and the client reports the rows
                self._record_error([s[0] for s in samples], e)
            finally:
                self._pool.release(job.buffer)
                self._done()

    def _record_error(self, indices, exc, *, retry: bool = True) -> None:
        """One line in the errors file: the client fails these rows naming the error, and sends them again
        unless ``retry`` is False (a fault that the same request would meet again)."""
        error = f"{type(exc).__name__}: {exc}"
        with self._cond:
            self.stats.errors += 1
            self.stats.last_error = error
        log.error("eagle3ops dump failed for rows %s: %s", indices, error)
        record = {"t": time.time(), "rows": indices, "error": error}
        if not retry:
            record["retry"] = False
        try:
            line = json.dumps(record) + "\n"
            with open(self.data_dir / HS_DIR / ERRORS_NAME, "a") as f:
                f.write(line)
        except OSError:
            pass

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued batch is written (tests; the server never needs to)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._inflight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self._inflight} batches still being written")
                self._cond.wait(timeout=left)

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            for t in self._writer_threads:
                t.join()
            self._queue = None
        if self._store is not None:
            self._store.close()


_ACTIVE: DumpHook | None = None


def active_hook(environ=os.environ) -> DumpHook | None:
    """What the patch calls at import: the process's hook, or None when no dump is configured."""
    global _ACTIVE
    if not environ.get(ENV_DUMP_DIR):
        return None
    if _ACTIVE is None:
        _ACTIVE = DumpHook.from_env(environ)
    return _ACTIVE
