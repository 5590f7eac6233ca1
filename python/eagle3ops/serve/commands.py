"""The serve phase's sub-commands: ``eagle3ops serve-convert`` (a speculators EAGLE-3 checkpoint -> the draft directory
SGLang serves) and ``eagle3ops serve-process start|stop|status`` (a server as a detached process, for hosts without
systemd)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eagle3ops.command import CommandError, emit, pick
from eagle3ops.serve.options import CONVERT, SERVE_PROCESS
from eagle3ops.sglang.versions import KNOWN


def register(sub) -> None:
    CONVERT.add_parser(sub).set_defaults(func=cmd_convert)
    SERVE_PROCESS.add_parser(sub).set_defaults(func=cmd_serve_process)


def cmd_convert(args) -> int:
    from eagle3ops.remote_code import require_trusted
    from eagle3ops.serve import convert as cv

    if args.target:  # the first step of the serve phase: a remote-code target without the flag stops it here
        require_trusted(args.target, args.trust_remote_code, CommandError)
    try:
        if cv.is_specforge_run(args.checkpoint):  # a run of trainer specforge: SpecForge's own exporter
            res = cv.convert_specforge(
                args.checkpoint,
                args.out,
                **pick(
                    args, "target_arch", "check", "sglang_version", "target", sglang_ids="sglang_layer_ids"
                ),
            )
        else:
            res = cv.convert(
                args.checkpoint,
                args.out,
                **pick(
                    args,
                    "serve_window",
                    "target_arch",
                    "check",
                    "sglang_version",
                    "target",
                    sglang_ids="sglang_layer_ids",
                ),
            )
    except cv.ConvertError as e:
        if args.check and e.details.get("missing") and args.sglang_version in (None, *KNOWN):
            # check mode before training wrote a checkpoint (e.g. a first --check run of the whole pipeline)
            res = {
                "changed": True,
                "check_mode": True,
                "out": args.out,
                "checkpoint": args.checkpoint,
                "would": "convert the checkpoint once training has written it",
                "layer_ids": None,
                "sglang_layer_ids": None,
                "serve_args": [],
                "draft_window_size": None,
                "config": {},
            }
            print(
                f"convert: {args.checkpoint} has no checkpoint yet; would convert it after training",
                file=sys.stderr,
            )
            emit(args, res)
            return 0
        raise CommandError(str(e), **e.details) from None
    verb = ("would write" if args.check else "wrote") if res["changed"] else "up to date:"
    print(
        f"convert: {verb} {res['out']} from {res['checkpoint']} (target {res['target_arch']}, layer ids "
        f"{res['layer_ids']} -> SGLang {res['sglang_layer_ids']})",
        file=sys.stderr,
    )
    emit(args, res, f"{res['out']}: serve with {' '.join(res['serve_args'])}")
    return 0


def _spec(args) -> dict:
    from eagle3ops.serve import process as sp

    if args.spec_file:
        try:
            specs = json.loads(Path(args.spec_file).read_text())
        except (OSError, ValueError) as e:
            raise CommandError(
                f"{args.spec_file}: cannot read the server specs ({e}); run the serve phase"
            ) from None
        if args.name not in specs:
            raise CommandError(
                f"{args.spec_file}: no server named {args.name!r} (has: {', '.join(sorted(specs))})"
            )
        s = specs[args.name]
        return sp.make_spec(s.get("argv") or [], s.get("env"), s.get("url"), s.get("cwd"), s.get("stamp"))
    env = {}
    for kv in args.env:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise CommandError(f"--env {kv!r}: expected KEY=VALUE")
        env[k] = v
    argv = []
    try:
        if args.env_json:
            env.update(json.loads(args.env_json))
        if args.argv_json:
            argv = json.loads(args.argv_json)
    except ValueError as e:
        raise CommandError(f"--argv-json/--env-json: not JSON ({e})") from None
    if not isinstance(argv, list) or not isinstance(env, dict):
        raise CommandError("--argv-json must be a JSON list and --env-json a JSON object")
    return sp.make_spec(argv, env, args.url, args.cwd, args.stamp)


def cmd_serve_process(args) -> int:
    from eagle3ops.serve import process as sp

    try:
        if args.action == "status":
            res = {"changed": False, **sp.status(args.run_dir, args.name)}
        elif args.action == "stop":
            res = sp.stop(args.run_dir, args.name, grace=args.stop_grace, check=args.check)
        else:
            spec = _spec(args)
            res = sp.start(
                args.run_dir,
                args.name,
                spec,
                **pick(args, "health_timeout", "interval", "check", "stop_grace"),
            )
            res["spec"] = spec
    except sp.ServeProcessError as e:
        raise CommandError(str(e)) from None
    except OSError as e:
        raise CommandError(f"{args.run_dir}: {e.strerror} ({e.filename}); check the run directory") from None
    human = f"{args.name}: {res.get('action', args.action)} (changed={res['changed']}, pid={res.get('pid')})"
    print(human, file=sys.stderr)
    emit(args, res, human)
    return 0
