"""The extraction's writer threads and the pinned-buffer pool, shared by both backends: a batch of samples goes
to disk as :mod:`eagle3ops.store.sample` files through :class:`eagle3ops.store.HiddenStateStore` (atomic files,
then the batch's manifest lines), while the next batch computes."""

from __future__ import annotations

import errno
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from eagle3ops.durable import fsync_dir
from eagle3ops.store import (
    DiskSpaceError,
    HiddenStateStore,
    human_bytes,
    sample_parts,
)
from eagle3ops.store import write as _write


# ----------------------------------------------------------------------------------------------------------
# the writer thread
# ----------------------------------------------------------------------------------------------------------
@dataclass
class WriterJob:
    indices: list[int]
    token_ids: list  # CPU int64 tensors
    states: list  # CPU tensors [T, K+1, H] (views of one pinned block)
    event: object | None  # CUDA event to wait on before reading
    release: Callable | None = None  # returns the pinned buffer to its pool once written
    scales: list | None = None  # fp8 only: CPU float32 [T, K+1, 1] per sample


@dataclass
class _WriterStats:
    written: int = 0
    bytes: int = 0
    tokens: int = 0
    error: BaseException | None = None
    write_seconds: float = 0.0
    serialize_seconds: float = 0.0


class PinnedPool:
    """Reused page-locked host buffers (uint8) for the GPU→CPU copies of both backends: cudaHostAlloc per batch
    costs more than the copy itself, and in the SGLang server it would stall the forward.

    :meth:`acquire` hands out the smallest free buffer that fits (by position, never ``list.remove``: that
    compares tensors elementwise, seen crashing the live server when two buffers of different sizes were free),
    else allocates one of the next power of two (few distinct sizes, good reuse); :meth:`reserve` allocates
    buffers up front (the transformers backend knows its largest block before the loop). At most ``keep`` free
    buffers are kept (the smallest go first). ``pin=False`` (no CUDA) gives plain CPU memory."""

    def __init__(self, pin: bool, *, keep: int = 8):
        self.pin = pin
        self.keep = keep
        self._free: list = []
        self._lock = threading.Lock()

    def _new(self, nbytes: int):
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)

    def reserve(self, count: int, nbytes: int) -> None:
        """Allocate ``count`` buffers of exactly ``nbytes`` now."""
        bufs = [self._new(nbytes) for _ in range(count)]
        with self._lock:
            self._free.extend(bufs)

    def acquire(self, nbytes: int):
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.numel() >= nbytes]
            if fits:
                best = min(fits, key=lambda i: self._free[i].numel())
                return self._free.pop(best)
        size = max(nbytes, 1 << 20)
        return self._new(1 << (size - 1).bit_length())

    def take(self, shape, dtype):
        """A buffer and a ``dtype`` tensor of ``shape`` at its start (give the buffer back with :meth:`release`)."""
        import math

        nbytes = math.prod(shape) * dtype.itemsize
        buf = self.acquire(nbytes)
        return buf, buf[:nbytes].view(dtype).view(shape)

    def release(self, buf) -> None:
        if buf is None:
            return
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self.keep:
                self._free.sort(key=lambda b: b.numel())
                self._free.pop(0)


def release_all(pool: PinnedPool, *bufs) -> None:
    for buf in bufs:
        pool.release(buf)


class SampleWriter:
    """Writer threads: each takes a batch, waits for its GPU→CPU copy, writes every sample atomically, then
    appends the batch's manifest lines. Disk writes and fsync release the GIL, so threads overlap I/O."""

    def __init__(
        self,
        store: HiddenStateStore,
        *,
        fsync: bool,
        threads: int = 2,
        depth: int = 3,
        checksum: bool = False,
        on_written: Callable | None = None,
        batch_dir_sync: bool = False,
        batch_sync: bool | None = None,
    ):
        self.store = store
        self.fsync = fsync
        # one directory fsync per batch instead of per file: opt-in, no win where measured (docs/performance.md,
        # "Extraction write path on CPU")
        self.batch_dir_sync = batch_dir_sync
        # all of a batch's files in flight before the first fsync (HiddenStateStore.write_samples); default:
        # eagle3ops.store.write.BATCH_SYNC ($EAGLE3OPS_BATCH_SYNC)
        self.batch_sync = _write.BATCH_SYNC if batch_sync is None else batch_sync
        self.checksum = checksum
        self.q: queue.Queue[WriterJob | None] = queue.Queue(maxsize=depth)
        self.stats = _WriterStats()
        self.on_written = on_written
        self._lock = threading.Lock()
        self._finished = False
        self._threads = [
            threading.Thread(target=self._run, name=f"eagle3ops-writer-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, job: WriterJob) -> None:
        while True:
            if self.stats.error is not None:
                raise self.stats.error
            try:
                self.q.put(job, timeout=0.5)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        while True:
            job = self.q.get()
            if job is None:
                return
            try:
                if self.stats.error is None:
                    self._write(job)
            except BaseException as e:  # surfaced to the main thread by submit()/finish()
                with self._lock:
                    self.stats.error = self.stats.error or e
            finally:
                if job.release is not None:
                    job.release()

    def _write(self, job: WriterJob) -> None:
        if job.event is not None:
            job.event.synchronize()
        scales = job.scales or [None] * len(job.indices)
        samples = list(zip(job.indices, job.token_ids, job.states, scales, strict=True))
        entries, t_ser, t_write = write_batch(
            self.store,
            samples,
            fsync=self.fsync,
            checksum=self.checksum,
            batch_sync=self.batch_sync,
            batch_dir_sync=self.batch_dir_sync,
        )
        self._record(entries, t_ser, t_write)

    def _record(self, entries: list, t_ser: float, t_write: float) -> None:
        self.store.append_manifest(entries)
        nbytes = sum(e.nbytes for e in entries)
        ntok = sum(e.seq_len for e in entries)
        with self._lock:
            st = self.stats
            st.written += len(entries)
            st.bytes += nbytes
            st.tokens += ntok
            st.serialize_seconds += t_ser
            st.write_seconds += t_write
        if self.on_written:
            self.on_written(len(entries), ntok)

    def finish(self) -> None:
        if not self._finished:  # a second call (the error path after a failed finish) only re-raises
            self._finished = True
            for _ in self._threads:
                self.q.put(None)
            for t in self._threads:
                t.join()
        if self.stats.error is not None:
            raise self.stats.error


def _disk_full(e: OSError, path, size: int) -> DiskSpaceError:
    return DiskSpaceError(
        f"disk full while writing {path} ({human_bytes(size)} sample): "
        f"{e.strerror}. No partial file was left; free space or move the data directory, then "
        "re-run: finished samples are kept and extraction resumes."
    )


def write_batch(
    store: HiddenStateStore,
    samples: list,
    *,
    fsync: bool,
    checksum: bool,
    batch_sync: bool,
    batch_dir_sync: bool = False,
) -> tuple[list, float, float]:
    """Write one batch of samples, ``(index, token_ids, states, scales or None)`` on the CPU, as sample files
    (:func:`eagle3ops.store.sample_parts`); returns their manifest entries, for the caller to append only now
    that every file of the batch is renamed into place (and durable, with ``fsync``), and the seconds spent
    serialising and writing. What both backends' writer threads do with a batch.

    ``batch_sync`` (with ``fsync``): all of the batch's files in flight before the first fsync
    (:meth:`HiddenStateStore.write_samples`). Otherwise one file at a time, each with its own directory fsync, or
    with ``batch_dir_sync`` one directory fsync for the batch. A full disk raises :class:`DiskSpaceError` naming
    the file being written and its size."""
    t0 = time.perf_counter()
    if batch_sync and fsync:
        parts = [(idx, sample_parts(tok, hs, sc), int(tok.shape[0])) for idx, tok, hs, sc in samples]
        t1 = time.perf_counter()
        try:
            entries = store.write_samples(parts, checksum=checksum)
        except OSError as e:
            if (
                e.errno == errno.ENOSPC
            ):  # name the file being written (atomic_write_many sets it) and its size
                sizes = {str(store.path(i)): sum(len(p) for p in payload) for i, payload, _ in parts}
                path = str(e.filename or store.dir)
                raise _disk_full(e, path, sizes.get(path, max(sizes.values()))) from e
            raise
        return entries, t1 - t0, time.perf_counter() - t1
    entries = []
    t_ser = t_write = 0.0
    for idx, tok, hs, sc in samples:
        t0 = time.perf_counter()
        payload = sample_parts(tok, hs, sc)
        t1 = time.perf_counter()
        try:
            entry = store.write_sample(
                idx,
                payload,
                int(tok.shape[0]),
                fsync=fsync,
                checksum=checksum,
                sync_dir=fsync and not batch_dir_sync,
            )
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise _disk_full(e, store.path(idx), sum(len(p) for p in payload)) from e
            raise
        entries.append(entry)
        t_ser += t1 - t0
        t_write += time.perf_counter() - t1
    # manifest lines only after every file of the batch is renamed into place (and, with fsync, after one
    # directory fsync makes all of the batch's renames durable)
    if fsync and batch_dir_sync and entries:
        t1 = time.perf_counter()
        fsync_dir(store.dir)
        t_write += time.perf_counter() - t1
    return entries, t_ser, t_write
