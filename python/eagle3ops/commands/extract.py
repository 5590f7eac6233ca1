"""``eagle3ops extract|status|lengths``: hidden-state extraction and its bookkeeping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def register(sub) -> None:
    from eagle3ops.extract_options import EXTRACT, LENGTHS, STATUS, WORKERS

    EXTRACT.add_parser(sub).set_defaults(func=cmd_extract)
    STATUS.add_parser(sub).set_defaults(func=cmd_status)
    WORKERS.add_parser(sub).set_defaults(func=cmd_workers)
    LENGTHS.add_parser(sub).set_defaults(func=cmd_lengths)


def _config(args):
    from eagle3ops.extract import ExtractConfig

    return ExtractConfig(
        data_dir=args.data,
        model_path=args.model,
        layer_ids=args.layer_ids,
        layer_convention=args.layer_convention,
        dtype=args.dtype,
        compute_dtype=args.compute_dtype,
        device=args.device,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_size=args.max_batch_size,
        world_size=args.world_size or 1,
        rank=args.rank or 0,
        fsync=args.fsync,
        writer_threads=args.writer_threads,
        margin_frac=args.margin,
        margin_bytes=disk_margin_bytes(args.disk_margin_mib),
        limit=args.limit,
        progress=args.progress,
        verify=args.verify,
        on_model_change=args.on_model_change,
        model_hash=args.model_hash,
    )


def disk_margin_bytes(mib: float) -> int:
    """``--disk-margin-mib`` as bytes (refused below 0)."""
    from eagle3ops.command import CommandError

    if mib < 0:
        raise CommandError(f"--disk-margin-mib {mib} must be 0 or more (MiB kept free on top of the need)")
    return int(mib * 2**20)


def _host_ranks(args) -> list[int] | None:
    """``--world-size W --first-rank R`` (no ``--rank``): the global ranks this host's workers take."""
    from eagle3ops.command import CommandError

    if args.rank is not None:
        return None
    if args.first_rank is None:
        if args.world_size is not None:
            raise CommandError(
                f"--world-size {args.world_size} needs --first-rank (this host's first global rank) or --rank"
            )
        return None
    if args.world_size is None:
        raise CommandError(f"--first-rank {args.first_rank} needs --world-size (the workers of all hosts)")
    n = _num_workers(args.workers)
    if args.first_rank < 0 or args.first_rank + n > args.world_size:
        raise CommandError(
            f"--first-rank {args.first_rank} with {n} workers needs ranks {args.first_rank}.."
            f"{args.first_rank + n - 1}, outside world size {args.world_size}: the world must be the sum of "
            "every host's workers (extract_workers per host)"
        )
    return list(range(args.first_rank, args.first_rank + n))


def _num_workers(spec: str) -> int:
    if spec == "auto":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return max(1, len([d for d in visible.split(",") if d.strip()]))
        try:
            import torch

            return max(1, torch.cuda.device_count())
        except ImportError:
            return 1
    n = int(spec)
    if n < 1:
        raise ValueError("--workers must be >= 1 or 'auto'")
    return n


def _loop_span(results: list[dict], tokens: int) -> dict:
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


def _spawn_workers(args, n: int, lock, ranks: list[int] | None = None, world: int | None = None) -> dict:
    """One process per GPU, each with CUDA_VISIBLE_DEVICES set to its device and a disjoint shard.

    The workers die with this process: each asks the kernel for SIGKILL when its parent ends
    (``runlock.die_with_parent``, kill -9 of the parent included), and SIGINT/SIGTERM/SIGHUP here terminate
    them before this process exits. They work under this process's lock (``lock.child_env()``)."""
    from eagle3ops.command import CommandError

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(n)]
    argv = [a for a in sys.argv[1:] if a != "--json"]
    # strip our own --workers value; children run one shard each
    clean: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--workers", "--first-rank", "--world-size"):
            skip = True
            continue
        if a.startswith(("--workers=", "--first-rank=", "--world-size=")) or a == "--model-hash":
            continue
        clean.append(a)
    # the model check, the verify check and any repair run once here, before any worker appends to a manifest
    from eagle3ops.extract import repair_store

    pre = repair_store(_config(args))
    clean += ["--verify", "size", "--on-model-change", "refuse"]  # the workers re-check cheaply only
    procs: list = []
    t0 = time.perf_counter()

    def on_signal(signum, _frame):
        raise _Terminated(signal.Signals(signum).name)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _run_workers(
            args, n, clean, devices, procs, t0, lock, CommandError, pre, ranks or list(range(n)), world or n
        )
    except (_Terminated, KeyboardInterrupt) as e:
        _stop_workers(procs)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise CommandError(
            f"extract on {args.data} stopped by {e}: its {n} workers were terminated; finished samples are "
            "kept, re-run to resume"
        ) from None
    finally:
        _stop_workers(procs)
        for s, h in old.items():
            signal.signal(s, h)


def _run_workers(args, n, clean, devices, procs, t0, lock, CommandError, pre, ranks, world) -> dict:
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
    keys = ("total", "done_before", "adopted", "written", "failed", "tokens", "bytes")
    merged = {k: sum(r.get(k, 0) for r in results) for k in keys}
    secs = time.perf_counter() - t0
    merged.update(
        **pre,
        seconds=round(secs, 3),
        tokens_per_second=round(merged["tokens"] / secs, 1),
        **_loop_span(results, merged["tokens"]),
        workers=results,
        layer_ids=results[0].get("layer_ids"),
        data_dir=args.data,
        world_size=world,
        ranks=ranks,
    )
    return merged


def worker_start() -> None:
    """In a worker spawned by ``extract --workers N``: end when the parent that owns the run ends."""
    from eagle3ops.runlock import die_with_parent

    parent = os.environ.get("EAGLE3OPS_DIE_WITH_PARENT", "")
    if parent.isdigit():
        die_with_parent(int(parent))


def cmd_extract(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.extract import ExtractError, check_shard, plan_extraction, run_extraction
    from eagle3ops.runlock import RunLock, holder, wait_free
    from eagle3ops.store import StoreError

    worker_start()
    try:
        if args.check:
            running = holder(args.data)  # check mode takes no lock; it reports a run in progress
            if running and args.wait_running > 0:
                print(
                    f"eagle3ops extract: waiting up to {args.wait_running:.0f} s for PID {running.get('pid')} "
                    f"({running.get('cmdline')}), which holds {args.data}",
                    file=sys.stderr,
                    flush=True,
                )
                running = wait_free(args.data, args.wait_running)
            cfg = _config(args)
            ranks = _host_ranks(args)
            if ranks:
                cfg.ranks, cfg.rank = ranks, ranks[0]
            res = plan_extraction(cfg)
            # what a run would report
            res["changed"] = (
                res["to_extract"] > 0
                or res.get("adoptable", 0) > 0
                or res.get("damaged", 0) > 0
                or res.get("duplicate_manifest_lines", 0) > 0
            )
            res.update(running=running is not None, holder=running)
            emit(
                args,
                res,
                f"would extract {res['to_extract']} of {res['total']} rows "
                f"({res['tokens_to_extract']} tokens, {res['bytes_needed']:,} bytes; "
                f"{res['free_bytes']:,} bytes free)"
                + _damaged_line(res)
                + (
                    f"; a run holds {args.data} now: PID {running.get('pid')} ({running.get('cmdline')})"
                    if running
                    else ""
                ),
            )
            return 0
        ranks = _host_ranks(args)
        n = len(ranks) if ranks else (_num_workers(args.workers) if args.rank is None else 1)
        with RunLock(args.data, what="extract") as lock:
            if ranks:  # one host's share of a multi-host extraction
                shard = check_shard(args.data, args.world_size, ranks, write=True)
                res = _host_share(args, ranks, lock)
                res["shard"] = shard
            else:
                res = _spawn_workers(args, n, lock) if n > 1 else run_extraction(_config(args))
            res.update(lock.result_fields())
    except (ExtractError, StoreError, ValueError) as e:
        raise CommandError(str(e)) from e
    # an OSError (full disk, read-only, missing path) goes to eagle3ops.cli.main: one line naming the path
    res["changed"] = (
        res["written"] > 0
        or res.get("adopted", 0) > 0
        or res.get("damaged", 0) > 0
        or res.get("duplicate_manifest_lines", 0) > 0
        or bool(res.get("discarded_store"))
    )
    emit(args, res, _human_summary(res))
    return 0


def _host_share(args, ranks: list[int], lock) -> dict:
    """Extract this host's global ranks: its workers (``--workers N`` > 1), or in this process for one."""
    import dataclasses

    from eagle3ops.extract import repair_store, run_extraction

    if len(ranks) > 1:
        return _spawn_workers(args, len(ranks), lock, ranks=ranks, world=args.world_size)
    cfg = _config(args)
    pre = repair_store(cfg)  # the store is this host's alone: check and repair it once, as a parent would
    res = run_extraction(
        dataclasses.replace(
            cfg,
            world_size=args.world_size,
            rank=ranks[0],
            verify="size",
            on_model_change="refuse",
            model_hash=False,
        )
    )
    res.update(pre, ranks=ranks)
    return res


def _damaged_line(r: dict) -> str:
    files = r.get("damaged_files") or {}
    if not files:
        return ""
    shown = "; ".join(f"row {i}: {d['file']}: {d['reason']}" for i, d in list(files.items())[:10])
    more = f" (and {len(files) - 10} more)" if len(files) > 10 else ""
    return f"\n  damaged: {len(files)} ({shown}{more})"


def _human_summary(r: dict) -> str:
    from eagle3ops.store import human_bytes

    return (
        f"extract: {r['written']} written, {r['done_before']} already done, {r['total']} total; "
        f"{r['tokens']:,} tokens, {human_bytes(r['bytes'])} in {r['seconds']:.1f} s"
        + (f" ({r['tokens_per_second']:,.0f} tok/s)" if r.get("tokens_per_second") else "")
        + f"\n  -> {Path(r['data_dir']) / 'hidden_states'}"
        + _damaged_line(r)
    )


def cmd_workers(args) -> int:
    from eagle3ops.command import CommandError, emit

    try:
        n = _num_workers(args.workers)
    except ValueError as e:
        raise CommandError(f"--workers {args.workers}: {e}") from e
    emit(args, {"workers": n, "spec": args.workers}, str(n))
    return 0


def cmd_status(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.extract import ExtractError, status, status_many

    for d in args.data:
        _require_data_dir(d)
    try:
        if len(args.data) > 1:
            res = status_many(args.data)
        else:
            args.data = args.data[0]
            res = status(args.data)
    except ExtractError as e:
        raise CommandError(str(e)) from e
    if "stores" in res:
        emit(args, res, _many_summary(res))
        return 0
    emit(
        args,
        res,
        f"{res['done']}/{res['rows']} rows extracted, {res['tokens_done']:,}/{res['tokens_total']:,} tokens"
        + _damaged_line(res)
        + (
            f"\n  duplicate manifest lines: {res['duplicate_manifest_lines']} (the next extract collapses them)"
            if res.get("duplicate_manifest_lines")
            else ""
        ),
    )
    return 0


def _many_summary(r: dict) -> str:
    lines = [
        f"{r['done']}/{r['rows']} rows extracted over {len(r['stores'])} stores; {r['missing']} missing"
        + (f", {r['done_twice']} done twice (rows {r['done_twice_rows']})" if r["done_twice"] else "")
        + (f", {r['not_covered']} in no store's ranks" if r["not_covered"] else "")
    ]
    for s in r["stores"]:
        who = f"host {s['host']}, ranks {s['ranks']} of {s['world_size']}" if s["ranks"] else "one host"
        lines.append(
            f"  {s['data_dir']} ({who}): {s['done']}/{s['expected']} done, {s['missing']} missing"
            + (
                f" (rows {s['missing_rows'][:10]}{' ...' if s['missing'] > 10 else ''})"
                if s["missing"]
                else ""
            )
        )
    return "\n".join(lines)


def _require_data_dir(path: str) -> None:
    """A data directory that does not exist (or holds neither a dataset nor hidden states) is a wrong path,
    not an empty result."""
    from eagle3ops.command import CommandError

    d = Path(path)
    if not d.is_dir():
        raise CommandError(
            f"{path}: no such data directory; pass the directory `eagle3ops prepare` wrote (extract_data_dir)",
            data_dir=path,
        )
    if not any((d / n).exists() for n in ("hidden_states", "state.json", "prepare_meta.json")):
        raise CommandError(
            f"{path}: not a data directory (no hidden_states/, state.json or prepare_meta.json in it); pass the "
            "directory `eagle3ops prepare` wrote (extract_data_dir)",
            data_dir=path,
        )


def cmd_lengths(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.store import HiddenStateStore, StoreError, atomic_write_json

    _require_data_dir(args.data)
    if args.out and not Path(args.out).absolute().parent.is_dir():
        raise CommandError(
            f"--out {args.out}: its folder {Path(args.out).absolute().parent} does not exist; create it "
            "(mkdir -p) or pass a path in an existing folder. Nothing was written.",
            out=args.out,
        )
    try:
        lengths = HiddenStateStore(args.data).lengths()
    except StoreError as e:
        raise CommandError(str(e)) from e
    if args.out:
        atomic_write_json(args.out, {str(k): v for k, v in sorted(lengths.items())})
    emit(
        args,
        {
            "count": len(lengths),
            "tokens": sum(lengths.values()),
            "out": args.out,
            "lengths": None if args.out else {str(k): v for k, v in sorted(lengths.items())},
        },
        f"{len(lengths)} samples, {sum(lengths.values()):,} tokens" + (f" -> {args.out}" if args.out else ""),
    )
    return 0
