"""``eagle3ops sglang-patch status|apply|restore`` (the sglang phase's) and ``eagle3ops extract-sglang`` (the
extract phase's SGLang backend). Found by :mod:`eagle3ops.cli` like every package's ``commands``; their option
definitions stay with the phases whose roles and modules use them (:mod:`eagle3ops.extract.options`)."""

from __future__ import annotations

import sys

from eagle3ops.command import CommandError, disk_margin_bytes, emit, pick
from eagle3ops.remote_code import require_trusted
from eagle3ops.sglang.versions import KNOWN, UnknownVersion, get

# the options of the store both the SGLang run and its check-mode plan (the transformers backend's) take
_STORE_OPTIONS = ("layer_ids", "layer_convention", "dtype", "limit", "trust_remote_code")
_ADOPT_OPTIONS = (
    "adopt_from",
    "adopt_layer_ids",
    "adopt_layer_convention",
    "adopt_last_state",
    "adopt_keys",
    "adopt_checksum",
)
_STORE_RENAMED = {"data_dir": "data", "model_path": "model", "margin_frac": "margin"}


def register(sub) -> None:
    from eagle3ops.sglang.options import SGLANG_EXTRACT, SGLANG_PATCH

    SGLANG_PATCH.add_parser(sub).set_defaults(func=cmd_patch)
    SGLANG_EXTRACT.add_parser(sub).set_defaults(func=cmd_extract)


def _check_version(version: str) -> None:
    try:
        get(version)
    except UnknownVersion as e:
        raise CommandError(str(e), sglang_version=version, known=list(KNOWN)) from None


def cmd_patch(args) -> int:
    from eagle3ops.sglang import patch as sp

    _check_version(args.sglang_version)
    try:
        path = args.file or sp.locate(python=args.python, site_packages=args.site_packages)
        if args.action == "status":
            res = sp.status(path, args.sglang_version)
        elif args.action == "apply":
            res = sp.apply(path, args.sglang_version, check=args.check, diff=args.diff)
        else:
            res = sp.restore(path, args.sglang_version, check=args.check, diff=args.diff)
    except sp.PatchError as e:
        raise CommandError(str(e), **e.details) from None
    res["check_mode"] = bool(args.check)
    human = f"{res['path']}: {res['state']}" + (" (changed)" if res.get("changed") else "")
    if args.diff and res.get("diff") and not args.json:
        human = res["diff"] + human
    emit(args, res, human)
    return 0


def _refuse_non_decoder(model) -> None:
    """A checkpoint with no decoder layers to capture (a vision tower or an encoder alone), or a shard its index
    lists that is missing or truncated: refused before the run lock, the run log or a request, as the transformers
    backend refuses it (eagle3ops.extract.text_model.describe reads config.json and the safetensors headers only).
    A model path that does not exist is left to the run's own check (it names the setting)."""
    from pathlib import Path

    from eagle3ops.extract.errors import ExtractError
    from eagle3ops.extract.text_model import describe

    if Path(model).is_dir():
        try:
            describe(model)
        except ExtractError as e:
            raise CommandError(str(e)) from None


def cmd_extract(args) -> int:
    from eagle3ops.extract.errors import ExtractError
    from eagle3ops.extract.status import note_running, run_log
    from eagle3ops.runlock import RunLock, holder, wait_free
    from eagle3ops.sglang.client import SGLangClientError, SGLangExtractConfig, run_sglang_extraction
    from eagle3ops.sglang.patch import PatchError
    from eagle3ops.store import StoreError

    _check_version(args.sglang_version)
    require_trusted(args.model, args.trust_remote_code, CommandError)  # before any work, check mode too
    _refuse_non_decoder(args.model)
    cfg = SGLangExtractConfig(
        **pick(
            args,
            *_STORE_OPTIONS,
            "url",
            "world_size",
            "first_rank",
            "reassign_ranks",
            "reassign_from_data",
            "concurrency",
            "request_timeout",
            "retries",
            "backoff",
            "backoff_max",
            "health_timeout",
            "confirm_timeout",
            "server_unit",
            "server_pid",
            "restore_patch",
            "restore_patch_always",
            "sglang_version",
            "progress",
            "pve_storage",
            *_ADOPT_OPTIONS,
            **_STORE_RENAMED,
        ),
        margin_bytes=disk_margin_bytes(args.disk_margin_mib),
        stop_server=not args.keep_server,
    )
    try:
        if args.check:
            from eagle3ops.extract.session import plan_extraction

            running = holder(args.data)  # check mode takes no lock; it reports a run in progress
            if running and args.wait_running > 0:
                running = wait_free(args.data, args.wait_running)
            from eagle3ops.sglang.client import routing

            _, ranks, _ = routing(cfg, 0)  # this host's global ranks (several hosts), as the run takes them
            res = plan_extraction(cfg.store_config(ranks))
            res.update(
                backend="sglang",
                check_mode=True,
                changed=bool(res["to_extract"] or res.get("importable") or res.get("dump_rows")),
                written=0,
                failed=0,
            )
            note_running(res, args.data, running)
            emit(
                args,
                res,
                f"sglang extract would send {res['to_extract']} of {res['total']} rows "
                f"({res['bytes_needed']} bytes to write, {res['free_bytes']} free)",
            )
            return 0
        with RunLock(args.data, what="sglang-extract") as lock, run_log(args.data, "extract-sglang"):
            res = run_sglang_extraction(cfg)
            res.update(lock.result_fields())
    except (SGLangClientError, ExtractError, StoreError, PatchError) as e:
        raise CommandError(str(e)) from None
    res["changed"] = (
        res["written"] > 0
        or res.get("imported", 0) > 0
        or bool(res.get("patch", {}).get("changed"))
        or bool((res.get("dump") or {}).get("changed"))
    )
    human = (
        f"sglang extract: {res['written']} written, {res['done_before']} already done, {res['failed']} failed "
        f"of {res['total']} rows; {res['tokens']} tokens, {res['bytes']} bytes in {res['seconds']} s"
    )
    if res["failed"]:
        emit(
            args,
            {
                **res,
                "failed": True,
                "failed_rows": res["failed"],
                "msg": f"{res['failed']} rows failed (first: {res['errors'][:1]}); re-run to retry them",
            },
            human,
        )
        print(human, file=sys.stderr)
        return 1
    emit(args, res, human)
    return 0
