"""The benchmark phase's sub-commands: ``benchmark-acceptance | -live | -spec-probe | -contamination | -report |
-dataset``: measure a draft and report it. Whether a result is up to date, and how it is written:
:mod:`.uptodate`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eagle3ops.command import CommandError, emit


def register(sub) -> None:
    from eagle3ops.benchmark import options as bo

    bo.ACCEPTANCE.add_parser(sub).set_defaults(func=cmd_acceptance)
    bo.REPORT.add_parser(sub).set_defaults(func=cmd_report)
    bo.SPEC_PROBE.add_parser(sub).set_defaults(func=cmd_spec_probe)
    bo.LIVE.add_parser(sub).set_defaults(func=cmd_live)
    bo.CONTAMINATION.add_parser(sub).set_defaults(func=cmd_contamination)
    bo.DATASET.add_parser(sub).set_defaults(func=cmd_dataset)


def _refuse_remote_code(model_path, trust_remote_code: bool) -> None:
    """A remote-code target without --trust-remote-code (eagle3ops_trust_remote_code): refused before any work."""
    from eagle3ops.remote_code import require_trusted

    require_trusted(model_path, trust_remote_code, CommandError)


def _tokenizer_check(args) -> dict:
    """The server's tokenizer against the prepared rows (eagle3ops.serve.tokcheck), before anything is measured: a
    difference is refused (exit 2) naming the row and the first differing token; what was not checked, and why,
    goes into the result."""
    if not args.tokenizer_check:
        return {"checked": False, "reason": "off (--no-tokenizer-check)"}
    if not args.data_dir:
        return {"checked": False, "reason": "no prepared data given (--data)"}
    from eagle3ops.serve import tokcheck

    if args.tokenizer_model:
        _refuse_remote_code(args.tokenizer_model, args.trust_remote_code)
    try:
        res = tokcheck.check(
            args.url, args.data_dir, args.tokenizer_model, trust_remote_code=args.trust_remote_code
        )
    except tokcheck.TokcheckError as e:
        raise CommandError(str(e), **e.details) from None
    if res["checked"]:
        print(
            f"tokenizer check: the server's ids equal the prepared rows ({res['rows']} rows of "
            f"{res['conversations']} conversations) and our chat template's",
            file=sys.stderr,
        )
    else:
        print(f"tokenizer check: not checked: {res['reason']}", file=sys.stderr)
    return res


def cmd_acceptance(args) -> int:
    from eagle3ops.benchmark import acceptance as acc
    from eagle3ops.benchmark import uptodate

    _refuse_remote_code(args.target, args.trust_remote_code)
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
    settings = {
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "limit": args.limit,
        "baseline": args.baseline,
    }
    # device and dtype are recorded only where set: results measured before they existed stay up to date
    if (args.device, args.dtype) != ("cpu", "float32"):
        settings |= {"device": args.device, "dtype": args.dtype}
    try:
        inputs = uptodate.acceptance_inputs(args.checkpoint, args.target, args.prompts, **settings)
    except uptodate.MissingInput as e:
        if not args.check:
            raise CommandError(str(e)) from None
        # check mode before the earlier phases produced the draft / target: a real run would measure
        emit(
            args,
            {"changed": True, "check_mode": True, "out": args.out, "would": "measure once its inputs exist"},
        )
        return 0
    out = Path(args.out)
    changed = uptodate.recorded_inputs(out) != inputs
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
            trust_remote_code=args.trust_remote_code,
            **settings,
        )
    except acc.AcceptanceError as e:
        raise CommandError(str(e)) from None
    result["inputs"] = inputs
    uptodate.write_result(out, result)
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
    from eagle3ops.benchmark import report as rp

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
        live = {}
        for key, path in (("with_draft", args.live_with), ("without_draft", args.live_without)):
            if path and Path(path).is_file():
                live[key] = json.loads(Path(path).read_text())
            elif path and not args.check:
                raise CommandError(f"{path}: no benchmark-live result (did the live benchmark run?)")
        if args.contamination and Path(args.contamination).is_file():
            live["contamination"] = json.loads(Path(args.contamination).read_text())
        res = rp.write(args.out_dir, acceptance, w, wo, check=args.check, live=live or None)
    except (OSError, ValueError, rp.ReportError) as e:
        raise CommandError(str(e)) from None
    emit(args, res, res["markdown"])
    return 0


def cmd_dataset(args) -> int:
    from eagle3ops.benchmark.acceptance import AcceptanceError, load_prompts
    from eagle3ops.benchmark.uptodate import write_text_if_changed

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
    changed = write_text_if_changed(args.out, "\n".join(lines) + "\n")
    emit(args, {"changed": changed, "out": str(Path(args.out)), "rows": len(lines)})
    return 0


def cmd_spec_probe(args) -> int:
    from eagle3ops.benchmark import loadgen
    from eagle3ops.benchmark.acceptance import AcceptanceError, load_prompts
    from eagle3ops.benchmark.uptodate import write_result

    if args.chat_template:
        _refuse_remote_code(args.chat_template, args.trust_remote_code)
    tokenizer_check = _tokenizer_check(args)
    try:
        if args.prompts:
            rows = load_prompts(args.prompts, args.limit)
            texts = [
                "\n".join(m["content"] for m in r["messages"] if m["role"] == "user")
                for r in rows
                if "messages" in r
            ]
            if not texts:
                raise CommandError(f"{args.prompts}: no text prompts (SGLang's /generate needs text)")
        else:
            texts = loadgen.BUILTIN_PROBE_PROMPTS[: args.limit or None]
        render = None
        if args.chat_template:
            if not Path(args.chat_template).is_dir():
                raise CommandError(
                    f"{args.chat_template}: not a directory (--chat-template wants the target's model directory, "
                    "the one SGLang serves)"
                )
            render = loadgen.chat_template_render(
                args.chat_template, trust_remote_code=args.trust_remote_code
            )
        res = loadgen.spec_probe(args.url, texts, max_new_tokens=args.max_new_tokens, render=render)
    except (AcceptanceError, loadgen.LiveError, OSError) as e:
        raise CommandError(str(e)) from None
    res["prompts_file"] = args.prompts or "(built-in probe prompts)"
    res["tokenizer_check"] = tokenizer_check
    if args.chat_template and render is None:
        res["chat_template_note"] = (
            f"{args.chat_template} has no chat template: prompts were sent as they are"
        )
    if args.min_accept_length is not None:
        res["min_accept_length"] = args.min_accept_length
        why = loadgen.guard(res, args.min_accept_length, args.url)
        if why:
            raise CommandError(why, **res)
    changed = False
    if args.out:
        write_result(args.out, res)
        changed = True
    print(
        f"acceptance length {res['acceptance_length']} over {res['prompts']} prompts (per request "
        f"{res['per_request']})",
        file=sys.stderr,
    )
    emit(args, {"changed": changed, "out": args.out, **res})
    return 0


def _sets(args, turns: str, skip_ids: bool = False) -> dict:
    from eagle3ops.benchmark import promptsets as ps

    sets = {}
    for pair in args.set.items():
        name, path = ps.parse_set_arg("=".join(pair))  # a usable name and a path
        sets[name] = {"path": path, **ps.load_set(path, turns=turns, skip_ids=skip_ids)}
    return sets


def _live_inputs(args) -> dict:
    from eagle3ops.benchmark.uptodate import live_inputs

    return live_inputs(
        args.set,
        server_key=args.server_key,
        url=args.url,
        settings={
            "mtbench_turns": args.mtbench_turns,
            "concurrency": list(args.concurrency),
            "num_requests": args.num_requests,
            "max_new_tokens": args.max_new_tokens,
            "time_budget": args.time_budget,
            "ignore_eos": args.ignore_eos,
            "template_model": args.template_model,
            "rounds": args.rounds,
            "per_category": args.per_category,
            "seed": args.seed,
            "lossless_sample": args.lossless_sample,
        },
    )


def _requests(args, sets: dict) -> tuple[dict, dict]:
    """Per set: its items (MT-bench sampled per category with ``--per-category``), and what the sample took."""
    from eagle3ops.benchmark import promptsets as ps

    chosen, sampled = {}, {}
    for name, s in sets.items():
        items = s["items"]
        if args.per_category and any(it.get("category") for it in items):
            st = ps.stratified(items, args.per_category, args.seed)
            items = st["items"]
            sampled[name] = {k: st[k] for k in ("per_category", "seed", "counts", "short", "missing")}
        if (
            args.num_requests
        ):  # exactly N: the first N prompts, repeated from the start when the set is smaller
            items = [items[i % len(items)] for i in range(args.num_requests)]
        chosen[name] = items
    return chosen, sampled


def _lossless_prompts(chosen: dict, n: int) -> list[dict]:
    """``n`` prompts for the lossless check, taken from the sets in turn (first turns, each prompt once)."""
    queues = {name: list({id(it): it for it in items}.values()) for name, items in chosen.items()}
    out: list[dict] = []
    while len(out) < n and any(queues.values()):
        for name, q in queues.items():
            if q and len(out) < n:
                it = q.pop(0)
                out.append(
                    {"set": name, "id": it["id"], "category": it.get("category"), "text": it["turns"][0]}
                )
    return out


def cmd_live(args) -> int:
    from eagle3ops.benchmark import loadgen
    from eagle3ops.benchmark import promptsets as ps
    from eagle3ops.benchmark.uptodate import recorded_inputs, write_result

    if args.template_model:
        _refuse_remote_code(args.template_model, args.trust_remote_code)
    inputs = _live_inputs(args)
    out = Path(args.out)
    changed = recorded_inputs(out) != inputs
    if not changed or args.check:
        res = {"changed": changed, "measure": changed, "check_mode": args.check, "out": str(out)}
        emit(args, res, f"{out}: {'would measure' if changed else 'up to date'}")
        return 0
    tokenizer_check = _tokenizer_check(args)
    try:
        sets = _sets(args, args.mtbench_turns)
        render = None
        if args.template_model:
            render = loadgen.chat_template_render(
                args.template_model, trust_remote_code=args.trust_remote_code
            )
            if render is None:
                print(
                    f"benchmark-live: {args.template_model} has no chat template; plain prompts",
                    file=sys.stderr,
                )
        chosen, sampled = _requests(args, sets)
        runs = []
        # a round measures every set and concurrency once: the rounds interleave them
        for rnd in range(args.rounds):
            for name, items in chosen.items():
                for conc in args.concurrency:
                    r = loadgen.run_load(
                        args.url,
                        [it["turns"] for it in items],
                        concurrency=conc,
                        max_new_tokens=args.max_new_tokens,
                        time_budget=args.time_budget,
                        timeout=args.timeout,
                        ignore_eos=args.ignore_eos,
                        render=render,
                    )
                    r |= {"set": name, "format": sets[name]["format"], "round": rnd + 1}
                    r["categories"] = [it.get("category") for it in items]
                    print(
                        f"{args.label} {name} c={conc} round {rnd + 1}: {r['output_tok_s']} tok/s over {r['turns']} "
                        f"turns, acceptance {r['acceptance_length']}",
                        file=sys.stderr,
                    )
                    runs.append(r)
        lossless = None
        if args.lossless_sample:
            prompts = _lossless_prompts(chosen, args.lossless_sample)
            lossless = {
                "sample": len(prompts),
                "max_new_tokens": args.max_new_tokens,
                "items": loadgen.greedy_sample(
                    args.url, prompts, max_new_tokens=args.max_new_tokens, render=render, timeout=args.timeout
                ),
            }
        info = loadgen.server_info(args.url)
    except (ps.PromptSetError, loadgen.LiveError) as e:
        raise CommandError(str(e)) from None
    result = {
        "label": args.label,
        "url": args.url,
        "rendering": "chat_template" if render else "plain",
        "runs": runs,
        "sampled": sampled,
        "lossless": lossless,
        "server": {k: info.get(k) for k in loadgen.SERVER_KEYS} if info else None,
        "tokenizer_check": tokenizer_check,
        "inputs": inputs,
    }
    write_result(out, result)
    summary = [
        {k: r[k] for k in ("set", "concurrency", "output_tok_s", "acceptance_length", "turns")} for r in runs
    ]
    emit(
        args,
        {
            "changed": True,
            "measure": True,
            "check_mode": False,
            "out": str(out),
            "summary": summary,
            "tokenizer_check": tokenizer_check,
        },
    )
    return 0


def cmd_contamination(args) -> int:
    from eagle3ops.benchmark import promptsets as ps
    from eagle3ops.benchmark.uptodate import write_text_if_changed

    try:
        sets = _sets(args, args.mtbench_turns, skip_ids=True)
        res = ps.contamination(sets, args.training)
    except ps.PromptSetError as e:
        raise CommandError(str(e)) from None
    res["mode"] = args.mode
    res["sets"] = {
        k: {"path": v["path"], "format": v["format"], "items": len(v["items"])} for k, v in sets.items()
    }
    if args.out:
        write_text_if_changed(args.out, json.dumps(res, indent=2, sort_keys=True) + "\n")
    if not args.training:
        res["msg"] = "no training data given: contamination not checked"
    elif not res["clean"]:
        lines = [
            f"{name}: {h['id']} turn {h['turn']} ({h['match']}) at {h['where']}"
            for name, hs in res["contaminated"].items()
            for h in hs[:10]
        ]
        n = sum(len(v) for v in res["contaminated"].values())
        msg = (
            f"{n} benchmark prompt turn(s) appear in the training data's user turns, so their acceptance would be "
            f"measured on text the draft was trained on: "
            + "; ".join(lines)
            + ". Remove these conversations from "
            "the training data (prepare_inputs) and train again, or drop them from the prompt set"
        )
        if args.mode == "fail":
            raise CommandError(msg + " (or set benchmark_contamination: warn to report only).", **res)
        res["msg"] = "WARNING: " + msg
        print(res["msg"], file=sys.stderr)
    else:
        res["msg"] = (
            f"no benchmark prompt in {res['training_user_turns']} training user turns ({', '.join(res['training'])})"
        )
    if res["training_missing"]:
        res["msg"] += (
            f"; WARNING: training data not found, not checked: {', '.join(res['training_missing'])} "
            "(benchmark_training_data)"
        )
    skipped = {k: v["skipped"] for k, v in sets.items() if v["skipped"]}
    if skipped:
        res["msg"] += f"; rows given only as token ids were not compared: {skipped}"
    emit(args, {"changed": False, **res}, res["msg"])
    return 0
