"""What the offline acceptance estimate (``benchmark-acceptance``) costs per verify step, by path: the whole sequence
recomputed at every step (the reference), the incremental path (KV caches, the default), and the incremental path
on a GPU in bf16 (``--device cuda --dtype bfloat16``); with the share of verify steps whose proposals equal the
reference's (fp32 vs bf16 may part on near-ties).

    # the test suite's tiny target and a speculators-built draft (random decoder weights: acceptance ~1)
    PYTHONPATH=python:tests/unit python bench/acceptance_device.py --device cuda --out FILE
    # a real target, a trained draft, real prompts (e.g. the live harness's CPU smoke run's SmolLM2 and draft)
    PYTHONPATH=python:tests/unit python bench/acceptance_device.py --device cpu --target DIR --checkpoint RUN \\
        --prompts-file mtbench_first_turns.jsonl --prompts 2 --tokens 64
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", help="the third path's device (cpu: the second path again)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--target", help="target model directory (default: the tiny test target)")
    ap.add_argument(
        "--checkpoint", help="draft checkpoint or train run (default: a random speculators draft)"
    )
    ap.add_argument("--prompts-file", help="prompts JSONL (default: random token ids)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch
    from eagle3ops.benchmark import acceptance as acc

    if a.threads:
        torch.set_num_threads(a.threads)
    if a.target:
        verifier, ckpt = Path(a.target), Path(a.checkpoint)
    else:
        from eagle3_draft_fixture import make_draft_checkpoint
        from eagle3ops.train.fixtures import make_tiny_verifier

        root = Path(tempfile.mkdtemp(prefix="acc-device-"))
        verifier = make_tiny_verifier(root / "verifier", vocab_size=512)
        ckpt = make_draft_checkpoint(root / "ckpt", verifier)
    if a.prompts_file:
        prompts = acc.load_prompts(a.prompts_file, a.prompts)
    else:
        g = torch.Generator().manual_seed(3)
        prompts = [
            {"id": f"p{i}", "input_ids": torch.randint(3, 500, (16,), generator=g).tolist()}
            for i in range(a.prompts)
        ]
    res: dict = {
        "target": str(verifier),
        "prompts": len(prompts),
        "tokens": a.tokens,
        "torch": torch.__version__,
    }
    res["threads"] = torch.get_num_threads()
    if a.device != "cpu":
        res["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    paths = {
        "cpu/float32/recompute": ("cpu", "float32", False),
        "cpu/float32": ("cpu", "float32", True),
        f"{a.device}/{a.dtype}": (a.device, a.dtype, True),
    }
    proposals: dict = {}
    for name, (device, dtype, incremental) in paths.items():
        drafter = acc.Eagle3Drafter(ckpt, dtype=dtype, device=device)
        target = acc.Target(verifier, drafter.layer_ids, dtype=dtype, device=device)
        seen: list = []
        propose = drafter.propose

        def recording(ids, aux, k, propose=propose, seen=seen):
            out = propose(ids, aux, k)
            seen.append((len(ids), out))
            return out

        drafter.propose = recording
        kw = {"k": 3, "incremental": incremental}
        acc.measure(target, drafter, prompts[:1], max_new_tokens=8, **kw)  # warm-up (kernels, allocator)
        seen.clear()
        t = time.time()
        m = acc.measure(target, drafter, prompts, max_new_tokens=a.tokens, **kw)
        if device != "cpu":
            torch.cuda.synchronize()
        secs = time.time() - t
        res[name] = {
            "acceptance_length": m["acceptance_length"],
            "verify_steps": m["verify_steps"],
            "seconds": round(secs, 3),
            "ms_per_verify_step": round(1000 * secs / m["verify_steps"], 2),
        }
        proposals[name] = seen
    ref = proposals["cpu/float32/recompute"]
    for name, seen in proposals.items():
        same = sum(1 for x, y in zip(ref, seen, strict=False) if x == y)
        res[name]["proposals_equal_to_recompute"] = round(same / max(1, min(len(ref), len(seen))), 4)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
