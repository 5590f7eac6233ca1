"""``eagle3ops extract-verify``: check a data directory's hidden-state files against their manifests (registered by
:mod:`eagle3ops.extract.commands`)."""

from __future__ import annotations

import sys
import time


def register(sub) -> None:
    from eagle3ops.extract.options import VERIFY

    VERIFY.add_parser(sub).set_defaults(func=cmd_verify)


def _progress(total_files: int, total_bytes: int, by_bytes: bool, enabled: bool):
    """(advance(entry), close): a rich bar on a terminal's stderr, a line every 10 s otherwise."""
    if not enabled or not total_files:
        return (lambda e: None), (lambda: None)
    total = total_bytes if by_bytes else total_files
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        cols = [BarColumn(), DownloadColumn() if by_bytes else MofNCompleteColumn(), TimeRemainingColumn()]
        prog = Progress("verify", *cols, console=Console(stderr=True))
        task = prog.add_task("verify", total=total)
        prog.start()
        return (lambda r: prog.update(task, advance=r["b"] if by_bytes else 1)), prog.stop
    state = {"n": 0, "last": time.monotonic()}

    def advance(r):
        state["n"] += r["b"] if by_bytes else 1
        now = time.monotonic()
        if now - state["last"] >= 10:
            state["last"] = now
            print(
                f"verify: {state['n'] / max(total, 1):.0%} of {total_files} files",
                file=sys.stderr,
                flush=True,
            )

    return advance, (lambda: None)


def cmd_verify(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.extract.errors import ExtractError
    from eagle3ops.extract.session import damaged_report, load_seq_lens
    from eagle3ops.store import HiddenStateStore, StoreError

    t0 = time.monotonic()
    store = HiddenStateStore(args.data)
    meta = store.read_meta()
    if meta is None or not all(meta.get(k) for k in ("num_states", "hidden_size", "dtype")):
        raise CommandError(
            f"{store.meta_path}: no extraction metadata (num_states, hidden_size, dtype) here; point --data at "
            "a data directory `eagle3ops extract` wrote into"
        )
    scan = store.scan_manifest()
    rows = scan.rows()
    try:
        seq_lens = load_seq_lens(args.data)
        lens = {i: (seq_lens[i] if i < len(seq_lens) else r["n"]) for i, r in rows.items()}
    except ExtractError:  # no dataset beside the states (copied alone): the manifest's lengths
        lens = {i: r["n"] for i, r in rows.items()}
    todo = [rows[i] for i in sorted(rows)]
    total_bytes = sum(r["b"] for r in todo)
    advance, close = _progress(len(todo), total_bytes, args.level == "checksum", args.progress)

    def feed():
        for r in todo:
            yield r
            advance(r)

    try:
        damaged, unchecked = store.check_files(
            feed(),
            lens,
            num_states=meta["num_states"],
            hidden_size=meta["hidden_size"],
            dtype=meta["dtype"],
            level=args.level,
        )
    except StoreError as e:
        raise CommandError(str(e)) from e
    finally:
        close()
    dups = scan.duplicates()
    res = {
        "data_dir": str(args.data),
        "level": args.level,
        "checked": len(todo),
        "bytes_checked": total_bytes if args.level == "checksum" else 0,
        "damaged": damaged_report(store, damaged),
        "duplicate_manifest_lines": sum(n - 1 for n in dups.values()),
        "duplicate_indices": sorted(dups)[:100],
        "unchecked_files": unchecked,
        "moved_aside": 0,
        "changed": False,
        "seconds": round(time.monotonic() - t0, 2),
    }
    if args.move_aside and (damaged or dups):
        moved = store.quarantine(damaged) if damaged else []
        if dups and not damaged:
            store.rewrite_manifests()
        res.update(moved_aside=sum(1 for m in moved if m["moved_to"]), changed=True, moved=moved)
    lines = [f"{i}: {d['file']}: {d['reason']}" for i, d in list(res["damaged"].items())[:20]]
    summary = (
        f"verify ({args.level}): {len(todo)} files checked, {len(damaged)} damaged or missing"
        + (f", {res['duplicate_manifest_lines']} duplicate manifest lines" if dups else "")
        + (f", {unchecked} without a checksum (adopted files)" if unchecked else "")
        + "".join(f"\n  {ln}" for ln in lines)
    )
    if damaged and not args.move_aside:
        raise CommandError(
            f"{summary}\n  re-run `eagle3ops extract` (or the extract phase"
            + (", extract_verify: checksum" if args.level == "checksum" else "")
            + ") to move them to hidden_states/damaged/ and extract them again, or `eagle3ops extract-verify "
            "--move-aside` to only move them aside",
            **res,
        )
    if res["moved_aside"] or (damaged and args.move_aside):
        summary += f"\n  moved aside to {store.dir / 'damaged'}; the next `eagle3ops extract` redoes them"
    emit(args, res, summary)
    return 0
