"""``eagle3ops train | train-status | train-stop``: the EAGLE-3 draft training run (speculators 0.9.0); the
options: :mod:`eagle3ops.train.options`."""

from __future__ import annotations

import sys


def register(sub) -> None:
    from eagle3ops.train.options import TRAIN, TRAIN_STATUS, TRAIN_STOP, TRAIN_VERIFY

    TRAIN.add_parser(sub).set_defaults(func=cmd_train)
    TRAIN_STATUS.add_parser(sub).set_defaults(func=cmd_status)
    TRAIN_STOP.add_parser(sub).set_defaults(func=cmd_stop)
    TRAIN_VERIFY.add_parser(sub).set_defaults(func=cmd_verify)


def _spec(args):
    """The run's settings from the parsed options (named alike; ``--extra`` is the spec's ``extra``)."""
    import dataclasses

    from eagle3ops.train.options import TRAIN
    from eagle3ops.train.spec import TrainSpec

    fields = {f.name for f in dataclasses.fields(TrainSpec)}
    given = {o.name: getattr(args, o.name) for o in TRAIN.options if o.cli and o.name in fields}
    return TrainSpec(**given, extra=args.extra_config)


def cmd_train(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.remote_code import require_trusted
    from eagle3ops.train.run import ensure_run
    from eagle3ops.train.spec import TrainError

    spec = _spec(args)
    require_trusted(spec.verifier_path, spec.trust_remote_code, CommandError)  # before any work, check too
    try:
        result = ensure_run(spec, check=args.check, wait=args.wait, timeout=args.timeout)
    except TrainError as e:
        raise CommandError(str(e), **e.details) from e
    m = result.get("metrics", {})
    human = (
        f"train {_what(result, args.check)} (changed={result['changed']}) run {result['run_dir']}"
        # check mode before extraction has run knows no layer ids/device yet: .get, not [...]
        f"\n  layer ids {result.get('layer_ids')}, draft vocab {result.get('draft_vocab_size')}, "
        f"device {result.get('device')} x{result.get('nproc')}"
        f"\n  val loss {m.get('val_loss')}, val cond acc {m.get('val_cond_acc')}"
    )
    for w in result.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    emit(args, result, human)
    return 0


def _what(result: dict, check: bool) -> str:
    """What happened to the run (check mode: what would), and its trainer's PID where there is one: check mode
    before a launch has none (issue 32: it printed "PID None")."""
    pid = f", PID {result['pid']}" if result.get("pid") else ""
    if check and result.get("would"):
        return f"--check: would {result['would']} (now {result.get('previous_status', 'new')}{pid})"
    if check:
        return f"--check: would leave it {result['status']}{pid}"
    return f"{result['status']}{pid}"


def cmd_status(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.train.run import status
    from eagle3ops.train.spec import TrainError

    try:
        emit(args, status(args.run_dir))
    except TrainError as e:
        raise CommandError(str(e), **e.details) from e
    return 0


def cmd_stop(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.train.run import stop
    from eagle3ops.train.spec import TrainError

    try:
        emit(args, stop(args.run_dir, args.grace, args.check))
    except TrainError as e:
        raise CommandError(str(e), **e.details) from e
    return 0


def cmd_verify(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.train.inputs import content_status
    from eagle3ops.train.spec import TrainError

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        res = content_status(args.data_dir, check=args.check, job_file=args.job_file, log=log)
    except TrainError as e:
        raise CommandError(str(e), **e.details) from e
    emit(args, res, res["progress"]["line"])
    return 0
