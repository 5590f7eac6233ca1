"""``RUN/metrics.jsonl``: speculators' metric records as the shim writes them, summed up per attempt."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3ops.train.spec import (
    METRICS,
)


def _attempt(number: int, launched_at) -> dict:
    """The summary of one launch, before its first step."""
    return {
        "attempt": number,
        "launched_at": launched_at,
        "steps": 0,
        "first_global_step": None,
        "last_global_step": None,
        "first_step_at": None,
        "last_step_at": None,
        "tokens_per_s": [],
    }


def read_metrics(run_dir: Path) -> dict:
    """Summarise RUN/metrics.jsonl: per attempt steps and timing, last val loss and per-step accuracies."""
    path = Path(run_dir) / METRICS
    attempts: list[dict] = []
    last_train = last_val = None
    cur = None
    if path.exists():
        for raw in path.read_text().splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # a torn last line of a killed writer
            kind = rec.get("kind")
            if kind == "attempt":
                cur = _attempt(rec["attempt"], rec["time"])
                attempts.append(cur)
            elif kind == "train":
                if cur is None:  # records of a run launched before the attempt markers
                    cur = _attempt(0, None)
                    attempts.append(cur)
                d = rec["data"]
                gs = d.get("global_step")
                cur["steps"] += 1
                if cur["first_global_step"] is None:
                    cur["first_global_step"], cur["first_step_at"] = gs, rec["time"]
                cur["last_global_step"], cur["last_step_at"] = gs, rec["time"]
                tps = (d.get("profile") or {}).get("tokens_per_s")
                if tps:
                    cur["tokens_per_s"].append(tps)
                last_train = d
            elif kind == "val":
                last_val = rec["data"]
    for a in attempts:
        tps = sorted(a.pop("tokens_per_s"))
        a["median_tokens_per_s_per_rank"] = tps[len(tps) // 2] if tps else None
        if a["launched_at"] and a["first_step_at"]:
            a["time_to_first_step_s"] = round(a["first_step_at"] - a["launched_at"], 3)
        # optimizer steps per second from the global step counter (records exist every log_freq steps)
        if a["steps"] > 1 and a["last_step_at"] > a["first_step_at"]:
            span = a["last_step_at"] - a["first_step_at"]
            a["steps_per_s"] = round((a["last_global_step"] - a["first_global_step"]) / span, 4)
    out: dict = {"attempts": attempts}
    if last_train:
        t = last_train.get("train", {})
        out["train_loss"] = t.get("loss")
        out["global_step"] = last_train.get("global_step")
        out["epoch"] = last_train.get("epoch")
    if last_val:
        v = last_val.get("val", {})
        out["val_loss"] = v.get("loss_epoch")
        out["val_epoch"] = last_val.get("epoch")
        for key in ("cond_acc", "full_acc"):
            vals = []
            i = 0
            while f"{key}_{i}_epoch" in v:
                vals.append(v[f"{key}_{i}_epoch"])
                i += 1
            out[f"val_{key}"] = vals
    return out


def progress(run_dir: Path, status: str, config_text: str | None) -> dict:
    """How far a training run is (:func:`eagle3ops.progress.describe`): the optimizer step, steps/s of the
    current attempt (the trainer's own records), the ETA and the log. The total is ``max_steps`` when the
    configuration sets it, else epochs x the steps of one epoch once one has ended (approximate: records come
    every log_freq steps); before that the ETA is unknown."""
    import re

    from eagle3ops.progress import describe
    from eagle3ops.train.spec import LOG

    m = read_metrics(run_dir)
    attempt = (m.get("attempts") or [{}])[-1]
    step = int(m.get("global_step") or 0)
    text = config_text or ""
    max_steps = re.search(r"^\s*max_steps:\s*(\d+)\s*$", text, flags=re.M)
    epochs = re.search(r"^\s*epochs:\s*(\d+)\s*$", text, flags=re.M)
    total, how = (int(max_steps.group(1)), "total from max_steps") if max_steps else (None, "")
    if total is None and epochs:
        per_epoch = _steps_per_epoch(Path(run_dir) / METRICS)
        if per_epoch:
            total, how = (
                per_epoch * int(epochs.group(1)),
                f"total ~{per_epoch} steps/epoch x {epochs.group(1)} epochs",
            )
    epoch = m.get("epoch")
    extra = f"epoch {epoch}" + (f" of {epochs.group(1)}" if epochs else "") if epoch is not None else ""
    extra = "; ".join(x for x in (status, extra, how) if x)
    return describe(
        "train", step, total, "steps", attempt.get("steps_per_s"), str(Path(run_dir) / LOG), extra=extra
    )


def first_record(path: Path, match) -> dict | None:
    """The first record of a metrics.jsonl that ``match`` accepts (None: no such record, or no file yet).

    Lines that are not JSON (one cut short by a kill) are passed over."""
    if not path.exists():
        return None
    for raw in path.read_text().splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if match(rec):
            return rec
    return None


def _steps_per_epoch(path: Path) -> int | None:
    """The global step of the first record of epoch 1: the optimizer steps one epoch takes (None before)."""

    def first_of_epoch_1(rec: dict) -> bool:
        d = rec.get("data") or {}
        return rec.get("kind") == "train" and d.get("epoch") == 1 and bool(d.get("global_step"))

    rec = first_record(path, first_of_epoch_1)
    return int(rec["data"]["global_step"]) if rec else None
