"""Plot a live SGLang run (bench/sglang_live.py's raw JSON in bench/results/) for docs/performance.md.

Three panels: acceptance length per served draft (MT-bench first turns, batch 1 and the higher concurrency,
overall = completion tokens / spec_verify_ct); the per-request acceptance of the regenerated vs the original
draft at the same settings (what regeneration is worth) or, for a run with ``--curve``, acceptance vs the number of
training conversations (``smol_curve``; points of earlier runs can be added as ``N:ACCEPTANCE:LABEL``); output tok/s
with and without the draft, each pair measured one right after the other.

    python bench/plot_live.py bench/results/sglang_live_2026-12-02_h200_run3.json docs/img/live-smol-2026-12-02.png
    python bench/plot_live.py bench/results/sglang_live_2026-12-02_h200_run4.json docs/img/live-smol-2026-12-02-run4.png \
        3000:2.113:run3
    python bench/plot_live.py bench/results/sglang_live_2026-12-03_h200_run6.json docs/img/live-smol-2026-12-03-run6.png \
        1500:1.657:run4 3000:2.113:run3 8000:2.347:run4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(src: str, out: str, *extra: str) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = json.loads(Path(src).read_text())
    smol = run["smol"]
    configs = [
        k
        for k in ("smol_eagle3_regen_3-1-4", "smol_eagle3_orig_3-1-4", "smol_eagle3_regen_5-1-6")
        if k in smol
    ]
    labels = [k.removeprefix("smol_eagle3_").replace("_", " ") for k in configs]
    conc = next(k for k in smol[configs[0]] if k.startswith("conc"))
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))

    x = range(len(configs))
    for off, key in ((-0.2, "batch1"), (0.2, conc)):
        ax[0].bar(
            [i + off for i in x], [smol[c][key]["acceptance_length"] for c in configs], width=0.4, label=key
        )
    ax[0].set_xticks(list(x), labels)
    ax[0].set_ylabel("acceptance length (tokens / verify step)")
    ax[0].axhline(1.0, color="grey", lw=0.8)
    ax[0].set_title("SGLang 0.5.17, MT-bench first turns")
    ax[0].legend()

    curve = smol.get("smol_curve") or []
    if not curve and extra and "smol_data" in smol:  # one draft: this run's point on the earlier runs' curve
        curve = [{"conversations": smol["smol_data"]["train_conversations"],
                  "acceptance_length": smol[configs[0]][conc]["acceptance_length"]}]  # fmt: skip
    if curve:
        ax[1].plot([p["conversations"] for p in curve], [p["acceptance_length"] for p in curve], "o-",
                   label="this run")  # fmt: skip
        for e in extra:  # N:ACCEPTANCE:LABEL of earlier runs
            n, acc, lab = e.split(":", 2)
            ax[1].plot([int(n)], [float(acc)], "s", label=lab)
        ax[1].axhline(2.5, color="grey", lw=0.8, ls="--")
        ax[1].set_xscale("log")
        ax[1].set_xlabel("regenerated training conversations")
        ax[1].set_ylabel(f"acceptance length, 3/1/4, {conc}")
        ax[1].set_title("acceptance vs N (MT-bench)")
        ax[1].legend(fontsize=7)
    else:
        per = [smol[c]["batch1"]["acceptance_per_request"] for c in configs[:2]]
        ax[1].boxplot(per, tick_labels=labels[:2])
        ax[1].set_ylabel("acceptance length per request (batch 1)")
        ax[1].set_title("regenerated vs original answers, same budget")

    width = 0.2
    for j, (key, name) in enumerate((("batch1", "batch 1"), (conc, conc))):
        w = [smol[c][key]["output_tok_s"] for c in configs]
        wo = [smol[c]["baseline_paired"][key]["output_tok_s"] for c in configs]
        ax[2].bar([i + (2 * j - 1.5) * width for i in x], w, width=width, label=f"{name} with draft")
        ax[2].bar([i + (2 * j - 0.5) * width for i in x], wo, width=width, label=f"{name} without", alpha=0.6)
    ax[2].set_xticks(list(x), labels)
    ax[2].set_yscale("log")
    ax[2].set_ylabel("output tok/s")
    ax[2].set_title("with vs without the draft (paired)")
    ax[2].legend(fontsize=7)
    n = (smol.get("smol_data") or {}).get("train_conversations")
    tr = smol.get("smol_train_regen") or {}
    secs = (tr.get("exit") or {}).get("seconds") or tr.get("wall_s")
    fig.suptitle(
        f"{run.get('date', '')}: SmolLM2-135M-Instruct target, EAGLE-3 draft trained "
        f"{f'{secs:.0f} s' if secs else '?'} on {n or '?'} regenerated conversations"
    )
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
