"""``extract --workers N``: one process per GPU, each with its own device and a disjoint shard of the rows, under
the parent's run lock; and one host's share of a multi-host extraction (``--first-rank R --world-size W``).

The workers are the same CLI, re-run with the parent's argv and ``--rank``; they die with the parent (the
kernel's parent-death signal, kill -9 included), and SIGINT/SIGTERM/SIGHUP of the parent terminate them. The
model check, the verify check and any repair run once in the parent before any worker appends to a manifest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

from eagle3ops.command import CommandError
from eagle3ops.extract.session import ExtractConfig, import_from_lost_parts, repair_store
from eagle3ops.extract.transformers_backend import run_extraction


def num_workers(spec: str) -> int:
    """``--workers``: a count, or ``auto`` (the visible GPUs; 1 without CUDA)."""
    if spec == "auto":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return max(1, len([d for d in visible.split(",") if d.strip()]))
        from eagle3ops.cuda import cuda_device_count

        return max(1, cuda_device_count())
    n = int(spec)
    if n < 1:
        raise ValueError("--workers must be >= 1 or 'auto'")
    return n


def loop_span(results: list[dict], tokens: int) -> dict:
    """The workers' extraction loops as one span: first loop start to last loop end (wall clock), so the
    throughput excludes each worker's start-up as a single worker's ``loop_tokens_per_second`` does. A late
    start of one worker (model loading side by side) counts against the span; ``sum_worker_loop_tokens_per_second``
    (each worker's own loop rate, summed) is the rate while all of them run, and ``start_skew_seconds`` says how
    far apart the loops began."""
    spans = [(r["loop_started_at"], r["loop_finished_at"]) for r in results if r.get("loop_started_at")]
    if not spans:
        return {}
    secs = max(e for _, e in spans) - min(b for b, _ in spans)
    rates = [r.get("loop_tokens_per_second") for r in results if r.get("loop_started_at")]
    return {
        "loop_seconds": round(secs, 3),
        "loop_tokens_per_second": round(tokens / secs, 1) if secs > 0 else None,
        "sum_worker_loop_tokens_per_second": round(sum(rates), 1) if all(rates) else None,
        "start_skew_seconds": round(max(b for b, _ in spans) - min(b for b, _ in spans), 3),
    }


class _Terminated(Exception):
    """SIGTERM/SIGHUP of the parent while its workers run."""


def _stop_workers(procs: list, grace: float = 5.0) -> None:
    """Terminate the workers still running, then kill those that outlive ``grace``; reap them all."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def worker_argv(argv: list[str]) -> list[str]:
    """The parent's CLI arguments for a worker: without ``--workers``, ``--first-rank``, ``--world-size`` (a worker
    runs one shard, given by ``--world-size``/``--rank``), ``--model-hash`` and ``--json``."""
    clean: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--workers", "--first-rank", "--world-size"):
            skip = True
            continue
        if a.startswith(("--workers=", "--first-rank=", "--world-size=")) or a in ("--model-hash", "--json"):
            continue
        clean.append(a)
    return clean


def spawn_workers(
    cfg: ExtractConfig,
    argv: list[str],
    n: int,
    lock,
    ranks: list[int] | None = None,
    world: int | None = None,
) -> dict:
    """Run ``n`` workers (global ``ranks`` of ``world``; default ranks 0..n-1 of n), one per visible device, each
    ``eagle3ops <argv> --world-size W --rank R``; returns their results merged. ``cfg``: the run's settings (the
    parent checks and repairs the store with them first); ``argv``: the parent's CLI arguments
    (:func:`worker_argv`); ``lock``: the parent's :class:`eagle3ops.runlock.RunLock`.

    The workers die with this process: each asks the kernel for SIGKILL when its parent ends
    (``runlock.die_with_parent``, kill -9 of the parent included), and SIGINT/SIGTERM/SIGHUP here terminate
    them before this process exits. They work under this process's lock (``lock.child_env()``)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(n)]
    # the model check, the verify check and any repair run once here, before any worker appends to a manifest
    pre = repair_store(cfg)
    # the finished rows this host takes over from a lost host's readable part: copied before any worker starts
    imported = import_from_lost_parts(dataclasses.replace(cfg, ranks=ranks, world_size=world or n))
    clean = [
        *worker_argv(argv),
        "--verify",
        "size",
        "--on-model-change",
        "refuse",
    ]  # workers re-check cheaply
    procs: list = []
    t0 = time.perf_counter()

    def on_signal(signum, _frame):
        raise _Terminated(signal.Signals(signum).name)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        results = _start_and_collect(clean, devices, procs, lock, ranks or list(range(n)), world or n)
    except (_Terminated, KeyboardInterrupt) as e:
        _stop_workers(procs)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise CommandError(
            f"extract on {cfg.data_dir} stopped by {e}: its {n} workers were terminated; finished samples are "
            "kept, re-run to resume"
        ) from None
    finally:
        _stop_workers(procs)
        for s, h in old.items():
            signal.signal(s, h)
    keys = ("total", "done_before", "adopted", "written", "failed", "tokens", "bytes", "oom_splits")
    merged = {k: sum(r.get(k, 0) for r in results) for k in keys}
    if warnings := [
        f"worker {r.get('rank', i)}: {w}" for i, r in enumerate(results) for w in r.get("warnings", [])
    ]:
        merged["warnings"] = warnings
    merged.update(imported)
    # what the repair above adopted, the workers count as done before (as a single process counts its adopted
    # files in done_before too); adopted says this run recorded them
    merged["adopted"] += pre.pop("adopted", 0)
    secs = time.perf_counter() - t0
    merged.update(
        **pre,
        seconds=round(secs, 3),
        tokens_per_second=round(merged["tokens"] / secs, 1),
        **loop_span(results, merged["tokens"]),
        workers=results,
        layer_ids=results[0].get("layer_ids"),
        data_dir=cfg.data_dir,
        world_size=world or n,
        ranks=ranks or list(range(n)),
    )
    return merged


def _start_and_collect(clean, devices, procs, lock, ranks, world) -> list[dict]:
    for k, rank in enumerate(ranks):
        env = dict(
            os.environ,
            CUDA_VISIBLE_DEVICES=devices[k % len(devices)],
            EAGLE3OPS_DIE_WITH_PARENT=str(os.getpid()),
            **lock.child_env(),
        )
        cmd = [
            sys.executable,
            "-m",
            "eagle3ops",
            *clean,
            "--world-size",
            str(world),
            "--rank",
            str(rank),
            "--json",
            "--no-progress",
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    results, failed = [], []
    for rank, p in zip(ranks, procs, strict=True):
        out, _ = p.communicate()
        lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
        res = json.loads(lines[-1]) if lines else {"failed": True, "msg": f"worker {rank} printed no result"}
        res["rank"] = rank
        results.append(res)
        if p.returncode != 0 or res.get("failed"):
            failed.append(res)
    if failed:
        raise CommandError("; ".join(f"worker {r['rank']}: {r.get('msg')}" for r in failed), workers=results)
    return results


def worker_start() -> None:
    """In a worker spawned by ``extract --workers N``: end when the parent that owns the run ends."""
    from eagle3ops.runlock import die_with_parent

    parent = os.environ.get("EAGLE3OPS_DIE_WITH_PARENT", "")
    if parent.isdigit():
        die_with_parent(int(parent))


def host_share(cfg: ExtractConfig, argv: list[str], ranks: list[int], world: int, lock) -> dict:
    """Extract this host's global ``ranks`` of ``world``: its workers (:func:`spawn_workers`) for several, or in
    this process for one (the store is this host's alone: it is checked and repaired once, as a parent would)."""
    if len(ranks) > 1:
        return spawn_workers(cfg, argv, len(ranks), lock, ranks=ranks, world=world)
    pre = repair_store(cfg)
    pre.update(import_from_lost_parts(dataclasses.replace(cfg, ranks=ranks, world_size=world)))
    res = run_extraction(
        dataclasses.replace(
            cfg, world_size=world, rank=ranks[0], verify="size", on_model_change="refuse", model_hash=False
        )
    )
    res.update(pre, ranks=ranks)
    return res
