"""Lane ``demo`` of bench/sglang_live.py (issue #17): the SGLang extraction backend against a real server.

On the box, with SGLang installed under /tmp/sglsite (bench/sglang_live.sh): the demo target
(``eagle3ops demo``: a tiny DeepSeek-V3, MLA + MoE, SGLang's config fields, bf16) is prepared once and copied
to two data directories; one is extracted by the transformers backend on CUDA, the other through the real
server: ``eagle3ops sglang-patch apply`` on the installed ``deepseek_v2.py``, the server launched with the
capture flags and the hook's environment, ``eagle3ops sglang-extract`` sending every row, the patch restored
byte-exact (sha256 checked). Then both stores are compared file by file (token ids equal; states within the
stated bf16 tolerance) and the capture overhead is measured on the same server: the same rows once more as
plain prefills (request ids the hook ignores, ``max_new_tokens=1``) against the captured run's tok/s.
Last, a demo draft is trained on the transformers store (speculators, on the GPU) and the serve and benchmark
phases run as playbooks (``playbooks/serve.yml`` + ``playbooks/benchmark.yml``, ``inventory/gpu-box``) against
the real server: the capture patch must be pristine again, the draft is converted and served by the role's own
launcher, the guard probes it, the benchmark measures it with and without the draft and writes the report.

Result: WORK/result.json (read by sglang_live.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_live as L  # the harness pieces (cli, Server, http)

SGLANG_VERSION = os.environ.get("LIVE_SGLANG_VERSION", "0.5.17")


def compare(tf_dir: Path, sg_dir: Path, limit: int | None = None) -> dict:
    """Per file: token ids equal; per (token, state) ||a-b|| / ||a|| (relative L2 error) and max |a-b|."""
    import torch
    from safetensors.torch import load_file

    files = sorted((tf_dir / "hidden_states").glob("hs_*.safetensors"), key=lambda p: int(p.stem[3:]))[:limit]
    worst_rel, worst_abs, rels, missing, id_mismatch, per_file = 0.0, 0.0, [], 0, 0, []
    for f in files:
        g = sg_dir / "hidden_states" / f.name
        if not g.exists():
            missing += 1
            continue
        a, b = load_file(str(f)), load_file(str(g))
        if not torch.equal(a["token_ids"], b["token_ids"]):
            id_mismatch += 1
            continue
        x, y = a["hidden_states"].float(), b["hidden_states"].float()
        rel = (x - y).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-6)  # [T, K+1]
        rels.append(rel.flatten())
        per_file.append(rel)
        worst_rel = max(worst_rel, rel.max().item())
        worst_abs = max(worst_abs, (x - y).abs().max().item())
    allrel = torch.cat(rels) if rels else torch.zeros(1)
    per_state = torch.stack([r.mean(0) for r in per_file]).mean(0).tolist() if per_file else []
    return {
        # how rare the large errors are (a token whose MoE routing flipped between the two backends)
        "share_rel_l2_over_0.05": round((allrel > 0.05).float().mean().item(), 6),
        "share_rel_l2_over_0.2": round((allrel > 0.2).float().mean().item(), 6),
        "rel_l2_mean_per_state": [round(x, 5) for x in per_state],  # the aux layers, then the last state
        "files_compared": len(rels),
        "missing_in_sglang_store": missing,
        "token_id_mismatches": id_mismatch,
        "rel_l2_max": round(worst_rel, 5),
        "rel_l2_mean": round(allrel.mean().item(), 5),
        "rel_l2_p99": round(allrel.quantile(0.99).item(), 5) if allrel.numel() > 1 else None,
        "abs_max": round(worst_abs, 5),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/live/demo")
    ap.add_argument("--budget-s", type=float, default=900)
    ap.add_argument("--site", default="/tmp/sglsite")
    ap.add_argument("--device", default="cuda", help="cpu: bench/sglang_live.py --smoke (stand-in server)")
    a = ap.parse_args()
    w = Path(a.work)
    w.mkdir(parents=True, exist_ok=True)
    L.W = w
    L.DEADLINE[0] = time.time() + a.budget_s
    res: dict = {}

    def done(k, v):
        res[k] = v
        (w / "result.json").write_text(json.dumps(res, indent=1, default=str))

    demo, tf, sg = w / "demo", w / "data-tf", w / "data-sgl"
    model = demo / "model"
    done("demo", L.cli("demo", "--out", str(demo), name="demo"))
    done("prepare", L.cli("prepare", "--model", str(model), "--input", str(demo / "conversations.jsonl"),
                          "--out", str(tf), name="prepare"))  # fmt: skip
    if not (tf / "prepare_meta.json").exists():
        return 1
    shutil.rmtree(sg, ignore_errors=True)
    shutil.copytree(tf, sg)
    done("extract_transformers", L.cli("extract", "--data", str(tf), "--model", str(model), "--device", a.device,
                                       "--workers", "1", "--no-progress", name="extract_tf"))  # fmt: skip
    meta = json.loads((tf / "hidden_states" / "extract_meta.json").read_text())
    ids = [str(i) for i in meta["layer_ids"]]
    site = ["--site-packages", a.site, "--sglang-version", SGLANG_VERSION]
    done("patch_status_before", L.cli("sglang-patch", "status", *site, name="patch_status0"))
    done("patch_apply", L.cli("sglang-patch", "apply", *site, name="patch_apply"))
    target = Path(a.site) / "sglang/srt/models/deepseek_v2.py"
    env = {"EAGLE3OPS_SGLANG_DUMP_DIR": str(sg), "EAGLE3OPS_SGLANG_LAYER_IDS": ",".join(ids)}
    from eagle3ops.sglang_versions import dump_capture_args

    # what the dump needs (docs/sglang.md), plus the version's capture-only flags (none on 0.5.17: the patch
    # turns the capture on itself)
    capture = ["--disable-radix-cache", "--chunked-prefill-size", "-1", "--disable-prefill-cuda-graph",
               *dump_capture_args(SGLANG_VERSION, meta["layer_ids"])]  # fmt: skip
    srv = L.Server("demo_capture", model, 30020, extra=capture, cuda_graph=True)
    try:
        if a.device == "cpu":  # the smoke run's stand-in serves; it runs no hook (tests/ansible cover that)
            raise RuntimeError("smoke run: no capture server on the CPU")
        srv.start(timeout=240, env=env)
        done("server_ready_s", srv.ready_s)
        r = L.cli("sglang-extract", "--data", str(sg), "--model", str(model), "--url", srv.url, "--concurrency",
                  "32", "--sglang-version", SGLANG_VERSION, "--no-progress", "--server-pid", str(srv.proc.pid),
                  "--health-timeout", "120", name="sglang_extract", timeout=max(60, L.left() - 120))  # fmt: skip
        done("extract_sglang", r)
        # the same rows again as plain prefills: request ids the hook ignores
        from datasets import load_from_disk

        rows = load_from_disk(str(tf)).with_format(None)["input_ids"]
        t = time.time()

        def prefill(i_ids):
            i, ids_ = i_ids
            L.http(srv.url + "/generate", {"input_ids": ids_, "rid": f"plain-{i}-{time.time_ns()}",
                                           "sampling_params": {"max_new_tokens": 1, "temperature": 0}})  # fmt: skip

        with cf.ThreadPoolExecutor(32) as ex:
            list(ex.map(prefill, enumerate(rows)))
        wall = time.time() - t
        toks = sum(len(x) for x in rows)
        cap = r.get("tokens_per_second") or r.get("tok_s")
        done("capture_overhead", {"plain_prefill_tok_s": round(toks / wall, 1), "rows": len(rows),
                                  "tokens": toks, "captured_tok_s": cap,
                                  "ratio": round(cap / (toks / wall), 3) if cap else None})  # fmt: skip
    except Exception as e:  # the restore below must run whatever happened
        done("server_error", f"{type(e).__name__}: {e}")
    finally:
        srv.stop()
        done("patch_restore", L.cli("sglang-patch", "restore", *site, name="patch_restore"))
        done("patch_status_after", L.cli("sglang-patch", "status", *site, name="patch_status1"))
        done("deepseek_v2_exists", target.exists())
    try:
        done("compare", compare(tf, sg))
    except Exception as e:
        done("compare", {"error": f"{type(e).__name__}: {e}"})

    # a demo draft, then the serve + benchmark phases (the roles) against the real server
    run = w / "run"
    done("train", L.cli("train", "--data", str(tf), "--verifier", str(model), "--run-dir", str(run), "--device",
                        "gpu" if a.device == "cuda" else "cpu", "--epochs", "2", "--total-seq-len", "2048",
                        "--launcher", "setsid", "--wait", "--timeout", str(int(max(60, min(300, L.left() - 240)))),
                        "--no-gpu-free-check", "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
                        "--env", json.dumps({"TORCH_COMPILE_DISABLE": "1"}), name="train"))  # fmt: skip
    if res["train"].get("status") not in ("finished", "done"):  # what it saved so far is served
        done("train_stop", L.cli("train-stop", "--run-dir", str(run), "--grace", "20", name="train_stop"))
    if L.left() < 150:
        done("playbook", {"skipped": f"{L.left():.0f} s left"})
        return 0
    ev = {
        "eagle3ops_checkpoint": str(run), "eagle3ops_model_path": str(model),
        "serve_port": 30050, "serve_baseline_port": 30051,
        "serve_sglang_site_packages": a.site, "eagle3ops_sglang_version": SGLANG_VERSION,
        # the demo target is random: its draft accepts little (offline ~1.1), so the floor is set just above 1.00
        # (what a draft that is never accepted gives); the smol lane's guard uses the default floor
        "serve_min_accept_length": 1.01,
        "serve_probe_prompts": str(demo / "heldout.jsonl"),
        "benchmark_target_path": str(model), "benchmark_prompts": str(demo / "heldout.jsonl"),
        "benchmark_limit": 8, "benchmark_prompt_sets": {"heldout": str(demo / "heldout.jsonl")},
        "benchmark_training_data": [str(demo / "conversations.jsonl")],
    }  # fmt: skip
    if os.environ.get("LIVE_SERVER_CMD"):
        ev["serve_server_command"] = L.SERVER_CMD
    done("playbook", L.run_playbooks("demo", ev, timeout=max(60, L.left() - 20)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
