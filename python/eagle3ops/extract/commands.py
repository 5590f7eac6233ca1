"""The extract phase's sub-commands: ``extract``, ``status``, ``workers``, ``lengths`` here, ``verify``
(:mod:`.verify`) beside; the SGLang backend's ``extract-sglang`` is :mod:`eagle3ops.sglang.commands`'. The logic is imported inside
the handlers, so that building the parser (every ``eagle3ops`` call) imports none of it."""

from __future__ import annotations

import sys
from pathlib import Path

from eagle3ops.command import CommandError, disk_margin_bytes, emit, pick_taken
from eagle3ops.remote_code import require_trusted


def register(sub) -> None:
    from eagle3ops.extract import verify
    from eagle3ops.extract.options import EXTRACT, LENGTHS, STATUS, WORKERS

    EXTRACT.add_parser(sub).set_defaults(func=cmd_extract)
    STATUS.add_parser(sub).set_defaults(func=cmd_status)
    WORKERS.add_parser(sub).set_defaults(func=cmd_workers)
    LENGTHS.add_parser(sub).set_defaults(func=cmd_lengths)
    verify.register(sub)


def _config(args, log=None):
    from eagle3ops.extract.options import EXTRACT
    from eagle3ops.extract.session import ExtractConfig

    # every option ExtractConfig takes by its name (layer_ids, dtype, writer_threads, ...: a new one needs no line
    # here), and those it takes otherwise
    return ExtractConfig(
        **pick_taken(
            args,
            ExtractConfig,
            EXTRACT,
            "world_size",
            "rank",
            data_dir="data",
            model_path="model",
            margin_frac="margin",
        ),
        world_size=args.world_size or 1,
        rank=args.rank or 0,
        margin_bytes=disk_margin_bytes(args.disk_margin_mib),
        log_path=str(log) if log else None,
    )


def _host_ranks(args) -> list[int] | None:
    """``--world-size W --first-rank R`` (no ``--rank``): the global ranks this host's workers take."""
    from eagle3ops.extract.workers import num_workers

    if args.rank is not None:
        return None
    if args.first_rank is None and (args.reassign_ranks or args.reassign_from_data):
        raise CommandError(
            "--reassign-ranks/--reassign-from-data re-assign a lost host's rows to the others of a multi-host "
            "extraction: they need --world-size and --first-rank (this host's share). Nothing was extracted."
        )
    if args.first_rank is None:
        if args.world_size is not None:
            raise CommandError(
                f"--world-size {args.world_size} needs --first-rank (this host's first global rank) or --rank"
            )
        return None
    if args.world_size is None:
        raise CommandError(f"--first-rank {args.first_rank} needs --world-size (the workers of all hosts)")
    n = num_workers(args.workers)
    if args.first_rank < 0 or args.first_rank + n > args.world_size:
        raise CommandError(
            f"--first-rank {args.first_rank} with {n} workers needs ranks {args.first_rank}.."
            f"{args.first_rank + n - 1}, outside world size {args.world_size}: the world must be the sum of "
            "every host's workers (extract_workers per host)"
        )
    return list(range(args.first_rank, args.first_rank + n))


def cmd_extract(args) -> int:
    from eagle3ops.extract.errors import ExtractError
    from eagle3ops.extract.session import plan_extraction
    from eagle3ops.extract.shards import check_shard
    from eagle3ops.extract.status import note_running, run_log
    from eagle3ops.extract.transformers_backend import run_extraction
    from eagle3ops.extract.workers import host_share, num_workers, spawn_workers, worker_start
    from eagle3ops.runlock import RunLock, holder, wait_free
    from eagle3ops.store import StoreError

    worker_start()
    require_trusted(args.model, args.trust_remote_code, CommandError)  # before any work, check mode too
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
            res["changed"] = _any_count(
                res, "to_extract", "adoptable", "importable", "damaged", "duplicate_manifest_lines"
            )
            note_running(res, args.data, running)
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
        n = len(ranks) if ranks else (num_workers(args.workers) if args.rank is None else 1)
        if ranks:  # a re-assignment is refused before the lock and any work
            from eagle3ops.extract.reassign import check_sources

            reassign = _config(args).reassignment()
            check_shard(args.data, args.world_size, ranks, write=False, reassign=reassign)
            check_sources(args.reassign_from_data or [], args.world_size, reassign)
        with RunLock(args.data, what="extract") as lock, run_log(args.data, "extract") as log:
            if ranks:  # one host's share of a multi-host extraction
                cfg = _config(args, log)
                shard = check_shard(
                    args.data, args.world_size, ranks, write=True, reassign=cfg.reassignment()
                )
                res = host_share(cfg, sys.argv[1:], ranks, args.world_size, lock)
                res["shard"] = shard
            else:
                cfg = _config(args, log)
                res = spawn_workers(cfg, sys.argv[1:], n, lock) if n > 1 else run_extraction(cfg)
            res.update(lock.result_fields())
    except (ExtractError, StoreError, ValueError) as e:
        raise CommandError(str(e)) from e
    # an OSError (full disk, read-only, missing path) goes to eagle3ops.cli.main: one line naming the path
    res["changed"] = _any_count(
        res, "written", "adopted", "imported", "damaged", "duplicate_manifest_lines"
    ) or bool(res.get("discarded_store"))
    emit(args, res, _human_summary(res))
    return 0


def _any_count(res: dict, first: str, *more: str) -> bool:
    """Whether any of these counts is above 0: ``first`` is always in the result, the others where they apply."""
    return res[first] > 0 or any(res.get(k, 0) > 0 for k in more)


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
        + "".join(f"\n  warning: {w}" for w in r.get("warnings", []))
    )


def cmd_workers(args) -> int:
    from eagle3ops.extract.workers import num_workers

    try:
        n = num_workers(args.workers)
    except ValueError as e:
        raise CommandError(f"--workers {args.workers}: {e}") from e
    emit(args, {"workers": n, "spec": args.workers}, str(n))
    return 0


def cmd_status(args) -> int:
    from eagle3ops.extract.errors import ExtractError
    from eagle3ops.extract.status import status, status_many

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
        if s.get("reassigned"):
            who += f", taking over the rows of lost rank(s) {s['reassigned']['lost_ranks']}"
        if s.get("kept_out"):
            lines.append(
                f"  {s['data_dir']} ({who}): KEPT OUT - its ranks were re-assigned to the other hosts; its "
                f"{s['held']} rows are left as they are (not counted, not to be gathered)"
            )
            continue
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
    from eagle3ops.durable import atomic_write_json
    from eagle3ops.store import HiddenStateStore, StoreError

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
