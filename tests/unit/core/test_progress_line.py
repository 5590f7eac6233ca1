"""The progress line a poll of a long run prints (issue #32): eagle3ops.progress, and what the train and extract
phases feed it. Real files: a training run's metrics and configuration, a store's manifests."""

from __future__ import annotations

import json
import os

from eagle3ops.extract.status import run_log_path, run_progress
from eagle3ops.progress import describe, hms, rate_per_second
from eagle3ops.store import HiddenStateStore
from eagle3ops.train import metrics as train_metrics
from eagle3ops.train.spec import METRICS
from tinymodels import build_prepared_dataset


def test_rate_eta_and_the_line():
    assert (
        rate_per_second([]) is None and rate_per_second([5.0]) is None and rate_per_second([3.0, 3.0]) is None
    )
    assert rate_per_second([10.0, 12.0, 11.0]) == 1.0  # 2 units after the first, over 2 s, in any order
    assert hms(None) == hms(-1) == "?" and hms(0) == "0:00:00" and hms(3723.4) == "1:02:03"
    assert hms(90061) == "1d 1:01:01"
    p = describe("extract", 312, 867, "rows", 4.1, "/d/x.log", extra="PID 7 since t")
    assert p["line"] == "extract: 312/867 rows (35%), 4.1 rows/s, ETA 0:02:15; PID 7 since t; log: /d/x.log"
    assert (p["done"], p["total"], p["rate_per_s"], p["eta_s"], p["log"]) == (
        312,
        867,
        4.1,
        135.4,
        "/d/x.log",
    )
    unknown = describe("train", 5, None, "steps", None, None)
    assert unknown["line"] == "train: 5 steps (of a total not known yet), steps/s not measured yet, ETA ?"
    assert describe("x", 3, 3, "rows", None, None)["eta_s"] == 0.0  # nothing left: no rate needed


def _train_record(step, epoch, t):
    return {"kind": "train", "time": t, "data": {"train": {"loss": 1.0}, "global_step": step, "epoch": epoch}}


def test_train_progress_from_metrics_and_config(tmp_path):
    recs = [{"kind": "attempt", "attempt": 1, "time": 100.0}]
    recs += [_train_record(s, 0, 100.0 + s) for s in range(0, 10)]  # 1 step/s, epoch 0
    (tmp_path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = "train:\n    epochs: 3\n"
    p = train_metrics.progress(tmp_path, "running", cfg)
    assert p["done"] == 9 and p["total"] is None and p["rate_per_s"] == 1.0 and p["eta_s"] is None
    assert p["line"].startswith(
        "train: 9 steps (of a total not known yet), 1 steps/s, ETA ?; running; epoch 0"
    )
    assert p["log"] == str(tmp_path / "train.log") and p["line"].endswith(f"log: {tmp_path / 'train.log'}")
    # epoch 1 began at step 12: one epoch takes ~12 steps, 3 epochs ~36
    with (tmp_path / METRICS).open("a") as f:
        f.write(json.dumps(_train_record(12, 1, 112.0)) + "\n")
    p = train_metrics.progress(tmp_path, "running", cfg)
    assert p["total"] == 36 and p["done"] == 12 and p["eta_s"] == 24.0, p
    assert "total ~12 steps/epoch x 3 epochs" in p["line"] and "12/36 steps (33%)" in p["line"]
    # max_steps names the total at once
    p = train_metrics.progress(tmp_path, "running", cfg + "    max_steps: 20\n")
    assert p["total"] == 20 and "total from max_steps" in p["line"]


def test_extract_progress_counts_the_rows_of_the_running_run_only(tmp_path):
    data = build_prepared_dataset(tmp_path / "data", [3, 4, 5, 6, 7])
    store = HiddenStateStore(data)
    store.dir.mkdir(parents=True, exist_ok=True)
    # rows 0-1 from an earlier run (before the holder started), rows 2-4 from this one, 2 s apart
    lines = [
        {"i": i, "n": 3 + i, "b": 10, "r": 0, "t": int(t * 1e9)}
        for i, t in enumerate([50, 60, 100, 102, 104])
    ]
    (store.dir / "manifest-rank0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    holder = {"pid": 4242, "started": 99.0, "started_at": "2026-12-04T00:00:00+00:00"}
    p = run_progress(data, 5, 8, holder)
    assert p["rate_per_s"] == 0.5 and p["eta_s"] == 6.0, p  # rows 2..4: 2 rows after the first in 4 s
    assert p["log"] is None  # no log written yet: none named
    run_log_path(data).write_text("")
    p = run_progress(data, 5, 8, holder)
    assert p["log"] == str(tmp_path / "data.extract.log")
    assert p["line"] == (
        f"extract: 5/8 rows (62%), 0.5 rows/s, ETA 0:00:06; PID 4242 since 2026-12-04T00:00:00+00:00; "
        f"log: {tmp_path / 'data.extract.log'}"
    )
    assert run_progress(data, 5, 8, None)["line"].startswith(
        "extract: 5/8 rows (62%), rows/s not measured yet"
    )
    assert os.path.dirname(run_log_path(data)) == str(tmp_path)  # beside the store, not in hidden_states/
