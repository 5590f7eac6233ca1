"""GPU check of the fp8 store option (issue #9, target 4): the CUDA path of ``run_extraction`` with
``dtype=float8_e4m3fn`` (quantisation on the device, scales through their own pinned buffers and the copy stream)
against a bf16 extraction of the same rows, plus throughput of both. CPU runs of the same code are covered by
tests/unit/extract/test_fp8.py; this proves the CUDA-only parts (pinned pools, record_stream, async copies).

Shape: a random-init Llama (hidden 2048, 16 layers by default; ``--tiny`` for a CPU smoke run), 2048-token rows.
Checks: every file's header (F8_E4M3 states + F32 scales [T, K+1, 1]), token ids equal, relative error of the
dequantised states vs the bf16 states < 5 %, fp8 bytes <= 0.51 x bf16 bytes.

Usage (GPU box): PYTHONPATH=python python3 bench/fp8_gpu.py --out "$OUT" [--rows 64]
Writes OUT/fp8_gpu_<date>_<card>.json; exit 0 when every check held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def random_target(model_dir: Path, rows: int, seq: int, tiny: bool):
    """A random-init bf16 Llama saved in ``model_dir`` (hidden 2048, 16 layers; ``tiny``: hidden 64, 8 layers)
    and ``rows`` random rows of ``seq`` tokens as a prepared dataset (input_ids, loss_mask, seq_len), not saved.
    Shared with bench/extract_oom_gpu.py."""
    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hidden = 64 if tiny else 2048
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 2 if tiny else 5632,
        num_hidden_layers=8 if tiny else 16,
        num_attention_heads=4 if tiny else 16,
        num_key_value_heads=4 if tiny else 16,
        vocab_size=1000 if tiny else 32000,
        max_position_embeddings=4096,
    )
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(model_dir))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (rows, seq), generator=g).tolist()
    return Dataset.from_dict({"input_ids": ids, "loss_mask": [[1] * seq] * rows, "seq_len": [seq] * rows})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--tiny", action="store_true", help="small model and rows: a CPU smoke run")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from eagle3ops.extract.session import ExtractConfig
    from eagle3ops.extract.transformers_backend import run_extraction
    from eagle3ops.store import FP8_SCALES_KEY, HiddenStateStore, load_sample, read_safetensors_header

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    hidden, layers, seq = (64, 8, 64) if args.tiny else (2048, 16, args.seq_len)
    rows = min(args.rows, 12) if args.tiny else args.rows
    result: dict = {
        "device": device,
        "rows": rows,
        "seq_len": seq,
        "hidden": hidden,
        "layers": layers,
        "checks": {},
    }
    with tempfile.TemporaryDirectory(prefix="fp8-gpu-") as tmp:
        t = Path(tmp)
        ds = random_target(t / "model", rows, seq, args.tiny)
        for dt in ("bfloat16", "float8_e4m3fn"):
            ds.save_to_disk(str(t / dt))
            t0 = time.perf_counter()
            r = run_extraction(
                ExtractConfig(
                    data_dir=str(t / dt),
                    model_path=str(t / "model"),
                    dtype=dt,
                    device=device,
                    max_batch_tokens=16384,
                    progress=False,
                )
            )
            r["wall_s"] = round(time.perf_counter() - t0, 2)
            result[dt] = {
                k: r.get(k)
                for k in (
                    "written",
                    "bytes",
                    "tokens",
                    "loop_tokens_per_second",
                    "compute_seconds",
                    "write_seconds",
                    "wall_s",
                )
            }
            print(f"{dt}: {json.dumps(result[dt])}", file=sys.stderr, flush=True)
        a, b = HiddenStateStore(t / "bfloat16"), HiddenStateStore(t / "float8_e4m3fn")
        errs, headers_ok, tokens_ok = [], True, True
        for i in range(rows):
            h = read_safetensors_header(b.path(i))
            headers_ok &= h["hidden_states"]["dtype"] == "F8_E4M3" and h[FP8_SCALES_KEY]["shape"] == [
                seq,
                4,
                1,
            ]
            x, y = load_sample(a.path(i), torch.float32), load_sample(b.path(i), torch.float32)
            tokens_ok &= torch.equal(x["token_ids"], y["token_ids"])
            ref = x["hidden_states"]
            errs.append(float((y["hidden_states"] - ref).norm() / ref.norm()))
        result["rel_error_vs_bf16"] = {"mean": sum(errs) / len(errs), "max": max(errs)}
        result["bytes_ratio"] = result["float8_e4m3fn"]["bytes"] / result["bfloat16"]["bytes"]
        result["checks"] = {
            "all_written": result["bfloat16"]["written"] == rows
            and result["float8_e4m3fn"]["written"] == rows,
            "headers": bool(headers_ok),
            "token_ids_equal": bool(tokens_ok),
            "rel_error_lt_5pct": max(errs) < 0.05,
            "bytes_le_0_51": result["bytes_ratio"] <= (0.51 if not args.tiny else 0.6),
        }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / result_name("fp8_gpu")).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("device", "rel_error_vs_bf16", "bytes_ratio", "checks")}))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
