"""The live report's sections beyond the per-concurrency table (:mod:`.report`): the batch curve with its
crossover and the setting to serve per concurrency (:mod:`.curve`), acceptance and speed-up per MT-bench
category, and the lossless check (:mod:`.lossless`), each as data for report.json and as markdown lines."""

from __future__ import annotations

from eagle3ops.benchmark import curve, lossless


def draft_setting(server: dict | None) -> str:
    """The draft's steps/topk/draft tokens as "3/1/4" from the server's /server_info, "the draft" if unknown."""
    keys = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    vals = [(server or {}).get(k) for k in keys]
    return "/".join(str(v) for v in vals) if all(v is not None for v in vals) else "the draft"


def batch(rows: list[dict], setting: str) -> dict:
    """One set's batch curve from its rows (one per concurrency, with the per-round tok/s): the points, the
    crossover, and per concurrency whether to serve the draft's setting or none."""
    pts = [
        curve.point(r["concurrency"], r["with_draft_tok_s_rounds"], r["without_draft_tok_s_rounds"])
        for r in rows
        if r.get("with_draft_tok_s_rounds") and r.get("without_draft_tok_s_rounds")
    ]
    return {
        "setting": setting,
        "points": pts,
        "crossover": curve.crossover(pts),
        "recommendation": curve.recommend({setting: pts}),
    }


def _pooled(turns: list[dict]) -> dict:
    spec = [t for t in turns if t.get("spec_verify_ct") is not None]
    v = sum(int(t["spec_verify_ct"]) for t in spec)
    c = sum(t["completion_tokens"] for t in spec)
    lat = sum(t["latency_s"] for t in turns)
    return {
        "turns": len(turns),
        "acceptance_length": round(c / v, 4) if v else None,
        "acceptance_length_without_prefill": round((c - len(spec)) / v, 4) if v else None,
        "tok_s_per_request": round(sum(t["completion_tokens"] for t in turns) / lat, 3) if lat > 0 else None,
    }


def _by_category(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in runs:
        cats = r.get("categories") or []
        for t in r.get("per_turn") or []:
            i = t.get("request")
            if i is not None and i < len(cats) and cats[i]:
                out.setdefault(cats[i], []).append(t)
    return out


def per_category(with_runs: list[dict], without_runs: list[dict]) -> dict | None:
    """Per category (of the set's MT-bench rows), at the lowest concurrency measured, over all its rounds:
    acceptance with and without the prefill token (pooled) and the speed-up of one request's decode (Σ
    completion tokens / Σ request latency, with against without the draft). None without categories."""
    if not with_runs:
        return None
    low = min(r["concurrency"] for r in with_runs)
    w = _by_category([r for r in with_runs if r["concurrency"] == low])
    o = _by_category([r for r in without_runs if r["concurrency"] == low])
    if not w:
        return None
    cats = {}
    for cat in sorted(w):
        pw, po = _pooled(w[cat]), _pooled(o.get(cat, []))
        sw, so = pw["tok_s_per_request"], po["tok_s_per_request"]
        cats[cat] = {
            "acceptance_length": pw["acceptance_length"],
            "acceptance_length_without_prefill": pw["acceptance_length_without_prefill"],
            "with_draft_tok_s": sw,
            "without_draft_tok_s": so,
            "speedup": round(sw / so, 3) if sw and so else None,
            "turns": pw["turns"],
        }
    sp = [c["speedup"] for c in cats.values() if c["speedup"]]
    return {
        "concurrency": low,
        "categories": cats,
        "mean_speedup": round(sum(sp) / len(sp), 3) if sp else None,
    }


def lossless_check(live: dict) -> dict | None:
    """The two servers' lossless samples compared, with what both ran (dtype, attention backend): None when
    either side has no sample (``lossless_sample: 0``, or only one server measured)."""
    w, o = live.get("with_draft") or {}, live.get("without_draft") or {}
    sw, so = (w.get("lossless") or {}).get("items"), (o.get("lossless") or {}).get("items")
    if not sw or not so:
        # measured with lossless_sample 0 (the key there, empty); results from before the check have no key
        off = any("lossless" in r and not r["lossless"] for r in (w, o))
        return {"off": True} if off else None
    nw, no = w["lossless"].get("max_new_tokens"), o["lossless"].get("max_new_tokens")
    if nw != no:
        return {"error": f"the servers' samples were cut at different lengths ({no} / {nw} tokens): measure both "
                "with the same benchmark_output_len"}  # fmt: skip
    try:
        res = lossless.compare(so, sw)
    except ValueError as e:
        return {"error": str(e)}
    same = {}
    for k in ("dtype", "attention_backend"):
        a, b = (o.get("server") or {}).get(k), (w.get("server") or {}).get(k)
        same[k] = {"without_draft": a, "with_draft": b, "same": a == b if a and b else None}
    res["servers"] = same
    return res


def markdown(lv: dict) -> list[str]:
    """The sections' markdown lines."""
    out: list[str] = []
    for name, st in lv.get("sets", {}).items():
        b = st.get("batch")
        if b and len(b["points"]) > 1:
            x = b["crossover"]
            where = (
                f"at concurrency ~{x['at']:g} (interpolated between {x['between'][0]} and {x['between'][1]})"
                if x.get("at")
                else f"{x['where']} ({x.get('above', x.get('below', '-'))})"
            )
            out += [
                f"Batch curve, {name}, draft {b['setting']}: speed-up (medians of the rounds; per-round range) "
                + ", ".join(
                    f"c={p['concurrency']} {p['speedup']:.3f}x ({p['ratio_min']:.3f}-{p['ratio_max']:.3f})"
                    for p in b["points"]
                )
                + f". Speculation stops paying {where}.",
                "Recommended per concurrency: "
                + "; ".join(f"c={r['concurrency']}: {r['setting']}" for r in b["recommendation"]),
                "",
            ]
        pc = st.get("per_category")
        if pc:
            out += [
                f"Per MT-bench category, {name}, concurrency {pc['concurrency']} (acceptance pooled over the "
                "requests; 'with prefill' counts the first token, which the prefill makes, 'without' counts only "
                "what the verify steps committed):",
                "",
                "| category | acceptance with prefill | without prefill | tok/s with / without (per request) "
                "| speed-up |",
                "|---|---|---|---|---|",
            ]
            for cat, c in pc["categories"].items():
                out.append(
                    f"| {cat} | {_f(c['acceptance_length'])} | {_f(c['acceptance_length_without_prefill'])} | "
                    f"{_f(c['with_draft_tok_s'], 1)} / {_f(c['without_draft_tok_s'], 1)} | {_f(c['speedup'])} |"
                )
            out += ["", f"Mean speed-up over the categories: {_f(pc['mean_speedup'])}", ""]
    ll = lv.get("lossless")
    if ll:
        if ll.get("off"):
            out += ["Lossless check: off (benchmark_lossless_sample: 0)", ""]
        elif ll.get("error"):
            out += [f"Lossless check: not compared: {ll['error']}", ""]
        else:
            srv = "; ".join(
                f"{k} {v['without_draft']} / {v['with_draft']}"
                + ("" if v["same"] is not False else " (DIFFERENT)")
                for k, v in ll["servers"].items()
            )
            out += [lossless.summary_line(ll) + f". Servers without / with the draft: {srv}.", ""]
    return out


def _f(v, nd=3):
    return "–" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))
