"""``eagle3ops benchmark-acceptance | benchmark-report | benchmark-dataset``: measure a draft and report it."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from eagle3ops.cli import CommandError, add_json_flag, emit

BIG = 1 << 30  # files above this are fingerprinted by size + mtime instead of sha256


def register(sub) -> None:
    a = sub.add_parser(
        "benchmark-acceptance",
        help="offline acceptance length of a draft: greedy chain drafting verified by the target (transformers)",
        description="Written only when its inputs (checkpoint, target, prompts, settings) changed.",
    )
    a.add_argument(
        "--checkpoint", required=True, help="speculators checkpoint dir, save path or train run dir"
    )
    a.add_argument("--target", required=True, help="target model directory (transformers)")
    a.add_argument("--prompts", required=True, help="held-out prompts JSONL (not used in training)")
    a.add_argument("--out", required=True, help="result JSON file")
    a.add_argument("--k", type=int, default=3, help="draft tokens per verify step (speculative-num-steps)")
    a.add_argument("--max-new-tokens", type=int, default=64)
    a.add_argument("--limit", type=int, help="use only the first N prompts")
    a.add_argument("--no-baseline", action="store_true", help="skip the random-draft baseline")
    a.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy machine)"
    )
    a.add_argument(
        "--max-target-gb",
        type=float,
        help="skip (not fail) when the target's weights exceed this size: the target runs in float32 here",
    )
    a.add_argument("--check", action="store_true", help="only say whether it would run")
    add_json_flag(a)
    a.set_defaults(func=cmd_acceptance)

    r = sub.add_parser("benchmark-report", help="JSON + markdown table + PNG plot of the benchmark results")
    r.add_argument("--out-dir", required=True)
    r.add_argument("--acceptance", help="benchmark-acceptance result JSON")
    r.add_argument("--sglang-with", help="SGLang bench JSONL of the server with the draft")
    r.add_argument("--sglang-without", help="SGLang bench JSONL of the server without the draft")
    r.add_argument(
        "--spec-probe", help="benchmark-spec-probe result JSON (completion tokens / spec_verify_ct)"
    )
    r.add_argument("--check", action="store_true")
    add_json_flag(r)
    r.set_defaults(func=cmd_report)

    q = sub.add_parser(
        "benchmark-spec-probe",
        help="acceptance length of a running SGLang EAGLE3 server: completion tokens / spec_verify_ct",
    )
    q.add_argument("--url", required=True, help="the server's base URL")
    q.add_argument("--prompts", required=True, help="held-out prompts JSONL")
    q.add_argument("--out", required=True, help="result JSON")
    q.add_argument("--max-new-tokens", type=int, default=128)
    q.add_argument("--limit", type=int)
    add_json_flag(q)
    q.set_defaults(func=cmd_spec_probe)

    d = sub.add_parser(
        "benchmark-dataset", help="held-out prompts -> the JSONL SGLang's bench reads (--dataset-name custom)"
    )
    d.add_argument("--prompts", required=True)
    d.add_argument("--out", required=True)
    add_json_flag(d)
    d.set_defaults(func=cmd_dataset)


def _fingerprint(paths: list[Path]) -> dict:
    out = {}
    for p in paths:
        st = p.stat()
        if st.st_size > BIG:
            out[str(p)] = f"size={st.st_size},mtime={int(st.st_mtime)}"
            continue
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out[str(p)] = h.hexdigest()
    return out


def acceptance_inputs(args) -> dict:
    from eagle3ops.convert import ConvertError, resolve_checkpoint

    try:
        ckpt = resolve_checkpoint(args.checkpoint)
    except ConvertError as e:
        raise CommandError(str(e)) from None
    target = Path(args.target)
    prompts = Path(args.prompts)
    for p in (target / "config.json", prompts):
        if not p.is_file():
            raise CommandError(f"{p}: missing (the target's config.json / the held-out prompts file)")
    files = [ckpt / "config.json", ckpt / "model.safetensors", target / "config.json", prompts]
    files += sorted(target.glob("*.safetensors"))
    return {
        "checkpoint": str(ckpt),
        "files": _fingerprint(files),
        "settings": {
            "k": args.k,
            "max_new_tokens": args.max_new_tokens,
            "limit": args.limit,
            "baseline": not args.no_baseline,
        },
    }


def cmd_acceptance(args) -> int:
    from eagle3ops import acceptance as acc

    if args.max_target_gb:
        size = sum(p.stat().st_size for p in Path(args.target).glob("*.safetensors"))
        if size > args.max_target_gb * 2**30:
            msg = (
                f"offline acceptance skipped: {args.target} holds {size / 2**30:.1f} GiB of weights (> "
                f"{args.max_target_gb:g}); it runs the target with transformers in float32. Measure on the SGLang "
                "server instead, or raise the limit (benchmark_offline_max_target_gb)."
            )
            print(msg, file=sys.stderr)
            emit(args, {"changed": False, "too_large": True, "msg": msg, "out": args.out})
            return 0
    try:
        inputs = acceptance_inputs(args)
    except CommandError:
        if not args.check:
            raise
        # check mode before the earlier phases produced the draft / target: a real run would measure
        emit(
            args,
            {"changed": True, "check_mode": True, "out": args.out, "would": "measure once its inputs exist"},
        )
        return 0
    out = Path(args.out)
    try:
        current = json.loads(out.read_text()).get("inputs")
    except (OSError, ValueError):
        current = None
    changed = current != inputs
    if not changed or args.check:
        res = {"changed": changed, "check_mode": args.check, "out": str(out)}
        if not changed:
            res["result"] = json.loads(out.read_text())
        emit(args, res, f"{out}: {'would measure' if changed else 'up to date'}")
        return 0
    import torch

    torch.set_num_threads(max(1, args.threads))
    try:
        result = acc.run(
            inputs["checkpoint"],
            args.target,
            args.prompts,
            k=args.k,
            max_new_tokens=args.max_new_tokens,
            limit=args.limit,
            baseline=not args.no_baseline,
        )
    except acc.AcceptanceError as e:
        raise CommandError(str(e)) from None
    result["inputs"] = inputs
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)
    d = result["draft"]
    print(
        f"acceptance: {d['acceptance_length']} (max {d['max_acceptance_length']}) over {d['verify_steps']} verify "
        f"steps, per position {d['per_position']}; random draft "
        f"{(result.get('random_draft') or {}).get('acceptance_length', '-')}",
        file=sys.stderr,
    )
    emit(args, {"changed": True, "check_mode": False, "out": str(out), "result": result})
    return 0


def cmd_report(args) -> int:
    from eagle3ops import report as rp

    if args.check and args.acceptance and not Path(args.acceptance).is_file():
        emit(
            args,
            {
                "changed": True,
                "check_mode": True,
                "paths": {},
                "report": None,
                "markdown": "",
                "would": f"write the report once {args.acceptance} exists",
            },
        )
        return 0
    try:
        acceptance = json.loads(Path(args.acceptance).read_text()) if args.acceptance else None
        w = rp.read_sglang_bench(args.sglang_with) if args.sglang_with else None
        wo = rp.read_sglang_bench(args.sglang_without) if args.sglang_without else None
        if w is not None and args.spec_probe:
            w["spec_probe"] = json.loads(Path(args.spec_probe).read_text())
        res = rp.write(args.out_dir, acceptance, w, wo, check=args.check)
    except (OSError, ValueError, rp.ReportError) as e:
        raise CommandError(str(e)) from None
    emit(args, res, res["markdown"])
    return 0


def cmd_dataset(args) -> int:
    from eagle3ops.acceptance import AcceptanceError, load_prompts

    try:
        rows = load_prompts(args.prompts)
    except (OSError, AcceptanceError) as e:
        raise CommandError(str(e)) from None
    raw = {}
    for line in Path(args.prompts).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            raw[r.get("id")] = r
    lines = []
    for r in rows:
        if "messages" not in r:
            raise CommandError(f"{args.prompts}: row {r['id']} has only input_ids; SGLang's bench needs text")
        user = "\n".join(m["content"] for m in r["messages"] if m["role"] == "user")
        ref = (raw.get(r["id"]) or {}).get("reference") or "(no reference)"
        lines.append(
            json.dumps(
                {
                    "id": r["id"],
                    "conversations": [
                        {"role": "user", "content": user},
                        {"role": "assistant", "content": ref},
                    ],
                }
            )
        )
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    changed = not out.is_file() or out.read_text() != text
    if changed:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    emit(args, {"changed": changed, "out": str(out), "rows": len(lines)})
    return 0


def cmd_spec_probe(args) -> int:
    from eagle3ops import report as rp
    from eagle3ops.acceptance import AcceptanceError, load_prompts

    try:
        rows = load_prompts(args.prompts, args.limit)
        texts = [
            "\n".join(m["content"] for m in r["messages"] if m["role"] == "user")
            for r in rows
            if "messages" in r
        ]
        if not texts:
            raise CommandError(f"{args.prompts}: no text prompts (SGLang's /generate needs text)")
        res = rp.spec_probe(args.url, texts, max_new_tokens=args.max_new_tokens)
    except (AcceptanceError, rp.ReportError, OSError) as e:
        raise CommandError(str(e)) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    emit(args, {"changed": True, "out": str(out), **res})
    return 0
