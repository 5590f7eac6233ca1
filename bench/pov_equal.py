"""Equal-footing proof of value (issue 45, item 1): our draft against SpecForge's with nothing but the trainer
different, served and measured alike.

Both trainers on the same store (one prepare, one extraction: the same rows, max length 2048), the same draft
vocabulary (``--draft-vocab``), the same aux layer ids (``LAYER_IDS``, given to both explicitly), the same TTT
steps (each of ``--ttt``, 3 and 7 by default: speculators' default is 3, SpecForge's 7) and the same whole number
of epochs (``--epochs``, at least 2), each alone on the GPU and each with its full schedule: no step cap and no
budget stop (SpecForge sizes its cosine schedule from its epochs, so it ends inside the run; the budget given
to each job is the plan's time with a margin, a guard only). Each seed of ``--seeds`` trains each pair again.
At equal wall-clock: the faster trainer again, as many whole epochs as fit the slower one's time (its schedule
full too). Each draft is served by SGLang against SmolLM2 at 3/1/4 and 5/1/6 and measured on all 80 MT-bench
first turns (``--mt-concurrency``, batch 1 by default; acceptance pooled and per category) and held-out ShareGPT
(concurrency 8); with ``--lossless-sample`` its greedy answers are compared with a plain server's. The jobs run in
waves of one TTT and seed, each wave measured and saved before the next trains. ``--n-conv``: a smaller store
(the first N conversations), every epoch shorter in proportion, so that both trainers' full schedules fit.

``--plan`` prints how long that takes from the measured rates (:func:`plan`; nothing runs) and how it splits
into device sessions; ``--jobs`` runs a subset (the plan's job names), so each session lands what it trained.
The result JSON (``WORK/res/equal.json``) gives ours / SpecForge at equal epochs and at equal wall-clock side
by side, per TTT: the mean over the seeds and the spread (:func:`compare`); ``--merge`` compares the sessions'
``equal.json`` files together (:func:`merge`). ``--smoke``: a CPU dry run of the whole plan's control flow
(bench/pov_smoke.py: the stand-in server, tiny sizes, our drafts copied in SpecForge's place; nothing measured).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pov_measure as M
import proof_of_value as P
import sglang_live as L
from pov_smoke import smoke, stand_in_specforge

# measured alone on the H200 (docs/performance.md, proof of value): ours at TTT 3, 8,192 packed tokens a step,
# 1,266 steps an epoch of the 15,596 rows (run 5: 7.48 steps/s, 69 s to the first step); SpecForge at TTT 7,
# batch 8 padded rows, 14,036 training rows = 1,755 steps an epoch (run 1: 5.67 steps/s, 86 s)
RATES = {
    "ours": {"steps_per_s": P.OURS_RATE_ALONE, "ttt": 3, "startup_s": 69.0, "steps_per_epoch": 1266},
    "specforge": {"steps_per_s": 5.67, "ttt": 7, "startup_s": 86.0, "steps_per_epoch": 1755},
}
DATA_S = 370.0  # carries, conversion, prepare, extraction before any training (runs 3-5)
DATA_ROWS_S = 172.0  # of which conversion, prepare and extraction of the 15,600 conversations (run 5)
N_CONV = 15600  # the conversations the rates' steps an epoch were measured on
SERVE_S = 110.0  # one group of servers started 8 s apart, ready (runs 3-5: 74-102 s each)
MEASURE_S = 55.0  # one server: 80 MT-bench prompts at batch 1 + 64 held-out at concurrency 8, 256 tokens
SESSION_S = 1800.0  # device time of one session
MARGIN = 1.3  # a job's budget: the plan's time x this (a guard; a full schedule is never cut on plan)

# what proof_of_value.Run and train read: the same data, store, vocabulary and servers as its runs 1-5
FIXED = {"wide_dir": "/tmp/pov-wide", "conversations": "smollm2-regenerated-sharegpt-15600.jsonl.xz",
         "max_length": 2048, "prepare_workers": 8, "draft_vocab": 32768, "total_seq_len": 8192,
         "sf_batch": 8, "sf_save_interval": 250, "sf_max_checkpoints": 2, "sf_fc_norm": False,
         "wide_late": True, "wide_intermediate": 153600, "mt_prompts": 80, "heldout_prompts": 64,
         "tokens": 256, "kv_tokens": 65536, "port0": 30100, "stagger_s": 8.0, "wide_prefill": 1024,
         "no_radix_cache": True, "mem_smol": 0.12, "device": "cuda"}  # fmt: skip


def rate(trainer: str, ttt: int) -> dict:
    """Steps/s of ``trainer`` at ``ttt`` TTT steps: measured at its default TTT; at more steps assumed to fall in
    proportion (every step's cost grows with the positions trained: an upper bound of the cost, not measured);
    at fewer, the measured rate (not assumed faster)."""
    m = RATES[trainer]
    r = m["steps_per_s"] * min(1.0, m["ttt"] / ttt)
    return {"steps_per_s": round(r, 3), "measured": ttt == m["ttt"], "assumed": ttt > m["ttt"]}


def steps_per_epoch(trainer: str, n_conv: int = N_CONV) -> int:
    """Steps an epoch of ``n_conv`` of the conversations: the measured count, in proportion (the rows are the
    first ``n_conv`` of the same file, so their mean length is about the same)."""
    return max(1, round(RATES[trainer]["steps_per_epoch"] * n_conv / N_CONV))


def train_s(trainer: str, ttt: int, epochs: int, n_conv: int = N_CONV) -> float:
    m = RATES[trainer]
    return m["startup_s"] + epochs * steps_per_epoch(trainer, n_conv) / rate(trainer, ttt)["steps_per_s"]


def plan(
    ttts: list[int],
    seeds: list[int],
    epochs: int,
    *,
    wall_clock: bool = True,
    configs: int = 2,
    n_conv: int = N_CONV,
) -> dict:
    """Every training job (trainer, TTT, seed, epochs) with its time from the measured rates, the serving and
    measuring after it, and a split into device sessions of ``SESSION_S`` (each session prepares the store again:
    /dev/shm does not outlive the box). Equal wall-clock adds, per TTT and seed, the faster trainer for as many
    whole epochs as fit the slower one's time. ``n_conv``: the conversations in the store (fewer than the
    15,600 the rates were measured on shorten every epoch and the extraction in proportion)."""
    if epochs < 2:
        raise ValueError(f"--epochs {epochs}: equal footing wants at least 2 (full schedules of both)")
    if not 0 < n_conv <= N_CONV:
        raise ValueError(f"--n-conv {n_conv}: between 1 and the {N_CONV} regenerated conversations")
    data_s = DATA_S - DATA_ROWS_S * (1 - n_conv / N_CONV)
    jobs = []
    for ttt in ttts:
        for seed in seeds:
            t = {k: train_s(k, ttt, epochs, n_conv) for k in RATES}
            for k in RATES:
                jobs.append({"name": f"{k}_ttt{ttt}_s{seed}_e{epochs}", "trainer": k, "ttt": ttt, "seed": seed,
                             "epochs": epochs, "seconds": round(t[k], 1), "role": "equal_epochs"})  # fmt: skip
            if wall_clock:
                fast, slow = sorted(RATES, key=lambda k: t[k])
                m = RATES[fast]
                fit = math.floor(
                    (t[slow] - m["startup_s"])
                    * rate(fast, ttt)["steps_per_s"]
                    / steps_per_epoch(fast, n_conv)
                )
                if fit > epochs:
                    jobs.append({"name": f"{fast}_ttt{ttt}_s{seed}_e{fit}", "trainer": fast, "ttt": ttt, "seed": seed,
                                 "epochs": fit, "seconds": round(train_s(fast, ttt, fit, n_conv), 1), "role": "equal_wall",
                                 "budget_of": f"{slow}_ttt{ttt}_s{seed}_e{epochs}"})  # fmt: skip
    per_draft = configs * MEASURE_S
    sessions: list[dict] = []
    for j in sorted(jobs, key=lambda j: -j["seconds"]):  # first fit, longest first
        need = j["seconds"] + per_draft
        cur = next((s for s in sessions if s["seconds"] + need <= SESSION_S), None)
        if cur is None:
            cur = {"jobs": [], "seconds": data_s + SERVE_S}
            sessions.append(cur)
        cur["jobs"].append(j["name"])
        cur["seconds"] = round(cur["seconds"] + need, 1)
    too_long = [j["name"] for j in jobs if data_s + SERVE_S + j["seconds"] + per_draft > SESSION_S]
    total = round(sum(s["seconds"] for s in sessions), 1)
    return {"jobs": jobs, "wall_clock": wall_clock, "n_conv": n_conv, "sessions": sessions, "device_s": total,
            "session_s": SESSION_S, "steps_per_epoch": {k: steps_per_epoch(k, n_conv) for k in RATES},
            "fits_one_session": len(sessions) == 1 and not too_long, "longer_than_a_session": too_long,
            "rates": {k: {str(t): rate(k, t) for t in ttts} for k in RATES}}  # fmt: skip


def _stats(xs: list[float]) -> dict:
    return (
        {"mean": round(statistics.fmean(xs), 4), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else {}
    )


def compare(results: dict, jobs: list[dict], wall_clock: bool = True) -> dict:
    """Ours / SpecForge per TTT and measure (``results``: job name -> {measure -> acceptance}), at equal epochs
    (the two ``equal_epochs`` jobs of a seed) and, with ``wall_clock`` (the plan's), at equal wall-clock (the
    slower one's equal-epochs job against the faster one's ``equal_wall`` job; where the plan has none, no whole
    epoch more fits the slower one's time and the equal-epochs pair is also the equal wall-clock one): the
    per-seed ratios, their mean and spread, and each side's mean."""
    out: dict = {}
    by = {j["name"]: j for j in jobs}
    for j in jobs:
        if j["role"] != "equal_epochs" or j["trainer"] != "ours":
            continue
        sf = f"specforge_ttt{j['ttt']}_s{j['seed']}_e{j['epochs']}"
        pairs = {"equal_epochs": (j["name"], sf)}
        wall = [
            w for w in jobs if w["role"] == "equal_wall" and w["ttt"] == j["ttt"] and w["seed"] == j["seed"]
        ]
        if wall:
            w = wall[0]
            pairs["equal_wall_clock"] = (w["name"], sf) if w["trainer"] == "ours" else (j["name"], w["name"])
        elif wall_clock:
            pairs["equal_wall_clock"] = pairs["equal_epochs"]
        for kind, (a, b) in pairs.items():
            ra, rb = results.get(a) or {}, results.get(b) or {}
            for measure in sorted(set(ra) & set(rb)):
                if ra[measure] and rb[measure]:
                    slot = out.setdefault(f"ttt{j['ttt']}", {}).setdefault(measure, {}).setdefault(kind, {
                        "ours": [], "specforge": [], "ratio": [], "epochs": (by[a]["epochs"], by[b]["epochs"])})  # fmt: skip
                    slot["ours"].append(ra[measure])
                    slot["specforge"].append(rb[measure])
                    slot["ratio"].append(round(ra[measure] / rb[measure], 4))
    for per_ttt in out.values():
        for per_measure in per_ttt.values():
            for slot in per_measure.values():
                slot.update({f"{k}_stats": _stats(slot[k]) for k in ("ours", "specforge", "ratio")})
    return out


# ---------------------------------------------------------------------------------------------- the run


def _train_flags(a, j: dict) -> list[str]:
    common = ["--epochs", str(j["epochs"]), "--ttt-steps", str(j["ttt"]), "--seed", str(j["seed"]),
              "--layer-ids", *map(str, P.LAYER_IDS)]  # fmt: skip
    if j["trainer"] == "ours":
        return [*common, *P.ours_flags(a)]
    return ["--trainer", "specforge", *common, "--extra", P.sf_extra(a), *P.sf_recipe(a)]


def run(a, p: dict) -> None:
    """The jobs asked (``--jobs``, default all), in waves of one TTT and seed: each job of a wave trained one
    after the other, each alone; then the wave's drafts served and measured, their servers stopped, and the
    comparison so far saved, before the next wave trains (a session cut short keeps its measured waves)."""
    r = P.Run(a)
    if not r.inputs():
        return
    names = a.jobs.split(",") if a.jobs else [j["name"] for j in p["jobs"]]
    jobs = [j for j in p["jobs"] if j["name"] in names]
    configs = [tuple(int(x) for x in c.split("-")) for c in a.configs.split(",")]
    cats = mtbench_categories(Path(a.assets) / "mtbench_question.jsonl", len(r.qs))
    out: dict = {"acceptance": {}, "per_category": {}, "lossless": {}}
    plain = None
    if a.lossless_sample:  # the plain server the drafts' greedy answers are compared with (same flags), once
        for t in r.start_group([("smol_base", r.m, None, configs[0], a.mem_smol)]):
            t.join()
        plain = plain_sample(a, r, cats)
    done: list[str] = []
    for wave in waves(jobs):
        stood_in = [j for j in wave if a.smoke and j["trainer"] == "specforge"]  # no SpecForge on a CPU
        for j in wave:
            if j not in stood_in:
                train_job(a, r, j)
        for j in stood_in:
            stand_in_specforge(r, smoke_twin(j, wave), j["name"])
        group = [(f"smol_{j['name']}_{'-'.join(map(str, c))}", r.m, r.drafts[j["name"]], c, a.mem_smol)
                 for j in wave if j["name"] in r.drafts for c in configs]  # fmt: skip
        for t in r.start_group(group):
            t.join()
        measure(a, r, group, cats, plain, out)
        for name, *_ in group:
            if name in r.servers:
                r.servers.pop(name).stop()
        # the jobs trained here (not stood in, not skipped by the budget guard)
        done += [j["name"] for j in wave if j not in stood_in and j["name"] in r.drafts]
        L.save("equal", {"plan": p, **out, "compare": compare(out["acceptance"], p["jobs"], p["wall_clock"]),
                         "jobs_run": done, "smoke": {"stood_in": L.SUMMARY.get("smoke_note") or {}} if a.smoke else None,
                         "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})  # fmt: skip
    for s in r.servers.values():
        s.stop()


def waves(jobs: list[dict]) -> list[list[dict]]:
    """The jobs grouped by (TTT, seed), in the plan's order: each group compares on its own."""
    out: dict[tuple, list[dict]] = {}
    for j in jobs:
        out.setdefault((j["ttt"], j["seed"]), []).append(j)
    return list(out.values())


def train_job(a, r, j: dict) -> None:
    run_dir = r.d / f"run-{j['name']}"

    @L.stage(f"train_{j['name']}", j["seconds"] + 60)  # not started where its plan cannot finish
    def tr():
        res = P.train(a, j["name"], r.data, r.m, run_dir, _train_flags(a, j), j["seconds"] * MARGIN)
        return {**res, "job": j}

    tr()
    r.convert_draft(j["name"], run_dir)


def plain_sample(a, r, cats: list[str]) -> tuple[list[dict], list[dict]] | None:
    """The lossless prompts (``--lossless-sample`` of MT-bench, spread over its categories) and the plain
    server's greedy answers to them; None if the plain server did not start."""
    from eagle3ops.benchmark.loadgen import greedy_sample

    base = r.servers.get("smol_base")
    if not base:
        return None
    lp = M.lossless_prompts(r.qs, a.lossless_sample)
    for it in lp:
        it["category"] = cats[it["id"]] if it["id"] < len(cats) else None

    @L.stage("lossless_plain", 30)
    def sample():
        return {
            "prompts": lp,
            "answers": greedy_sample(base.url, lp, max_new_tokens=a.tokens, render=r.render),
        }

    got = sample()
    return (lp, got["answers"]) if got else None


def mtbench_categories(path: Path, n: int) -> list[str]:
    """The categories of MT-bench's first ``n`` rows (the order of ``first_turns``'s prompts)."""
    from eagle3ops.benchmark import promptsets as ps

    return [str(it.get("category") or "") for it in ps.load_set(path)["items"]][:n]


def measure(a, r, group: list[tuple], cats: list[str], plain, out: dict) -> None:
    """Each draft's servers in ``group``: acceptance on all MT-bench first turns (at ``--mt-concurrency``;
    pooled, and per category with and without the prefill token) and on the held-out prompts (concurrency 8);
    with ``plain`` (:func:`plain_sample`), the server's greedy answers against the plain server's. Into ``out``."""
    from eagle3ops.benchmark.report_sections import per_category

    mt = f"mtbench_conc{a.mt_concurrency}" if a.mt_concurrency != 1 else "mtbench_batch1"
    lp, answers = plain or (None, None)
    for name, _, _, c, _ in group:
        s = r.servers.get(name)
        if not s:
            continue
        key = name.removeprefix("smol_").rsplit("_", 1)[0]
        tag = "-".join(map(str, c))

        @L.stage(name, 60)
        def acc(s=s):
            run = M.load(s.url, r.qs, a.tokens, a.mt_concurrency, r.render, cats)
            run["per_category"] = per_category([run], [])
            run.pop("per_turn", None)
            return {mt: run,
                    "heldout_conc8": L.measure(s.url, r.heldout, a.tokens, 8, r.render) if r.heldout else None}  # fmt: skip

        m = acc() or {}
        for measure_, v in m.items():
            if isinstance(v, dict) and v.get("acceptance_length"):
                out["acceptance"].setdefault(key, {})[f"{measure_}_{tag}"] = v["acceptance_length"]
        pc = (m.get(mt) or {}).get("per_category")
        if pc:
            out["per_category"].setdefault(key, {})[tag] = {
                k: {x: v[x] for x in ("acceptance_length", "acceptance_length_without_prefill", "turns")}
                for k, v in pc["categories"].items()
            }
        if lp:

            @L.stage(f"lossless_{key}_{tag}", 30)
            def lossless(s=s):
                return M.lossless_check(a, s, r.servers["smol_base"], lp, r.render, answers)

            res = lossless() or {}
            keep = ("lossless", "compared", "identical", "match_rate", "near_ties", "mismatches", "unexplained",
                    "summary")  # fmt: skip
            out["lossless"].setdefault(key, {})[tag] = {k: res.get(k) for k in keep}


def merge(sessions: list[dict]) -> dict:
    """The comparison over several sessions' ``equal.json`` (each ran some of one plan's jobs, ``--jobs``): their
    measurements together (a job measured in two sessions: the later one's, named in ``measured_twice``)."""
    plans = {json.dumps(s["plan"]["jobs"], sort_keys=True) for s in sessions}
    if len(plans) != 1:
        raise ValueError(
            "the sessions ran different plans (--ttt, --seeds, --epochs, --no-wall-clock differ)"
        )
    p, results, twice = sessions[0]["plan"], {}, []
    for s in sessions:
        twice += [k for k in s["acceptance"] if k in results]
        results.update(s["acceptance"])
    return {"plan": p, "acceptance": results, "compare": compare(results, p["jobs"], p.get("wall_clock", True)),
            "sessions": [s.get("jobs_run") for s in sessions], "measured_twice": twice}  # fmt: skip


def smoke_twin(j: dict, jobs: list[dict]) -> str:
    """The job of ours whose draft stands in for SpecForge's job ``j`` in a smoke run: ours at its TTT, seed and
    epochs, else ours at equal epochs of its TTT and seed."""
    ours = [o for o in jobs if o["trainer"] == "ours" and (o["ttt"], o["seed"]) == (j["ttt"], j["seed"])]
    same = [o for o in ours if o["epochs"] == j["epochs"]] or [o for o in ours if o["role"] == "equal_epochs"]
    return (same or ours or [{"name": ""}])[0]["name"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttt", default="3,7", help="TTT steps, each trained by both")
    ap.add_argument("--seeds", default="0,1", help="training seeds, each trained by both")
    ap.add_argument("--epochs", type=int, default=2, help="whole epochs of each (>= 2)")
    ap.add_argument("--no-wall-clock", action="store_true", help="equal epochs only")
    ap.add_argument(
        "--plan", action="store_true", help="print the plan and the sessions it needs; run nothing"
    )
    ap.add_argument("--jobs", default="", help="the plan's job names to run (comma-separated; default all)")
    ap.add_argument("--work", default="/tmp/pov-equal")
    ap.add_argument("--assets", default="/tmp/assets")
    ap.add_argument(
        "--smol-dir",
        default="",
        help="data, store, runs, drafts (default /dev/shm/pov; WORK/smol with --smoke)",
    )
    ap.add_argument("--budget-s", type=float, default=1700)
    ap.add_argument("--configs", default="3-1-4,5-1-6")
    ap.add_argument(
        "--n-conv", type=int, default=N_CONV, help="the first N regenerated conversations (one store)"
    )
    ap.add_argument(
        "--sf-lr", type=float, default=0.0, help="SpecForge's learning rate (0: its recipe's, 1e-4)"
    )
    ap.add_argument("--mt-concurrency", type=int, default=1, help="MT-bench's acceptance at this concurrency")
    ap.add_argument("--lossless-sample", type=int, default=16,
                    help="MT-bench prompts answered greedily by each draft's server and the plain one (0: off)")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="CPU dry run with the stand-in server, tiny sizes "
                    "(bench/pov_smoke.py); SpecForge's drafts stood in by copies of ours")  # fmt: skip
    ap.add_argument("--merge", nargs="+", metavar="EQUAL_JSON", default=[],
                    help="compare over the sessions' res/equal.json files (printed; runs nothing)")  # fmt: skip
    a = ap.parse_args()
    if a.merge:
        try:
            print(json.dumps(merge([json.loads(Path(f).read_text()) for f in a.merge]), indent=1))
        except (OSError, ValueError, KeyError) as e:
            print(f"pov_equal: --merge: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        p = plan([int(x) for x in a.ttt.split(",")], [int(x) for x in a.seeds.split(",")], a.epochs,
                 wall_clock=not a.no_wall_clock, configs=len(a.configs.split(",")), n_conv=a.n_conv)  # fmt: skip
    except ValueError as e:
        print(f"pov_equal: {e}", file=sys.stderr)
        return 2
    if a.plan:
        print(json.dumps(p, indent=1))
        return 0
    for k, v in FIXED.items():
        setattr(a, k, v)
    a.smol_dir = a.smol_dir or (str(Path(a.work) / "smol") if a.smoke else "/dev/shm/pov")
    if a.smoke:
        smoke(a, wide_dir=str(Path(a.smol_dir) / "wide"))
    L.W = Path(a.work)
    L.W.mkdir(parents=True, exist_ok=True)
    L.DEADLINE[0] = L.T0 + a.budget_s
    os.environ["PYTHONPATH"] = f"{L.ROOT / 'python'}:{os.environ.get('PYTHONPATH', '')}"  # the CLI's children
    L.log(f"pov_equal: {' '.join(sys.argv[1:])}")
    try:
        run(a, p)
    except Exception as e:  # the results so far are kept; the error says where it stopped
        L.log(f"FAILED: {type(e).__name__}: {e}")
        L.save("harness", {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
