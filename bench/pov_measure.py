"""The measurements of a proof-of-value run (bench/proof_of_value.py, issue #31): the widened target's answers against
the original's, interleaved with/without rounds, the cycle split, and the verdict on the issue's goals."""

from __future__ import annotations

import statistics

import sglang_live as L


def identical(a, base: L.Server, wide: L.Server, qs: list[str], render) -> dict:
    """The widened target's greedy answers against SmolLM2's, token by token (output ids when the server returns
    them, else the text)."""
    from eagle3ops.benchmark.loadgen import generate

    same, first_diff, compared = 0, [], 0
    for i, q in enumerate(qs):
        s = {"temperature": 0, "max_new_tokens": a.identity_tokens}
        x, y = (
            generate(base.url, render([{"role": "user", "content": q}]), s),
            generate(wide.url, render([{"role": "user", "content": q}]), s),
        )
        xs, ys = x.get("output_ids") or x.get("text"), y.get("output_ids") or y.get("text")
        compared += len(xs)
        if xs == ys:
            same += 1
        else:
            k = next(
                (j for j, (u, v) in enumerate(zip(xs, ys, strict=False)) if u != v), min(len(xs), len(ys))
            )
            first_diff.append({"prompt": i, "at": k})
    return {"prompts": len(qs), "identical": same, "compared_units": compared,
            "unit": "output_ids" if isinstance(xs, list) else "text", "differ": first_diff}  # fmt: skip


def rounds(a, eagle: L.Server, base: L.Server, qs: list[str], render) -> dict:
    """Interleaved batch-1 rounds: with, without, with, without, ... (``a.rounds`` each); the speed-up from the
    medians, the spread of the per-round ratios."""
    w, wo, acc = [], [], []
    for _ in range(a.rounds):
        r1 = L.measure(eagle.url, qs, a.tokens, 1, render)
        r0 = L.measure(base.url, qs, a.tokens, 1, render)
        w.append(r1["output_tok_s"])
        wo.append(r0["output_tok_s"])
        acc.append(r1["acceptance_length"])
    ratios = [x / y for x, y in zip(w, wo, strict=True)]
    return {"prompts": len(qs), "tokens": a.tokens, "with_tok_s": w, "without_tok_s": wo, "acceptance": acc,
            "with_median": statistics.median(w), "without_median": statistics.median(wo),
            "speedup": round(statistics.median(w) / statistics.median(wo), 4),
            "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4)}  # fmt: skip


def cycle_split(res: dict) -> dict:
    """One EAGLE3 cycle's time, split from the measured batch-1 rates (derived, not profiled): cycle = accepted
    tokens per cycle / tok/s; verify ~ the plain decode step (a 4-6 token verify of a memory-bound 8B model costs
    about one decode step); one draft step ~ (cycle at 5 steps - cycle at 3 steps) / 2 (same verify); the rest
    (draft extend, sampling, scheduling) = cycle - verify - steps x draft step."""
    out = {}
    for draft in ("ours", "specforge"):
        r3, r5 = res.get(f"wide_{draft}_3-1-4"), res.get(f"wide_{draft}_5-1-6")
        if not (r3 and r5) or "speedup" not in r3 or "speedup" not in r5:
            continue
        c3 = 1000 * statistics.median(r3["acceptance"]) / r3["with_median"]
        c5 = 1000 * statistics.median(r5["acceptance"]) / r5["with_median"]
        verify = 1000 / statistics.median(r3["without_tok_s"] + r5["without_tok_s"])
        step = max(0.0, (c5 - c3) / 2)
        out[draft] = {"cycle_ms_3-1-4": round(c3, 3), "cycle_ms_5-1-6": round(c5, 3), "verify_ms": round(verify, 3),
                      "draft_step_ms": round(step, 3), "rest_ms_3-1-4": round(c3 - verify - 3 * step, 3),
                      "derived": True}  # fmt: skip
    return out


def measure_all(a, servers, drafts, configs, tag, qs, heldout, render) -> None:
    res: dict = {}
    base, wide_base = servers.get("smol_base"), servers.get("wide_base")
    if base and wide_base:

        @L.stage("identity", 20)
        def ident():
            return identical(a, base, wide_base, qs[: a.identity_prompts], render)

        ident()
    # ours first: run 2 spent its budget before our draft's rounds on the widened target were reached
    order = sorted(drafts, key=lambda k: k != "ours")
    for key in order:
        s = servers.get(f"smol_{key}_3-1-4")
        if s:

            @L.stage(f"smol_{key}_3-1-4", 60)
            def acc(s=s):
                return {"batch1": L.measure(s.url, qs, a.tokens, 1, render),
                        "conc8": L.measure(s.url, qs, a.tokens, 8, render),
                        "heldout_conc8": L.measure(s.url, heldout, a.tokens, 8, render) if heldout else None}  # fmt: skip

            acc()
    sub = qs[: a.speed_prompts]
    for c in configs:
        for key in order:
            s = servers.get(f"wide_{key}_{tag[c]}")
            if not (s and wide_base):
                continue

            @L.stage(f"wide_{key}_{tag[c]}", 60)
            def speed(s=s):
                r = rounds(a, s, wide_base, sub, render)
                r["all_mtbench_conc8"] = L.measure(s.url, qs, a.tokens, 8, render)
                return r

            res[f"wide_{key}_{tag[c]}"] = speed()
    L.save("cycle_split", cycle_split(res))
    L.save("verdict", verdict(a))


def verdict(a) -> dict:
    """The issue's three goals, read from the results (reached or not, with the numbers)."""
    s = L.SUMMARY
    acc = {k: ((s.get(f"smol_{k}_3-1-4") or {}).get("batch1") or {}).get("acceptance_length")
           for k in ("ours", "specforge")}  # fmt: skip
    speed = {
        k: v.get("speedup")
        for k, v in s.items()
        if k.startswith("wide_") and isinstance(v, dict) and "speedup" in v
    }
    best = max(speed.items(), key=lambda kv: kv[1] or 0) if speed else (None, None)
    ratio = acc["ours"] / acc["specforge"] if acc["ours"] and acc["specforge"] and not a.smoke else None
    top = max((x for x in acc.values() if x), default=None)
    return {"acceptance_3-1-4_batch1": acc, "ours_over_specforge": round(ratio, 4) if ratio else None,
            "goal_ratio_ge_1": ratio >= 1.0 if ratio else None, "best_speedup": {"server": best[0], "x": best[1]},
            "goal_speedup_ge_1.8": (best[1] or 0) >= 1.8 if best[1] else None,
            "goal_acceptance_ge_2.5": (top or 0) >= 2.5 if top else None, "smoke": a.smoke}  # fmt: skip
