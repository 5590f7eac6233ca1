"""Lane ``smol`` of bench/sglang_live_lanes.py (issue #18): what is measured against the SGLang servers.

The target agreement of the served and the trained-on target (a ceiling on acceptance); every EAGLE3 server
started side by side on the drafts of bench/sglang_live_smol.py; the offline estimate (``benchmark-acceptance``)
running meanwhile; the serve guard on the right draft and on its bad copies; acceptance length and output tok/s
of each draft paired with a like-for-like baseline server; the curve of acceptance vs conversations, and the
offline estimate against the served acceptance per prompt. The run's state is read through ``sglang_live``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time
from pathlib import Path

import sglang_live as L
from sglang_live import Server, cli, http, left, measure, measure_pair, save, stage, start_server


def target_agreement(a, m: Path, base: Server, qs_all: list[str], render) -> None:
    """Does the served target predict what the trained-on target predicts? The draft learns the argmax of the
    transformers forward (extraction's, bf16) and is verified against SGLang's. Where the two disagree no draft can
    be accepted, so the share of SGLang's greedy tokens that transformers' argmax also gives, on the same token
    ids, is a ceiling on the per-token acceptance. SmolLM2 is often near a tie (its first answer token to "What is
    the capital of France?" is "The" at 0.173 against "L" at 0.135 in transformers bf16), so bf16 kernels that
    differ can flip it: in every box run SGLang answered "L'Etoile, ..." where transformers answers "Paris"."""

    @stage("smol_target_agreement", 40)
    def agreement():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(m))
        prompts = [render([{"role": "user", "content": q}]) for q in qs_all[: a.agreement_prompts]]
        ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]

        def served(k):
            # the rendered text, as the measurements send it (SmolLM2's tokenizer adds no BOS: the same ids)
            o = http(base.url + "/generate", {"text": prompts[k], "return_logprob": True,
                     "sampling_params": {"temperature": 0, "max_new_tokens": a.agreement_tokens}})  # fmt: skip
            got = [t[1] for t in (o.get("meta_info") or {}).get("output_token_logprobs") or []]
            return (got or o.get("output_ids") or tok(o["text"], add_special_tokens=False).input_ids), bool(
                got
            )

        with cf.ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(served, range(len(prompts))))
        dev = "cuda" if a.device == "cuda" else "cpu"
        model = AutoModelForCausalLM.from_pretrained(str(m), dtype=torch.bfloat16).to(dev).eval()
        agree = total = 0
        first_diff, margins = [], []
        for x, (y, _) in zip(ids, outs, strict=True):
            if not y:
                continue
            with torch.no_grad():
                logits = (
                    model(torch.tensor([x + y], device=dev))
                    .logits[0, len(x) - 1 : len(x) + len(y) - 1]
                    .float()
                )
            pred = logits.argmax(-1).tolist()
            same = [p == t for p, t in zip(pred, y, strict=True)]
            agree, total = agree + sum(same), total + len(same)
            first_diff.append(same.index(False) if False in same else None)
            probs = logits.softmax(-1)
            for j, ok in enumerate(same):  # how close transformers' own choice was where the two differ
                if not ok:
                    margins.append(round(float(probs[j, pred[j]] - probs[j, y[j]]), 4))
        del model
        share = agree / total if total else None
        return {
            "prompts": len(ids),
            "tokens": total,
            "agreement": round(share, 4) if share is not None else None,
            # 1 + a + a^2 + a^3: the most 3/1/4 can reach when each token is accepted at most as often as they agree
            "ceiling_3_1_4": round(sum(share**k for k in range(4)), 3) if share is not None else None,
            "first_divergence": first_diff,
            "disagreement_prob_gap": {
                "n": len(margins),
                "median": sorted(margins)[len(margins) // 2] if margins else None,
            },
            "served_ids_from": "output_token_logprobs" if all(g for _, g in outs) else "text (re-tokenised)",
        }

    agreement()


def smol_serve(a, m, d, base, servers, render, drafts, sets, heldout, mt_prompts, qs_all, train_rows) -> None:
    """The EAGLE3 servers of ``drafts`` (started into ``servers``: the lane stops them) and all they measure."""
    # every EAGLE3 server at once (each caps its KV pool: they fit side by side), measured one after the other
    configs = list(a.serve_configs)
    configs += [(k, (3, 1, 4)) for k in drafts if k.startswith("regen") and k != "regen"]  # the curve's
    configs = [(k, sp) for k, sp in configs if k in drafts]
    off_thread, offline = _start_offline(a, m, d, drafts, mt_prompts)
    _start_eagle3(m, drafts, configs, servers)

    waited = time.time()
    L.DEMO_QUIET.wait(timeout=max(0.0, min(a.quiet_wait_s, left() - 240)))
    save("smol_quiet_wait", {"waited_s": round(time.time() - waited, 1), "demo_quiet": L.DEMO_QUIET.is_set()})
    _smol_guard(a, m, servers)
    _measure_all(a, m, base, servers, configs, render, heldout, qs_all)
    _smol_curve(a, sets, train_rows)
    _offline_result(a, off_thread, offline)


def _start_offline(a, m, d, drafts, mt_prompts) -> tuple[threading.Thread, dict]:
    """Start the offline estimate in a thread; returns the thread and the dict its result lands in (key ``res``)."""
    # the offline estimate (benchmark-acceptance: transformers target, speculators draft) of the regenerated draft
    # on the same MT-bench questions, on the CPU or the GPU (--offline-device) while the servers start and measure
    offline: dict = {}

    def offline_estimate():
        if "regen" not in drafts or a.offline_prompts <= 0:
            return
        # the checkpoint the served draft was converted from, in the server's dtype on the GPU when asked for
        ckpt = (L.SUMMARY.get("smol_convert_draft_regen") or {}).get("checkpoint") or d / "run-regen"
        offline["res"] = cli("benchmark-acceptance", "--checkpoint", str(ckpt), "--target", str(m),
                             "--prompts", str(mt_prompts), "--out", str(d / "offline-regen.json"), "--k", "3",
                             "--max-new-tokens", str(a.offline_tokens), "--limit", str(a.offline_prompts),
                             "--threads", str(a.offline_threads), "--no-baseline", "--device", a.offline_device,
                             "--dtype", a.offline_dtype, name="offline_regen",
                             timeout=max(60, left() - 60))  # fmt: skip

    off_thread = threading.Thread(target=offline_estimate, name="offline")
    off_thread.start()
    return off_thread, offline


def _start_eagle3(m, drafts, configs, servers) -> None:
    """Start every configuration's EAGLE3 server at once; those that came up are added to ``servers``."""
    starts: dict[str, object] = {}

    def start_one(i_cfg):
        i, (key, spec) = i_cfg
        name = f"smol_eagle3_{key}_{'-'.join(map(str, spec))}"
        try:
            starts[name] = start_server(
                name, m, 30040 + i, draft=drafts[key], spec=spec, graph_bs=16, timeout=360
            )
        except Exception as e:  # recorded; the other configurations still run
            starts[name] = e

    t = time.time()
    with cf.ThreadPoolExecutor(len(configs)) as ex:
        list(ex.map(start_one, enumerate(configs)))
    save("smol_eagle3_starts", {n: (f"FAILED {s}" if isinstance(s, Exception) else
                                    {"ready_s": s.ready_s, "cuda_graph": s.cuda_graph,
                                     "graph_error": getattr(s, "graph_error", None)})
                                for n, s in starts.items()} | {"parallel_start_s": round(time.time() - t, 1)})  # fmt: skip
    for n, s in starts.items():
        if isinstance(s, Server):
            servers[n] = s


def _smol_guard(a, m, servers) -> None:
    """Stage smol_guard: the serve phase's probe on the right draft and the bad copies."""
    # the guard (#17): the serve phase's probe, on the right draft (must pass), the wrong-layer copy and the one that
    # is never accepted (must fail); before the tok/s measurements (nothing else may run during those), probes at once
    right, wrong_s = servers.get("smol_eagle3_regen_3-1-4"), servers.get("smol_eagle3_wrong_3-1-4")
    broken_s = servers.get("smol_eagle3_broken_3-1-4")
    if right or wrong_s or broken_s:

        @stage("smol_guard", 30)
        def guard():
            out = {}
            probes = [(k, s) for k, s in (("right", right), ("wrong_layer_ids", wrong_s), ("never_accepted", broken_s))
                      if s is not None]  # fmt: skip

            def probe(k_s):  # each on its own server: at once
                k, s = k_s
                out[k] = cli("benchmark-spec-probe", "--url", s.url, "--min-accept-length", str(a.guard_floor),
                             "--chat-template", str(m), name=f"guard_{k}")  # fmt: skip

            with cf.ThreadPoolExecutor(max(1, len(probes))) as ex:
                list(ex.map(probe, probes))
            out["passed_right"] = out.get("right", {}).get("rc") == 0 if right else None
            out["fired_on_wrong"] = out.get("wrong_layer_ids", {}).get("rc") == 2 if wrong_s else None
            out["fired_on_never_accepted"] = (
                out.get("never_accepted", {}).get("rc") == 2 if broken_s else None
            )
            return out

        guard()


def _measure_all(a, m, base, servers, configs, render, heldout, qs_all) -> None:
    """One stage per EAGLE3 server: the curve's points (acceptance), the others paired with a baseline (tok/s,
    speedup); the regenerated draft at 3/1/4 also on held-out ShareGPT prompts."""
    # the baseline each measurement is paired with: the base server when the EAGLE3 server has CUDA graphs too,
    # else one started like it, without graphs (like for like)
    nograph_base: list[Server] = []

    def baseline_for(s: Server) -> Server:
        if s.cuda_graph or not base.cuda_graph:
            return base
        if not nograph_base:
            nograph_base.append(Server("smol_base_nograph", m, 30019, cuda_graph=False).start())
            servers["base_nograph"] = nograph_base[0]
        return nograph_base[0]

    # measured in this order (the budget may cut the tail): the regenerated draft at 3/1/4, the curve's points, the
    # original-answers draft, then the rest (5/1/6; the guard's bad copies are not measured)
    def rank(cfg) -> int:
        key, spec = cfg
        if key == "regen":
            return 0 if spec == (3, 1, 4) else 3
        return 1 if key.startswith("regen") else 2 if key == "orig" else 3

    configs.sort(key=rank)
    for key, spec in configs:
        name = f"smol_eagle3_{key}_{'-'.join(map(str, spec))}"
        s = servers.get(name)
        if s is None or key in ("wrong", "broken"):
            continue
        if key.startswith("regen") and key != "regen":  # a point of the curve: its acceptance is what counts

            @stage(name, 20)
            def curve_point(s=s, key=key):
                k = f"conc{a.bench_concurrency}"
                r = measure(s.url, qs_all[: a.mt_prompts], a.bench_tokens, a.bench_concurrency, render)
                return {"conversations": int(key[len("regen") :]), "ready_s": s.ready_s, k: r}

            curve_point()
            continue

        @stage(name, 60)
        def serve_measure(s=s):
            qs, toks = (qs_all[: a.mt_prompts], a.bench_tokens) if s.cuda_graph else (qs_all[:24], 128)
            out = {"ready_s": s.ready_s, "cuda_graph": s.cuda_graph, "prompts": len(qs), "max_new_tokens": toks,
                   **measure_pair(s.url, qs, a, render, toks)}  # fmt: skip
            b = baseline_for(s)
            out["baseline_paired"] = {"server": b.name, "cuda_graph": b.cuda_graph,
                                      **measure_pair(b.url, qs, a, render, toks)}  # fmt: skip
            for k in ("batch1", f"conc{a.bench_concurrency}"):
                with_, without = out[k].get("output_tok_s"), out["baseline_paired"][k].get("output_tok_s")
                out[f"speedup_{k}"] = round(with_ / without, 3) if with_ and without else None
            return out

        serve_measure()
        if key == "regen" and spec == (3, 1, 4) and a.heldout_prompts > 0:
            # the same draft on prompts like its training data. MT-bench's acceptance is far below what the
            # validation accuracy predicts: near that prediction here, the gap is MT-bench's distance from
            # ShareGPT; as low as MT-bench here, the serving path loses it
            heldout_first = [
                json.loads(x)["conversations"][0]["value"] for x in heldout.read_text().splitlines()
            ]

            @stage("smol_heldout_regen_3-1-4", 20)
            def heldout_measure(s=s, qs=heldout_first[: a.heldout_prompts]):
                k = f"conc{a.bench_concurrency}"
                return {
                    "prompts": len(qs),
                    k: measure(s.url, qs, a.bench_tokens, a.bench_concurrency, render),
                }

            heldout_measure()


def _smol_curve(a, sets, train_rows) -> None:
    """Stage result smol_curve: acceptance length against the number of training conversations."""
    curve = []
    for key in sets:
        if not key.startswith("regen"):
            continue
        name = f"smol_eagle3_{key}_3-1-4"
        got = L.SUMMARY.get(name) or {}
        point = got.get(f"conc{a.bench_concurrency}") or {}
        trained = L.SUMMARY.get(f"smol_train_{key}") or {}
        curve.append({"conversations": int(key[len("regen") :] or len(train_rows)),
                      "rows": (trained.get("samples") or {}).get("samples_with_states"),
                      "steps": ((trained.get("train_status") or {}).get("metrics") or {}).get("global_step"),
                      "acceptance_length": point.get("acceptance_length")})  # fmt: skip
    if len(curve) > 1:
        save("smol_curve", sorted(curve, key=lambda x: x["conversations"]))


def _offline_result(a, off_thread, offline) -> None:
    """Wait (bounded) for the offline estimate and save it, compared per prompt with the served batch-1 acceptance."""
    off_thread.join(timeout=max(1.0, left() - 200))
    if a.offline_prompts > 0:
        res = offline.get("res") or {"error": "not finished within the budget"}
        per = ((res.get("result") or {}).get("draft") or {}).get("per_prompt") or []
        served = ((L.SUMMARY.get("smol_eagle3_regen_3-1-4") or {}).get("batch1") or {}).get(
            "acceptance_per_request"
        )
        # the same prompts (the first N MT-bench first turns, in order) on the server, batch 1
        if per and served:
            pairs = [
                (p["acceptance_length"], s)
                for p, s in zip(per, served, strict=False)
                if p["acceptance_length"]
            ]
            res["vs_served_batch1"] = {
                "prompts": len(pairs),
                "offline_mean_per_prompt": round(sum(o for o, _ in pairs) / len(pairs), 4),
                "served_mean_per_prompt": round(sum(s for _, s in pairs) / len(pairs), 4),
            }
        save("smol_offline_regen", res)
