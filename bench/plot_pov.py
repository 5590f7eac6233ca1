"""Plot of a proof-of-value run (bench/proof_of_value.py, issue #31): the widened target's batch-1 rounds with and
without the draft, the acceptance lengths, and both trainers' accuracy against their wall-clock time.

    python bench/plot_pov.py bench/results/proof_of_value_2026-12-04_h200_run1.json docs/img/pov-2026-12-04-run1.png \
        bench/results/proof_of_value_2026-12-04_h200_run1_ours_metrics.jsonl.gz \
        bench/results/proof_of_value_2026-12-04_h200_run1_specforge_metrics.jsonl.gz "proof-of-value run 1 (...)"
"""

from __future__ import annotations

import gzip
import json
import sys


def _metrics(path: str):
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            rec = json.loads(line)
            out.append(rec)
    return out


def main(
    src: str, dst: str, ours_metrics: str | None = None, sf_metrics: str | None = None, title: str = ""
) -> int:
    """``title``: what the run was (the date, the box and the SGLang version are put before it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(src) as f:
        whole = json.load(f)
    run = whole["run"]
    args = (run.get("run") or {}).get("args") or {}
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    for key, color in (("wide_ours_3-1-4", "tab:blue"), ("wide_ours_5-1-6", "tab:green"),
                       ("wide_specforge_3-1-4", "tab:orange"), ("wide_specforge_5-1-6", "tab:red")):  # fmt: skip
        r = run.get(key)
        if not r or "with_tok_s" not in r:
            continue
        xs = range(1, len(r["with_tok_s"]) + 1)
        ax[0].plot(
            xs, r["with_tok_s"], "o-", color=color, label=f"{key[5:]} with draft ({r['speedup']:.3f}x)"
        )
        ax[0].plot(xs, r["without_tok_s"], "x--", color=color, alpha=0.6, label=f"{key[5:]} paired baseline")
    ax[0].set_xlabel("interleaved round")
    ax[0].set_ylabel("output tok/s, batch 1")
    ax[0].set_title("8.02B widened SmolLM2: with vs without (medians)")
    ax[0].set_ylim(bottom=0)
    ax[0].legend(fontsize=7)

    bars, labels = [], []
    for key, sub in (("smol_ours_3-1-4", "batch1"), ("smol_ours_3-1-4", "conc8"), ("smol_ours_3-1-4", "heldout_conc8"),
                     ("smol_specforge_3-1-4", "batch1")):  # fmt: skip
        v = ((run.get(key) or {}).get(sub) or {}).get("acceptance_length")
        if v:
            bars.append(v)
            labels.append(f"{key.split('_')[1]} 3/1/4\n{sub}")
    for key in ("wide_ours_5-1-6", "wide_specforge_5-1-6"):
        v = ((run.get(key) or {}).get("all_mtbench_conc8") or {}).get("acceptance_length")
        if v:
            bars.append(v)
            labels.append(f"{key.split('_')[1]} 5/1/6\nconc8")
    ax[1].bar(range(len(bars)), bars, color="tab:blue")
    ax[1].axhline(2.5, color="gray", ls=":", label="goal 2.5 at 3/1/4")
    ax[1].set_xticks(range(len(bars)), labels, fontsize=7)
    ax[1].set_ylabel("acceptance length (tokens / verify step)")
    ax[1].set_title("MT-bench (80 first turns) and held-out ShareGPT")
    ax[1].legend(fontsize=7)

    if ours_metrics:
        recs = _metrics(ours_metrics)
        t0 = next(r["time"] for r in recs if r.get("kind") == "attempt")
        val = [(r["time"] - t0, r["data"]["val"]["full_acc_0_epoch"]) for r in recs if r.get("kind") == "val"]
        ax[2].plot(*zip(*val, strict=True), "o-", label="ours (speculators): validation full_acc_0 per epoch")
    if sf_metrics:
        recs = _metrics(sf_metrics)
        pts = [(r["time"], r["data"]["acc_0"]) for r in recs if r.get("kind") == "train" and r.get("time")]
        t0 = pts[0][0] - 86  # its first logged step came 86 s after the launch (start-up measured)
        ax[2].plot([t - t0 for t, _ in pts], [a for _, a in pts], ".", ms=3, alpha=0.5,
                   label="SpecForge: training acc_0 every 10 steps (batch 8)")  # fmt: skip
    ax[2].set_xlabel("seconds since launch")
    ax[2].set_ylabel("top-1 agreement, first draft position")
    if args.get("only_ours"):
        ax[2].set_title(f"our trainer alone, {args.get('train_s', '?'):.0f} s budget")
    else:
        how = "side by side" if args.get("side_by_side") else "one after the other"
        ax[2].set_title(f"the two trainers, {args.get('train_s', '?'):.0f} s budget each, {how}")
    ax[2].set_ylim(0, 1)
    ax[2].legend(fontsize=7)
    fig.suptitle(
        f"{whole.get('date', '?')}, H200, SGLang 0.5.17: {title or 'proof-of-value run'}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
