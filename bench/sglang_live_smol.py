"""Lane ``smol`` of bench/sglang_live_lanes.py (issue #18) up to its drafts, and its playbook stage.

SmolLM2 converted and served (the base server); the data (ShareGPT training and held-out conversations, MT-bench
first turns checked absent from training); the regeneration through the base server, timed against a plain load
generator; each training set (regenerated, original, the curve's subsets) prepared, extracted, trained and
converted, plus the guard's two bad copies of the regenerated draft. What is measured on the EAGLE3 servers is in
bench/sglang_live_smol_serve.py; the last stage runs the serve and benchmark playbooks on the regenerated draft.
The run's state (``W``, ``SUMMARY``, ``DEMO_QUIET``, ``SERVER_CMD``) is read through the ``sglang_live`` module.
"""

from __future__ import annotations

import concurrent.futures as cf
import gzip
import json
import shutil
import time
from pathlib import Path

import sglang_live as L
from sglang_live import (
    Server,
    cli,
    demo_capture_over,
    http,
    left,
    norm,
    run_playbooks,
    save,
    sharegpt_rows,
    stage,
    start_server,
    stop_playbook_servers,
)
from sglang_live_smol_serve import smol_serve, target_agreement


def _loadgen(url: str, inp: Path, concurrency: int, max_tokens: int, limit: int) -> dict:
    """The plain load generator: the first-turn requests of the same conversations, nothing written."""
    rows = [json.loads(x) for x in inp.read_text().splitlines() if x.strip()][:limit]
    reqs = [[{"role": "user", "content": r["conversations"][0]["value"]}] for r in rows]

    def one(msgs):
        o = http(url + "/v1/chat/completions", {"model": "m", "messages": msgs, "temperature": 0,
                                                 "max_tokens": max_tokens})  # fmt: skip
        return o.get("usage", {}).get("completion_tokens", 0)

    t = time.time()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        toks = sum(ex.map(one, reqs))
    wall = time.time() - t
    return {
        "requests": len(reqs),
        "output_tokens": toks,
        "wall_s": round(wall, 2),
        "tok_s": round(toks / wall, 1),
    }


def lane_smol(a) -> None:
    m = L.W / "models" / "smollm2"
    d = a.smol_dir
    d.mkdir(parents=True, exist_ok=True)
    gguf = Path(a.assets) / "SmolLM2-135M-Instruct.Q4_1.gguf"

    @stage("smol_convert", 60)
    def convert():
        return cli(
            "assets", "convert", "--source", str(gguf), "--out", str(m), name="assets_convert", timeout=900
        )

    convert()
    if not (m / "config.json").exists():
        return
    from eagle3ops.benchmark.loadgen import chat_template_render

    render = chat_template_render(str(m))

    # data: training conversations, held-out conversations, MT-bench (checked absent from training)
    rows = [json.loads(x) for x in sharegpt_rows(a.assets)]
    mt = [
        json.loads(x)
        for x in (Path(a.assets) / "mtbench_question.jsonl").read_text().splitlines()
        if x.strip()
    ]
    mt_first = {norm(q["turns"][0]) for q in mt}
    clean = [r for r in rows if norm(r["conversations"][0]["value"]) not in mt_first]
    train_rows = clean[: a.n_conv]
    # held-out rows: none of their user turns may occur in training (ShareGPT repeats prompts: the benchmark
    # phase's contamination check caught one such row in the 2026-12-02 run)
    seen = {norm(t["value"]) for r in train_rows for t in r["conversations"] if t["from"] == "human"}
    heldout_rows = [
        r
        for r in clean[a.n_conv :]
        if not any(t["from"] == "human" and norm(t["value"]) in seen for t in r["conversations"])
    ][:64]
    contaminated = sum(
        1
        for r in train_rows
        for t in r["conversations"]
        if t["from"] == "human" and norm(t["value"]) in mt_first
    )
    qs_all = [q["turns"][0] for q in mt]  # MT-bench first turns
    orig = d / "original.jsonl"
    orig.write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    heldout = d / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(r) + "\n" for r in heldout_rows))
    mt_prompts = d / "mtbench_first_turns.jsonl"  # the offline estimate's prompts: the same questions
    mt_prompts.write_text(
        "".join(json.dumps({"id": f"mt-{q['question_id']}", "prompt": q["turns"][0]}) + "\n" for q in mt)
    )
    save("smol_data", {"train_conversations": len(train_rows), "heldout_conversations": len(heldout_rows),
                       "mtbench_questions": len(mt), "mtbench_in_training": contaminated})  # fmt: skip

    # the base server regenerates (with CUDA graphs: without them the 135M target is launch-bound, 4.6x slower
    # on 2026-12-02) and stays up as the baseline each EAGLE3 measurement is paired with
    # its KV pool holds the regeneration's concurrent requests (each up to ~2k tokens of prompt and answer)
    base = start_server("smol_base", m, 30010, cuda_graph=True, max_tokens=max(262144, a.concurrency * 2048))
    servers: dict[str, Server] = {"base": base}
    try:
        _smol_measured(a, m, d, base, servers, render, orig, heldout, mt_prompts, qs_all, train_rows)
    finally:
        for s in servers.values():
            s.stop()
    _smol_playbook(a, m, d, heldout, orig)


def _smol_measured(a, m, d, base, servers, render, orig, heldout, mt_prompts, qs_all, train_rows) -> None:
    """Everything lane smol does while its base server is up, in order: regenerate, the training sets, the drafts,
    then (sglang_live_smol_serve) the EAGLE3 servers and their measurements."""
    regen = _smol_regenerate(a, m, d, base, render, orig, qs_all, train_rows)
    sets = _smol_sets(a, d, orig, regen)
    _smol_prepare_extract(a, m, d, sets)
    _smol_train(a, m, d, sets)
    drafts = _smol_drafts(a, d, sets)
    if not drafts:
        return
    smol_serve(a, m, d, base, servers, render, drafts, sets, heldout, mt_prompts, qs_all, train_rows)


def _smol_regenerate(a, m, d, base, render, orig, qs_all, train_rows) -> Path:
    """The base server's sanity answer and target agreement, the regeneration of the training conversations through
    it, and the plain load generator at the same concurrency; returns the regenerated file's path."""

    @stage("smol_sanity", 20)
    def sanity():
        o = http(base.url + "/v1/chat/completions", {"model": "m", "temperature": 0, "max_tokens": 24,
                 "messages": [{"role": "user", "content": "What is the capital of France?"}]})  # fmt: skip
        return {"answer": o["choices"][0]["message"]["content"], "ready_s": base.ready_s,
                "cuda_graph": base.cuda_graph}  # fmt: skip

    sanity()
    target_agreement(a, m, base, qs_all, render)
    regen = d / "regenerated.jsonl"

    @stage("smol_regenerate", 120)
    def regenerate():
        r = cli("regenerate", "--backend", "openai", "--url", base.url, "--model", str(m), "--input", str(orig),
                "--out", str(regen), "--concurrency", str(a.concurrency), "--max-new-tokens", str(a.max_tokens),
                name="regenerate", timeout=max(60, left() - 300))  # fmt: skip
        r.pop("failures", None)
        return r

    rg = regenerate() or {}

    @stage("smol_loadgen", 60)
    def loadgen():
        lg = _loadgen(
            base.url, orig, a.concurrency, a.max_tokens, limit=min(len(train_rows), a.loadgen_requests)
        )
        tps = rg.get("tok_per_s")
        lg["regenerate_tok_s"] = tps
        lg["ratio_regenerate_vs_loadgen"] = round(tps / lg["tok_s"], 3) if tps else None
        lg["cuda_graph"] = base.cuda_graph
        return lg

    if a.loadgen_requests > 0:
        loadgen()
    return regen


def _smol_sets(a, d, orig, regen) -> dict:
    """The training sets: key -> conversations file (regen, orig unless --no-orig, and the curve's regenN)."""
    sets = {} if a.no_orig else {"orig": orig}
    if regen.exists():
        sets = {"regen": regen, **sets}
        # the curve of acceptance vs N (#18): drafts trained on the first N regenerated conversations, N < n_conv,
        # with the same epochs and wall budget as the full one, trained at the same time on the one GPU
        lines = regen.read_text().splitlines(keepends=True)
        for n in sorted({int(x) for x in a.curve.split(",") if x.strip()}):
            if n < len(lines):
                sub = d / f"regenerated-{n}.jsonl"
                sub.write_text("".join(lines[:n]))
                sets[f"regen{n}"] = sub
    return sets


def _smol_prepare_extract(a, m, d, sets) -> None:
    """Prepare every set (CPU, at once; lane demo's --mid measurement takes the GPU meanwhile), then extract them."""

    def prepare(key):
        @stage(f"smol_prepare_{key}", 40)
        def prep(src=sets[key]):
            return cli("prepare", "--model", str(m), "--input", str(src), "--out", str(d / f"data-{key}"),
                       "--max-length", str(a.max_length), "--on-error", "skip", "--rows", a.prepare_rows,
                       "--workers", str(a.prepare_workers), name=f"prepare_{key}")  # fmt: skip

        return prep()

    # the GPU idles while prepare runs on the CPU: lane demo's capture-overhead measurement (--mid) takes that window
    (d / "gpu-window").touch()
    with cf.ThreadPoolExecutor(2) as ex:  # CPU work, independent: both at once
        list(ex.map(prepare, list(sets)))
    if a.mid and "demo" in a.lanes.split(","):  # ... and the extraction waits (bounded) until it is over

        @stage("smol_wait_mid", 5)
        def wait_mid():
            t, done = time.time(), L.W / "demo" / "mid-done"
            while not done.exists() and not L.DEMO_QUIET.is_set() and time.time() - t < a.mid_wait_s:
                time.sleep(1)
            return {"waited_s": round(time.time() - t, 1), "mid_done": done.exists()}

        wait_mid()

    def extract(key):
        @stage(f"smol_extract_{key}", 60)
        def ext():
            return cli("extract", "--data", str(d / f"data-{key}"), "--model", str(m), "--device", a.device,
                       "--workers", "1", "--no-progress", name=f"extract_{key}")  # fmt: skip

        return ext()

    with cf.ThreadPoolExecutor(3) as ex:  # disk-bound, each well under the NVMe's ceiling: at once
        list(ex.map(extract, [k for k in sets if (d / f"data-{k}" / "prepare_meta.json").exists()]))


def _smol_train(a, m, d, sets) -> None:
    """Train a draft on every extracted set, with the same budget, in parallel."""

    # train both with the same budget, in parallel (the GPU has room for both)
    def train(key):
        @stage(f"smol_train_{key}", 90)
        def tr():
            # the same budget for both; what is left after it must still fit the serving stages
            t_train = int(min(a.train_timeout, max(60, left() - a.reserve_s)))
            r = cli("train", "--data", str(d / f"data-{key}"), "--verifier", str(m), "--run-dir",
                    str(d / f"run-{key}"), "--device", "gpu" if a.device == "cuda" else "cpu", "--epochs",
                    str(a.epochs), "--total-seq-len", str(a.total_seq_len), "--launcher", "setsid", "--wait",
                    "--timeout", str(t_train), "--no-gpu-free-check", "--draft-attn-impl", "sdpa",
                    "--loss-implementation", "eager", "--draft-vocab-size", str(a.draft_vocab),
                    "--checkpoint-freq", str(a.checkpoint_freq), "--env", json.dumps({"TORCH_COMPILE_DISABLE": "1"}),
                    name=f"train_{key}", timeout=t_train + 300)  # fmt: skip
            r["budget_s"] = t_train
            if r.get("status") not in ("finished", "done"):
                cli(
                    "train-stop",
                    "--run-dir",
                    str(d / f"run-{key}"),
                    "--grace",  # the ranks' interrupt save must end before the group stop
                    "45",
                    name=f"train_stop_{key}",
                )
            st = cli("train-status", "--run-dir", str(d / f"run-{key}"), name=f"train_status_{key}")
            r["train_status"] = {
                k: st.get(k) for k in ("status", "metrics", "checkpoint", "save_path") if k in st
            }
            # every validation and step record comes back with the logs (train-status keeps only the last)
            metrics = d / f"run-{key}" / "metrics.jsonl"
            if metrics.is_file():
                with gzip.open(L.W / "logs" / f"train_metrics_{key}.jsonl.gz", "wb") as f:
                    f.write(metrics.read_bytes())
            return r

        return tr()

    with cf.ThreadPoolExecutor(len(sets)) as ex:
        list(ex.map(train, [k for k in sets if (d / f"data-{k}" / "hidden_states").is_dir()]))


def _smol_drafts(a, d, sets) -> dict:
    """Convert every trained draft for SGLang; returns key -> draft directory, with the guard's bad copies (wrong
    aux layer ids, never accepted) of the regenerated one when --serve-configs asks for them."""
    for key in sets:

        @stage(f"smol_convert_draft_{key}", 20)
        def conv(key=key):
            # a finished run: convert's default (checkpoint_best, the best validated epoch); a stopped one: its
            # newest readable save (the interrupted one, later in the LR decay than any validated epoch)
            from eagle3ops.checkpoints import newest_checkpoint

            ended = ((L.SUMMARY.get(f"smol_train_{key}") or {}).get("train_status") or {}).get("status")
            ckpt = d / f"run-{key}"
            if ended not in ("finished", "done"):
                ckpt = newest_checkpoint(ckpt) or ckpt
            r = cli(
                "serve-convert",
                "--checkpoint",
                str(ckpt),
                "--out",
                str(d / f"draft-{key}"),
                name=f"convert_{key}",
            )
            r["train_ended"] = ended
            return r

        conv()

    drafts = {k: d / f"draft-{k}" for k in sets if (d / f"draft-{k}" / "config.json").exists()}
    # a copy of the regenerated draft whose aux layer ids are wrong: the guard must fire on it
    wanted = {k for k, _ in a.serve_configs}
    if "regen" in drafts and "wrong" in wanted:
        wrong = d / "draft-wrong-layers"
        shutil.rmtree(wrong, ignore_errors=True)
        shutil.copytree(drafts["regen"], wrong)
        cfg = json.loads((wrong / "config.json").read_text())
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [5, 9, 20]
        (wrong / "config.json").write_text(json.dumps(cfg, indent=1))
        drafts["wrong"] = wrong
    if "regen" in drafts and "broken" in wanted:
        # ... and one that is never accepted (sglang#21272's 1.00: a draft answering in another vocabulary, as one
        # trained for another target or tokenizer does): its lm_head rows rolled by one, so every proposal is the
        # neighbour of what it means. The 2026-12-02 run showed wrong layer ids cost only ~20 % (1.46)
        broken = d / "draft-never-accepted"
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(drafts["regen"], broken)
        from safetensors.torch import load_file, save_file

        w = load_file(str(broken / "model.safetensors"))
        w["lm_head.weight"] = w["lm_head.weight"].roll(1, dims=0).contiguous()
        save_file(w, str(broken / "model.safetensors"))
        drafts["broken"] = broken
    return drafts


def _smol_playbook(a, m, d, heldout, orig) -> None:
    """The serve and benchmark phases themselves on the regenerated draft, when the budget still allows."""
    if not (d / "run-regen").is_dir() or not (d / "draft-regen" / "config.json").exists():
        return
    graphs = L.SUMMARY.get("smol_eagle3_starts", {}).get("smol_eagle3_regen_3-1-4", {})
    nograph = isinstance(graphs, dict) and graphs.get("cuda_graph") is False

    @stage("smol_playbook", a.playbook_need_s)
    def pb():
        waited = demo_capture_over(timeout=max(0.0, left() - a.playbook_need_s))
        return {"waited_for_demo_capture": waited, **run_playbooks("smol", {
            "eagle3ops_checkpoint": str(d / "run-regen"), "eagle3ops_model_path": str(m),
            "serve_port": 30030, "serve_baseline_port": 30031, "serve_disable_cuda_graph": nograph,
            "serve_min_accept_length": a.guard_floor,
            "benchmark_offline": False,
            "benchmark_prompt_sets": {"mtbench": str(Path(a.assets) / "mtbench_question.jsonl"),
                                      "heldout": str(heldout)},
            "benchmark_training_data": [str(orig), str(d / "regenerated.jsonl")],
            **({"serve_server_command": L.SERVER_CMD, "serve_sglang_site_packages": a.smoke_site} if a.smoke else {}),
        }, timeout=max(60, left() - 20))}  # fmt: skip

    pb()
    if a.smoke:
        save("smol_playbook_servers_stopped", stop_playbook_servers("smol"))
