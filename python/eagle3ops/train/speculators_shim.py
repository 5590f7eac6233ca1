"""Entry point of one speculators training process: ``python -m eagle3ops.train.speculators_shim --config C``.

It is what the ``train`` phase launches (directly, or under ``torchrun -m``), instead of
``speculators train``, for these reasons:

1. **CPU device shim** (only when no accelerator is available), written for and pinned to
   ``speculators==0.9.0`` (any other version is refused: re-check these lines before bumping it):

   - ``speculators.train.trainer.get_local_rank`` returns the int ``0``, which ``Trainer`` passes to
     ``model.to(...)`` / ``tensor.to(...)``: that means ``cuda:0``. Redirected to ``"cpu"``.
   - ``speculators.train.checkpointer.get_current_device`` falls back to ``"cuda:0"`` without an
     accelerator (used to load a checkpoint on resume). Redirected to ``"cpu"``.
   - ``torch.accelerator.synchronize`` (called by the step timer) raises without an accelerator.
     Made a no-op when none is available.

   With these, plus ``draft_attn_impl: sdpa``, ``loss_implementation: eager`` and ``num_workers: 0``
   in the config (the launcher sets them for CPU runs), a small draft trains on CPU.
2. **Machine-readable metrics**: speculators logs metrics through the ``speculators.metrics`` logger
   into a Rich console handler. A handler added here writes every metric record as one JSON line to
   ``$EAGLE3OPS_METRICS`` (rank 0 only), which the launcher parses (val loss, per-step accuracy).
3. **One loader for every row**: native and adopted files, each file checked on its first read on request
   (:func:`install_store_reader`).
4. **An honest exit record**: speculators turns SIGINT/SIGTERM into an "interrupted" checkpoint and a
   normal return; the shim notices that and writes ``$EAGLE3OPS_EXIT`` (JSON) with ``status``
   ``finished`` only for a run that really completed, ``interrupted``/``failed`` otherwise (each node's
   first process writes its node's record).
5. **The target's token ids**: speculators builds the draft's decoder config as a ``LlamaConfig`` from the
   verifier's shapes, which leaves Llama's ``bos_token_id``/``eos_token_id`` (1, 2) in the saved draft;
   :func:`install_target_token_ids` sets the verifier's own (``text_config`` first). Its ``pad_token_id`` is
   left alone: in a Llama config it is also the embedding's padding row.
6. **A checked resume**: after the trainer restored its optimizers from a checkpoint, every rank compares
   them with the saved file (:mod:`eagle3ops.train.resume_check`) and stops with exit 2 on a difference
   (:func:`install_resume_check`); the exit record says what was checked.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Mapping

from eagle3ops.speculators_pin import PINNED, installed_version

SUPPORTED_SPECULATORS = PINNED
ENV_METRICS = "EAGLE3OPS_METRICS"
ENV_EXIT = "EAGLE3OPS_EXIT"
ENV_FORCE_CPU = "EAGLE3OPS_FORCE_CPU"
ENV_CHECK_ON_READ = "EAGLE3OPS_CHECK_ON_READ"

_interrupted: dict[str, str] = {}
_resumed: dict = {}


class UnsupportedSpeculatorsVersion(RuntimeError):
    pass


def check_version(installed: str | None = None) -> str:
    """Return the installed speculators version; refuse any version the shim was not written for."""
    if installed is None:
        installed = installed_version()
        if installed is None:
            raise UnsupportedSpeculatorsVersion(
                f"speculators is not installed in {sys.prefix}; install speculators=={SUPPORTED_SPECULATORS} "
                "(requirements/speculators.txt, --no-deps) or run the runtime phase."
            )
    if installed != SUPPORTED_SPECULATORS:
        raise UnsupportedSpeculatorsVersion(
            f"speculators {installed} is installed in {sys.prefix}, but eagle3ops' training shim "
            f"(python/eagle3ops/train/speculators_shim.py) is pinned to {SUPPORTED_SPECULATORS}: it patches "
            "trainer/checkpointer internals and parses its metric records. Install "
            f"speculators=={SUPPORTED_SPECULATORS}, or re-validate the shim against {installed} and bump "
            "SUPPORTED_SPECULATORS."
        )
    return installed


def accelerator_available() -> bool:
    import torch

    if os.environ.get(ENV_FORCE_CPU) == "1":
        return False
    return torch.accelerator.is_available()


def apply_cpu_shim() -> None:
    """Redirect speculators 0.9.0's CUDA assumptions to the CPU (see the module docstring)."""
    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer
    import torch

    trainer.get_local_rank = lambda: "cpu"
    checkpointer.get_current_device = lambda: "cpu"
    original_sync = torch.accelerator.synchronize

    def synchronize(device=None):
        if torch.accelerator.is_available():
            return original_sync(device)
        return None

    torch.accelerator.synchronize = synchronize


def install_store_reader(check_on_read: bool | None = None) -> None:
    """speculators' offline loader reads every row through :class:`eagle3ops.store.reader.StoreReader`: its file
    transfer's ``get_cached`` (``hs_connectors.transfer.FileTransfer``, which the fp8 transfer calls too) is
    replaced, so rows adopted from another tool's dump are read where they lie, converted on read, and with
    ``check_on_read`` (``$EAGLE3OPS_CHECK_ON_READ=1``: train ``verify: overlapped``) each file's checksum is
    compared on its first read in the loader's workers. A damaged file becomes a skipped sample
    (``SampleUnavailable``), logged and queued for re-extraction, instead of the end of the run."""
    import hs_connectors.transfer as transfer
    from speculators.train import data as spec_data

    from eagle3ops.store.reader import DamagedSample, StoreReader

    if getattr(transfer.FileTransfer.get_cached, "eagle3ops", False):
        return
    check = os.environ.get(ENV_CHECK_ON_READ) == "1" if check_on_read is None else check_on_read
    readers: dict[str, StoreReader] = {}

    def get_cached(self, file_idx: int):
        key = str(self.hidden_states_path)
        reader = readers.get(key)
        if reader is None:
            reader = readers[key] = StoreReader(key, check_on_read=check)
        return reader.get(file_idx)

    get_cached.eagle3ops = True
    transfer.FileTransfer.get_cached = get_cached
    original = spec_data.ArrowDataset._get_raw_data

    def _get_raw_data(self, index: int):
        try:
            return original(self, index)
        except DamagedSample as e:
            print(
                f"eagle3ops: skipped {e} - queued for re-extraction in hidden_states/requeue.jsonl "
                "(the next extract run redoes it)",
                file=sys.stderr,
                flush=True,
            )
            return spec_data.SampleUnavailable(reason=str(e))

    spec_data.ArrowDataset._get_raw_data = _get_raw_data


class JsonlMetricsHandler(logging.Handler):
    """Append each ``speculators.metrics`` record (a Mapping) as one JSON line."""

    def __init__(self, path: str):
        super().__init__(level=logging.INFO)
        self.path = path
        self._fh = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if not isinstance(msg, Mapping):
            return
        line = {"time": round(record.created, 3), "step": getattr(record, "step", None)}
        if getattr(record, "hparams", False):
            line["kind"] = "hparams"
        else:
            line["kind"] = "val" if "val" in msg else "train" if "train" in msg else "other"
            line["data"] = msg
        try:
            self._fh.write(json.dumps(line, default=_jsonable) + "\n")
        except Exception:  # a metric we cannot serialise must never stop training
            self.handleError(record)

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            super().close()


def _jsonable(v):
    try:
        return v.item()
    except Exception:
        return str(v)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _install_interrupt_probe() -> None:
    """Record that speculators' graceful-shutdown handler fired (it swallows the signal)."""
    from speculators.train import graceful_shutdown

    cls = graceful_shutdown.GracefulShutdownHandler
    original = cls._handler

    def _handler(self, signum, frame):
        if os.getpid() == self._owner_pid:
            _interrupted.setdefault("signal", str(signum))
        return original(self, signum, frame)

    cls._handler = _handler


def _hook_metrics(path: str) -> None:
    """Add the JSONL handler right after speculators configures its loggers (its dictConfig
    removes handlers that were attached to ``speculators.metrics`` before)."""
    import speculators.train.cli as cli

    original = cli.setup_metric_logger

    def setup_metric_logger(*args, **kwargs):
        result = original(*args, **kwargs)
        logging.getLogger("speculators.metrics").addHandler(JsonlMetricsHandler(path))
        return result

    cli.setup_metric_logger = setup_metric_logger


def install_target_token_ids() -> None:
    """5.: the draft decoder config speculators builds from a verifier (``create_transformer_layer_config``, the
    default path; a given draft config or a warm start keeps its own) gets the verifier's bos/eos ids."""
    import speculators.train.cli as speculators_cli

    from eagle3ops.layers import special_token_ids

    build = speculators_cli.create_transformer_layer_config

    def create_transformer_layer_config(verifier_name_or_path, *args, **kwargs):
        config = build(verifier_name_or_path, *args, **kwargs)
        try:
            with open(os.path.join(verifier_name_or_path, "config.json")) as f:
                ids = special_token_ids(json.load(f))
        except (OSError, ValueError):
            return config  # a hub id: speculators resolved it itself; nothing here to read
        for k in ("bos_token_id", "eos_token_id"):
            if k in ids:
                setattr(config, k, ids[k])
        return config

    speculators_cli.create_transformer_layer_config = create_transformer_layer_config


class ResumeMismatch(RuntimeError):
    """The optimizer state a rank restored is not the one the checkpoint saved."""


def install_resume_check() -> None:
    """6.: right after speculators' single-process/DDP checkpointer restored the optimizers (every rank loads
    the whole file), compare them with the file; FSDP's sharded restore is recorded as not checked."""
    from speculators.train import checkpointer as ck

    load = ck.SingleGPUCheckpointer.load_optimizer_state_dict

    def checked(self, model, optimizer, float_dtype=None):
        out = load(self, model, optimizer, float_dtype)
        import torch

        from eagle3ops.train import resume_check

        path = self.optimizer_path(self.previous_epoch)
        saved = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        msg, counts = resume_check.problem(saved, optimizer)
        _resumed.update(file=str(path), epoch=self.previous_epoch, rank=_rank(), equal=msg is None, **counts)
        if msg:
            raise ResumeMismatch(
                f"{path}: the optimizer state restored on rank {_rank()} is not the saved one: {msg}"
            )
        print(
            f"eagle3ops.train.speculators_shim: resumed from epoch {self.previous_epoch}; rank {_rank()}'s "
            f"optimizer state equals {path} ({counts['parameters']} parameters, {counts['tensors']} tensors)",
            file=sys.stderr,
            flush=True,
        )
        return out

    ck.SingleGPUCheckpointer.load_optimizer_state_dict = checked
    load_sharded = ck.DistributedCheckpointer.load_optimizer_state_dict

    def sharded(self, model, optimizer, float_dtype=None):
        out = load_sharded(self, model, optimizer, float_dtype)
        _resumed.update(
            epoch=self.previous_epoch, equal=None, note="FSDP-sharded optimizer state: not compared"
        )
        return out

    ck.DistributedCheckpointer.load_optimizer_state_dict = sharded


def write_exit(status: str, **extra) -> None:
    """The exit record of this node's run directory, by its first process (LOCAL_RANK 0): on several hosts
    every node has its own run directory, and each must know how its trainer ended (rank 0 alone would leave
    the other nodes' runs looking killed after a finished job)."""
    path = os.environ.get(ENV_EXIT)
    if not path or int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return
    from eagle3ops.durable import atomic_write_json

    atomic_write_json(path, {"status": status, "pid": os.getpid(), "time": time.time(), **extra})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    try:
        version = check_version()
    except UnsupportedSpeculatorsVersion as e:
        print(f"eagle3ops.train.speculators_shim: {e}", file=sys.stderr)
        write_exit("failed", error=str(e))
        return 2
    device = "accelerator"
    if not accelerator_available():
        apply_cpu_shim()
        device = "cpu"
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    install_store_reader()
    install_target_token_ids()
    install_resume_check()

    _install_interrupt_probe()
    metrics_path = os.environ.get(ENV_METRICS)
    if metrics_path and _rank() == 0:
        _hook_metrics(metrics_path)
    print(
        f"eagle3ops.train.speculators_shim: speculators {version}, device {device}, rank {_rank()}, "
        f"pid {os.getpid()}",
        file=sys.stderr,
        flush=True,
    )
    try:
        cfg = TrainConfig.resolve(argv)
        train_main(cfg)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
        if code:
            write_exit("failed", rc=code, error=f"exited {code} (configuration error? see the log)")
        raise
    except ResumeMismatch as e:
        print(f"eagle3ops.train.speculators_shim: {e}", file=sys.stderr, flush=True)
        write_exit("failed", rc=2, error=str(e), resume_check=dict(_resumed))
        return 2
    except BaseException as e:
        write_exit("failed", rc=1, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        raise
    resumed = {"resume_check": dict(_resumed)} if _resumed else {}
    if _interrupted:
        write_exit(
            "interrupted", rc=143, signal=_interrupted["signal"], seconds=time.time() - started, **resumed
        )
        return 143
    write_exit("finished", rc=0, seconds=round(time.time() - started, 3), **resumed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
