"""``eagle3ops train | train-status | train-stop``: the EAGLE-3 draft training run (speculators 0.9.0)."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="start (or find running/finished, or resume) the detached speculators training run of a run dir",
        description="Idempotent: a running or finished run with the same config is left alone (changed=false); "
        "a killed/crashed one is relaunched and resumes from its last checkpoint.",
    )
    p.add_argument("--data", required=True, help="data dir: Arrow dataset + hidden_states/ + token_freq.pt")
    p.add_argument("--verifier", required=True, help="target model directory (the one the states came from)")
    p.add_argument("--run-dir", required=True, help="run directory (state, rendered config, log, metrics)")
    p.add_argument("--save-path", help="checkpoint directory (default RUN/checkpoints)")
    p.add_argument("--layer-ids", type=int, nargs="+", help="only to assert: must equal extract_meta.json's")
    p.add_argument("--draft-vocab-size", type=int, help="default 32000, capped at the distinct tokens seen")
    p.add_argument("--token-freq", help="token frequencies (default DATA/token_freq.pt)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--num-layers", type=int, default=1, help="draft decoder layers")
    p.add_argument("--total-seq-len", type=int, default=8192, help="tokens per packed batch")
    p.add_argument("--train-data-ratio", type=float, default=0.9)
    p.add_argument("--max-steps", type=int)
    p.add_argument(
        "--checkpoint-freq", type=float, default=1.0, help="epochs between checkpoints (<1: within)"
    )
    p.add_argument("--log-freq", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--norm-before-residual",
        action="store_true",
        help="speculators' default; SGLang 0.5.23 cannot serve it, so off unless asked",
    )
    p.add_argument("--attention", choices=["full", "sliding"], default="full")
    p.add_argument("--sliding-window", type=int, default=2048)
    p.add_argument("--on-missing", choices=["raise", "skip", "warn"], default="raise")
    p.add_argument("--mask-token-id", type=int)
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--nproc", type=int, help="trainer processes on GPUs (default: every visible GPU)")
    p.add_argument("--num-workers", type=int, help="loader workers per process (default 0 on CPU)")
    p.add_argument("--nnodes", type=int, default=1, help="hosts training together (torchrun --nnodes)")
    p.add_argument(
        "--node-rank", type=int, default=0, help="this host's index among them (0 = rendezvous host)"
    )
    p.add_argument(
        "--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (the first host), with --nnodes > 1"
    )
    p.add_argument("--rdzv-id", help="rendezvous id, the same on every node (default from the run directory)")
    p.add_argument(
        "--nic", help="network interface for NCCL and gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)"
    )
    p.add_argument(
        "--trainer",
        choices=["speculators", "ddp_probe"],
        default="speculators",
        help="speculators, or ddp_probe: the minimal DDP job through the same launcher (a cluster check; the "
        "multi-node trainer on CPU)",
    )
    p.add_argument("--draft-attn-impl", choices=["simple_flex_attention", "sdpa", "eager"])
    p.add_argument(
        "--loss-implementation",
        choices=["fused", "eager"],
        help="default eager (speculators 0.9.0's fused loss failed under torch 2.11 dynamo on an H200)",
    )
    p.add_argument("--extra", default="{}", help="JSON: {group: {speculators key: value}} for other settings")
    p.add_argument("--env", default="{}", help="JSON: extra environment variables for the trainer")
    p.add_argument("--restart-on-change", action="store_true")
    p.add_argument("--launcher", choices=["auto", "systemd", "setsid"], default="auto")
    p.add_argument("--unit-name", help="systemd unit name (default eagle3-train-<hash of run dir>)")
    p.add_argument("--python", help="interpreter for the trainer (default: this one)")
    p.add_argument("--no-gpu-free-check", action="store_true")
    p.add_argument("--gpu-free-timeout", type=float, default=60)
    p.add_argument("--wait", action="store_true", help="block until the run ends; return its final metrics")
    p.add_argument("--timeout", type=float, default=3600, help="seconds --wait waits")
    p.add_argument("--check", action="store_true", help="predict what would happen; change nothing")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    p.set_defaults(func=cmd_train)

    s = sub.add_parser("train-status", help="state, resume point and metrics of a training run dir")
    s.add_argument("--run-dir", required=True)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    k = sub.add_parser(
        "train-stop", help="stop a running training run (SIGTERM: speculators saves 'interrupted')"
    )
    k.add_argument("--run-dir", required=True)
    k.add_argument("--grace", type=float, default=60)
    k.add_argument("--check", action="store_true")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_stop)


def _json_arg(text: str, name: str) -> dict:
    from eagle3ops.command import CommandError

    try:
        v = json.loads(text or "{}")
    except ValueError as e:
        raise CommandError(f"--{name} is not valid JSON: {e}") from e
    if not isinstance(v, dict):
        raise CommandError(f"--{name} must be a JSON object")
    return v


def cmd_train(args) -> int:
    from eagle3ops.command import CommandError, emit
    from eagle3ops.train.run import ensure_run
    from eagle3ops.train.spec import TrainError, TrainSpec

    spec = TrainSpec(
        data_dir=args.data,
        verifier_path=args.verifier,
        run_dir=args.run_dir,
        save_path=args.save_path,
        layer_ids=args.layer_ids,
        draft_vocab_size=args.draft_vocab_size,
        token_freq_path=args.token_freq,
        epochs=args.epochs,
        lr=args.lr,
        ttt_steps=args.ttt_steps,
        num_layers=args.num_layers,
        total_seq_len=args.total_seq_len,
        train_data_ratio=args.train_data_ratio,
        max_steps=args.max_steps,
        checkpoint_freq=args.checkpoint_freq,
        log_freq=args.log_freq,
        seed=args.seed,
        norm_before_residual=args.norm_before_residual,
        attention=args.attention,
        sliding_window=args.sliding_window,
        on_missing=args.on_missing,
        mask_token_id=args.mask_token_id,
        device=args.device,
        nproc=args.nproc,
        num_workers=args.num_workers,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        nic=args.nic,
        trainer=args.trainer,
        draft_attn_impl=args.draft_attn_impl,
        loss_implementation=args.loss_implementation,
        extra=_json_arg(args.extra, "extra"),
        env=_json_arg(args.env, "env"),
        restart_on_change=args.restart_on_change,
        launcher=args.launcher,
        unit_name=args.unit_name,
        python=args.python,
        gpu_free_check=not args.no_gpu_free_check,
        gpu_free_timeout=args.gpu_free_timeout,
    )
    try:
        result = ensure_run(spec, check=args.check, wait=args.wait, timeout=args.timeout)
    except TrainError as e:
        raise CommandError(str(e), **e.details) from e
    m = result.get("metrics", {})
    human = (
        f"train {result['status']} (changed={result['changed']}) run {result['run_dir']} PID {result.get('pid')}"
        # check mode before extraction has run knows no layer ids/device yet: .get, not [...]
        f"\n  layer ids {result.get('layer_ids')}, draft vocab {result.get('draft_vocab_size')}, "
        f"device {result.get('device')} x{result.get('nproc')}"
        f"\n  val loss {m.get('val_loss')}, val cond acc {m.get('val_cond_acc')}"
    )
    for w in result.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    emit(args, result, human)
    return 0


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
