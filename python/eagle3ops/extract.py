"""Hidden-state extraction, transformers backend (CPU or CUDA).

For every prepared row i, the target's hidden states at the aux layers (input-of-layer convention, the one
SGLang, vLLM and speculators use) plus the **pre-norm** output of the last decoder layer are written as
``hidden_states/hs_{i}.safetensors`` through :mod:`eagle3ops.store` (atomic files + manifest).

Pipeline per batch: rows sorted by length are packed into batches under a padded-token budget; the forward
runs the base model only (no lm_head); forward hooks capture the states; the [B, L, K+1, H] block is cast to
the store dtype on the device, copied to (pinned) CPU memory asynchronously and handed to a writer thread that
serialises and writes while the next batch computes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import layers
from eagle3ops import store as _store
from eagle3ops.store import (
    DTYPE_SIZES,
    DiskSpaceError,
    HiddenStateStore,
    ResumePlan,
    StoreError,  # noqa: F401 - re-exported
    fsync_dir,
    human_bytes,
    meta_decision,
    preflight_disk,
    sample_nbytes,
)


class ExtractError(RuntimeError):
    """A user-actionable extraction error."""


# ----------------------------------------------------------------------------------------------------------
# layer ids: the rule lives in eagle3ops.layers; this name stays for extract's callers (sglang_client, tests)
# ----------------------------------------------------------------------------------------------------------
def resolve_layer_ids(
    num_layers: int, layer_ids: Sequence[int] | None = None, convention: str = "input"
) -> list[int]:
    """:func:`eagle3ops.layers.resolve` (default or given ids, input convention, checked, sorted), its
    refusal as an :class:`ExtractError`."""
    try:
        return layers.resolve(num_layers, layer_ids, convention)
    except layers.LayerIdError as e:
        raise ExtractError(str(e)) from None


# ----------------------------------------------------------------------------------------------------------
# dataset + model facts (cheap: no weights loaded)
# ----------------------------------------------------------------------------------------------------------
def _seq_lens_from_arrow(data_dir: Path) -> list[int] | None:
    """``seq_len`` straight from the Arrow files that ``datasets.save_to_disk`` wrote (``state.json`` lists
    them; each is an IPC stream, memory-mapped: no token data is read). ``None`` when the layout is not the
    plain one, so the caller falls back to ``datasets``. Importing ``datasets`` costs 1-3 s per process,
    which dominated resume planning (docs/performance.md, "Resume")."""
    try:
        state = json.loads((data_dir / "state.json").read_text())
        files = [data_dir / f["filename"] for f in state["_data_files"]]
        if not files or state.get("_indices_data_files"):
            return None
        import pyarrow as pa

        out: list[int] = []
        for f in files:
            with pa.memory_map(str(f)) as src:
                table = pa.ipc.open_stream(src).read_all()
            if "seq_len" not in table.column_names:
                return None
            out.extend(int(x) for x in table.column("seq_len").to_pylist())
        return out
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None


def load_seq_lens(data_dir: str | os.PathLike) -> list[int]:
    """The ``seq_len`` column of the prepared Arrow dataset (no token data read)."""
    fast = _seq_lens_from_arrow(Path(data_dir))
    if fast is not None:
        return fast
    from datasets import load_from_disk

    try:
        ds = load_from_disk(str(data_dir))
    except FileNotFoundError as e:
        raise ExtractError(
            f"{data_dir}: no prepared dataset here ({e}). Run the prepare phase first "
            "(ansible-playbook site.yml --tags prepare, or `eagle3ops prepare`)."
        ) from e
    if "seq_len" not in ds.column_names:
        raise ExtractError(
            f"{data_dir}: dataset has no seq_len column (columns: {ds.column_names}); re-run prepare"
        )
    return [int(x) for x in ds.data.column("seq_len").to_pylist()]


def model_facts(model_path: str | os.PathLike, *, content_hash: bool = False) -> dict:
    """num_layers, hidden_size and a fingerprint of the target, from its config and its weight files' sizes,
    mtimes and safetensors headers (``content_hash``: also a hash of every weight byte).

    Plain ``config.json`` files (top-level or ``text_config`` keys ``num_hidden_layers`` and ``hidden_size``)
    are read as JSON; anything else goes through ``transformers.AutoConfig`` (importing transformers costs
    3-9 s per process on the 2-core box, which dominated ``extract --plan``)."""
    p = Path(model_path)
    if not p.exists():
        raise ExtractError(
            f"target model path {model_path} does not exist. Set extract_model_path (or --model) to a local "
            "model directory; hubs are not reachable from here (HF_HUB_OFFLINE=1)."
        )
    facts = _facts_from_config_json(p / "config.json")
    if facts is None:
        from transformers import AutoConfig

        try:
            cfg = AutoConfig.from_pretrained(str(p))
        except (OSError, ValueError) as e:
            raise ExtractError(f"{model_path}: cannot read the model config ({e})") from e
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        facts = (int(text_cfg.num_hidden_layers), int(text_cfg.hidden_size), getattr(cfg, "model_type", None))
    h = hashlib.sha256()
    cfg_file = p / "config.json"
    if cfg_file.exists():
        h.update(cfg_file.read_bytes())
    weights: dict[str, list] = {}
    for f in sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin")):
        st = f.stat()
        h.update(
            f"{f.name}:{st.st_size}".encode()
        )  # the fingerprint of metas before issue 16: kept as it was
        weights[f.name] = [st.st_size, st.st_mtime_ns, _weights_header_digest(f)]
    out = {
        "num_layers": facts[0],
        "hidden_size": facts[1],
        "model_type": facts[2],
        "model_fingerprint": h.hexdigest()[:16],
        # per weight file: size, mtime (ns), sha256 of its safetensors header (None for .bin/unreadable): cheap
        # (no tensor bytes read) and it sees weights replaced in place by other weights of the same size
        "model_weights": weights,
    }
    if content_hash:
        out["model_content_hash"] = _weights_content_hash(p, sorted(weights))
    return out


def _weights_header_digest(path: Path) -> str | None:
    """sha256 (16 hex) of a safetensors file's length + JSON header (names, dtypes, shapes, offsets, metadata),
    None when it has none (``.bin``) or it does not parse as one."""
    if path.suffix != ".safetensors":
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return None
            n = int.from_bytes(head, "little")
            if n > 100 * 2**20:
                return None
            body = f.read(n)
    except OSError:
        return None
    return hashlib.sha256(head + body).hexdigest()[:16] if len(body) == n else None


def _weights_content_hash(p: Path, names: list[str]) -> dict:
    """The full content of every weight file (``--model-hash``): xxh3-64 (sha256 without xxhash), with a
    progress line per file on stderr; reads every byte of the weights (terabytes for Kimi-K2.5: on request)."""
    from eagle3ops.store import _xxh3, file_hashes

    algo = "xxh3_64" if _xxh3() is not None else "sha256"
    files = {}
    for name in names:
        t0 = time.monotonic()
        if algo == "xxh3_64":
            files[name] = format(file_hashes(p / name, {"h"})["h"], "016x")
        else:
            hh = hashlib.sha256()
            with open(p / name, "rb") as f:
                while chunk := f.read(8 << 20):
                    hh.update(chunk)
            files[name] = hh.hexdigest()
        print(f"model hash: {name} in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    return {"algo": algo, "files": files}


def _facts_from_config_json(path: Path) -> tuple[int, int, str | None] | None:
    """(num_layers, hidden_size, model_type) from a config.json without transformers, or None to fall back."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict) or any(k in cfg for k in ("text_encoder", "decoder", "generator")):
        return None  # sub-configs transformers' get_text_config() would pick: let it
    text = layers.text_config(cfg)
    try:
        return int(text["num_hidden_layers"]), int(text["hidden_size"]), cfg.get("model_type")
    except (KeyError, TypeError, ValueError):
        return None


def dataset_fingerprint(data_dir: str | os.PathLike) -> str | None:
    """The prepare step's fingerprint (prepare_meta.json), else the Arrow state's fingerprint."""
    d = Path(data_dir)
    meta = d / "prepare_meta.json"
    if meta.exists():
        fp = json.loads(meta.read_text()).get("fingerprint")
        if fp:
            return str(fp)
    state = d / "state.json"
    if state.exists():
        return json.loads(state.read_text()).get("_fingerprint")
    return None


# ----------------------------------------------------------------------------------------------------------
# serialisation (shared with the SGLang hook: byte-identical files whatever the backend)
# ----------------------------------------------------------------------------------------------------------
_ST_NAMES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "int64": "I64",
    "float8_e4m3fn": "F8_E4M3",
}


FP8_DTYPE = "float8_e4m3fn"
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# the key hs_connectors 0.9.0 (speculators' loader, `hidden_states_backend: fp8`) dequantises with
FP8_SCALES_KEY = "hidden_states_scales"


def quantize_fp8(states):
    """``states`` [..., K+1, H] (any float dtype, any device) -> (float8_e4m3fn [..., K+1, H], float32 scale
    [..., K+1, 1]) with one scale per row (one token's one state): ``scale = amax(|row|) / 448``.

    Stored as ``hidden_states`` + ``hidden_states_scales``: exactly what ``hs_connectors.FP8Transfer`` (selected in
    speculators 0.9.0 by ``data.hidden_states_backend: fp8``) reads and dequantises as ``fp8.to(bf16) * scale``
    (its own writer uses one scale per token, shape [T, 1, 1]; a [T, K+1, 1] scale broadcasts the same way and
    keeps early layers, far smaller than the last one, from losing their precision). A non-finite row gives a
    non-finite scale, so checking the scales checks the states."""
    import torch

    x = states.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (x / scale).to(torch.float8_e4m3fn), scale


def sample_parts(token_ids, hidden_states, scales=None) -> list:
    """One sample as safetensors, without copying the tensors: [header, token_ids bytes, (scales bytes,)
    hidden_states bytes].

    ``token_ids`` [T] int64 first (8-byte aligned), then for fp8 ``hidden_states_scales`` [T, K+1, 1] float32,
    then ``hidden_states`` [T, K+1, H]; the header JSON is padded with spaces to a multiple of 8, as the
    safetensors format asks. Any safetensors reader loads it.
    """
    import torch

    if token_ids.dtype != torch.int64:
        token_ids = token_ids.to(torch.int64)
    if token_ids.shape[0] != hidden_states.shape[0]:
        raise ValueError(
            f"token_ids has {token_ids.shape[0]} tokens but hidden_states {hidden_states.shape[0]}"
        )
    tok = token_ids.contiguous().view(torch.uint8).numpy()
    hs = hidden_states.contiguous().view(torch.uint8).numpy()
    n_tok, n_hs = tok.nbytes, hs.nbytes
    header = {"token_ids": {"dtype": "I64", "shape": list(token_ids.shape), "data_offsets": [0, n_tok]}}
    bufs = [memoryview(tok).cast("B")]
    off = n_tok
    if scales is not None:
        sc = scales.to(torch.float32).contiguous().view(torch.uint8).numpy()
        header[FP8_SCALES_KEY] = {
            "dtype": "F32",
            "shape": list(scales.shape),
            "data_offsets": [off, off + sc.nbytes],
        }
        bufs.append(memoryview(sc.reshape(-1)).cast("B"))
        off += sc.nbytes
    header["hidden_states"] = {
        "dtype": _ST_NAMES[str(hidden_states.dtype).removeprefix("torch.")],
        "shape": list(hidden_states.shape),
        "data_offsets": [off, off + n_hs],
    }
    bufs.append(memoryview(hs.reshape(-1)).cast("B"))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little") + text, *bufs]


def serialize_sample(token_ids, hidden_states, scales=None) -> bytes:
    """safetensors bytes of one sample (``token_ids`` [T] int64, ``hidden_states`` [T, K+1, H], for fp8 also
    ``hidden_states_scales`` [T, K+1, 1]).

    The same bytes every backend writes (transformers here, the SGLang hook): see :func:`sample_parts`.
    """
    return b"".join(bytes(p) for p in sample_parts(token_ids, hidden_states, scales))


# ----------------------------------------------------------------------------------------------------------
# batching
# ----------------------------------------------------------------------------------------------------------
def make_batches(
    indices: Sequence[int], seq_lens: Sequence[int], max_batch_tokens: int, max_batch_size: int
) -> list[list[int]]:
    """Length-sorted batches whose padded size (B × longest) stays under ``max_batch_tokens``."""
    order = sorted(indices, key=lambda i: (-seq_lens[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = seq_lens[cur[0]] if cur else seq_lens[i]
        if cur and ((len(cur) + 1) * longest > max_batch_tokens or len(cur) >= max_batch_size):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


# ----------------------------------------------------------------------------------------------------------
# capture
# ----------------------------------------------------------------------------------------------------------
def decoder_layers(model):
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ExtractError(f"{type(model).__name__}: cannot find the decoder layers (model.model.layers)")
    return base, layers


class StateCapture:
    """Forward hooks that capture the inputs of the aux layers and the output of the last layer."""

    def __init__(self, model, layer_ids: Sequence[int]):
        self.base, layers = decoder_layers(model)
        self.layer_ids = list(layer_ids)
        self.captured: dict[int, object] = {}
        self._handles = []
        for lid in self.layer_ids:
            self._handles.append(layers[lid].register_forward_pre_hook(self._pre_hook(lid), with_kwargs=True))
        self._handles.append(layers[len(layers) - 1].register_forward_hook(self._post_hook))

    def _pre_hook(self, lid):
        def hook(_module, args, kwargs):
            self.captured[lid] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _post_hook(self, _module, _args, output):
        self.captured["last"] = output[0] if isinstance(output, (tuple, list)) else output

    def stacked(self):
        """[B, L, K+1, H]: the aux states in layer order, then the pre-norm last state."""
        import torch

        parts = [self.captured[lid] for lid in self.layer_ids] + [self.captured["last"]]
        self.captured = {}
        return torch.stack(parts, dim=2)

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []


def target_limits(model) -> dict:
    """The loaded target's vocabulary size and position limit (None: no limit in its config)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return {
        "vocab": int(model.get_input_embeddings().num_embeddings),
        "max_positions": getattr(cfg, "max_position_embeddings", None),
    }


def load_model(model_path: str, device: str, compute_dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, compute_dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    model.to(device)
    model.eval()
    return model


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ExtractError(
            f"device {device!r} asked for, but torch sees no CUDA device; use device=cpu or auto"
        )
    return device


# ----------------------------------------------------------------------------------------------------------
# the writer thread
# ----------------------------------------------------------------------------------------------------------
@dataclass
class _Job:
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
    """A few reusable page-locked host buffers (cudaHostAlloc per batch costs more than the copy itself)."""

    def __init__(self, count: int, numel: int, dtype):
        import torch

        self.numel = numel
        self.free: queue.Queue = queue.Queue()
        for _ in range(count):
            self.free.put(torch.empty(numel, dtype=dtype, pin_memory=True))

    def take(self, shape):
        import math

        n = math.prod(shape)
        if n > self.numel:
            raise ValueError(f"batch block of {n} elements exceeds the pinned buffer ({self.numel})")
        buf = self.free.get()
        return buf, buf[:n].view(shape)

    def give(self, buf) -> None:
        self.free.put(buf)


def _give_both(pool, buf, scale_pool, sbuf) -> None:
    pool.give(buf)
    scale_pool.give(sbuf)


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
        # one directory fsync per batch instead of per file: opt-in, it measured slower on the VM disk here
        self.batch_dir_sync = batch_dir_sync
        # all of a batch's files in flight before the first fsync (HiddenStateStore.write_samples); default:
        # eagle3ops.store.BATCH_SYNC ($EAGLE3OPS_BATCH_SYNC)
        self.batch_sync = _store.BATCH_SYNC if batch_sync is None else batch_sync
        self.checksum = checksum
        self.q: queue.Queue[_Job | None] = queue.Queue(maxsize=depth)
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

    def submit(self, job: _Job) -> None:
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

    def _disk_full(self, e: OSError, path, size: int) -> DiskSpaceError:
        return DiskSpaceError(
            f"disk full while writing {path} ({human_bytes(size)} sample): "
            f"{e.strerror}. No partial file was left; free space or move the data directory, then "
            "re-run: finished samples are kept and extraction resumes."
        )

    def _write_batch(self, job: _Job) -> tuple[list, float, float]:
        """The batch-sync path (only with fsync): serialize all, then one HiddenStateStore.write_samples call."""
        scales = job.scales or [None] * len(job.indices)
        t0 = time.perf_counter()
        samples = [
            (idx, sample_parts(tok, hs, sc), int(tok.shape[0]))
            for idx, tok, hs, sc in zip(job.indices, job.token_ids, job.states, scales, strict=True)
        ]
        t1 = time.perf_counter()
        try:
            entries = self.store.write_samples(samples, checksum=self.checksum)
        except OSError as e:
            if e.errno == 28:  # ENOSPC: name the file being written (atomic_write_many sets it) and its size
                sizes = {str(self.store.path(i)): sum(len(p) for p in parts) for i, parts, _ in samples}
                path = str(e.filename or self.store.dir)
                raise self._disk_full(e, path, sizes.get(path, max(sizes.values()))) from e
            raise
        return entries, t1 - t0, time.perf_counter() - t1

    def _write(self, job: _Job) -> None:
        if job.event is not None:
            job.event.synchronize()
        if self.batch_sync and self.fsync:
            entries, t_ser, t_write = self._write_batch(job)
            self._record(entries, t_ser, t_write)
            return
        entries = []
        t_ser = t_write = 0.0
        scales = job.scales or [None] * len(job.indices)
        for idx, tok, hs, sc in zip(job.indices, job.token_ids, job.states, scales, strict=True):
            t0 = time.perf_counter()
            parts = sample_parts(tok, hs, sc)
            t1 = time.perf_counter()
            try:
                entry = self.store.write_sample(
                    idx,
                    parts,
                    int(tok.shape[0]),
                    fsync=self.fsync,
                    checksum=self.checksum,
                    sync_dir=self.fsync and not self.batch_dir_sync,
                )
            except OSError as e:
                if e.errno == 28:  # ENOSPC
                    raise self._disk_full(e, self.store.path(idx), sum(len(p) for p in parts)) from e
                raise
            entries.append(entry)
            t_ser += t1 - t0
            t_write += time.perf_counter() - t1
        # manifest lines only after every file of the batch is renamed into place (and, with fsync, after one
        # directory fsync makes all of the batch's renames durable)
        if self.fsync and self.batch_dir_sync and entries:
            t1 = time.perf_counter()
            fsync_dir(self.store.dir)
            t_write += time.perf_counter() - t1
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


# ----------------------------------------------------------------------------------------------------------
# the extraction run
# ----------------------------------------------------------------------------------------------------------
@dataclass
class ExtractConfig:
    data_dir: str
    model_path: str
    layer_ids: list[int] | None = None
    layer_convention: str = "input"
    dtype: str = "bfloat16"  # stored dtype; float8_e4m3fn = e4m3 + a float32 scale per row (see quantize_fp8)
    compute_dtype: str = "auto"  # bfloat16 on CUDA, float32 on CPU
    device: str = "auto"
    max_batch_tokens: int = 16384
    max_batch_size: int = 64
    world_size: int = 1
    rank: int = 0
    fsync: bool = True
    writer_threads: int = 2
    # xxh3-64 of every file in its manifest line, over the bytes the writer holds (docs/performance.md)
    checksum: bool = True
    verify: str = (
        "size"  # the plan's check of finished files: size (cheap, headers) or checksum (re-reads all)
    )
    on_model_change: str = "refuse"  # refuse | discard (move hidden_states aside) | accept (same model)
    model_hash: bool = False  # hash every weight byte for the model check (slow; on request)
    margin_frac: float = 0.05
    margin_bytes: int = 64 * 1024 * 1024
    check_finite: bool = True
    limit: int | None = None  # only the first N rows (testing / smoke runs)
    progress: bool = True
    extra: dict = field(default_factory=dict)
    # several hosts (docs/scale.md): the global ranks this host's store covers, of ``world_size``; None = the
    # one rank ``rank`` (or every row with world_size 1)
    ranks: list[int] | None = None


def build_meta(cfg: ExtractConfig, facts: dict, layer_ids: list[int], num_rows: int) -> dict:
    return {
        "format": "speculators-0.9.0-offline",
        "layer_ids": layer_ids,
        "layer_convention": "input",
        "last_state": "pre-norm output of the last decoder layer",
        "num_layers": facts["num_layers"],
        "hidden_size": facts["hidden_size"],
        "num_states": len(layer_ids) + 1,
        "dtype": cfg.dtype,
        "model_path": str(Path(cfg.model_path).resolve()),
        "model_type": facts.get("model_type"),
        "model_fingerprint": facts["model_fingerprint"],
        "model_weights": facts.get("model_weights"),
        **({"model_content_hash": facts["model_content_hash"]} if facts.get("model_content_hash") else {}),
        "dataset_fingerprint": dataset_fingerprint(cfg.data_dir),
        "num_rows": num_rows,
        "backend": "transformers",
    }


def rank_indices(num_rows: int, world_size: int, rank: int, limit: int | None = None) -> list[int]:
    """Disjoint strided shards: rank r takes rows r, r+W, r+2W, ... (balanced lengths after prepare's shuffle)."""
    n = num_rows if limit is None else min(limit, num_rows)
    if not 0 <= rank < world_size:
        raise ExtractError(f"rank {rank} is outside world size {world_size}")
    return list(range(rank, n, world_size))


def shard_indices(
    num_rows: int, world_size: int, ranks: Sequence[int], limit: int | None = None
) -> list[int]:
    """The rows of several ranks of ``world_size`` (a host's share when extraction spans several hosts), sorted."""
    out: list[int] = []
    for r in ranks:
        out.extend(rank_indices(num_rows, world_size, r, limit))
    return sorted(out)


def config_indices(cfg: ExtractConfig, num_rows: int) -> list[int]:
    if cfg.ranks:
        return shard_indices(num_rows, cfg.world_size, cfg.ranks, cfg.limit)
    return rank_indices(num_rows, cfg.world_size, cfg.rank, cfg.limit)


SHARD_FILE = "shard.json"


def shard_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / "hidden_states" / SHARD_FILE


def read_shard(data_dir: str | os.PathLike) -> dict | None:
    p = shard_path(data_dir)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ExtractError(
            f"{p}: unreadable shard record ({e}); restore it or remove it to start the record anew"
        ) from e


def check_shard(data_dir: str | os.PathLike, world_size: int, ranks: list[int], *, write: bool) -> dict:
    """The store of one host of a multi-host extraction records which global ranks it covers
    (``hidden_states/shard.json``); a later run with other ranks or another world size is refused, because
    the strided shards would move: rows another host already holds would be extracted here again, and rows
    of this store would be given to another host. Returns the record (written when ``write`` and new)."""
    import socket

    old = read_shard(data_dir)
    want = {"world_size": int(world_size), "ranks": [int(r) for r in ranks]}
    if old is not None:
        if old.get("world_size") != want["world_size"] or old.get("ranks") != want["ranks"]:
            raise ExtractError(
                f"{shard_path(data_dir)}: this store holds global ranks {old.get('ranks')} of world size "
                f"{old.get('world_size')} (host {old.get('host')}), but this run is ranks {want['ranks']} of "
                f"{want['world_size']}: the hosts sharing the rows (extract_shard_hosts) or their worker counts "
                "changed, which would extract rows another host already holds and leave some of these unused. "
                "Run with the inventory of the first run, or gather every host's store into one and extract "
                "that with one host (docs/scale.md, 'Changing the hosts'). Nothing was extracted."
            )
        return old
    rec = {**want, "host": socket.gethostname(), "created_at": round(time.time(), 3)}
    if write:
        shard_path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        _store.atomic_write_json(shard_path(data_dir), rec)
    return rec


def _damaged_report(store: HiddenStateStore, damaged: dict[int, str]) -> dict:
    return {str(i): {"file": str(store.path(i)), "reason": r} for i, r in sorted(damaged.items())}


def plan_extraction(cfg: ExtractConfig) -> dict:
    """What a run would do, without loading weights or writing anything (check mode)."""
    seq_lens = load_seq_lens(cfg.data_dir)
    facts = model_facts(cfg.model_path, content_hash=cfg.model_hash)
    layer_ids = resolve_layer_ids(facts["num_layers"], cfg.layer_ids, cfg.layer_convention)
    store = HiddenStateStore(cfg.data_dir, rank=cfg.rank)
    meta = build_meta(cfg, facts, layer_ids, len(seq_lens))
    old = store.read_meta()
    action = "ok"
    if old is not None:  # same refusal as a real run, but read-only
        action, _ = meta_decision(old, meta, store.meta_path, cfg.on_model_change)
    if cfg.ranks:
        check_shard(cfg.data_dir, cfg.world_size, cfg.ranks, write=False)
    indices = config_indices(cfg, len(seq_lens))
    num_states = len(layer_ids) + 1
    if action == "discard":  # the run moves the old states aside and starts over: everything is to do
        plan = ResumePlan(
            remaining=list(indices),
            done=0,
            adopted=0,
            invalid={},
            torn_lines=[],
            bytes_needed=sum(
                sample_nbytes(seq_lens[i], num_states, facts["hidden_size"], cfg.dtype) for i in indices
            ),
            tokens_remaining=sum(seq_lens[i] for i in indices),
        )
    else:
        plan = store.plan(
            seq_lens,
            num_states=num_states,
            hidden_size=facts["hidden_size"],
            dtype=cfg.dtype,
            indices=indices,
            adopt=False,
            verify=cfg.verify,
        )
    free = preflight_disk(store.dir, 0)["free_bytes"]
    return {
        "total": len(indices),
        "done_before": plan.done,  # plan.done already counts adopted files
        "adoptable": plan.adopted,
        "to_extract": len(plan.remaining),
        "tokens_to_extract": plan.tokens_remaining,
        "bytes_needed": plan.bytes_needed,
        "free_bytes": free,
        "fits": plan.bytes_needed * (1 + cfg.margin_frac) + cfg.margin_bytes <= free or not plan.remaining,
        "invalid_files": {str(k): v for k, v in plan.invalid.items()},
        "damaged": len(plan.damaged),
        "damaged_files": _damaged_report(store, plan.damaged),
        "duplicate_manifest_lines": plan.duplicates,
        "unchecked_files": plan.unchecked,
        "verify": cfg.verify,
        "discards_store": action == "discard",
        "layer_ids": layer_ids,
        "num_layers": facts["num_layers"],
        "hidden_size": facts["hidden_size"],
        "dtype": cfg.dtype,
        "world_size": cfg.world_size,
        "ranks": list(cfg.ranks) if cfg.ranks else [cfg.rank],
    }


def _progress_reporter(total_samples: int, total_tokens: int, enabled: bool):
    """A rich progress bar on a terminal, periodic log lines otherwise. Returns (advance, close)."""
    if not enabled or total_samples == 0:
        return (lambda n, t: None), (lambda: None)
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        prog = Progress(
            TextColumn("extract"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            transient=False,
            console=None,
        )
        task = prog.add_task("extract", total=total_samples, rate="")
        prog.start()
        t0 = time.monotonic()
        tok = [0]

        def advance(n, t):
            tok[0] += t
            rate = tok[0] / max(time.monotonic() - t0, 1e-9)
            prog.update(task, advance=n, rate=f"{rate:,.0f} tok/s")

        return advance, prog.stop
    t0 = time.monotonic()
    state = {"n": 0, "t": 0, "last": t0}

    def advance(n, t):
        state["n"] += n
        state["t"] += t
        now = time.monotonic()
        if now - state["last"] >= 10 or state["n"] == total_samples:
            state["last"] = now
            rate = state["t"] / max(now - t0, 1e-9)
            eta = (total_tokens - state["t"]) / rate if rate else float("inf")
            print(
                f"extract: {state['n']}/{total_samples} samples, {rate:,.0f} tok/s, ETA {eta:,.0f} s",
                file=sys.stderr,
                flush=True,
            )

    return advance, (lambda: None)


def run_extraction(cfg: ExtractConfig) -> dict:
    """Extract every remaining row of this rank; resumable; returns counts."""
    t_start = time.perf_counter()
    seq_lens = load_seq_lens(cfg.data_dir)
    facts = model_facts(cfg.model_path, content_hash=cfg.model_hash)
    layer_ids = resolve_layer_ids(facts["num_layers"], cfg.layer_ids, cfg.layer_convention)
    num_states, hidden = len(layer_ids) + 1, facts["hidden_size"]
    if cfg.dtype not in DTYPE_SIZES:
        raise ExtractError(
            f"store dtype {cfg.dtype!r} is not supported here; use bfloat16, float16, float32 or {FP8_DTYPE}"
        )
    fp8 = cfg.dtype == FP8_DTYPE

    store = HiddenStateStore(cfg.data_dir, rank=cfg.rank)
    discarded = store.ensure_meta(
        build_meta(cfg, facts, layer_ids, len(seq_lens)), on_model_change=cfg.on_model_change
    )
    removed_tmp = store.clean_temp_files()
    indices = rank_indices(len(seq_lens), cfg.world_size, cfg.rank, cfg.limit)
    # damaged files are moved aside and their entries dropped by the one process that owns the directory: a
    # single run, or the parent of --workers N before it starts them (repair_store); a worker only reports
    plan = store.plan(
        seq_lens,
        num_states=num_states,
        hidden_size=hidden,
        dtype=cfg.dtype,
        indices=indices,
        verify=cfg.verify,
        repair=cfg.world_size == 1,
    )
    result = {
        "total": len(indices),
        "done_before": plan.done,
        "adopted": plan.adopted,
        "written": 0,
        "failed": 0,
        "tokens": 0,
        "bytes": 0,
        "seconds": 0.0,
        "layer_ids": layer_ids,
        "num_layers": facts["num_layers"],
        "hidden_size": hidden,
        "dtype": cfg.dtype,
        "rank": cfg.rank,
        "world_size": cfg.world_size,
        "removed_temp_files": len(removed_tmp),
        "invalid_files_replaced": sorted(plan.invalid),
        "damaged": len(plan.damaged),
        "damaged_files": _damaged_report(store, plan.damaged),
        "moved_aside": plan.moved_aside,
        "duplicate_manifest_lines": plan.duplicates,
        "unchecked_files": plan.unchecked,
        "verify": cfg.verify,
        "discarded_store": discarded,
        "torn_manifest_lines": plan.torn_lines,
        "data_dir": str(cfg.data_dir),
    }
    if not plan.remaining:
        result["seconds"] = round(time.perf_counter() - t_start, 3)
        return result
    import torch  # only now: a converged re-run never pays its import (3-9 s on the loaded 2-core box)

    result["preflight"] = preflight_disk(
        store.dir, plan.bytes_needed, margin_frac=cfg.margin_frac, margin_bytes=cfg.margin_bytes
    )

    from datasets import load_from_disk

    ds = load_from_disk(str(cfg.data_dir)).with_format("numpy", columns=["input_ids"])
    device = resolve_device(cfg.device)
    compute_dtype = (
        cfg.compute_dtype
        if cfg.compute_dtype != "auto"
        else ("bfloat16" if device.startswith("cuda") else "float32")
    )
    model = load_model(cfg.model_path, device, compute_dtype)
    limits = target_limits(model)
    too_long = [
        i for i in plan.remaining if limits["max_positions"] and seq_lens[i] > limits["max_positions"]
    ]
    if too_long:
        raise ExtractError(
            f"{cfg.data_dir}: {len(too_long)} rows are longer than the target's max_position_embeddings "
            f"{limits['max_positions']} (rows {too_long[:20]}, up to {max(seq_lens[i] for i in too_long)} "
            f"tokens): past its context length the target gives states it was never trained for. Re-run prepare with --max-length "
            f"{limits['max_positions']} or less (prepare_max_length). Nothing was extracted for them."
        )
    capture = StateCapture(model, layer_ids)
    store_dtype = getattr(torch, cfg.dtype)
    cuda = device.startswith("cuda")
    copy_stream = torch.cuda.Stream() if cuda else None

    batches = make_batches(plan.remaining, seq_lens, cfg.max_batch_tokens, cfg.max_batch_size)
    advance, close_progress = _progress_reporter(len(plan.remaining), plan.tokens_remaining, cfg.progress)
    writer = SampleWriter(
        store, fsync=cfg.fsync, threads=cfg.writer_threads, checksum=cfg.checksum, on_written=advance
    )
    depth = 3
    pool = scale_pool = None
    if cuda:
        max_block = max(len(b) * max(seq_lens[i] for i in b) for b in batches) * num_states * hidden
        pool = PinnedPool(depth + cfg.writer_threads + 1, max_block, store_dtype)
        if fp8:
            scale_pool = PinnedPool(depth + cfg.writer_threads + 1, max_block // hidden, torch.float32)
    writer.start()
    ok = False  # the manifest is closed in `finally`; its error must not hide the one that got us there
    t_compute = 0.0
    t_loop = time.perf_counter()
    loop_started_at = time.time()  # wall clock: workers' loops are merged into one span
    try:
        with torch.inference_mode():
            for batch in batches:
                rows = ds[batch]["input_ids"]
                lens = [seq_lens[i] for i in batch]
                for i, r, n in zip(batch, rows, lens, strict=True):
                    if len(r) != n:
                        raise ExtractError(
                            f"{cfg.data_dir}: row {i} has {len(r)} input_ids but seq_len {n}; re-run prepare"
                        )
                oov = [
                    (i, int(r.max())) for i, r in zip(batch, rows, strict=True) if r.max() >= limits["vocab"]
                ]
                if oov:
                    raise ExtractError(
                        f"{cfg.data_dir}: rows {[i for i, _ in oov][:20]} hold token ids up to {max(t for _, t in oov)}"
                        f" but the target {cfg.model_path} has a vocabulary of {limits['vocab']}: the data was "
                        "prepared with another tokenizer. Re-run prepare with this model (prepare_model_path = "
                        "extract_model_path). Rows finished before are kept."
                    )
                longest = max(lens)
                ids = torch.zeros((len(batch), longest), dtype=torch.long)
                mask = torch.zeros((len(batch), longest), dtype=torch.long)
                for b, r in enumerate(rows):
                    ids[b, : len(r)] = torch.as_tensor(r, dtype=torch.long)
                    mask[b, : len(r)] = 1
                t0 = time.perf_counter()
                capture.base(
                    input_ids=ids.to(device, non_blocking=True),
                    attention_mask=mask.to(device, non_blocking=True),
                    use_cache=False,
                )
                scales = None
                if fp8:  # [B, L, K+1, H] e4m3 + [B, L, K+1, 1] float32, on device
                    block, scales = quantize_fp8(capture.stacked())
                else:
                    block = capture.stacked().to(store_dtype)  # [B, L, K+1, H] on device
                if cfg.check_finite:
                    probe = scales if fp8 else block  # a row's scale is finite iff the row is
                    finite = (
                        torch.isfinite(probe).flatten(1).all(dim=1)
                        if len(batch) > 1
                        else torch.isfinite(probe).all().reshape(1)
                    )
                    # padding positions are finite too (masked attention still yields numbers)
                    if not bool(finite.all()):
                        bad = [batch[b] for b in range(len(batch)) if not bool(finite[b])]
                        raise ExtractError(
                            f"non-finite hidden states for rows {bad[:20]} (model {cfg.model_path}); "
                            "nothing was written for them. Check the model dtype/weights."
                        )
                event = release = None
                host_scales = scales
                if cuda:
                    buf, host = pool.take(tuple(block.shape))
                    if fp8:
                        sbuf, host_scales = scale_pool.take(tuple(scales.shape))
                    copy_stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(copy_stream):
                        host.copy_(block, non_blocking=True)
                        if fp8:
                            host_scales.copy_(scales, non_blocking=True)
                        event = torch.cuda.Event()
                        event.record(copy_stream)
                    block.record_stream(copy_stream)
                    release = functools.partial(pool.give, buf)
                    if fp8:
                        scales.record_stream(copy_stream)
                        release = functools.partial(_give_both, pool, buf, scale_pool, sbuf)
                else:
                    host = block
                t_compute += time.perf_counter() - t0
                states = [host[b, :n] for b, n in enumerate(lens)]
                toks = [ids[b, :n] for b, n in enumerate(lens)]
                sc = [host_scales[b, :n] for b, n in enumerate(lens)] if fp8 else None
                writer.submit(_Job(list(batch), toks, states, event, release, sc))
        writer.finish()
        ok = True
    except BaseException:
        # stop the writer after what it already has; finished samples stay valid and recorded
        try:
            writer.finish()
        except BaseException as werr:  # the writer's own error is the more useful one
            if isinstance(werr, DiskSpaceError):  # say how much the rest of the run still needs
                left = max(0, plan.bytes_needed - writer.stats.bytes)
                free = shutil.disk_usage(store.dir).free
                werr = DiskSpaceError(
                    f"{werr} {human_bytes(left)} of hidden states still to write in {store.dir}, "
                    f"{human_bytes(free)} free there now."
                )
            raise werr from None
        raise
    finally:
        capture.remove()
        close_progress()
        if ok:
            store.close()
        else:
            with contextlib.suppress(OSError):  # e.g. a second ENOSPC: the first one is the report
                store.close()
    st = writer.stats
    now = time.perf_counter()
    secs, loop_secs = now - t_start, now - t_loop
    result.update(
        written=st.written,
        tokens=st.tokens,
        bytes=st.bytes,
        seconds=round(secs, 3),
        tokens_per_second=round(st.tokens / secs, 1) if secs else None,
        loop_seconds=round(loop_secs, 3),
        loop_tokens_per_second=round(st.tokens / loop_secs, 1) if loop_secs else None,
        loop_started_at=loop_started_at,
        loop_finished_at=time.time(),
        compute_seconds=round(t_compute, 3),
        write_seconds=round(st.write_seconds, 3),
        serialize_seconds=round(st.serialize_seconds, 3),
        device=device,
        compute_dtype=compute_dtype,
        batches=len(batches),
    )
    return result


def repair_store(cfg: ExtractConfig) -> dict:
    """What ``extract --workers N`` does once in the parent before it starts the workers: the model check
    (with ``on_model_change``), temp-file cleanup and the verify check of every row at ``cfg.verify``, moving
    damaged files aside and collapsing duplicate manifest lines, so that no worker rewrites a manifest another
    one appends to. Returns the counts for the run's result."""
    seq_lens = load_seq_lens(cfg.data_dir)
    facts = model_facts(cfg.model_path, content_hash=cfg.model_hash)
    layer_ids = resolve_layer_ids(facts["num_layers"], cfg.layer_ids, cfg.layer_convention)
    store = HiddenStateStore(cfg.data_dir)
    discarded = store.ensure_meta(
        build_meta(cfg, facts, layer_ids, len(seq_lens)), on_model_change=cfg.on_model_change
    )
    store.clean_temp_files()
    plan = store.plan(
        seq_lens,
        num_states=len(layer_ids) + 1,
        hidden_size=facts["hidden_size"],
        dtype=cfg.dtype,
        indices=range(min(len(seq_lens), cfg.limit if cfg.limit is not None else len(seq_lens))),
        verify=cfg.verify,
    )
    store.close()
    return {
        "damaged": len(plan.damaged),
        "damaged_files": _damaged_report(store, plan.damaged),
        "moved_aside": plan.moved_aside,
        "duplicate_manifest_lines": plan.duplicates,
        "unchecked_files": plan.unchecked,
        "discarded_store": discarded,
    }


def status(data_dir: str | os.PathLike) -> dict:
    """Progress of a data directory from the manifests, with the cheap check of every finished file against the
    disk (size + header, no tensors loaded): damaged or missing files do not count as done."""
    store = HiddenStateStore(data_dir)
    meta = store.read_meta()
    seq_lens = load_seq_lens(data_dir)
    scan = store.scan_manifest()
    done = scan.entries
    damaged: dict[int, str] = {}
    if meta and all(meta.get(k) for k in ("num_states", "hidden_size", "dtype")):
        lens = {i: (seq_lens[i] if i < len(seq_lens) else e.seq_len) for i, e in done.items()}
        damaged, _ = store.check_files(
            scan.rows().values(),
            lens,
            num_states=meta["num_states"],
            hidden_size=meta["hidden_size"],
            dtype=meta["dtype"],
        )
    good = {i: e for i, e in done.items() if i not in damaged}
    return {
        "data_dir": str(data_dir),
        "rows": len(seq_lens),
        "done": len(good),
        "remaining": len(seq_lens) - len([i for i in good if i < len(seq_lens)]),
        "tokens_done": sum(e.seq_len for e in good.values()),
        "tokens_total": sum(seq_lens),
        "bytes": sum(e.nbytes for e in good.values()),
        "damaged": len(damaged),
        "damaged_files": _damaged_report(store, damaged),
        "duplicate_manifest_lines": sum(n - 1 for n in scan.duplicates().values()),
        "torn_manifest_lines": scan.torn_lines,
        "meta": meta,
    }


def status_many(data_dirs: Sequence[str | os.PathLike]) -> dict:
    """One view over the stores of a multi-host extraction (each host's own data directory, reachable here
    through a shared mount or after copying them): per store, the global ranks it covers (its
    ``hidden_states/shard.json``), its rows done and missing; overall, the rows done in some store, the rows no
    store has yet, rows held by more than one store (done twice), and rows no store's ranks cover."""
    stores = []
    fingerprints = set()
    rows = None
    owner: dict[int, list[int]] = {}  # row -> indices of the stores holding it
    covered: set[int] = set()
    for k, d in enumerate(data_dirs):
        st = status(d)
        meta = st.get("meta") or {}
        if meta.get("dataset_fingerprint"):
            fingerprints.add(meta["dataset_fingerprint"])
        if rows is None:
            rows = st["rows"]
        elif st["rows"] != rows:
            raise ExtractError(
                f"{d} holds a dataset of {st['rows']} rows but {data_dirs[0]} one of {rows}: these stores are "
                "not shares of one extraction; pass the data directories of one prepared dataset"
            )
        shard = read_shard(d)
        store = HiddenStateStore(d)
        good = {i for i in store.scan_manifest().entries if str(i) not in st["damaged_files"]}
        expected = (
            set(shard_indices(st["rows"], shard["world_size"], shard["ranks"])) if shard else set(range(rows))
        )
        covered |= expected
        for i in good:
            owner.setdefault(i, []).append(k)
        missing = sorted(expected - good)
        stores.append(
            {
                "data_dir": str(d),
                "host": (shard or {}).get("host"),
                "world_size": (shard or {}).get("world_size"),
                "ranks": (shard or {}).get("ranks"),
                "expected": len(expected),
                "done": len(good & expected),
                "missing": len(missing),
                "missing_rows": missing[:50],
                "outside_ranks": len(good - expected),
                "damaged": st["damaged"],
                "tokens_done": st["tokens_done"],
                "bytes": st["bytes"],
            }
        )
    if len(fingerprints) > 1:
        raise ExtractError(
            f"the stores {', '.join(map(str, data_dirs))} were extracted from different prepared datasets "
            f"(dataset fingerprints {sorted(fingerprints)}); pass the stores of one extraction"
        )
    worlds = {s["world_size"] for s in stores if s["world_size"]}
    rows = rows or 0
    done = {i for i in owner if i < rows}
    twice = sorted(i for i, ks in owner.items() if len(ks) > 1)
    return {
        "stores": stores,
        "rows": rows,
        "done": len(done),
        "missing": rows - len(done),
        "missing_rows": sorted(set(range(rows)) - done)[:50],
        "done_twice": len(twice),
        "done_twice_rows": twice[:50],
        "not_covered": len(set(range(rows)) - covered),
        "world_sizes": sorted(worlds),
        "complete": len(done) == rows and not twice,
    }
