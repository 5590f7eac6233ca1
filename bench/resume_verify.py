"""The disk check of the resume plan at 100k finished samples (issue 16 §1), store only, standard library only.

bench/resume_plan.py measures the whole plan (dataset lengths, model config, a fresh CLI process) and needs
torch/datasets/transformers; this one times just ``HiddenStateStore.plan`` with ``verify=None`` (the manifest
trusted, as before issue 16) against ``verify="size"`` (every manifest entry opened: exists, recorded size,
safetensors header byte-compared) on the same directory, so it also runs on a machine without the workload
packages (the lent GPU box) and says what the check itself costs per file.

STAND-IN, as in resume_plan.py: every ``hs_{i}.safetensors`` is a hard link to one real sample file of the row's
size (header from :func:`eagle3ops.store.sample_header`, zero tensor bytes): the check reads the header and the
size, never tensor bytes, so the figures do not depend on the contents. The manifest lines are written by the real
:class:`HiddenStateStore`.

Usage: python bench/resume_verify.py [--rows 100000] [--reps 3] [--sizes 64,7168] [--out bench/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

SEQ_LEN, NUM_STATES = 128, 4


def build(root: Path, rows: int, hidden: int, ctime: bool = True) -> int:
    from eagle3ops.store import HiddenStateStore, ManifestEntry, sample_header

    store = HiddenStateStore(root)
    store.dir.mkdir(parents=True)
    head, total = sample_header(SEQ_LEN, NUM_STATES, hidden, "bfloat16")
    protos = [store.dir / f"proto{k}.bin" for k in range((rows + 59_999) // 60_000)]
    for p in protos:
        with open(p, "wb") as f:
            f.write(head)
            f.truncate(total)  # sparse: the tensor bytes are never read
    for i in range(rows):
        os.link(protos[i // 60_000], store.path(i))
    ctimes = [os.stat(p).st_ctime_ns for p in protos]  # what the writer records after each rename
    for start in range(0, rows, 10_000):
        entries = [ManifestEntry(i, SEQ_LEN, total, None, 0) for i in range(start, min(rows, start + 10_000))]
        if ctime:
            entries = [dataclasses.replace(e, ctime_ns=ctimes[e.index // 60_000]) for e in entries]
        store.append_manifest(entries)
    store.close()
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="64,7168")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument(
        "--name", default=None, help="result file name (default resume_verify_<date>_<card>.json)"
    )
    args = ap.parse_args()
    from eagle3ops.store import HiddenStateStore

    result = {
        "bench": "resume_verify",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
        "rows": args.rows,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "sizes": {},
    }
    seq_lens = [SEQ_LEN] * args.rows
    with tempfile.TemporaryDirectory(prefix="resume-verify-") as tmp:
        for h in [int(x) for x in args.sizes.split(",") if x]:
            root = Path(tmp) / f"h{h}"
            per_file = build(root, args.rows, h)
            times: dict[str, list[float]] = {"trusted": [], "size": []}
            for _ in range(args.reps):
                for label, verify in (("trusted", None), ("size", "size")):
                    t0 = time.perf_counter()
                    plan = HiddenStateStore(root).plan(
                        seq_lens,
                        num_states=NUM_STATES,
                        hidden_size=h,
                        dtype="bfloat16",
                        adopt=False,
                        verify=verify,
                    )
                    times[label].append(time.perf_counter() - t0)
                    assert plan.done == args.rows and not plan.remaining and not plan.damaged, plan.damaged
            med = {k: round(statistics.median(v), 3) for k, v in times.items()}
            result["sizes"][str(h)] = {
                "bytes_per_file": per_file,
                "store_plan_trusted_s": med["trusted"],
                "store_plan_size_check_s": med["size"],
                "check_us_per_file": round((med["size"] - med["trusted"]) / args.rows * 1e6, 2),
                "all": {k: [round(x, 3) for x in v] for k, v in times.items()},
            }
            print(f"hidden {h}: {result['sizes'][str(h)]}", file=sys.stderr, flush=True)
    result["loadavg_end"] = os.getloadavg()
    result["goal_le_2s"] = all(s["store_plan_size_check_s"] <= 2.0 for s in result["sizes"].values())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or result_name("resume_verify")
    (out / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("host", "cpus", "goal_le_2s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
