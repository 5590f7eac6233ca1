"""A speculators save directory (what the train phase writes and serve, benchmark and the DDP probe read): epoch
directories ``SAVE/<n>/`` (model.safetensors, optimizer and scheduler state, training_state.json written last),
``SAVE/checkpoint_best`` (a link to the best epoch); a train run directory holds its save directory as
``RUN/checkpoints/``. Which checkpoint is complete, which is the newest, which one a path means."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from eagle3ops.errors import WithDetails
from eagle3ops.store.sample import read_safetensors_header


class CheckpointError(WithDetails, Exception):
    """No usable checkpoint where one was asked for; ``details``: ``path``, ``missing``."""


def _valid_zip(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            z.namelist()
        return True
    except (OSError, zipfile.BadZipFile):
        return False


def checkpoint_problem(ckpt: Path, scheduler: bool = True) -> str | None:
    """None when a speculators epoch checkpoint is complete, else what is wrong with it."""
    model = ckpt / "model.safetensors"
    try:
        read_safetensors_header(model)
    except (OSError, ValueError) as e:
        return f"{model}: {e}"
    for name in ("optimizer_state_dict.pt", *(("scheduler_state_dict.pt",) if scheduler else ())):
        if not _valid_zip(ckpt / name):
            return f"{ckpt / name}: missing or truncated"
    ts = ckpt / "training_state.json"
    try:
        json.loads(ts.read_text())
    except (OSError, ValueError):
        return f"{ts}: missing or unreadable (the save was cut short)"
    return None


def epoch_dirs(save_path: Path) -> list[int]:
    if not save_path.is_dir():
        return []
    out = []
    for d in save_path.iterdir():
        if d.is_dir() and not d.is_symlink() and d.name.isdigit():
            out.append(int(d.name))
    return sorted(out)


def final_checkpoint(save_path: Path) -> str | None:
    best = save_path / "checkpoint_best"
    if best.exists():
        return str(best.resolve())
    eps = epoch_dirs(save_path)
    return str(save_path / str(eps[-1])) if eps else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory from: itself, a speculators save dir (checkpoint_best or the newest epoch),
    or a train run dir (its ``checkpoints/``)."""
    p = Path(path)
    if (p / "config.json").is_file() and (p / "model.safetensors").is_file():
        return p
    if (p / "checkpoints").is_dir():
        return resolve_checkpoint(p / "checkpoints")
    if (p / "checkpoint_best").exists():
        return resolve_checkpoint((p / "checkpoint_best").resolve())
    epochs = sorted(
        (d for d in p.glob("*") if d.is_dir() and d.name.isdigit() and (d / "model.safetensors").is_file()),
        key=lambda d: int(d.name),
    )
    if epochs:
        return epochs[-1]
    raise CheckpointError(
        f"{p}: no speculators checkpoint (config.json + model.safetensors) here, in checkpoint_best, in a "
        "numbered epoch directory or in checkpoints/. Point --checkpoint at the train run's save path "
        "(eagle3ops train-status --run-dir RUN shows it) after a checkpoint was written.",
        path=str(p),
        missing=True,
    )


def newest_checkpoint(save_path: str | os.PathLike) -> Path | None:
    """The most recently written checkpoint of a save directory whose weights are readable: a numbered epoch
    directory (end or mid-epoch save) or speculators' ``interrupted`` save (a stopped run's last state, written
    without a training_state.json). None when there is none. Not ``checkpoint_best``: that one is the best
    *validated* epoch, and a stopped run's newest weights (later in its learning-rate decay) were never validated."""
    p = Path(save_path)
    if (p / "checkpoints").is_dir():
        p = p / "checkpoints"
    found = []
    for d in p.iterdir() if p.is_dir() else ():
        if d.is_symlink() or not d.is_dir() or not (d.name.isdigit() or d.name == "interrupted"):
            continue
        model = d / "model.safetensors"
        try:
            read_safetensors_header(model)
        except (OSError, ValueError):
            continue
        if (d / "config.json").is_file():
            found.append((model.stat().st_mtime_ns, d))
    return max(found)[1] if found else None
