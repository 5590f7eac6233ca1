"""A DeepSeek-V3-shaped random target of realistic width, for the capture-overhead measurement of issue #17.

The demo target (hidden 64) computes a row in microseconds, so through the patched server the per-row costs (the
request, the hook's durable write, the client's confirmation) are all that is measured: 0.126 of plain prefill on
2026-12-02. The overhead the issue asks about is the capture's share of a *real* prefill, so this builds a target whose
forward dominates: the demo's architecture and SGLang config fields (``eagle3ops.tinymodel``: MLA with DeepSeek-V3's
head dims, MoE with a shared expert, the checkpoint fields SGLang reads), at hidden 2048 and 40 layers (~3.9B
parameters, ~1.7B active per token: ~3.5 GFLOP per token of prefill), random bf16 weights, built on the GPU in
seconds. The states it captures are 4 x 2048 bf16 per token (16 KiB), whatever the depth: depth makes the forward,
not the capture, the cost, as at Kimi-K2.5's scale.

The tokenizer (and chat template) comes from ``--tokenizer-from`` (on the box: the converted SmolLM2, vocab 49152),
so ``eagle3ops prepare`` turns ShareGPT conversations into rows of real length for it.

    python bench/capture_target.py --out /dev/shm/e3mid/model --tokenizer-from /tmp/live/models/smollm2
    python bench/capture_target.py --out /tmp/mid --tokenizer-from M --hidden 64 --layers 4 --device cpu  # smoke

Prints one JSON line (parameters, active parameters per token, seconds, the directory).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "vocab.json", "merges.txt")  # fmt: skip


def shape(a) -> dict:
    """The config overrides of eagle3ops.tinymodel for this size (MLA head dims stay DeepSeek-V3's own)."""
    heads = max(1, a.hidden // 128)
    return {
        "hidden_size": a.hidden,
        "intermediate_size": 4 * a.hidden,
        "moe_intermediate_size": a.moe_intermediate or max(16, (a.hidden * 11) // 16),
        "num_hidden_layers": a.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "n_routed_experts": a.experts,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "q_lora_rank": (a.hidden * 3) // 4,
        "max_position_embeddings": 4096,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--tokenizer-from", required=True, help="a model directory whose tokenizer files are copied"
    )
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--moe-intermediate", type=int, default=0, help="default 11/16 of hidden")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    out, src = Path(a.out), Path(a.tokenizer_from)
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        print(json.dumps({"out": str(out), "kept": True}))
        return 0
    import torch
    from eagle3ops import tinymodel
    from transformers import DeepseekV3ForCausalLM

    vocab = int(json.loads((src / "config.json").read_text())["vocab_size"])
    t = time.time()
    torch.manual_seed(0)
    cfg = tinymodel.hf_config(vocab, None, **shape(a))
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(a.device):
        model = DeepseekV3ForCausalLM(cfg).eval()
    built = time.time() - t
    n = sum(p.numel() for p in model.parameters())
    per_layer_experts = 3 * cfg.hidden_size * cfg.moe_intermediate_size  # one expert's gate/up/down
    moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    inactive = moe_layers * (cfg.n_routed_experts - cfg.num_experts_per_tok) * per_layer_experts
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tinymodel.save(model, tmp)
    for f in TOKENIZER_FILES:
        if (src / f).exists():
            shutil.copy2(src / f, tmp / f)
    cj = json.loads((tmp / "config.json").read_text())
    for k in (
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):  # the tokenizer's, not DeepseekV3Config's defaults
        v = json.loads((src / "config.json").read_text()).get(k)
        if v is not None:
            cj[k] = v
    (tmp / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(json.dumps({"out": str(out), "parameters": n, "active_parameters_per_token": n - inactive,
                      "hidden_size": cfg.hidden_size, "num_layers": cfg.num_hidden_layers, "vocab_size": vocab,
                      "build_s": round(built, 1), "seconds": round(time.time() - t, 1), "device": a.device}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
