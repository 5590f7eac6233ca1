"""Proof of value (issue #31) on the lent H200: our draft against SpecForge's on the same hidden states, served by
SGLang 0.5.17 against SmolLM2-135M-Instruct and against its zero-widened 8B-class twin.

One extraction, two trainers, one server per (target, draft, steps/topk/draft tokens):

1. SmolLM2 (the registry GGUF, converted once); the 15,600 conversations SmolLM2 already regenerated through our
   regenerate phase (``../shared/data``: nothing is regenerated here); ``prepare --rows conversation`` and one
   ``extract`` (transformers backend, CUDA) into a store in /dev/shm.
2. Meanwhile, on the CPU, ``bench/widen_target.py`` writes the widened target (every MLP zero-widened to
   ``--wide-intermediate``: 8.02 B parameters at 153,600, the same outputs).
3. The two trainers one after the other, each alone on the GPU, each with the same wall-clock budget
   ``--train-s``: SpecForge first (``eagle3ops train --trainer specforge``: its own recipe, its cosine schedule
   sized to end inside the budget from the step rate ``--sf-rate`` that ``--probe`` measured on this box), then
   ours (``--trainer speculators``, ``--epochs``, stopped at the budget if it overruns). While ours trains, the
   servers of SpecForge's draft and the two baselines start (their load perturbs our trainer, not SpecForge's).
4. ``eagle3ops convert`` of each run (SpecForge's through its own exporter), then every EAGLE3 server.
5. Measured one server at a time: the widened target's greedy answers against SmolLM2's, token by token; on
   SmolLM2, both drafts' acceptance on MT-bench (80 first turns) at batch 1 and concurrency 8 and on held-out
   ShareGPT; on the widened target, both drafts at every steps/topk/draft setting in interleaved batch-1 rounds
   (with, without, with, without, ...), the speed-up from the medians, and the time of one EAGLE3 cycle split
   from the measured rates (draft step, verify, the rest).

``--probe`` is the first device call (before the SGLang wheels travel): SpecForge trained through our train phase
on synthetic states of SmolLM2's shape (a random target of its config), its step rate and start-up time measured,
its draft exported through ``eagle3ops convert``. A SpecForge that fails there fails before the long run.

Results: ``WORK/res/<stage>.json`` and ``WORK/summary.json``; logs under ``WORK/logs`` (bench/sglang_live.py's
helpers: servers, stages, budget). ``--smoke``: a CPU dry run of the control flow with the stand-in server
(tests/fixtures/sglang_standin_server.py) and tiny sizes; SpecForge cannot train on a CPU, so the smoke run serves
a copy of our draft in SpecForge's place (said in its results) to drive the same code paths.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import lzma
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_live as L  # the live harness: servers, stages, budget

ROOT = L.ROOT
PY = sys.executable
LAYER_IDS = (2, 15, 27)
# SmolLM2-135M-Instruct's config (the registry GGUF's metadata): the probe's random target has its shapes
SMOL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "hidden_act": "silu",
}  # fmt: skip


def now() -> float:
    return round(time.time() - L.T0, 1)


def disk(label: str, paths: list[Path]) -> dict:
    """What the run's directories hold now and what their filesystems have left (the peak is the max of these)."""
    out = {"label": label, "at_s": now(), "du_bytes": {}, "df": {}}
    for p in paths:
        if p.exists():
            r = subprocess.run(["du", "-sb", str(p)], capture_output=True, text=True, check=False)
            out["du_bytes"][str(p)] = int((r.stdout.split() or ["0"])[0])
            st = os.statvfs(p)
            out["df"][str(p)] = {"free_gb": round(st.f_bavail * st.f_frsize / 1e9, 1)}
    return out


def train(a, key: str, data: Path, model: Path, run_dir: Path, extra: list[str], budget: float) -> dict:
    """One trainer through the train phase's CLI, waited for up to ``budget`` s, stopped if it overruns; its wall
    time from launch to exit, its status and its metrics."""
    t = time.time()
    r = L.cli("train", "--data", str(data), "--verifier", str(model), "--run-dir", str(run_dir),
              "--device", "gpu" if a.device == "cuda" else "cpu", "--launcher", "setsid", "--wait",
              "--timeout", str(int(budget)), "--no-gpu-free-check", "--draft-vocab-size", str(a.draft_vocab),
              *extra, name=f"train_{key}", timeout=budget + 300)  # fmt: skip
    if r.get("status") not in ("finished", "done"):
        L.cli("train-stop", "--run-dir", str(run_dir), "--grace", "45", name=f"train_stop_{key}")
    st = L.cli("train-status", "--run-dir", str(run_dir), name=f"train_status_{key}")
    r["wall_s"] = round(time.time() - t, 1)
    r["budget_s"] = budget
    r["train_status"] = {k: st.get(k) for k in ("status", "exit", "metrics") if k in st}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        (L.W / "logs" / f"train_metrics_{key}.jsonl").write_bytes(metrics.read_bytes())
        r["rate"] = step_rate(metrics)
    return r


def step_rate(metrics: Path) -> dict | None:
    """Steps per second between the first and the last timed metric record (the start-up excluded), and the
    start-up: from the launch to where the first step would have begun at that rate."""
    pts, launched = [], None
    for line in metrics.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("kind") == "attempt":
            launched = rec.get("time")
        elif rec.get("kind") == "train" and rec.get("time") and rec.get("step") is not None:
            pts.append((int(rec["step"]), float(rec["time"])))
    if len(pts) < 2 or pts[-1][1] <= pts[0][1]:
        return None
    (s0, t0), (s1, t1) = pts[0], pts[-1]
    rate = (s1 - s0) / (t1 - t0)
    out = {"steps_per_s": round(rate, 3), "steps": s1}
    if launched:
        out["startup_s"] = round(t0 - launched - s0 / rate, 1)
    return out


# ---------------------------------------------------------------------------------------------- --probe


def probe(a) -> None:
    """SpecForge through our train phase on synthetic states of SmolLM2's shape: it runs on this box, its rate and
    start-up, its draft through convert."""
    from eagle3ops.train.fixtures import make_data_dir

    d = Path(a.smol_dir) / "probe"
    tgt = d / "target"

    @L.stage("probe_target", 10)
    def target():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = dict(SMOL_CONFIG)
        cfg.pop("architectures")
        cfg.pop("model_type")
        LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.bfloat16).save_pretrained(tgt)
        rows = make_data_dir(d / "data", tgt, num_samples=a.probe_rows, min_len=a.probe_min_len,
                             max_len=a.probe_max_len, layer_ids=LAYER_IDS, real=False)  # fmt: skip
        return {"target": str(tgt), "data": str(rows), "rows": a.probe_rows}

    target()
    extra = [
        "--trainer",
        "specforge",
        "--epochs",
        "50",
        "--max-steps",
        str(a.probe_steps),
        "--extra",
        sf_extra(a),
    ]

    @L.stage("probe_train_specforge", 60)
    def tr():
        return train(a, "probe_specforge", d / "data", tgt, d / "run-sf", extra, a.probe_budget_s)

    tr()

    @L.stage("probe_convert_specforge", 20)
    def conv():
        r = L.cli("convert", "--checkpoint", str(d / "run-sf"), "--out", str(d / "draft-sf"), "--sglang-version",
                  "0.5.17", name="probe_convert")  # fmt: skip
        cfg = d / "draft-sf" / "config.json"
        r["draft_config"] = json.loads(cfg.read_text()) if cfg.exists() else None
        return r

    conv()
    if a.probe_ours_steps:

        @L.stage("probe_train_ours", 60)
        def ours():
            return train(a, "probe_ours", d / "data", tgt, d / "run-ours",
                         ["--max-steps", str(a.probe_ours_steps), *ours_flags(a)], a.probe_budget_s)  # fmt: skip

        ours()


def sf_extra(a) -> str:
    # save_interval: SpecForge saves nothing when it is stopped (run 1 of 2026-12-04 lost its whole run to a budget
    # stop at 82 % of its steps); a save every 200 steps leaves the newest one to serve
    return json.dumps({"training": {"batch_size": a.sf_batch, "save_interval": 200},
                       "data": {"dataloader_num_workers": 8}})  # fmt: skip


def ours_flags(a) -> list[str]:
    return ["--total-seq-len", str(a.total_seq_len), "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
            "--env", json.dumps({"TORCH_COMPILE_DISABLE": "1"})]  # fmt: skip


# ---------------------------------------------------------------------------------------------- the run


def first_turns(path: Path, limit: int) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            turns = r.get("turns") or [
                t["value"] for t in r.get("conversations", []) if t.get("from") == "human"
            ]
            out.append(turns[0])
    return out[:limit]


def identical(a, base: L.Server, wide: L.Server, qs: list[str], render) -> dict:
    """The widened target's greedy answers against SmolLM2's, token by token (output ids when the server returns
    them, else the text)."""
    from eagle3ops.benchmark.loadgen import generate

    same, first_diff, compared = 0, [], 0
    for i, q in enumerate(qs):
        s = {"temperature": 0, "max_new_tokens": a.identity_tokens}
        x, y = (
            generate(base.url, render([{"role": "user", "content": q}]), s),
            generate(wide.url, render([{"role": "user", "content": q}]), s),
        )
        xs, ys = x.get("output_ids") or x.get("text"), y.get("output_ids") or y.get("text")
        compared += len(xs)
        if xs == ys:
            same += 1
        else:
            k = next(
                (j for j, (u, v) in enumerate(zip(xs, ys, strict=False)) if u != v), min(len(xs), len(ys))
            )
            first_diff.append({"prompt": i, "at": k})
    return {"prompts": len(qs), "identical": same, "compared_units": compared,
            "unit": "output_ids" if isinstance(xs, list) else "text", "differ": first_diff}  # fmt: skip


def rounds(a, eagle: L.Server, base: L.Server, qs: list[str], render) -> dict:
    """Interleaved batch-1 rounds: with, without, with, without, ... (``a.rounds`` each); the speed-up from the
    medians, the spread of the per-round ratios."""
    w, wo, acc = [], [], []
    for _ in range(a.rounds):
        r1 = L.measure(eagle.url, qs, a.tokens, 1, render)
        r0 = L.measure(base.url, qs, a.tokens, 1, render)
        w.append(r1["output_tok_s"])
        wo.append(r0["output_tok_s"])
        acc.append(r1["acceptance_length"])
    ratios = [x / y for x, y in zip(w, wo, strict=True)]
    return {"prompts": len(qs), "tokens": a.tokens, "with_tok_s": w, "without_tok_s": wo, "acceptance": acc,
            "with_median": statistics.median(w), "without_median": statistics.median(wo),
            "speedup": round(statistics.median(w) / statistics.median(wo), 4),
            "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4)}  # fmt: skip


def cycle_split(res: dict) -> dict:
    """One EAGLE3 cycle's time, split from the measured batch-1 rates (derived, not profiled): cycle = accepted
    tokens per cycle / tok/s; verify ~ the plain decode step (a 4-6 token verify of a memory-bound 8B model costs
    about one decode step); one draft step ~ (cycle at 5 steps - cycle at 3 steps) / 2 (same verify); the rest
    (draft extend, sampling, scheduling) = cycle - verify - steps x draft step."""
    out = {}
    for draft in ("ours", "specforge"):
        r3, r5 = res.get(f"wide_{draft}_3-1-4"), res.get(f"wide_{draft}_5-1-6")
        if not (r3 and r5) or "speedup" not in r3 or "speedup" not in r5:
            continue
        c3 = 1000 * statistics.median(r3["acceptance"]) / r3["with_median"]
        c5 = 1000 * statistics.median(r5["acceptance"]) / r5["with_median"]
        verify = 1000 / statistics.median(r3["without_tok_s"] + r5["without_tok_s"])
        step = max(0.0, (c5 - c3) / 2)
        out[draft] = {"cycle_ms_3-1-4": round(c3, 3), "cycle_ms_5-1-6": round(c5, 3), "verify_ms": round(verify, 3),
                      "draft_step_ms": round(step, 3), "rest_ms_3-1-4": round(c3 - verify - 3 * step, 3),
                      "derived": True}  # fmt: skip
    return out


def run(a) -> None:
    d = Path(a.smol_dir)
    d.mkdir(parents=True, exist_ok=True)
    m = d / "models" / "smollm2"
    wide = Path(a.wide_dir)
    assets = Path(a.assets)

    @L.stage("convert_target", 60)
    def convert():
        return L.cli("assets", "convert", "--gguf", str(assets / "SmolLM2-135M-Instruct.Q4_1.gguf"), "--out", str(m),
                     name="assets_convert", timeout=900)  # fmt: skip

    convert()
    if not (m / "config.json").exists():
        return
    from eagle3ops.benchmark.loadgen import chat_template_render

    render = chat_template_render(str(m))
    with lzma.open(assets / a.conversations, "rt", encoding="utf-8") as f:
        conv = [x for x in f if x.strip()][: a.n_conv]
    regen = d / "regenerated.jsonl"
    regen.write_text("".join(conv))
    qs = first_turns(assets / "mtbench_question.jsonl", a.mt_prompts)
    heldout = first_turns(assets / "heldout.jsonl", a.heldout_prompts)
    seen = {
        L.norm(t["value"]) for r in map(json.loads, conv) for t in r["conversations"] if t["from"] == "human"
    }
    L.save("data", {"conversations": len(conv), "mtbench": len(qs), "heldout": len(heldout),
                    "mtbench_in_training": sum(L.norm(q) in seen for q in qs),
                    "heldout_in_training": sum(L.norm(q) in seen for q in heldout)})  # fmt: skip
    data = d / "data"
    paths = [d, wide.parent, Path("/tmp")]

    def widen():
        @L.stage("widen_target", 30)
        def w():
            r = subprocess.run([PY, str(ROOT / "bench" / "widen_target.py"), str(m), str(wide), "--intermediate",
                                str(a.wide_intermediate)], capture_output=True, text=True, check=False)  # fmt: skip
            if r.returncode:
                raise RuntimeError(r.stderr[-1500:])
            return json.loads(r.stdout.strip().splitlines()[-1])

        return w()

    def prep_extract():
        @L.stage("prepare", 40)
        def prep():
            return L.cli("prepare", "--model", str(m), "--input", str(regen), "--out", str(data), "--max-length",
                         str(a.max_length), "--on-error", "skip", "--rows", "conversation", "--workers",
                         str(a.prepare_workers), name="prepare")  # fmt: skip

        prep()

        @L.stage("extract", 60)
        def ext():
            return L.cli("extract", "--data", str(data), "--model", str(m), "--device", a.device, "--workers", "1",
                         "--no-progress", name="extract")  # fmt: skip

        ext()

    t_data = time.time()
    with cf.ThreadPoolExecutor(2) as ex:  # --wide-late: after the training, in the store's place
        list(ex.map(lambda f: f(), [prep_extract] if a.wide_late else [widen, prep_extract]))
    data_s = round(time.time() - t_data, 1)
    L.save("disk_after_extract", disk("after extract", paths))
    if not (data / "hidden_states").is_dir():
        return

    # ---- the trainers, one after the other, the same budget each
    budget = float(a.train_s)
    steps = a.sf_steps or max(10, int(a.sf_rate * max(30.0, budget - a.sf_startup_s)))
    sf_run, ours_run = d / "run-specforge", d / "run-ours"
    servers: dict[str, L.Server] = {}
    starts: dict[str, object] = {}
    drafts: dict[str, Path] = {}

    @L.stage("train_specforge", 90)
    def train_sf():
        r = train(a, "specforge", data, m, sf_run,
                  ["--trainer", "specforge", "--epochs", "50", "--max-steps", str(steps), "--extra", sf_extra(a)],
                  budget)  # fmt: skip
        r["planned_steps"] = steps
        r["planned_from"] = {"steps_per_s": a.sf_rate, "startup_s": a.sf_startup_s, "budget_s": budget}
        return r

    if not a.smoke:
        train_sf()

    def convert_draft(key: str, run_dir: Path) -> None:
        @L.stage(f"convert_{key}", 20)
        def c():
            from eagle3ops.checkpoints import newest_checkpoint

            ckpt = run_dir
            ended = ((L.SUMMARY.get(f"train_{key}") or {}).get("train_status") or {}).get("status")
            if key == "ours" and ended not in ("finished", "done"):
                ckpt = newest_checkpoint(run_dir) or run_dir
            r = L.cli("convert", "--checkpoint", str(ckpt), "--out", str(d / f"draft-{key}"), "--sglang-version",
                      "0.5.17", name=f"convert_{key}")  # fmt: skip
            r["train_ended"] = ended
            return r

        c()
        if (d / f"draft-{key}" / "config.json").exists():
            drafts[key] = d / f"draft-{key}"

    ports = iter(range(a.port0, a.port0 + 100))  # one port per server, taken when it is launched

    def start(name: str, model: Path, draft: Path | None, spec, mem: float, port: int):
        try:
            servers[name] = L.start_server(name, model, port, draft=draft, spec=spec, graph_bs=16,
                                           mem=mem, max_tokens=a.kv_tokens, timeout=420)  # fmt: skip
            starts[name] = servers[name].ready_s
        except Exception as e:  # recorded; the other servers still run
            starts[name] = f"{type(e).__name__}: {e}"[-600:]

    def start_group(names: list[tuple]) -> list[threading.Thread]:
        ts = []
        for i, args in enumerate(names):
            t = threading.Thread(target=start, args=(*args, next(ports)), name=args[0])
            t.start()
            ts.append(t)
            time.sleep(a.stagger_s if i < len(names) - 1 else 0)
        return ts

    configs = [tuple(int(x) for x in c.split("-")) for c in a.configs.split(",")]
    tag = {c: "-".join(map(str, c)) for c in configs}

    def group(key: str, targets=("smol", "wide")) -> list[tuple]:
        g = [(f"smol_{key}_3-1-4", m, drafts[key], (3, 1, 4), 0.1)] if "smol" in targets else []
        if "wide" in targets and (wide / "config.json").exists():
            g += [(f"wide_{key}_{tag[c]}", wide, drafts[key], c, 0.3) for c in configs]
        return g

    waiting: list[threading.Thread] = []
    if not a.smoke:
        convert_draft("specforge", sf_run)
    base_group = [("smol_base", m, None, (3, 1, 4), 0.1)]
    if (wide / "config.json").exists():
        base_group.append(("wide_base", wide, None, (3, 1, 4), 0.3))
    # while our trainer runs: the baselines and SpecForge's servers start (their load is on our trainer)
    waiting += start_group(base_group + (group("specforge") if "specforge" in drafts else []))

    @L.stage("train_ours", 90)
    def train_ours():
        return train(a, "ours", data, m, ours_run, ["--epochs", str(a.epochs), *ours_flags(a)], budget)

    train_ours()
    L.save("disk_after_training", disk("after training", [*paths, sf_run, ours_run]))
    convert_draft("ours", ours_run)
    if a.smoke and "ours" in drafts:  # no SpecForge on a CPU: a copy of ours drives the same code paths
        shutil.copytree(drafts["ours"], d / "draft-specforge-standin", dirs_exist_ok=True)
        drafts["specforge"] = d / "draft-specforge-standin"
        L.save(
            "smoke_note", {"specforge": "not trained (CPU); a copy of our draft stands in for the code paths"}
        )
        waiting += start_group(group("specforge"))
    if "ours" in drafts:
        waiting += start_group(group("ours"))
    if a.wide_late:  # the store is no longer read: the widened target takes its place
        shutil.rmtree(data / "hidden_states", ignore_errors=True)
        L.save("disk_store_dropped", disk("store dropped for the widened target", paths))
        widen()
        if (wide / "config.json").exists():
            waiting += start_group([("wide_base", wide, None, (3, 1, 4), 0.3)]
                                   + [x for k in drafts for x in group(k, ("wide",))])  # fmt: skip
    for t in waiting:
        t.join()
    L.save("servers", {"ready_s": starts, "data_s": data_s})
    measure_all(a, servers, drafts, configs, tag, qs, heldout, render)
    for s in servers.values():
        s.stop()
    L.save("time_to_served", {k: {"data_s": data_s, "train_s": (L.SUMMARY.get(f"train_{k}") or {}).get("wall_s"),
                                  "convert_s": (L.SUMMARY.get(f"convert_{k}") or {}).get("wall_s"),
                                  "server_ready_s": starts.get(f"smol_{k}_3-1-4")}
                              for k in drafts})  # fmt: skip


def measure_all(a, servers, drafts, configs, tag, qs, heldout, render) -> None:
    res: dict = {}
    base, wide_base = servers.get("smol_base"), servers.get("wide_base")
    if base and wide_base:

        @L.stage("identity", 20)
        def ident():
            return identical(a, base, wide_base, qs[: a.identity_prompts], render)

        ident()
    for key in drafts:
        s = servers.get(f"smol_{key}_3-1-4")
        if s:

            @L.stage(f"smol_{key}_3-1-4", 60)
            def acc(s=s):
                return {"batch1": L.measure(s.url, qs, a.tokens, 1, render),
                        "conc8": L.measure(s.url, qs, a.tokens, 8, render),
                        "heldout_conc8": L.measure(s.url, heldout, a.tokens, 8, render) if heldout else None}  # fmt: skip

            acc()
    sub = qs[: a.speed_prompts]
    for c in configs:
        for key in drafts:
            s = servers.get(f"wide_{key}_{tag[c]}")
            if not (s and wide_base):
                continue

            @L.stage(f"wide_{key}_{tag[c]}", 60)
            def speed(s=s):
                r = rounds(a, s, wide_base, sub, render)
                r["all_mtbench_conc8"] = L.measure(s.url, qs, a.tokens, 8, render)
                return r

            res[f"wide_{key}_{tag[c]}"] = speed()
    L.save("cycle_split", cycle_split(res))
    L.save("verdict", verdict(a))


def verdict(a) -> dict:
    """The issue's three goals, read from the results (reached or not, with the numbers)."""
    s = L.SUMMARY
    acc = {k: ((s.get(f"smol_{k}_3-1-4") or {}).get("batch1") or {}).get("acceptance_length")
           for k in ("ours", "specforge")}  # fmt: skip
    speed = {
        k: v.get("speedup")
        for k, v in s.items()
        if k.startswith("wide_") and isinstance(v, dict) and "speedup" in v
    }
    best = max(speed.items(), key=lambda kv: kv[1] or 0) if speed else (None, None)
    ratio = acc["ours"] / acc["specforge"] if acc["ours"] and acc["specforge"] and not a.smoke else None
    top = max((x for x in acc.values() if x), default=None)
    return {"acceptance_3-1-4_batch1": acc, "ours_over_specforge": round(ratio, 4) if ratio else None,
            "goal_ratio_ge_1": ratio >= 1.0 if ratio else None, "best_speedup": {"server": best[0], "x": best[1]},
            "goal_speedup_ge_1.8": (best[1] or 0) >= 1.8 if best[1] else None,
            "goal_acceptance_ge_2.5": (top or 0) >= 2.5 if top else None, "smoke": a.smoke}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/pov")
    ap.add_argument("--assets", default="/tmp/assets")
    ap.add_argument(
        "--smol-dir", default="/dev/shm/pov", help="data, store, runs, drafts (the store: ~50 GB)"
    )
    ap.add_argument("--wide-dir", default="/tmp/pov-wide", help="the widened target (16 GB at 153,600)")
    ap.add_argument("--budget-s", type=float, default=1380)
    ap.add_argument("--conversations", default="smollm2-regenerated-sharegpt-15600.jsonl.xz")
    ap.add_argument("--n-conv", type=int, default=15600)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--prepare-workers", type=int, default=8)
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--train-s", type=float, default=330, help="each trainer's wall-clock budget")
    ap.add_argument("--epochs", type=int, default=2, help="our trainer's epochs")
    ap.add_argument("--total-seq-len", type=int, default=8192)
    # SpecForge at batch 8 on this box (2026-12-04): 7.67 steps/s on the probe's uniform 200-1400-token rows, 5.67 on
    # the 15,596 real conversation rows (long-tailed: a padded batch is as long as its longest row); 82-86 s start-up
    ap.add_argument(
        "--sf-rate", type=float, default=5.4, help="SpecForge steps/s (measured on the real rows)"
    )
    ap.add_argument("--sf-startup-s", type=float, default=86, help="SpecForge's start-up (measured)")
    ap.add_argument(
        "--sf-steps", type=int, default=0, help="SpecForge's steps (default: from rate and budget)"
    )
    ap.add_argument("--sf-batch", type=int, default=8, help="SpecForge's batch size (its recipe's global 8)")
    ap.add_argument("--wide-intermediate", type=int, default=153600)
    ap.add_argument(
        "--wide-late",
        action="store_true",
        help="widen after the training, in the store's place (where disk and /dev/shm cannot hold both)",
    )
    ap.add_argument("--configs", default="3-1-4,5-1-6")
    ap.add_argument("--mt-prompts", type=int, default=80)
    ap.add_argument("--heldout-prompts", type=int, default=64)
    ap.add_argument("--speed-prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--identity-prompts", type=int, default=16)
    ap.add_argument("--identity-tokens", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=65536)
    ap.add_argument("--port0", type=int, default=30100)
    ap.add_argument("--stagger-s", type=float, default=8)
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--probe", action="store_true", help="the first device call: SpecForge on synthetic states"
    )
    ap.add_argument("--probe-rows", type=int, default=480)
    ap.add_argument("--probe-min-len", type=int, default=200)
    ap.add_argument("--probe-max-len", type=int, default=1400)
    ap.add_argument("--probe-steps", type=int, default=200)
    ap.add_argument("--probe-ours-steps", type=int, default=0, help="also our trainer on the same states")
    ap.add_argument("--probe-budget-s", type=float, default=300)
    ap.add_argument("--smoke", action="store_true", help="CPU dry run with the stand-in server, tiny sizes")
    a = ap.parse_args()
    L.W = Path(a.work)
    L.W.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        L.SERVER_CMD = [PY, str(ROOT / "tests" / "fixtures" / "sglang_standin_server.py")]
        os.environ["LIVE_SERVER_CMD"] = shlex.join(L.SERVER_CMD)
        for k, v in {"device": "cpu", "n_conv": 12, "max_length": 256, "epochs": 1, "total_seq_len": 512,
                     "train_s": 400, "draft_vocab": 512, "mt_prompts": 4, "heldout_prompts": 3, "tokens": 16,
                     "speed_prompts": 2, "identity_prompts": 2, "identity_tokens": 8, "wide_intermediate": 3072,
                     "prepare_workers": 2, "stagger_s": 0.5, "kv_tokens": 4096}.items():  # fmt: skip
            setattr(a, k, v)
    L.DEADLINE[0] = L.T0 + a.budget_s
    os.environ["PYTHONPATH"] = f"{ROOT / 'python'}:{os.environ.get('PYTHONPATH', '')}"
    L.log(f"proof of value: {' '.join(sys.argv[1:])}")
    try:
        probe(a) if a.probe else run(a)
    except Exception as e:  # the results so far are kept; the error says where it stopped
        L.log(f"FAILED: {type(e).__name__}: {e}")
        L.save("harness", {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})
    L.save("run", {"seconds": now(), "args": vars(a)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
