#!/usr/bin/env python3
"""GPU proof of the train phase: speculators 0.9.0 through ``eagle3ops train`` (torchrun, all visible GPUs).

Runs unattended on the lent H200 boxes (1 or 2 GPUs; Python 3.12, torch 2.11, no internet) and writes
``$OUT/train_gpu_<date>_<card>.json``. Stages (each optional, see --stages):

``pipeline``  the real chain on the GPU: ``eagle3ops demo`` -> ``prepare`` -> ``extract --device cuda`` ->
              ``train --device gpu`` (wait), then a second ``train`` that must report changed=false.
              (Needs ``datasets``; the demo target is tiny, so this proves the chain, not the speed.)
``synth-N``   speed at Kimi-K2.5 shapes (hidden 7168, vocab 163840, 3 aux layers + last, bf16) on a
              synthetic store of N rows (STAND-IN for extracted data): K distinct random samples; row i is
              sample i % K (same input_ids), its ``hs_i.safetensors`` a hard link to that sample's file, so
              20k rows fit on the box's disk while the loader still opens one file per row. The verifier
              directory holds a Kimi-shaped config.json and random embed/lm_head/norm weights only (all
              speculators loads from a verifier). Reports steps/s, tokens/s and time to the first step; the
              time to the first step must not grow with N (lengths come from the Arrow seq_len column /
              manifest, no file is opened before training).

Usage (repo root)::

    python bench/train_gpu.py                       # pipeline, synth-1000, synth-20000
    python bench/train_gpu.py --stages synth-1000 --max-steps 50
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
os.environ["PYTHONPATH"] = f"{ROOT / 'python'}:{os.environ.get('PYTHONPATH', '')}"
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_k] = "1"


def log(msg: str) -> None:
    print(f"[train_gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cli(*args: str, timeout: float = 3600) -> tuple[int, dict, float]:
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "eagle3ops", *args, "--json"], capture_output=True, text=True, timeout=timeout
    )
    dt = time.time() - t0
    res = {}
    for line in reversed(r.stdout.strip().splitlines()):
        if line.startswith("{"):
            res = json.loads(line)
            break
    if r.returncode != 0:
        log(f"eagle3ops {args[0]} exited {r.returncode}: {res.get('msg') or r.stderr[-3000:]}")
    return r.returncode, res, dt


# ------------------------------------------------------------------ synthetic Kimi-shaped store ---------


def make_verifier(out: Path, hidden: int, vocab: int, layers: int) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config

    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cfg = DeepseekV3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=64,
        num_key_value_heads=64,
        pad_token_id=0,
    )
    cfg.save_pretrained(out)
    dev = "cpu"  # never hold GPU memory in this process: the train phase checks the GPUs are free
    g = torch.Generator(device=dev).manual_seed(0)
    w = {
        "model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=g, device=dev) * 0.02)
        .bfloat16()
        .cpu(),
        "lm_head.weight": (torch.randn(vocab, hidden, generator=g, device=dev) * 0.02).bfloat16().cpu(),
        "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
    }
    save_file(w, str(out / "model.safetensors"))
    return out


def make_synth_store(
    data: Path, verifier: Path, n_rows: int, k: int, min_len: int, max_len: int, layer_ids: list[int]
) -> dict:
    """K distinct samples, N rows (row i = sample i % K), hidden-state files hard-linked."""
    import torch
    from datasets import Dataset, concatenate_datasets
    from eagle3ops.store import HiddenStateStore, ManifestEntry
    from safetensors.torch import save

    if (data / "token_freq.pt").exists():
        return json.loads((data / "synth.json").read_text())
    t0 = time.time()
    vcfg = json.loads((verifier / "config.json").read_text())
    hidden, vocab = vcfg["hidden_size"], vcfg["vocab_size"]
    dev = "cpu"  # never hold GPU memory in this process: the train phase checks the GPUs are free
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(min_len, max_len + 1, (k,), generator=g).tolist()
    ids = [torch.randint(0, vocab, (n,), generator=g) for n in lens]
    masks = []
    for n in lens:
        m = torch.zeros(n, dtype=torch.long)
        m[n // 4 :] = 1
        masks.append(m)
    base = Dataset.from_dict(
        {"input_ids": [t.tolist() for t in ids], "loss_mask": [m.tolist() for m in masks], "seq_len": lens}
    )
    reps = -(-n_rows // k)
    ds = concatenate_datasets([base] * reps).select(range(n_rows)) if reps > 1 else base.select(range(n_rows))
    data.mkdir(parents=True, exist_ok=True)
    ds.with_format("torch").save_to_disk(str(data))
    store = HiddenStateStore(data)
    store.ensure_meta(
        {
            "layer_ids": layer_ids,
            "num_layers": vcfg["num_hidden_layers"],
            "hidden_size": hidden,
            "dtype": "bfloat16",
            "model_path": str(verifier),
            "num_rows": n_rows,
            "layer_convention": "input",
            "synthetic": True,
        }
    )
    store.dir.mkdir(parents=True, exist_ok=True)
    base_dir = data / "hs_base"
    base_dir.mkdir(exist_ok=True)
    sizes = []
    gd = torch.Generator(device=dev).manual_seed(2)
    for j, n in enumerate(lens):
        hs = torch.randn((n, len(layer_ids) + 1, hidden), generator=gd, device=dev).bfloat16().cpu()
        payload = save({"token_ids": ids[j].contiguous(), "hidden_states": hs})
        (base_dir / f"s{j}.safetensors").write_bytes(payload)
        sizes.append(len(payload))
    entries = []
    for i in range(n_rows):
        j = i % k
        os.link(base_dir / f"s{j}.safetensors", store.path(i))
        entries.append(ManifestEntry(i, lens[j], sizes[j], None, 0))
    store.append_manifest(entries, fsync=True)
    store.close()
    freq: dict[int, int] = {}
    for t, m in zip(ids, masks, strict=True):
        for tok in t[m.bool()].tolist():
            freq[tok] = freq.get(tok, 0) + 1
    torch.save(freq, data / "token_freq.pt")
    info = {
        "rows": n_rows,
        "distinct_samples": k,
        "tokens": sum(lens[i % k] for i in range(n_rows)),
        "distinct_bytes": sum(sizes),
        "build_s": round(time.time() - t0, 1),
    }
    (data / "synth.json").write_text(json.dumps(info))
    return info


def train_stage(name: str, data: Path, verifier: Path, work: Path, args, extra_args=()) -> dict:
    run_dir = work / f"run-{name}"
    argv = [
        "train",
        "--data",
        str(data),
        "--verifier",
        str(verifier),
        "--run-dir",
        str(run_dir),
        "--device",
        args.device,
        "--epochs",
        "1",
        "--total-seq-len",
        str(args.total_seq_len),
        "--launcher",
        "setsid",
        "--wait",
        "--timeout",
        str(args.stage_timeout),
        *(("--draft-attn-impl", args.draft_attn_impl) if args.draft_attn_impl else ()),
        # this bench process itself has the GPU's device files open (CUDA initialised to read the GPU's
        # name), which the gpu_free check rightly reports; that check is proven by bench/gpu_free_release.py
        "--no-gpu-free-check",
        "--loss-implementation",
        args.loss_implementation,
        *(("--env", args.env) if args.env else ()),
        *extra_args,
    ]
    rc, res, dt = cli(*argv, timeout=args.stage_timeout + 600)
    if res.get("status") not in ("finished", "done"):
        # never leave a detached trainer behind to compete with the next stage for the GPU
        src, sres, _ = cli("train-stop", "--run-dir", str(run_dir), "--grace", "20", timeout=120)
        log(
            f"stopped {name} after status={res.get('status')}: rc={src} {sres.get('status') or sres.get('msg')}"
        )
    out = {
        "rc": rc,
        "wall_s": round(dt, 1),
        "changed": res.get("changed"),
        "status": res.get("status"),
        "nproc": res.get("nproc"),
        "draft_vocab_size": res.get("draft_vocab_size"),
        "layer_ids": res.get("layer_ids"),
        "gpu_free": bool(res.get("gpu_free")),
        "msg": res.get("msg"),
    }
    m = res.get("metrics") or {}
    att = (m.get("attempts") or [{}])[-1]
    out.update(
        {
            "time_to_first_step_s": att.get("time_to_first_step_s"),
            "steps_per_s": att.get("steps_per_s"),
            "median_tokens_per_s_per_rank": att.get("median_tokens_per_s_per_rank"),
            "steps_logged": att.get("steps"),
            "last_global_step": att.get("last_global_step"),
            "val_loss": m.get("val_loss"),
            "val_cond_acc": m.get("val_cond_acc"),
        }
    )
    if att.get("median_tokens_per_s_per_rank") and res.get("nproc"):
        out["tokens_per_s"] = round(att["median_tokens_per_s_per_rank"] * res["nproc"], 1)
    if rc != 0 and (run_dir / "train.log").exists():
        out["log_tail"] = (run_dir / "train.log").read_text()[-4000:]
    # second invocation: must be a no-op
    rc2, res2, dt2 = cli(*[a for a in argv if a != "--wait"], timeout=600)
    if res.get("status") not in ("finished", "done"):
        return out  # a second launch would just relaunch a failed run
    out["second_run"] = {
        "rc": rc2,
        "changed": res2.get("changed"),
        "status": res2.get("status"),
        "wall_s": round(dt2, 1),
    }
    return out


def pipeline_stage(work: Path, args) -> dict:
    demo, data = work / "demo", work / "pipe-data"
    res: dict = {}
    rc, r, dt = cli("demo", "--out", str(demo))
    res["demo"] = {"rc": rc, "s": round(dt, 1)}
    if rc:
        return res
    inputs = demo / "conversations.jsonl"
    rc, r, dt = cli("prepare", "--model", str(demo / "model"), "--input", str(inputs), "--out", str(data))
    res["prepare"] = {"rc": rc, "s": round(dt, 1), "rows": r.get("rows")}
    if rc:
        return res
    rc, r, dt = cli(
        "extract",
        "--data",
        str(data),
        "--model",
        str(demo / "model"),
        "--device",
        "cuda" if args.device == "gpu" else "cpu",
        "--workers",
        "auto",
        "--no-progress",
    )
    res["extract"] = {
        "rc": rc,
        "s": round(dt, 1),
        "written": r.get("written"),
        "layer_ids": r.get("layer_ids"),
    }
    if rc:
        return res
    res["train"] = train_stage("pipeline", data, demo / "model", work, args, ("--epochs", "2"))
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", default="pipeline,synth-1000,synth-20000")
    ap.add_argument("--work", default=os.environ.get("TRAIN_GPU_WORK", "/tmp/eagle3ops-train-gpu"))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--data-root",
        help="where the synthetic verifier and stores live (default --work); share it between runs",
    )
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument(
        "--distinct", type=int, default=50, help="distinct synthetic samples (divides 1000 and 20000)"
    )
    ap.add_argument("--min-len", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--total-seq-len", type=int, default=8192)
    ap.add_argument("--max-steps", type=int, default=120)
    ap.add_argument(
        "--loss-implementation",
        default="eager",
        help="eager: speculators 0.9.0's fused KL loss failed under torch 2.11 dynamo on the H200 (2026-11-29)",
    )
    ap.add_argument("--stage-timeout", type=float, default=1500)
    ap.add_argument(
        "--env",
        default="",
        help='JSON, passed to `eagle3ops train --env` (e.g. {"TORCH_COMPILE_DISABLE": "1"})',
    )
    ap.add_argument(
        "--draft-attn-impl",
        choices=["simple_flex_attention", "sdpa", "eager"],
        help="default: speculators' flex attention on GPU (torch.compile); sdpa if that cannot compile there",
    )
    ap.add_argument(
        "--device", choices=["gpu", "cpu"], default="gpu", help="cpu: a smoke test of this script"
    )
    args = ap.parse_args()
    import torch
    from eagle3ops.train.speculators_shim import check_version

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "host": os.uname().nodename,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "speculators": check_version(),
        "gpus": torch.cuda.device_count(),
        "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "stages": {},
    }
    out_path = Path(args.out) / result_name("train_gpu")

    def dump():
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2, default=str))

    for stage in [s.strip() for s in args.stages.split(",") if s.strip()]:
        log(f"stage {stage}")
        t0 = time.time()
        try:
            if stage == "pipeline":
                result["stages"][stage] = pipeline_stage(work, args)
            elif stage.startswith("synth-"):
                n = int(stage.split("-", 1)[1])
                droot = Path(args.data_root) if args.data_root else work
                verifier = make_verifier(droot / "kimi-shaped-verifier", args.hidden, args.vocab, args.layers)
                ids = [2, args.layers // 2, args.layers - 3]
                data = droot / f"synth-{n}"
                info = make_synth_store(data, verifier, n, args.distinct, args.min_len, args.max_len, ids)
                r = train_stage(
                    stage,
                    data,
                    verifier,
                    work,
                    args,
                    (
                        "--max-steps",
                        str(args.max_steps),
                        "--train-data-ratio",  # the same 20 validation rows at every N
                        str(1 - 20 / n),
                        "--log-freq",
                        "5",
                        "--draft-vocab-size",
                        "32000",
                    ),
                )
                result["stages"][stage] = {"data": info, **r}
            else:
                result["stages"][stage] = {"error": "unknown stage"}
        except Exception as e:  # record and go on with the next stage
            result["stages"][stage] = {"error": f"{type(e).__name__}: {e}"}
        result["stages"][stage]["stage_s"] = round(time.time() - t0, 1)
        dump()
        log(json.dumps(result["stages"][stage], default=str)[:1500])
    s1, s2 = result["stages"].get("synth-1000", {}), result["stages"].get("synth-20000", {})
    if s1.get("time_to_first_step_s") and s2.get("time_to_first_step_s"):
        result["time_to_first_step_ratio_20k_over_1k"] = round(
            s2["time_to_first_step_s"] / s1["time_to_first_step_s"], 3
        )
    dump()
    print(json.dumps({k: v for k, v in result.items() if k != "stages"}, default=str))
    for name, st in result["stages"].items():
        print(
            f"{name}: rc={st.get('rc')} status={st.get('status')} ttfs={st.get('time_to_first_step_s')} s "
            f"steps/s={st.get('steps_per_s')} tok/s={st.get('tokens_per_s')} second_run={st.get('second_run')}"
        )
    if os.environ.get("TRAIN_GPU_KEEP") != "1":
        shutil.rmtree(work / "run-synth-1000" / "checkpoints", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
