"""Time to the first training step on an adopted dump, 1k vs 37k samples, with the checks overlapped (CPU).

The question: does ``eagle3ops train --verify overlapped`` on a store whose rows all live in an adopted dump (the
original job's 37k samples, ~4.6 TB of ~125 MB ``torch.save`` files) reach its first step as soon as on a small
one? Goal: 37k / 1k <= 1.2, i.e. nothing before the first step walks the store's files by their bytes.

What is built, per size N (real code paths; STAND-IN data):

* a prepared Arrow dataset of N rows (row i = sample i % K of K distinct random samples, 32-128 tokens), the
  tiny DeepSeek-V3 verifier of :mod:`eagle3ops.train.fixtures` (hidden 64), token_freq.pt, extract_meta.json;
* a dump of N SpecForge-layout ``.ckpt`` files in ``rows_A-B`` folders, each its own inode (no hard links: a
  real dump's 37k inodes are what a per-file stat pays), **sparse at the real size**: the ``hidden_state``
  tensor is a view on a 125 MB storage that ``torch.save`` writes whole, so each file is a valid zip of 125 MB
  (crc32s of the zeros included) whose blocks past the real tensors are a hole. 37,000 of them are 4.6 TB
  apparent on a disk of 252 GB: what depends on the number of files (listing, stat, record lines) is real;
  what depends on their bytes is not disk-bound (a hole reads as zeros from memory), which is the right
  stand-in for "time to first step" because only the first batch's files are read before it;
* the real adoption (:func:`eagle3ops.store.adopt.survey` + ``commit``, headers checked, no content pass):
  ``hidden_states/adopted.jsonl`` of N rows.

Then the real ``eagle3ops train --verify overlapped`` (renders the config, launches the detached speculators
trainer through the shim, whose loader checks each file's crc32s on its first read). Timed: CLI start -> the
first training-step record of metrics.jsonl, and trainer launch -> first step (``time_to_first_step_s``).
Sizes interleaved (1k, 37k, 1k, 37k ...) because the box is shared; medians compared.

Usage: .venv/bin/python bench/adopt_first_step.py [--sizes 1000,37000] [--reps 2]
Raw JSON: bench/results/adopt_first_step_<date>_cpu.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
LAYER_IDS = [2, 4, 5]
FILE_BYTES = 125_000_000


def templates(k: int, vocab: int, hidden: int, min_len: int, max_len: int) -> list[dict]:
    """K distinct samples, each as the head and tail bytes of its sparse 125 MB file (and its tokens)."""
    import torch
    from eagle3ops.store.torchfile import TorchFile

    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(k):
        t = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(0, vocab, (t,), generator=g)
        mask = torch.zeros(t, dtype=torch.long)
        mask[t // 4 :] = 1
        hs = torch.randn((t, 4, hidden), generator=g).bfloat16()
        big = torch.zeros(FILE_BYTES // 2, dtype=torch.bfloat16)  # the padding: zeros past the real tensor
        big[: t * hidden] = hs[:, 3].reshape(-1)
        obj = {"input_ids": ids, "loss_mask": mask, "aux_hidden_state": hs[:, :3].reshape(1, t, -1).clone(),
               "hidden_state": big[: t * hidden].view(1, t, hidden)}  # fmt: skip
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        tf = TorchFile("<template>", data)
        start, end = tf.data_range(tf.storage_name(tf.obj["hidden_state"]))
        hole_a = -(-(start + t * hidden * 2) // 4096) * 4096
        hole_b = end // 4096 * 4096
        out.append({"tokens": ids.tolist(), "mask": mask.tolist(), "size": len(data),
                    "head": data[:hole_a], "tail_at": hole_b, "tail": data[hole_b:]})  # fmt: skip
    return out


def write_sparse(path: Path, tpl: dict) -> None:
    with open(path, "wb") as f:
        f.write(tpl["head"])
        f.seek(tpl["tail_at"])
        f.write(tpl["tail"])


def build_store(data: Path, dump: Path, verifier: Path, n: int, tpls: list[dict]) -> dict:
    """Prepared rows, the sparse dump, and its real adoption; returns what was built and how long it took."""
    import torch
    from datasets import Dataset
    from eagle3ops.store import HiddenStateStore
    from eagle3ops.store.adopt import commit, survey

    t0 = time.time()
    k = len(tpls)
    rows = [tpls[i % k] for i in range(n)]
    Dataset.from_dict(
        {"input_ids": [r["tokens"] for r in rows], "loss_mask": [r["mask"] for r in rows],
         "seq_len": [len(r["tokens"]) for r in rows]}
    ).with_format("torch").save_to_disk(str(data))  # fmt: skip
    vcfg = json.loads((verifier / "config.json").read_text())
    meta = {"layer_ids": LAYER_IDS, "num_layers": vcfg["num_hidden_layers"], "hidden_size": vcfg["hidden_size"],
            "dtype": "bfloat16", "model_path": str(verifier), "num_rows": n, "layer_convention": "input",
            "synthetic": True}  # fmt: skip
    HiddenStateStore(data).ensure_meta(meta)
    freq: dict[int, int] = {}
    for r in tpls:
        for tok, m in zip(r["tokens"], r["mask"], strict=True):
            if m:
                freq[tok] = freq.get(tok, 0) + 1
    torch.save(freq, data / "token_freq.pt")
    for i in range(n):
        folder = dump / f"rows_{i // 2000 * 2000}-{i // 2000 * 2000 + 2000}"
        if i % 2000 == 0:
            folder.mkdir(parents=True, exist_ok=True)
        write_sparse(folder / f"data_{i}.ckpt", rows[i])
    (dump / "eagle3ops-dump.json").write_text(
        json.dumps({"layer_ids": LAYER_IDS, "layer_convention": "input", "last_state": "pre-norm"})
    )
    built = time.time() - t0
    t1 = time.time()
    res = commit(survey(data, dump, run_layer_ids=LAYER_IDS, hidden_size=vcfg["hidden_size"]))
    assert res["adopted"] == n, {k: v for k, v in res.items() if k != "unmatched"}
    apparent = sum(r["size"] for r in rows)
    return {"rows": n, "apparent_bytes": apparent, "build_s": round(built, 1),
            "adopt_s": round(time.time() - t1, 1), "adopted": res["adopted"]}  # fmt: skip


def main() -> int:
    from first_step import bench_arguments, launch_to_first_step, record_run, write_result

    ap = bench_arguments(__doc__, "1000,37000")
    ap.add_argument("--work", default=os.environ.get("BENCH_TMP"))
    args = ap.parse_args()

    import train_gpu  # bench/train_gpu.py: train_stage, the same CLI call as the GPU proof
    from eagle3ops.train.fixtures import make_tiny_verifier

    sizes = [int(x) for x in args.sizes.split(",")]
    date = time.strftime("%Y-%m-%d")
    result: dict = {"bench": "adopt_first_step", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "host": platform.node(), "cpus": os.cpu_count(),
                    "command": " ".join([Path(sys.executable).name, *sys.argv]),
                    "loadavg_start": os.getloadavg(), "runs": []}  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="adopt-first-step-", dir=args.work))
    try:
        verifier = make_tiny_verifier(work / "verifier")
        vcfg = json.loads((verifier / "config.json").read_text())
        tpls = templates(args.distinct, vcfg["vocab_size"], vcfg["hidden_size"], 32, 128)
        result["stores"] = {}
        for n in sizes:
            result["stores"][str(n)] = build_store(work / f"data-{n}", work / f"dump-{n}", verifier, n, tpls)
            print(json.dumps(result["stores"][str(n)]), file=sys.stderr, flush=True)
        targs = argparse.Namespace(device="cpu", total_seq_len=512, stage_timeout=900, draft_attn_impl="sdpa",
                                   loss_implementation="eager", env=None)  # fmt: skip
        extra = ("--verify", "overlapped", "--max-steps", str(args.max_steps), "--log-freq", "1",
                 "--train-data-ratio", "0.98")  # fmt: skip
        for rep in range(args.reps):
            for n in sizes:
                name = f"{n}-rep{rep}"
                verified = work / f"data-{n}" / "hidden_states" / "verified.jsonl"
                verified.unlink(missing_ok=True)
                row, _ = launch_to_first_step(
                    train_gpu, name, work / f"data-{n}", verifier, work, targs, extra
                )
                row = {"rows": n, "rep": rep, "cli_start_to_first_step_s": row.pop("cli_to_first_step_s"), **row,
                       "files_checked_on_read": len(verified.read_text().splitlines()) if verified.exists() else 0}  # fmt: skip
                record_run(result, row, work / f"run-{name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keys = ("time_to_first_step_s", "cli_start_to_first_step_s")
    return write_result(result, sizes, keys, Path(args.out) / f"adopt_first_step_{date}_cpu.json")


if __name__ == "__main__":
    sys.exit(main())
