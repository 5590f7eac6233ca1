"""The measurements of a proof-of-value run (bench/proof_of_value.py, issue #31): the widened target's answers against
the original's, interleaved with/without rounds, the cycle split, and the verdict on the issue's goals. Issue 45: the
speed prompts are a stratified sample of MT-bench (``--per-category`` of each of its 8 categories, ``--seed``), with
acceptance (with and without the prefill token) and speed-up per category; the batch curve (``--curve``
concurrencies, ``--curve-rounds`` interleaved rounds) with its crossover and the setting to serve per concurrency
over the settings measured; the lossless check (``--lossless-sample`` greedy answers of each draft's server against
the plain server's on the widened target, same dtype and attention backend)."""

from __future__ import annotations

import statistics
from pathlib import Path

import sglang_live as L


def add_args(ap) -> None:
    """The measurement's options (proof_of_value.py's parser)."""
    ap.add_argument(
        "--per-category", type=int, default=3, help="speed prompts: this many of each MT-bench category"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the per-category sample")
    ap.add_argument("--curve", default="1,4,16,64", help="batch curve concurrencies ('' : none)")
    ap.add_argument("--curve-rounds", type=int, default=3, help="interleaved rounds of the batch curve")
    ap.add_argument("--lossless-sample", type=int, default=16, help="greedy answers compared (0: off)")


def speed_prompts(a) -> tuple[list[str], list[str]]:
    """The stratified speed prompts: first turns and their categories, in the file's order."""
    from eagle3ops.benchmark import promptsets as ps

    items = ps.load_set(Path(a.assets) / "mtbench_question.jsonl")["items"]
    st = ps.stratified(items, a.per_category, a.seed)
    L.save("speed_prompts", {k: st[k] for k in ("per_category", "seed", "counts", "short", "missing")})
    return [it["turns"][0] for it in st["items"]], [it["category"] for it in st["items"]]


def load(url: str, qs: list[str], tokens: int, conc: int, render, cats: list[str] | None = None) -> dict:
    """One run of the load generator over ``qs`` (repeated up to ``conc`` requests), with the categories of its
    requests for the per-category figures; the per-turn records are dropped once those are computed."""
    from eagle3ops.benchmark.loadgen import run_load

    n = max(len(qs), conc)
    r = run_load(
        url, [[qs[i % len(qs)]] for i in range(n)], concurrency=conc, max_new_tokens=tokens, render=render
    )
    r["categories"] = [cats[i % len(cats)] for i in range(n)] if cats else []
    return r


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


def rounds(a, eagle: L.Server, base: L.Server, qs: list[str], render, cats: list[str] | None = None) -> dict:
    """Interleaved batch-1 rounds: with, without, with, without, ... (``a.rounds`` each); the speed-up from the
    medians, the spread of the per-round ratios; acceptance with and without the prefill token; per category
    (acceptance, speed-up) over all rounds."""
    from eagle3ops.benchmark.report_sections import per_category

    w, wo, acc, acc0, runs_w, runs_o = [], [], [], [], [], []
    for _ in range(a.rounds):
        r1 = load(eagle.url, qs, a.tokens, 1, render, cats)
        r0 = load(base.url, qs, a.tokens, 1, render, cats)
        w.append(r1["output_tok_s"])
        wo.append(r0["output_tok_s"])
        acc.append(r1["acceptance_length"])
        acc0.append(r1.get("acceptance_length_without_prefill"))
        runs_w.append(r1)
        runs_o.append(r0)
    ratios = [x / y for x, y in zip(w, wo, strict=True)]
    out = {"prompts": len(qs), "tokens": a.tokens, "with_tok_s": w, "without_tok_s": wo, "acceptance": acc,
           "acceptance_without_prefill": acc0, "with_median": statistics.median(w),
           "without_median": statistics.median(wo), "speedup": round(statistics.median(w) / statistics.median(wo), 4),
           "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4)}  # fmt: skip
    if cats:
        out["per_category"] = per_category(runs_w, runs_o)
    return out


def batch_curve(a, eagle: L.Server, base: L.Server, qs: list[str], render) -> list[dict]:
    """Speed-up at each ``a.curve`` concurrency: ``a.curve_rounds`` rounds, each with every concurrency once
    (with, then without), so rounds and concurrencies interleave; :func:`eagle3ops.benchmark.curve.point` each."""
    from eagle3ops.benchmark.curve import point

    concs = [int(c) for c in a.curve.split(",") if c.strip()]
    w: dict[int, list] = {c: [] for c in concs}
    wo: dict[int, list] = {c: [] for c in concs}
    for _ in range(a.curve_rounds):
        for c in concs:
            w[c].append(load(eagle.url, qs, a.tokens, c, render)["output_tok_s"])
            wo[c].append(load(base.url, qs, a.tokens, c, render)["output_tok_s"])
    return [point(c, w[c], wo[c]) for c in concs]


def lossless_prompts(qs: list[str], n: int) -> list[dict]:
    """``n`` of the speed prompts, evenly spread over them (they are in category order)."""
    step = max(1, len(qs) // max(1, n))
    return [{"set": "mtbench", "id": i, "text": qs[i]} for i in range(0, len(qs), step)][:n]


def lossless_check(a, eagle: L.Server, base: L.Server, prompts: list[dict], render, plain: list) -> dict:
    """The draft's server's greedy output ids against the plain server's (``plain``: its sample of the same
    ``prompts``, taken once); both servers' dtype and attention backend beside the comparison."""
    from eagle3ops.benchmark import loadgen, lossless

    spec = loadgen.greedy_sample(eagle.url, prompts, max_new_tokens=a.tokens, render=render)
    res = lossless.compare(plain, spec)
    res["servers"] = {u: {k: (loadgen.server_info(u) or {}).get(k) for k in ("dtype", "attention_backend")}
                      for u in (base.url, eagle.url)}  # fmt: skip
    res["summary"] = lossless.summary_line(res)
    return res


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
    sub, cats = speed_prompts(a)
    curves: dict = {}
    plain = None
    for c in configs:
        for key in order:
            s = servers.get(f"wide_{key}_{tag[c]}")
            if not (s and wide_base):
                continue

            @L.stage(f"wide_{key}_{tag[c]}", 60)
            def speed(s=s):
                r = rounds(a, s, wide_base, sub, render, cats)
                r["all_mtbench_conc8"] = L.measure(s.url, qs, a.tokens, 8, render)
                return r

            res[f"wide_{key}_{tag[c]}"] = speed()
            if a.lossless_sample:
                lp = lossless_prompts(sub, a.lossless_sample)
                if plain is None:  # the plain server's answers, once for every draft and setting
                    from eagle3ops.benchmark.loadgen import greedy_sample

                    plain = greedy_sample(wide_base.url, lp, max_new_tokens=a.tokens, render=render)

                @L.stage(f"lossless_{key}_{tag[c]}", 30)
                def same(s=s, plain=plain, lp=lp):
                    return lossless_check(a, s, wide_base, lp, render, plain)

                same()
            if a.curve:

                @L.stage(f"curve_{key}_{tag[c]}", 60)
                def cur(s=s):
                    return {"points": batch_curve(a, s, wide_base, sub, render)}

                pts = (cur() or {}).get("points")
                if pts:
                    curves.setdefault(key, {})[tag[c].replace("-", "/")] = pts
    if curves:
        from eagle3ops.benchmark.curve import crossover, recommend

        L.save("batch_curve", {k: {"crossover": {t: crossover(p) for t, p in v.items()}, "recommend": recommend(v),
                                   "points": v} for k, v in curves.items()})  # fmt: skip
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
    # issue 45: the speed-up averaged over the 8 categories (best setting), at concurrency 16, and lossless
    cat = {k: (v.get("per_category") or {}).get("mean_speedup") for k, v in s.items()
           if k.startswith("wide_") and isinstance(v, dict)}  # fmt: skip
    c16 = {f"{k}_{t}": next((p["speedup"] for p in pts if p["concurrency"] == 16), None)
           for k, v in (s.get("batch_curve") or {}).items() for t, pts in v["points"].items()}  # fmt: skip
    same = {k: v.get("lossless") for k, v in s.items() if k.startswith("lossless_") and isinstance(v, dict)}
    best_cat = max((x for x in cat.values() if x), default=None)
    return {"acceptance_3-1-4_batch1": acc, "ours_over_specforge": round(ratio, 4) if ratio else None,
            "goal_ratio_ge_1": ratio >= 1.0 if ratio else None, "best_speedup": {"server": best[0], "x": best[1]},
            "goal_speedup_ge_1.8": (best[1] or 0) >= 1.8 if best[1] else None,
            "goal_acceptance_ge_2.5": (top or 0) >= 2.5 if top else None,
            "category_mean_speedup": cat, "goal_category_mean_ge_1.8": best_cat >= 1.8 if best_cat else None,
            "speedup_at_conc16": c16, "goal_conc16_ge_1": any((x or 0) >= 1.0 for x in c16.values()) if c16 else None,
            "lossless": same, "goal_lossless": all(same.values()) if same else None, "smoke": a.smoke}  # fmt: skip
