"""An 8B-class target that computes exactly what a small one computes: every MLP zero-widened (issue #31).

Each MLP's gate and up projections get extra rows of zeros and its down projection extra columns of zeros, so
the extra intermediate units compute ``silu(0) * 0 = 0`` and add nothing: each layer adds what it added before,
and the hidden states of every layer (the aux layers and the last state a draft is trained on) are unchanged.
The widened model costs what its size costs: SmolLM2-135M-Instruct widened to intermediate 153,600 has 8.02 B
parameters (16.0 GB in bf16) and decodes at an 8B model's step time on an H200 (4.9-5.0 ms against 1.8 ms;
../shared/notes/gpu-machine.md), so a draft trained on SmolLM2's states is measured against the cost of an 8B
verify step without training anything new.

Dense Llama/Qwen-style MLPs (``mlp.{gate,up,down}_proj``, ``intermediate_size``) are widened, and with
``moe_intermediate`` DeepSeek-V3-style experts too (``mlp.experts.N.*`` and ``mlp.shared_experts.*``,
``moe_intermediate_size``; the shared experts are ``n_shared_experts`` times that wide). Weights are streamed one
tensor at a time into shards of about ``shard_gb``; the other files (tokenizer, chat template, generation config)
are copied; the config names the new widths.

    python bench/widen_target.py SRC DST --intermediate 153600
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

DENSE = re.compile(r"\.mlp\.(gate|up|down)_proj\.weight$")
EXPERT = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
SHARED = re.compile(r"\.mlp\.shared_experts\.(gate|up|down)_proj\.weight$")


def _pad(t, width: int, kind: str):
    """gate/up [I, H] -> [width, H] (rows of zeros); down [H, I] -> [H, width] (columns of zeros)."""
    import torch

    if kind in ("gate", "up"):
        if width < t.shape[0]:
            raise ValueError(f"cannot narrow an MLP: {tuple(t.shape)} to {width} rows")
        return torch.cat([t, t.new_zeros(width - t.shape[0], t.shape[1])], dim=0)
    if width < t.shape[1]:
        raise ValueError(f"cannot narrow an MLP: {tuple(t.shape)} to {width} columns")
    return torch.cat([t, t.new_zeros(t.shape[0], width - t.shape[1])], dim=1)


def widen(src: str | Path, dst: str | Path, intermediate: int, moe_intermediate: int | None = None,
          shard_gb: float = 4.0) -> dict:  # fmt: skip
    """Write the widened copy of the model in ``src`` to ``dst``; return what was done."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    t0 = time.time()
    cfg = json.loads((src / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    n_shared = int(text.get("n_shared_experts") or 0)
    widths = {"dense": int(intermediate)}
    if moe_intermediate:
        widths["expert"] = int(moe_intermediate)
        widths["shared"] = int(moe_intermediate) * max(1, n_shared)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if (
            f.is_file()
            and not f.name.endswith((".safetensors", ".safetensors.index.json"))
            and f.name != "config.json"
        ):
            shutil.copy2(f, dst / f.name)
    shards: list[dict] = [{}]
    sizes = [0]
    limit = int(shard_gb * (1 << 30))
    widened = params = 0
    for s in sorted(src.glob("*.safetensors")):
        with safe_open(str(s), "pt") as fh:
            for k in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                t = fh.get_tensor(k)
                for name, rx in (("expert", EXPERT), ("shared", SHARED), ("dense", DENSE)):
                    m = rx.search(k)
                    if m and name in widths:
                        t = _pad(t, widths[name], m.group(1))
                        widened += 1
                        break
                t = t.contiguous()
                n = t.numel() * t.element_size()
                params += t.numel()
                if sizes[-1] and sizes[-1] + n > limit:
                    shards.append({})
                    sizes.append(0)
                shards[-1][k] = t
                sizes[-1] += n
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards, strict=True):
        save_file(shard, str(dst / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    (dst / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}, indent=1, sort_keys=True
        )
    )
    text["intermediate_size"] = widths["dense"]
    if moe_intermediate:
        text["moe_intermediate_size"] = widths["expert"]
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return {"src": str(src), "dst": str(dst), "intermediate_size": widths["dense"],
            "moe_intermediate_size": widths.get("expert"), "tensors_widened": widened, "parameters": params,
            "bytes": sum(sizes), "shards": len(shards), "seconds": round(time.time() - t0, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--intermediate", type=int, required=True, help="the dense MLPs' new intermediate size")
    ap.add_argument(
        "--moe-intermediate", type=int, help="the experts' new intermediate size (DeepSeek-V3 style)"
    )
    ap.add_argument("--shard-gb", type=float, default=4.0)
    a = ap.parse_args(argv)
    try:
        print(json.dumps(widen(a.src, a.dst, a.intermediate, a.moe_intermediate, a.shard_gb)))
    except (OSError, ValueError) as e:
        print(f"widen_target: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
