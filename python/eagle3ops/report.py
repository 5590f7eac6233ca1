"""The benchmark report: one JSON, a markdown table and a PNG plot, written only when the inputs changed.

Inputs: the offline acceptance result (:func:`eagle3ops.acceptance.run`) and, on SGLang hosts, SGLang's own
benchmark (``python -m sglang.benchmark.serving --output-file``) run once against the server with the draft
and once without (:func:`read_sglang_bench` keeps the last record of each JSONL file).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

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
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    if not lines:
        raise ReportError(f"{path}: empty SGLang benchmark output; did the bench run finish?")
    try:
        rec = json.loads(lines[-1])
    except ValueError as e:
        raise ReportError(f"{path}:{len(lines)}: not JSON ({e})") from None
    return {k: rec.get(k) for k in SGLANG_KEYS}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def build(
    acceptance: dict | None, sglang_with: dict | None = None, sglang_without: dict | None = None
) -> dict:
    """The report dict (what report.json holds)."""
    rep: dict = {"report_version": REPORT_VERSION, "offline": None, "sglang": None}
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
        }
    if sglang_with or sglang_without:
        s: dict = {"with_draft": sglang_with, "without_draft": sglang_without}
        probe = (sglang_with or {}).get("spec_probe")
        s["acceptance_length_spec_verify"] = probe.get("acceptance_length") if probe else None
        tw = (sglang_with or {}).get("output_throughput")
        to = (sglang_without or {}).get("output_throughput")
        s["speedup"] = round(tw / to, 3) if tw and to else None
        rep["sglang"] = s
    rep["inputs_sha256"] = _digest([acceptance, sglang_with, sglang_without])
    return rep


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
    else:
        out += ["SGLang serving benchmark: not run (no SGLang server on this host).", ""]
    return "\n".join(out)


def plot(rep: dict, path: str | os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = rep.get("sglang")
    ncols = 2 if s else 1
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
    ax.set_title("Offline acceptance per draft position")
    if s:
        ax2 = axes[0][1]
        vals = [
            (s.get("without_draft") or {}).get("output_throughput"),
            (s.get("with_draft") or {}).get("output_throughput"),
        ]
        ax2.bar(["without draft", "with draft"], [v or 0 for v in vals], color=["#999999", "#3070b0"])
        ax2.set_ylabel("output tok/s")
        ax2.set_title("SGLang output throughput")
    fig.tight_layout()
    tmp = Path(f"{path}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write(
    out_dir: str | os.PathLike,
    acceptance: dict | None,
    sglang_with: dict | None = None,
    sglang_without: dict | None = None,
    *,
    check: bool = False,
) -> dict:
    """Write report.json, report.md, report.png into out_dir unless they already hold these inputs."""
    if not acceptance and not (sglang_with or sglang_without):
        raise ReportError("nothing to report: give an acceptance result and/or SGLang benchmark results")
    out = Path(out_dir)
    rep = build(acceptance, sglang_with, sglang_without)
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
        _atomic_write(paths["markdown"], md + "\n")
        _atomic_write(paths["json"], json.dumps(rep, indent=2, sort_keys=True) + "\n")
    return {
        "changed": changed,
        "check_mode": check,
        "paths": {k: str(v) for k, v in paths.items()},
        "report": rep,
        "markdown": md,
    }


def spec_probe(url: str, prompts: list[str], *, max_new_tokens: int = 128, timeout: float = 600) -> dict:
    """Acceptance length as SGLang counts it: completion tokens / ``spec_verify_ct`` (``/generate`` meta_info),
    greedy, one request at a time, summed over the prompts."""
    import urllib.request

    completion = verify = 0
    for text in prompts:
        body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}}
        req = urllib.request.Request(
            url.rstrip("/") + "/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            meta = json.loads(r.read())["meta_info"]
        if "spec_verify_ct" not in meta:
            raise ReportError(
                f"{url}/generate returned no spec_verify_ct: the server runs without a draft "
                "(--speculative-algorithm unset?)"
            )
        completion += int(meta["completion_tokens"])
        verify += int(meta["spec_verify_ct"])
    if not verify:
        raise ReportError(f"{url}: spec_verify_ct is 0 over {len(prompts)} prompts; nothing was verified")
    return {
        "prompts": len(prompts),
        "completion_tokens": completion,
        "spec_verify_ct": verify,
        "acceptance_length": round(completion / verify, 4),
    }
