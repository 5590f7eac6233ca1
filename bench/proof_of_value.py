"""Proof of value (issue #31) on the lent H200: our draft against SpecForge's on the same hidden states, served by
SGLang 0.5.17 against SmolLM2-135M-Instruct and against its zero-widened 8B-class twin.

One extraction, two trainers, one server per (target, draft, steps/topk/draft tokens):

1. SmolLM2 (the registry GGUF, converted once); the 15,600 conversations SmolLM2 already regenerated through our
   regenerate phase (``../shared/data``: nothing is regenerated here); ``prepare --rows conversation`` and one
   ``extract`` (transformers backend, CUDA) into a store in /dev/shm.
2. Meanwhile, on the CPU, ``bench/widen_target.py`` writes the widened target (every MLP zero-widened to
   ``--wide-intermediate``: 8.02 B parameters at 153,600, the same outputs).
3. The two trainers, each with the same wall-clock budget ``--train-s``: with ``--side-by-side`` both at once on
   the one GPU (the baselines' servers starting beside them), else one after the other, each alone: SpecForge
   first (``eagle3ops train --trainer specforge``: its own recipe, its cosine schedule sized to end inside the
   budget from the step rate ``--sf-rate``, measured on this box; it saves every ``--sf-save-interval`` steps), then
   ours (``--trainer speculators``, ``--epochs``, stopped at the budget if it overruns). While ours trains, the
   servers of SpecForge's draft and the two baselines start (their load perturbs our trainer, not SpecForge's).
4. ``eagle3ops convert`` of each run (SpecForge's through its own exporter), then every EAGLE3 server.
5. Measured one server at a time: the widened target's greedy answers against SmolLM2's, token by token; on
   SmolLM2, both drafts' acceptance on MT-bench (80 first turns) at batch 1 and concurrency 8 and on held-out
   ShareGPT; on the widened target, each draft and setting: bench/pov_measure.py (speed per MT-bench category,
   batch curve, lossless check, the cycle split).

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
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pov_measure as M  # the measurements
import sglang_live as L  # the live harness: servers, stages, budget
from pov_smoke import smoke, stand_in_specforge  # --smoke

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
    r = L.cli(*train_argv(a, data, model, run_dir, extra, budget), name=f"train_{key}", timeout=budget + 300)
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


def train_argv(a, data: Path, model: Path, run_dir: Path, extra: list[str], budget: float) -> list[str]:
    """``eagle3ops train`` and its flags (``--json`` aside) for one trainer: the run's common ones, then ``extra``."""
    return ["train", "--data", str(data), "--verifier", str(model), "--run-dir", str(run_dir),
            "--device", "gpu" if a.device == "cuda" else "cpu", "--launcher", "setsid", "--wait",
            "--timeout", str(int(budget)), "--no-gpu-free-check", "--draft-vocab-size", str(a.draft_vocab),
            *extra]  # fmt: skip


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
        r = L.cli("serve-convert", "--checkpoint", str(d / "run-sf"), "--out", str(d / "draft-sf"), "--sglang-version",
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
    return json.dumps({"training": {"batch_size": a.sf_batch, "save_interval": a.sf_save_interval,
                                    "max_checkpoints": a.sf_max_checkpoints},
                       "data": {"dataloader_num_workers": 8}})  # fmt: skip


def sf_recipe(a) -> list[str]:
    """Departures from SpecForge's own recipe, when asked: its fc_norm (an RMSNorm on each aux state before fc) and
    a learning rate of its own (its recipe: 1e-4)."""
    return [*(["--specforge-fc-norm"] if a.sf_fc_norm else []), *(["--lr", str(a.sf_lr)] if a.sf_lr else [])]


# our steps/s on the H200, the slowest measured (docs/performance.md): alone (run 5; run 4: 8.25), beside SpecForge
OURS_RATE_ALONE, OURS_RATE_BESIDE = 7.48, 5.2


def ours_plan(a, budget: float) -> dict:
    """Whether our trainer's epochs fit its budget, from measured figures (``--ours-rate``, ``--ours-startup-s``,
    ``--ours-steps-per-epoch``); side by side its rate defaults to the one measured side by side."""
    rate = a.ours_rate or (OURS_RATE_BESIDE if a.side_by_side else OURS_RATE_ALONE)
    need = a.ours_startup_s + a.epochs * a.ours_steps_per_epoch / rate
    return {"epochs": a.epochs, "steps_per_epoch": a.ours_steps_per_epoch, "steps_per_s": rate,
            "startup_s": a.ours_startup_s, "seconds_needed": round(need, 1), "budget_s": budget,
            "fits": need <= budget}  # fmt: skip


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


class Run:
    """One proof-of-value run: its paths, the drafts converted so far, the servers started (one port each)."""

    def __init__(self, a):
        self.a = a
        self.d = Path(a.smol_dir)
        self.d.mkdir(parents=True, exist_ok=True)
        self.m = self.d / "models" / "smollm2"
        self.wide = Path(a.wide_dir)
        self.assets = Path(a.assets)
        self.data = self.d / "data"
        self.paths = [self.d, self.wide.parent, Path("/tmp")]
        self.drafts: dict[str, Path] = {}
        self.servers: dict[str, L.Server] = {}
        self.starts: dict[str, object] = {}
        self.ports = iter(range(a.port0, a.port0 + 100))  # one port per server, taken when it is launched
        self.configs = [tuple(int(x) for x in c.split("-")) for c in a.configs.split(",")]
        self.tag = {c: "-".join(map(str, c)) for c in self.configs}
        self.data_s = None

    # ---- data: the target, the conversations, prepare + extract (the widening beside them)
    def inputs(self) -> bool:
        a, m = self.a, self.m

        @L.stage("convert_target", 60)
        def convert():
            return L.cli("assets", "convert", "--source", str(self.assets / "SmolLM2-135M-Instruct.Q4_1.gguf"), "--out",
                         str(m), name="assets_convert", timeout=900)  # fmt: skip

        convert()
        if not (m / "config.json").exists():
            return False
        from eagle3ops.benchmark.loadgen import chat_template_render

        self.render = chat_template_render(str(m))
        with lzma.open(self.assets / a.conversations, "rt", encoding="utf-8") as f:
            conv = [x for x in f if x.strip()][: a.n_conv]
        self.regen = self.d / "regenerated.jsonl"
        self.regen.write_text("".join(conv))
        self.qs = first_turns(self.assets / "mtbench_question.jsonl", a.mt_prompts)
        self.heldout = first_turns(self.assets / "heldout.jsonl", a.heldout_prompts)
        seen = {
            L.norm(t["value"])
            for r in map(json.loads, conv)
            for t in r["conversations"]
            if t["from"] == "human"
        }
        L.save("data", {"conversations": len(conv), "mtbench": len(self.qs), "heldout": len(self.heldout),
                        "mtbench_in_training": sum(L.norm(q) in seen for q in self.qs),
                        "heldout_in_training": sum(L.norm(q) in seen for q in self.heldout)})  # fmt: skip
        t = time.time()
        with cf.ThreadPoolExecutor(2) as ex:  # --wide-late: after the training, in the store's place
            list(
                ex.map(lambda f: f(), [self.prep_extract] if a.wide_late else [self.widen, self.prep_extract])
            )
        self.data_s = round(time.time() - t, 1)
        L.save("disk_after_extract", disk("after extract", self.paths))
        return (self.data / "hidden_states").is_dir()

    def widen(self):
        @L.stage("widen_target", 30)
        def w():
            r = subprocess.run([PY, str(ROOT / "bench" / "widen_target.py"), str(self.m), str(self.wide),
                                "--intermediate", str(self.a.wide_intermediate)], capture_output=True, text=True,
                               check=False)  # fmt: skip
            if r.returncode:
                raise RuntimeError(r.stderr[-1500:])
            return json.loads(r.stdout.strip().splitlines()[-1])

        return w()

    def prep_extract(self):
        a, m, data = self.a, self.m, self.data

        @L.stage("prepare", 40)
        def prep():
            return L.cli("prepare", "--model", str(m), "--input", str(self.regen), "--out", str(data),
                         "--max-length", str(a.max_length), "--on-error", "skip", "--rows", "conversation",
                         "--workers", str(a.prepare_workers), name="prepare")  # fmt: skip

        prep()

        @L.stage("extract", 60)
        def ext():
            return L.cli("extract", "--data", str(data), "--model", str(m), "--device", a.device, "--workers", "1",
                         "--no-progress", name="extract")  # fmt: skip

        ext()

    # ---- drafts and servers
    def convert_draft(self, key: str, run_dir: Path) -> None:
        @L.stage(f"convert_{key}", 20)
        def c():
            from eagle3ops.checkpoints import newest_checkpoint

            ckpt = run_dir
            ended = ((L.SUMMARY.get(f"train_{key}") or {}).get("train_status") or {}).get("status")
            if key.startswith("ours") and ended not in ("finished", "done"):  # (pov_equal: ours_ttt3_...)
                ckpt = newest_checkpoint(run_dir) or run_dir
            r = L.cli("serve-convert", "--checkpoint", str(ckpt), "--out", str(self.d / f"draft-{key}"), "--sglang-version",
                      "0.5.17", name=f"convert_{key}")  # fmt: skip
            r["train_ended"] = ended
            return r

        c()
        if (self.d / f"draft-{key}" / "config.json").exists():
            self.drafts[key] = self.d / f"draft-{key}"

    def _start(self, name: str, model: Path, draft: Path | None, spec, mem: float, port: int):
        # every server of the widened target (with and without a draft) prefills in the same chunks
        extra = ("--chunked-prefill-size", str(self.a.wide_prefill)) if model == self.wide else ()
        # every server alike, with and without a draft: the rounds repeat their prompts, and a radix-cache hit
        # lowered the draft's acceptance in every run so far (run 3: 2.47 against 2.82 uncached, ours at 5/1/6)
        extra += ("--disable-radix-cache",) if self.a.no_radix_cache else ()
        try:
            self.servers[name] = L.start_server(name, model, port, draft=draft, spec=spec, graph_bs=16, mem=mem,
                                                max_tokens=self.a.kv_tokens, timeout=420, extra=extra)  # fmt: skip
            self.starts[name] = self.servers[name].ready_s
        except Exception as e:  # recorded; the other servers still run
            self.starts[name] = f"{type(e).__name__}: {e}"[-600:]

    def start_group(self, names: list[tuple]) -> list[threading.Thread]:
        """Start each server in a thread of its own, ``stagger_s`` apart. 0.5.17 sizes a server from the memory free
        when it starts; a server loads its weights ~45 s after its launch and for ~3 s, so servers launched 8 s
        apart do not load at once. (Run 2 waited for each server's KV pools before the next launch: ~50 s a server,
        5 min for six.)"""
        ts = []
        for i, args in enumerate(names):
            t = threading.Thread(target=self._start, args=(*args, next(self.ports)), name=args[0])
            t.start()
            ts.append(t)
            time.sleep(self.a.stagger_s if i < len(names) - 1 else 0)
        return ts

    def group(self, key: str, targets=("smol", "wide")) -> list[tuple]:
        """A draft's servers: SmolLM2 at 3/1/4, the widened target at every setting."""
        a = self.a
        g = (
            [(f"smol_{key}_3-1-4", self.m, self.drafts[key], (3, 1, 4), a.mem_smol)]
            if "smol" in targets
            else []
        )
        if "wide" in targets and (self.wide / "config.json").exists():
            g += [
                (f"wide_{key}_{self.tag[c]}", self.wide, self.drafts[key], c, a.mem_wide)
                for c in self.configs
            ]
        return g

    def bases(self) -> list[tuple]:
        b = [("smol_base", self.m, None, (3, 1, 4), self.a.mem_smol)]
        if (self.wide / "config.json").exists():
            b.append(("wide_base", self.wide, None, (3, 1, 4), self.a.mem_wide))
        return b


def run(a) -> None:
    """The run (the module docstring): data, the two trainers (one after the other, or side by side with
    ``--side-by-side``), the servers, the measurements."""
    r = Run(a)
    if not r.inputs():
        return
    budget = float(a.train_s)
    steps = a.sf_steps or max(10, int(a.sf_rate * max(30.0, budget - a.sf_startup_s)))
    sf_run, ours_run = r.d / "run-specforge", r.d / "run-ours"

    @L.stage("train_specforge", 90)
    def train_sf():
        res = train(a, "specforge", r.data, r.m, sf_run,
                    ["--trainer", "specforge", "--epochs", "50", "--max-steps", str(steps), "--extra", sf_extra(a),
                     *sf_recipe(a)], budget)  # fmt: skip
        res["planned_steps"] = steps
        res["planned_from"] = {"steps_per_s": a.sf_rate, "startup_s": a.sf_startup_s, "budget_s": budget,
                               "side_by_side": a.side_by_side}  # fmt: skip
        return res

    plan = ours_plan(a, budget)  # (the box's figures: a smoke run's tiny data trains in seconds, unplanned)
    if not a.smoke:
        L.log(
            f"train_ours plan: {plan['epochs']} epochs x ~{plan['steps_per_epoch']} steps at {plan['steps_per_s']} "
            f"steps/s + {plan['startup_s']:.0f} s start-up = ~{plan['seconds_needed']:.0f} s for a {budget:.0f} s "
            f"budget: {'fits' if plan['fits'] else 'does NOT fit (the budget stops it; the interrupted save serves)'}"
        )

    @L.stage("train_ours", 90)
    def train_ours():
        res = train(a, "ours", r.data, r.m, ours_run, ["--epochs", str(a.epochs), *ours_flags(a)], budget)
        res["side_by_side"] = a.side_by_side
        res["planned"] = None if a.smoke else plan
        return res

    if a.side_by_side:  # (a smoke run: SpecForge is refused on the CPU, recorded, and ours goes on)
        # both trainers at once on the one GPU, each with the same wall-clock budget; the baselines' servers start
        # beside them (their start-up load falls on both alike)
        waiting = []
        with cf.ThreadPoolExecutor(2) as ex:
            jobs = [ex.submit(train_sf), ex.submit(train_ours)]
            time.sleep(min(30.0, budget / 10))
            waiting = r.start_group(r.bases())
            for j in jobs:
                j.result()
        L.save("disk_after_training", disk("after training", [*r.paths, sf_run, ours_run]))
        r.convert_draft("specforge", sf_run)
        r.convert_draft("ours", ours_run)
        waiting += r.start_group([x for k in ("specforge", "ours") if k in r.drafts for x in r.group(k)])
    else:
        waiting = run_one_after_the_other(a, r, train_sf, train_ours, sf_run, ours_run)
    for t in waiting:
        t.join()
    L.save("servers", {"ready_s": r.starts, "data_s": r.data_s})
    M.measure_all(a, r.servers, r.drafts, r.configs, r.tag, r.qs, r.heldout, r.render)
    for s in r.servers.values():
        s.stop()
    L.save("time_to_served", {k: {"data_s": r.data_s, "train_s": (L.SUMMARY.get(f"train_{k}") or {}).get("wall_s"),
                                  "convert_s": (L.SUMMARY.get(f"convert_{k}") or {}).get("wall_s"),
                                  "server_ready_s": r.starts.get(f"smol_{k}_3-1-4")}
                              for k in r.drafts})  # fmt: skip


def run_one_after_the_other(a, r: Run, train_sf, train_ours, sf_run: Path, ours_run: Path) -> list:
    """SpecForge first, alone on the GPU; then ours, with the baselines' and SpecForge's servers starting beside it
    (their load is on our trainer); our servers once it is done. The server threads still starting."""
    if not (a.smoke or a.only_ours):
        train_sf()
        r.convert_draft("specforge", sf_run)
    # while our trainer runs: the baselines and SpecForge's servers start (their load is on our trainer)
    waiting = r.start_group(r.bases() + (r.group("specforge") if "specforge" in r.drafts else []))
    train_ours()
    L.save("disk_after_training", disk("after training", [*r.paths, sf_run, ours_run]))
    r.convert_draft("ours", ours_run)
    if a.smoke and not a.only_ours and stand_in_specforge(r, "ours", "specforge"):
        waiting += r.start_group(r.group("specforge"))
    if "ours" in r.drafts:
        waiting += r.start_group(r.group("ours"))
    if a.wide_late:  # the store is no longer read: the widened target takes its place
        shutil.rmtree(r.data / "hidden_states", ignore_errors=True)
        L.save("disk_store_dropped", disk("store dropped for the widened target", r.paths))
        r.widen()
        if (r.wide / "config.json").exists():
            waiting += r.start_group([("wide_base", r.wide, None, (3, 1, 4), a.mem_wide)]
                                     + [x for k in r.drafts for x in r.group(k, ("wide",))])  # fmt: skip
    return waiting


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
    # ours (runs 2-5): ~1,266 steps an epoch of the 15,596 rows at 8,192 tokens a step; 48-69 s to the first step
    ap.add_argument("--ours-rate", type=float, default=0.0, help=f"our steps/s for the plan (measured; default: "
                    f"{OURS_RATE_ALONE} alone, {OURS_RATE_BESIDE} with --side-by-side)")  # fmt: skip
    ap.add_argument("--ours-startup-s", type=float, default=69, help="our start-up for the plan (measured)")
    ap.add_argument("--ours-steps-per-epoch", type=int, default=1266, help="our steps an epoch (measured)")
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
    M.add_args(ap)  # the speed prompts per category, the batch curve, the lossless check
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--identity-prompts", type=int, default=16)
    ap.add_argument("--identity-tokens", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=65536)
    ap.add_argument("--port0", type=int, default=30100)
    ap.add_argument("--stagger-s", type=float, default=8, help="between two server launches")
    ap.add_argument(
        "--wide-prefill", type=int, default=1024,
        help="--chunked-prefill-size of a widened-target server: at 8192 (the default) its warm-up kept ~12.7 GB "
        "more (run 2), and five of them did not fit beside the rest",
    )  # fmt: skip
    ap.add_argument(
        "--no-radix-cache", action="store_true",
        help="--disable-radix-cache on every server (with and without a draft): rounds without prefix-cache hits",
    )  # fmt: skip
    ap.add_argument("--mem-smol", type=float, default=0.3, help="--mem-fraction-static of a SmolLM2 server")
    ap.add_argument(
        "--mem-wide", type=float, default=0.6, help="--mem-fraction-static of a widened-target server"
    )
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="both trainers at once on the one GPU, each with --train-s",
    )
    ap.add_argument(
        "--only-ours", action="store_true",
        help="our trainer alone on the GPU, no SpecForge (the acceptance goal, with the whole budget for ours)",
    )  # fmt: skip
    ap.add_argument("--sf-fc-norm", action="store_true", help="SpecForge's fc_norm on (off in its recipe)")
    ap.add_argument(
        "--sf-lr", type=float, default=0.0, help="SpecForge's learning rate (default: its recipe's)"
    )
    ap.add_argument("--sf-save-interval", type=int, default=250, help="SpecForge saves every N steps")
    ap.add_argument("--sf-max-checkpoints", type=int, default=2, help="SpecForge keeps the newest N saves")
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
    if a.side_by_side and a.only_ours:
        ap.error("--only-ours trains one draft: there is nothing to run beside it (drop --side-by-side)")
    L.W = Path(a.work)
    L.W.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        smoke(a, epochs=1, train_s=400, per_category=1, curve="1,2", curve_rounds=1, lossless_sample=2,
              identity_prompts=2, identity_tokens=8, wide_intermediate=3072)  # fmt: skip
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
