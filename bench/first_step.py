"""Time to the first training step at 1k vs 20k samples (issue #9, target 3), CPU, real speculators 0.9.0.

Runs the real ``eagle3ops train`` (the train phase's CLI: renders the speculators config, launches the detached
trainer through ``eagle3ops.train.speculators_shim``, waits) on two synthetic stores that differ only in row count.
STAND-IN data (as in bench/train_gpu.py, whose ``make_synth_store`` this reuses): K distinct random samples, row
i = sample i % K, its ``hs_i.safetensors`` a hard link to that sample's file; the verifier is the tiny
DeepSeek-V3 of ``eagle3ops.train.fixtures`` (hidden 64), so the draft is tiny and what is timed is the
trainer's start-up path (imports, dataset + lengths, batch packing, vocab mapping, first batch), which is
what could grow with the number of samples.

time to first step = launch of the detached trainer -> its first metric record (``train-status``'s
``metrics.attempts[-1].time_to_first_step_s``). Also recorded: wall time of the whole CLI call. Runs are
interleaved (1k, 20k, 1k, 20k, ...) because the box is shared; medians are compared. Goal: 20k / 1k <= 1.2.

Usage: .venv/bin/python bench/first_step.py [--reps 2] [--sizes 1000,20000] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))


def first_train_record_time(path: Path) -> float | None:
    """Wall-clock time of the first training-step record the shim wrote (metrics.jsonl, kind "train")."""
    from eagle3ops.train.metrics import first_record

    rec = first_record(path, lambda r: r.get("kind") == "train")
    return float(rec["time"]) if rec else None


def bench_arguments(doc: str, sizes: str) -> argparse.ArgumentParser:
    """The arguments the first-step benches share: store sizes (rows, comma-separated; ``sizes`` by default),
    repetitions, distinct samples, trainer steps and the results folder."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--sizes", default=sizes)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--distinct", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    return ap


def launch_to_first_step(
    train_gpu, name: str, store: Path, verifier: Path, work: Path, targs, extra
) -> tuple:
    """One launch of the trainer CLI on ``store`` (``train_gpu.train_stage``, run directory ``work/run-<name>``).

    Returns its row of timings (``cli_to_first_step_s``: from the CLI call to the first step record) and
    train_stage's result."""
    shutil.rmtree(work / f"run-{name}", ignore_errors=True)
    t_cli = time.time()
    r = train_gpu.train_stage(name, store, verifier, work, targs, extra)
    first = first_train_record_time(work / f"run-{name}" / "metrics.jsonl")
    row = {
        "time_to_first_step_s": r.get("time_to_first_step_s"),
        "cli_to_first_step_s": round(first - t_cli, 3) if first else None,
        "cli_wall_s": r.get("wall_s"),
        "status": r.get("status"),
        "rc": r.get("rc"),
        "loadavg": os.getloadavg()[0],
    }
    if r.get("rc") != 0:
        row["msg"] = r.get("msg")
    return row, r


def record_run(result: dict, row: dict, run_dir: Path) -> None:
    """Keep ``row`` in the result, show it on stderr, and remove the run's directory."""
    result["runs"].append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)


def write_result(result: dict, sizes: list[int], keys: tuple[str, ...], path: Path) -> int:
    """Sum the runs up (:func:`median_ratios`, goal: every ratio at most 1.2), write ``path`` and print the sums.

    Returns the exit code: 0 when the goal is met."""
    ratios = median_ratios(result, sizes, keys)
    result["goal_le_1_2"] = all(r is not None and r <= 1.2 for r in ratios)
    result["loadavg_end"] = os.getloadavg()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.startswith(("median_", "ratio_", "goal_"))}))
    return 0 if result["goal_le_1_2"] else 1


def median_ratios(result: dict, sizes: list[int], keys: tuple[str, ...]) -> list:
    """Per key, the median over reps of each size (``median_<key>``) and largest/smallest (``ratio_<key>``).

    Written into ``result``; returns the ratios in ``keys`` order (None where a size has no value)."""
    for key in keys:
        med = {}
        for n in sizes:
            vals = [r[key] for r in result["runs"] if r["rows"] == n and r[key]]
            med[str(n)] = round(statistics.median(vals), 2) if vals else None
        result[f"median_{key}"] = med
        a, b = med.get(str(sizes[0])), med.get(str(sizes[-1]))
        result[f"ratio_{key}"] = round(b / a, 3) if a and b else None
    return [result[f"ratio_{key}"] for key in keys]


def main() -> int:
    ap = bench_arguments(__doc__, "1000,20000")
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir, removed after)")
    args = ap.parse_args()

    import train_gpu  # bench/train_gpu.py: make_synth_store, train_stage (the same code as the GPU proof)
    from eagle3ops.train.fixtures import make_tiny_verifier

    sizes = [int(x) for x in args.sizes.split(",")]
    result: dict = {
        "bench": "first_step",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "loadavg_start": os.getloadavg(),
        "runs": [],
    }
    tmp = tempfile.mkdtemp(prefix="first-step-", dir=args.work)
    try:
        work = Path(tmp)
        verifier = make_tiny_verifier(work / "verifier")
        stores = {}
        for n in sizes:
            stores[n] = train_gpu.make_synth_store(
                work / f"synth-{n}", verifier, n, args.distinct, args.min_len, args.max_len, [2, 4, 5]
            )
        result["stores"] = {str(n): s for n, s in stores.items()}
        targs = argparse.Namespace(
            device="cpu",
            total_seq_len=512,
            stage_timeout=900,
            draft_attn_impl="sdpa",
            loss_implementation="eager",
            env=None,
        )
        for rep in range(args.reps):
            for n in sizes:
                name = f"{n}-rep{rep}"
                extra = ("--max-steps", str(args.max_steps), "--log-freq", "1", "--train-data-ratio", "0.98")
                row, r = launch_to_first_step(
                    train_gpu, name, work / f"synth-{n}", verifier, work, targs, extra
                )
                row = {
                    "rows": n,
                    "rep": rep,
                    "cli_launch_to_first_step_s": row.pop("cli_to_first_step_s"),
                    **row,
                }
                if r.get("rc") != 0:
                    row["log_tail"] = r.get("log_tail", "")[-1500:]
                record_run(result, row, work / f"run-{name}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys = ("time_to_first_step_s", "cli_launch_to_first_step_s")
    return write_result(result, sizes, keys, Path(args.out) / result_name("first_step"))


if __name__ == "__main__":
    sys.exit(main())
