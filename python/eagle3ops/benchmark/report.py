"""The benchmark report: one JSON, a markdown table and a PNG plot, written only when the inputs changed.

Inputs: the offline acceptance result (:func:`eagle3ops.acceptance.run`) and, on SGLang hosts, SGLang's own
benchmark (``python -m sglang.benchmark.serving --output-file``) run once against the server with the draft
and once without (:func:`read_sglang_bench` keeps the last record of each JSONL file).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import statistics
from pathlib import Path

from eagle3ops import jsonl
from eagle3ops.benchmark import report_sections as rs
from eagle3ops.benchmark.loadgen import request_mean
from eagle3ops.durable import atomic_write_bytes, atomic_write_json, atomic_write_text

REPORT_VERSION = 1
SGLANG_KEYS = (
    "completed",
    "total_output_tokens",
    "output_throughput",
    "median_e2e_latency_ms",
    "median_ttft_ms",
    "median_itl_ms",
    "accept_length",
    "max_concurrency",
)


class ReportError(Exception):
    pass


def read_sglang_bench(path: str | os.PathLike) -> dict:
    """The last record of an SGLang bench JSONL (``--output-file`` appends one line per run)."""
    lines = [ln for _, ln in jsonl.split_lines(Path(path).read_text(encoding="utf-8")) if ln.strip()]
    if not lines:
        raise ReportError(f"{path}: empty SGLang benchmark output; did the bench run finish?")
    try:
        rec = json.loads(lines[-1])
    except ValueError as e:
        raise ReportError(f"{path}:{len(lines)}: not JSON ({e})") from None
    return {k: rec.get(k) for k in SGLANG_KEYS}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _live_row(c: int, ws: list[dict], wos: list[dict]) -> dict:
    """One set's row at concurrency ``c`` from its rounds with and without the draft: medians of the output
    tok/s, the speed-up from the medians, acceptance from the first round (greedy: every round alike)."""
    tw_r = [r["output_tok_s"] for r in ws if r.get("output_tok_s")]
    to_r = [r["output_tok_s"] for r in wos if r.get("output_tok_s")]
    tw = statistics.median(tw_r) if tw_r else None
    to = statistics.median(to_r) if to_r else None
    w, wo = (ws or [{}])[0], (wos or [{}])[0]
    ratios = [x / y for x, y in zip(tw_r, to_r, strict=False) if y]
    return {
        "concurrency": c,
        "rounds": max(len(ws), len(wos)),
        "with_draft_tok_s": tw,
        "without_draft_tok_s": to,
        "with_draft_tok_s_rounds": tw_r,
        "without_draft_tok_s_rounds": to_r,
        "speedup": round(tw / to, 3) if tw and to else None,
        "ratio_min": round(min(ratios), 4) if ratios else None,
        "ratio_max": round(max(ratios), 4) if ratios else None,
        "acceptance_length": w.get("acceptance_length"),
        "acceptance_length_without_prefill": w.get("acceptance_length_without_prefill"),
        "acceptance_length_request_mean": request_mean(w.get("acceptance_per_request")),
        "acceptance_per_request": w.get("acceptance_per_request"),
        "with_draft_median_latency_s": (w.get("latency_s") or {}).get("median"),
        "without_draft_median_latency_s": (wo.get("latency_s") or {}).get("median"),
        "turns": w.get("turns", wo.get("turns")),
        "completion_tokens": w.get("completion_tokens"),
        "failed": sum(r.get("failed") or 0 for r in [*ws, *wos]),
        "time_budget_hit": any(r.get("time_budget_hit") for r in [*ws, *wos]),
    }


def build_live(live: dict, offline: dict | None) -> dict:
    """Per prompt set and concurrency: output tok/s with and without the draft, the speed-up, the server's
    acceptance length (overall and per request); the server's acceptance on held-out prompts next to the offline
    estimate; the contamination check's verdict."""
    runs: dict = {}
    for key in ("with_draft", "without_draft"):
        for r in (live.get(key) or {}).get("runs", []):
            runs.setdefault(r["set"], {}).setdefault(r["concurrency"], {}).setdefault(key, []).append(r)
    setting = rs.draft_setting((live.get("with_draft") or {}).get("server"))
    sets = {}
    for name, by_c in runs.items():
        rows = [
            _live_row(c, by_c[c].get("with_draft") or [], by_c[c].get("without_draft") or [])
            for c in sorted(by_c)
        ]
        fmt = next(iter(next(iter(by_c.values())).values()))[0].get("format")
        sets[name] = {"format": fmt, "rows": rows, "batch": rs.batch(rows, setting)}
        pc = rs.per_category(
            [r for rs_ in by_c.values() for r in rs_.get("with_draft", [])],
            [r for rs_ in by_c.values() for r in rs_.get("without_draft", [])],
        )
        if pc:
            sets[name]["per_category"] = pc
    out: dict = {
        "sets": sets,
        "offline_vs_server": None,
        "contamination": None,
        "lossless": rs.lossless_check(live),
    }
    if offline and "heldout" in sets:
        first = sets["heldout"]["rows"][0]
        srv = first["acceptance_length"]
        out["offline_vs_server"] = {
            "offline_acceptance_length": offline["acceptance_length"],
            "server_acceptance_length": srv,
            "server_concurrency": first["concurrency"],
            "difference": round(srv - offline["acceptance_length"], 4) if srv is not None else None,
            "offline_k": offline["k"],
        }
    cont = live.get("contamination")
    if cont:
        out["contamination"] = {
            "clean": cont.get("clean"),
            "mode": cont.get("mode"),
            "training_user_turns": cont.get("training_user_turns"),
            "contaminated": {k: len(v) for k, v in (cont.get("contaminated") or {}).items()},
        }
    return out


def build(
    acceptance: dict | None,
    sglang_with: dict | None = None,
    sglang_without: dict | None = None,
    live: dict | None = None,
) -> dict:
    """The report dict (what report.json holds)."""
    rep: dict = {"report_version": REPORT_VERSION, "offline": None, "sglang": None, "live": None}
    if acceptance:
        d = acceptance["draft"]
        rep["offline"] = {
            "checkpoint": acceptance.get("checkpoint"),
            "target": acceptance.get("target"),
            "prompts_file": acceptance.get("prompts_file"),
            "layer_ids": acceptance.get("layer_ids"),
            "k": d["k"],
            "prompts": d["prompts"],
            "verify_steps": d["verify_steps"],
            "acceptance_length": d["acceptance_length"],
            "max_acceptance_length": d["max_acceptance_length"],
            "per_position": d["per_position"],
            "per_position_conditional": d["per_position_conditional"],
            "random_draft_acceptance_length": (acceptance.get("random_draft") or {}).get("acceptance_length"),
            "random_draft_per_position": (acceptance.get("random_draft") or {}).get("per_position"),
            "draft_global_step": (acceptance.get("draft_training") or {}).get("global_step"),
        }
    if sglang_with or sglang_without:
        s: dict = {"with_draft": sglang_with, "without_draft": sglang_without}
        probe = (sglang_with or {}).get("spec_probe")
        s["acceptance_length_spec_verify"] = probe.get("acceptance_length") if probe else None
        tw = (sglang_with or {}).get("output_throughput")
        to = (sglang_without or {}).get("output_throughput")
        s["speedup"] = round(tw / to, 3) if tw and to else None
        rep["sglang"] = s
    if live:
        rep["live"] = build_live(live, rep["offline"])
    rep["inputs_sha256"] = _digest([acceptance, sglang_with, sglang_without, live])
    return rep


# A draft trained for fewer optimizer steps than this is a smoke run (the SmolLM2 profile's 10 CPU steps, `make
# run`'s demo): that it accepts no more than random tokens is expected. The drafts that beat random in
# docs/performance.md trained thousands of steps on thousands of conversations.
SMOKE_STEPS = 1000
# trained minus random acceptance length below this: "no better than random" (1.000 vs 1.000 at CPU scale)
NO_BETTER = 0.02


def versus_random(off: dict) -> str | None:
    """A sentence when the trained draft is no better than the random-token baseline, saying whether that is
    expected at the draft's training scale (its optimizer steps, from the checkpoint's training_state.json);
    None when it is better or there is no baseline."""
    trained, rnd = off.get("acceptance_length"), off.get("random_draft_acceptance_length")
    if trained is None or rnd is None or trained - rnd >= NO_BETTER:
        return None
    steps = off.get("draft_global_step")
    head = (
        f"The trained draft is no better than random tokens ({trained:.3f} vs {rnd:.3f}, "
        f"{off.get('verify_steps')} verify steps)."
    )
    if steps is None:
        return (
            head
            + " Whether that is expected depends on how long it trained, which its checkpoint does not say "
            "(no training_state.json): below about "
            f"{SMOKE_STEPS} optimizer steps it is; after a real training run it is not."
        )
    if steps < SMOKE_STEPS:
        return (
            head
            + f" Expected at this scale: the draft trained {steps} optimizer steps, a smoke run (a draft "
            f"starts to beat random after about {SMOKE_STEPS} steps on thousands of conversations; "
            "docs/performance.md). It says the pipeline ran end to end, not how good a draft it makes."
        )
    return (
        head
        + f" Not expected after {steps} optimizer steps: check that the draft was trained on this target "
        "(its verifier), with the aux layer ids extract recorded, and on this target's tokenizer and chat template."
    )


def _live_sets(lv: dict | None) -> dict:
    return (lv or {}).get("sets") or {}


def _fmt(v, nd=2):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def markdown(rep: dict) -> str:
    out = ["# EAGLE-3 draft benchmark", ""]
    off = rep.get("offline")
    if off:
        k = off["k"]
        out += [
            f"Offline acceptance (greedy chain, k={k}, {off['prompts']} held-out prompts, "
            f"{off['verify_steps']} verify steps; target `{off['target']}`, draft `{off['checkpoint']}`, "
            f"aux layers {off['layer_ids']}):",
            "",
            "| draft | acceptance length (max "
            + str(k + 1)
            + ") | "
            + " | ".join(f"pos {i + 1}" for i in range(k))
            + " |",
            "|---|---|" + "---|" * k,
            f"| trained | {_fmt(off['acceptance_length'], 3)} | "
            + " | ".join(_fmt(x, 3) for x in off["per_position"])
            + " |",
        ]
        if off.get("random_draft_acceptance_length") is not None:
            out.append(
                f"| random tokens | {_fmt(off['random_draft_acceptance_length'], 3)} | "
                + " | ".join(_fmt(x, 3) for x in off["random_draft_per_position"] or [None] * k)
                + " |"
            )
        out += [
            "",
            "pos i: share of verify steps whose draft token i was accepted (all of 1..i matched the target's "
            "greedy choice); conditional rates: "
            + ", ".join(_fmt(x, 3) for x in off["per_position_conditional"]),
            "",
        ]
        verdict = versus_random(off)
        if verdict:
            out += [verdict, ""]
    s = rep.get("sglang")
    if s:
        out += [
            "SGLang serving benchmark (same prompts, same settings):",
            "",
            "| server | output tok/s | median e2e latency (ms) | median ITL (ms) | median TTFT (ms) | acceptance length |",
            "|---|---|---|---|---|---|",
        ]
        for name, key in (("with draft (EAGLE3)", "with_draft"), ("without draft", "without_draft")):
            r = s.get(key) or {}
            out.append(
                f"| {name} | {_fmt(r.get('output_throughput'))} | {_fmt(r.get('median_e2e_latency_ms'))} | "
                f"{_fmt(r.get('median_itl_ms'))} | {_fmt(r.get('median_ttft_ms'))} | {_fmt(r.get('accept_length'))} |"
            )
        out += ["", f"Speed-up (output tok/s): {_fmt(s.get('speedup'), 3)}"]
        if s.get("acceptance_length_spec_verify") is not None:
            out.append(
                "Acceptance length, completion tokens / spec_verify_ct (greedy /generate probe): "
                + _fmt(s["acceptance_length_spec_verify"], 3)
            )
        out.append("")
    elif not _live_sets(rep.get("live")):
        out += [
            "SGLang serving benchmark: not run (no SGLang server on this host: no live results; the serve phase "
            "starts one, and benchmark_live measures it, only where SGLang runs on a GPU). Nothing is tabled or "
            "drawn for it.",
            "",
        ]
    lv = rep.get("live")
    if lv and not _live_sets(lv) and lv.get("contamination"):
        c = lv["contamination"]
        out += [_contamination_line(c), ""]
    if lv and _live_sets(lv):
        out += [
            "Live SGLang server (eagle3ops load generator, greedy, same prompts with and without the draft; tok/s: "
            "the median of the rounds, the speed-up the ratio of the medians, in brackets the per-round range; "
            "acceptance pooled over the requests, with the prefill token counted and without it):",
            "",
            "| prompt set | concurrency | rounds | tok/s with draft | tok/s without | speed-up | acceptance with / "
            "without prefill token | median latency with / without (s) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, st in lv["sets"].items():
            for r in st["rows"]:
                spread = (
                    f" ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})"
                    if r.get("rounds", 1) > 1 and r.get("ratio_min") is not None
                    else ""
                )
                out.append(
                    f"| {name} ({st['format']}) | {r['concurrency']} | {r.get('rounds', 1)} | "
                    f"{_fmt(r['with_draft_tok_s'], 1)} | {_fmt(r['without_draft_tok_s'], 1)} | "
                    f"{_fmt(r['speedup'], 3)}{spread} | {_fmt(r['acceptance_length'], 3)} / "
                    f"{_fmt(r.get('acceptance_length_without_prefill'), 3)} | "
                    f"{_fmt(r['with_draft_median_latency_s'], 3)} / {_fmt(r['without_draft_median_latency_s'], 3)} |"
                )
        out.append("")
        for name, st in lv["sets"].items():
            first = st["rows"][0] if st["rows"] else {}
            per = first.get("acceptance_per_request")
            if per:
                out.append(
                    f"Acceptance per request, {name}, concurrency {first['concurrency']}: "
                    f"min {min(per):.2f}, median {statistics.median(per):.2f}, max {max(per):.2f}, "
                    f"mean {request_mean(per):.3f} ({len(per)} requests; the table's pooled value "
                    f"{_fmt(first['acceptance_length'], 3)} weighs each request by its verify steps, the mean "
                    "weighs each request once)"
                )
        out += ["", *rs.markdown(lv), "![the report's plots](report.png)", ""]
        ov = lv.get("offline_vs_server")
        if ov:
            out.append(
                f"Held-out acceptance length: server {_fmt(ov['server_acceptance_length'], 3)} vs offline estimate "
                f"{_fmt(ov['offline_acceptance_length'], 3)} (k={ov['offline_k']}; difference "
                f"{_fmt(ov['difference'], 3)})"
            )
        c = lv.get("contamination")
        if c:
            out.append(_contamination_line(c))
        out.append("")
    return "\n".join(out)


def _contamination_line(c: dict) -> str:
    return "Contamination check: " + (
        f"clean (no benchmark prompt among {c['training_user_turns']} training user turns)"
        if c["clean"]
        else f"CONTAMINATED {c['contaminated']} (mode {c['mode']})"
    )


def plot(rep: dict, path: str | os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = rep.get("sglang")
    lv = rep.get("live") if _live_sets(rep.get("live")) else None  # no live results: no empty panel
    curves = {
        n: st["batch"]
        for n, st in (lv or {}).get("sets", {}).items()
        if len((st.get("batch") or {}).get("points", [])) > 1
    }
    ncols = 1 + bool(s) + bool(lv) + bool(curves)
    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4), squeeze=False)
    ax = axes[0][0]
    off = rep.get("offline")
    if off:
        xs = list(range(1, off["k"] + 1))
        ax.plot(xs, off["per_position"], marker="o", label=f"trained (τ={off['acceptance_length']:.2f})")
        if off.get("random_draft_per_position"):
            ax.plot(
                xs,
                off["random_draft_per_position"],
                marker="x",
                linestyle="--",
                label=f"random (τ={off['random_draft_acceptance_length']:.2f})",
            )
        ax.set_xticks(xs)
        ax.set_ylim(0, 1.05)
        ax.legend()
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    title = "Offline acceptance per draft position"
    if off and versus_random(off):
        steps = off.get("draft_global_step")
        scale = "expected" if steps is not None and steps < SMOKE_STEPS else "see report.md"
        title += f"\ntrained no better than random ({scale}: {steps if steps is not None else '?'} steps)"
    ax.set_title(title)
    if s:
        ax2 = axes[0][1]
        vals = [
            (s.get("without_draft") or {}).get("output_throughput"),
            (s.get("with_draft") or {}).get("output_throughput"),
        ]
        ax2.bar(["without draft", "with draft"], [v or 0 for v in vals], color=["#999999", "#3070b0"])
        ax2.set_ylabel("output tok/s")
        ax2.set_title("SGLang output throughput")
    if curves:
        _plot_curves(axes[0][ncols - 1], curves)
    if lv:
        ax3 = axes[0][ncols - 1 - bool(curves)]
        labels, w, wo = [], [], []
        for name, st in lv["sets"].items():
            for r in st["rows"]:
                labels.append(f"{name}\nc={r['concurrency']}")
                w.append(r["with_draft_tok_s"] or 0)
                wo.append(r["without_draft_tok_s"] or 0)
        xs = list(range(len(labels)))
        ax3.bar([x - 0.2 for x in xs], wo, width=0.4, color="#999999", label="without draft")
        ax3.bar([x + 0.2 for x in xs], w, width=0.4, color="#3070b0", label="with draft")
        ax3.set_xticks(xs)
        ax3.set_xticklabels(labels, fontsize=8)
        ax3.set_ylabel("output tok/s")
        ax3.set_title("Live server, per prompt set and concurrency")
        ax3.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())


def _plot_curves(ax, curves: dict) -> None:
    """Speed-up against concurrency per prompt set (log2 axis), the per-round range as error bars, 1.0 marked,
    and each set's crossover where it was interpolated."""
    for name, b in curves.items():
        pts = b["points"]
        xs = [p["concurrency"] for p in pts]
        ys = [p["speedup"] for p in pts]
        err = [[y - p["ratio_min"] for y, p in zip(ys, pts, strict=True)],
               [p["ratio_max"] - y for y, p in zip(ys, pts, strict=True)]]  # fmt: skip
        line = ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{name} ({b['setting']})")
        at = b["crossover"].get("at")
        if at:
            ax.axvline(at, linestyle=":", color=line[0].get_color())
            ax.annotate(
                f"crossover ~{at:g}", (at, 1.0), textcoords="offset points", xytext=(4, 6), fontsize=8
            )
    ax.axhline(1.0, color="#999999", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("speed-up (output tok/s, with / without)")
    ax.set_title("Batch curve: where speculation stops paying")
    ax.legend(fontsize=8)


def write(
    out_dir: str | os.PathLike,
    acceptance: dict | None,
    sglang_with: dict | None = None,
    sglang_without: dict | None = None,
    *,
    check: bool = False,
    live: dict | None = None,
) -> dict:
    """Write report.json, report.md, report.png into out_dir unless they already hold these inputs."""
    if not acceptance and not (sglang_with or sglang_without) and not live:
        raise ReportError("nothing to report: give an acceptance result and/or SGLang benchmark results")
    out = Path(out_dir)
    rep = build(acceptance, sglang_with, sglang_without, live)
    paths = {"json": out / "report.json", "markdown": out / "report.md", "plot": out / "report.png"}
    try:
        current = json.loads(paths["json"].read_text()).get("inputs_sha256")
    except (OSError, ValueError):
        current = None
    changed = current != rep["inputs_sha256"] or not all(p.is_file() for p in paths.values())
    md = markdown(rep)
    if changed and not check:
        out.mkdir(parents=True, exist_ok=True)
        plot(rep, paths["plot"])
        atomic_write_text(paths["markdown"], md + "\n")
        atomic_write_json(paths["json"], rep)
    return {
        "changed": changed,
        "check_mode": check,
        "paths": {k: str(v) for k, v in paths.items()},
        "report": rep,
        "markdown": md,
    }
