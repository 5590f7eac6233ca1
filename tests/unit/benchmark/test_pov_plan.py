"""bench/proof_of_value.py's plan of our trainer's epochs (issue #31): the run is planned from measured figures,
so a plan that does not fit its budget says so before any training (run 4's 4 epochs needed ~666 s for 650 s;
run 5 was planned at run 4's 8.25 steps/s, ran at 7.48 and stopped at 92 % of its fifth epoch). And
bench/pov_equal.py's plan of the equal-footing comparison (issue 45): each job's time from the same measured
rates, the device sessions it needs, and ours / SpecForge at equal epochs and equal wall-clock."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import pov_equal
import proof_of_value


def _args(**kw) -> Namespace:
    base = {
        "epochs": 5,
        "ours_steps_per_epoch": 1266,
        "ours_startup_s": 69.0,
        "ours_rate": 0.0,
        "side_by_side": False,
    }
    return Namespace(**{**base, **kw})


def test_the_plan_is_startup_plus_steps_over_the_measured_rate():
    plan = proof_of_value.ours_plan(_args(ours_rate=7.48), 840.0)
    assert plan["seconds_needed"] == round(69.0 + 5 * 1266 / 7.48, 1)
    assert plan["fits"] is False  # 915.2 s: run 5's 840 s budget was short at its measured rate
    assert proof_of_value.ours_plan(_args(ours_rate=7.48), 920.0)["fits"] is True


def test_the_default_rate_is_the_slowest_measured_alone_and_the_side_by_side_one_beside_specforge():
    alone = proof_of_value.ours_plan(_args(), 1000.0)
    beside = proof_of_value.ours_plan(_args(side_by_side=True), 1000.0)
    assert alone["steps_per_s"] == 7.48
    assert beside["steps_per_s"] == 5.2
    assert beside["seconds_needed"] > alone["seconds_needed"]


# bench/pov_equal.py (issue 45, item 1): the equal-footing comparison's plan and its comparison, synthetic inputs


def test_the_equal_footing_plan_times_each_job_from_the_measured_rates():
    assert pov_equal.rate("ours", 3) == {"steps_per_s": 7.48, "measured": True, "assumed": False}
    # more TTT steps: the rate falls in proportion (assumed, said so); fewer: the measured rate, not faster
    assert pov_equal.rate("ours", 7) == {
        "steps_per_s": round(7.48 * 3 / 7, 3),
        "measured": False,
        "assumed": True,
    }
    assert pov_equal.rate("specforge", 3)["steps_per_s"] == 5.67
    p = pov_equal.plan([3], [0], 2)
    jobs = {j["name"]: j for j in p["jobs"]}
    assert jobs["ours_ttt3_s0_e2"]["seconds"] == round(69 + 2 * 1266 / 7.48, 1)  # 407.5
    assert jobs["specforge_ttt3_s0_e2"]["seconds"] == round(86 + 2 * 1755 / 5.67, 1)  # 705.0
    # equal wall-clock: ours (faster) gets the whole epochs that fit SpecForge's 705 s: (705 - 69) x 7.48 / 1266
    wall = jobs["ours_ttt3_s0_e3"]
    assert wall["role"] == "equal_wall" and wall["budget_of"] == "specforge_ttt3_s0_e2"
    # 2,979 s of device time: it does not fit one 1,800 s session; every job fits one of its own
    assert p["fits_one_session"] is False and p["longer_than_a_session"] == [] and len(p["sessions"]) == 2
    assert sorted(n for s in p["sessions"] for n in s["jobs"]) == sorted(jobs)
    assert all(s["seconds"] <= pov_equal.SESSION_S for s in p["sessions"])
    # at TTT 7 ours is the slower: SpecForge fits no third epoch in ours' time, so no extra job
    p7 = pov_equal.plan([7], [0, 1], 2)
    assert {j["role"] for j in p7["jobs"]} == {"equal_epochs"} and len(p7["jobs"]) == 4
    with pytest.raises(ValueError, match="at least 2"):
        pov_equal.plan([3], [0], 1)


def test_a_smaller_store_shortens_every_epoch_and_the_extraction_in_proportion():
    """A session that fits both trainers' full schedules: the first 4,000 conversations, epochs and data
    time scaled from the measured figures; the job names stay, the plan records its store."""
    full, small = pov_equal.plan([3], [0], 2), pov_equal.plan([3], [0], 2, n_conv=4000)
    assert small["steps_per_epoch"] == {
        "ours": round(1266 * 4000 / 15600),
        "specforge": round(1755 * 4000 / 15600),
    }
    jobs = {j["name"]: j for j in small["jobs"]}
    assert jobs["ours_ttt3_s0_e2"]["seconds"] == round(69 + 2 * 325 / 7.48, 1)
    assert jobs["specforge_ttt3_s0_e2"]["seconds"] == round(86 + 2 * 450 / 5.67, 1)
    # equal wall-clock: ours fits 4 whole epochs of 325 steps in SpecForge's 244.7 s
    assert jobs["ours_ttt3_s0_e4"]["budget_of"] == "specforge_ttt3_s0_e2"
    assert small["fits_one_session"] is True and full["fits_one_session"] is False
    assert small["n_conv"] == 4000 and small["device_s"] < full["device_s"]
    for bad in (0, 15601):
        with pytest.raises(ValueError, match="--n-conv"):
            pov_equal.plan([3], [0], 2, n_conv=bad)


def test_the_comparison_gives_ours_over_specforge_at_equal_epochs_and_equal_wall_clock_per_seed():
    p = pov_equal.plan([3], [0, 1], 2)
    res = {
        "ours_ttt3_s0_e2": {"mt": 2.4},
        "ours_ttt3_s1_e2": {"mt": 2.2},
        "specforge_ttt3_s0_e2": {"mt": 2.0},
        "specforge_ttt3_s1_e2": {"mt": 2.2},
        "ours_ttt3_s0_e3": {"mt": 2.5},
        "ours_ttt3_s1_e3": {"mt": 2.64},
    }
    c = pov_equal.compare(res, p["jobs"])["ttt3"]["mt"]
    assert c["equal_epochs"]["ratio"] == [1.2, 1.0] and c["equal_epochs"]["epochs"] == (2, 2)
    assert c["equal_epochs"]["ratio_stats"] == {"mean": 1.1, "min": 1.0, "max": 1.2, "n": 2}
    assert c["equal_wall_clock"]["ratio"] == [1.25, 1.2] and c["equal_wall_clock"]["epochs"] == (3, 2)
    # a seed whose SpecForge draft was not measured drops out of the ratios instead of failing
    del res["specforge_ttt3_s1_e2"]
    assert pov_equal.compare(res, p["jobs"])["ttt3"]["mt"]["equal_epochs"]["ratio"] == [1.2]


def test_the_pov_measurements_run_against_stand_in_servers(tmp_path):
    """bench/pov_measure.py's issue-45 measurements against two STAND-IN SGLang servers (no GPU here: real
    processes and HTTP, stand-in tokens): the stratified speed prompts from an 8-category question.jsonl, the
    interleaved rounds with acceptance with/without the prefill token per category, the batch curve's points, and
    the lossless check finding the planted mismatch (a runner-up 3 nats below: a real mismatch)."""
    import json
    from types import SimpleNamespace

    import pov_measure
    import sglang_live as L
    from eagle3ops.serve import process as sp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from serve_standin import free_port, standin_argv

    cats = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
    rows = [{"question_id": 81 + 10 * j + i, "category": c, "turns": [f"Please answer {c} question {i}."]}
            for j, c in enumerate(cats) for i in range(3)]  # fmt: skip
    (tmp_path / "mtbench_question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.json").write_text("{}")
    L.W = tmp_path / "work"
    a = SimpleNamespace(assets=str(tmp_path), per_category=1, seed=0, rounds=2, tokens=10, curve="1,2",
                        curve_rounds=2, lossless_sample=4)  # fmt: skip
    urls = {}
    try:
        for name, draft, extra in (("o", None, ()), ("d", tmp_path, ("--standin-diverge-at", "0"))):
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            argv = standin_argv(tmp_path, port, draft, "--standin-step-seconds", "0.002", *extra)
            sp.start(
                tmp_path / "run", name, sp.make_spec(argv, {}, urls[name]), health_timeout=30, interval=0.1
            )
        base, spec = SimpleNamespace(url=urls["o"]), SimpleNamespace(url=urls["d"])
        sub, cs = pov_measure.speed_prompts(a)
        assert sorted(cs) == sorted(cats) and len(sub) == 8
        r = pov_measure.rounds(a, spec, base, sub, None, cs)
        assert (
            len(r["with_tok_s"]) == 2
            and r["acceptance"] == [2.5, 2.5]
            and r["acceptance_without_prefill"] == [2.25, 2.25]
        )
        assert set(r["per_category"]["categories"]) == set(cats)
        pts = pov_measure.batch_curve(a, spec, base, sub, None)
        assert [p["concurrency"] for p in pts] == [1, 2] and all(p["rounds"] == 2 for p in pts)
        lp = pov_measure.lossless_prompts(sub, a.lossless_sample)
        assert [p["id"] for p in lp] == [0, 2, 4, 6]  # spread over the categories
        from eagle3ops.benchmark.loadgen import greedy_sample

        plain = greedy_sample(base.url, lp, max_new_tokens=a.tokens)
        res = pov_measure.lossless_check(a, spec, base, lp, None, plain)
        assert res["identical"] == 0 and res["mismatches"] == 4 and res["lossless"] is False
        assert res["divergences"][0]["position"] == 0 and res["divergences"][0]["gap"] == pytest.approx(3.0)
    finally:
        for name in urls:
            sp.stop(tmp_path / "run", name, grace=10)


# what bench/pov_equal.py's CPU dry run (--smoke, bench/results/pov_equal_2026-12-07_cpu_smoke.json) showed can
# break with no GPU to find it: the flags of every job, the comparison of the results' shape, several sessions


def test_every_equal_footing_job_s_train_flags_are_accepted_by_the_train_command_s_parser():
    """Each job of the default plan (TTT 3 and 7, seeds 0 and 1, both trainers, equal wall-clock) with the run's
    fixed settings and with the smoke sizes: its ``eagle3ops train`` argv parses (the parser only, no training)
    into its TTT steps, seed, epochs, trainer and aux layer ids; SpecForge's recipe departures parse too."""
    from eagle3ops.cli import build_parser
    from pov_smoke import SMOKE_SIZES

    p = pov_equal.plan([3, 7], [0, 1], 2)
    assert len(p["jobs"]) == 10
    parser = build_parser(json_errors=True)
    # sf_lr: --sf-lr's default (0: SpecForge's own recipe), then a departure from it
    base = {**pov_equal.FIXED, "sf_lr": 0.0}
    for settings in (base, {**base, **SMOKE_SIZES, "sf_fc_norm": True, "sf_lr": 1e-4}):
        a = Namespace(**settings)
        for j in p["jobs"]:
            flags = pov_equal._train_flags(a, j)
            argv = proof_of_value.train_argv(a, Path("d"), Path("m"), Path("r"), flags, j["seconds"] * 1.3)
            got = parser.parse_args([*argv, "--json"])
            assert (got.ttt_steps, got.seed, got.epochs) == (j["ttt"], j["seed"], j["epochs"]), j["name"]
            assert got.trainer == ("specforge" if j["trainer"] == "specforge" else "speculators"), j["name"]
            assert got.layer_ids == list(proof_of_value.LAYER_IDS)
            assert got.draft_vocab_size == a.draft_vocab and got.device == (
                "cpu" if a.device == "cpu" else "gpu"
            )
            if j["trainer"] == "specforge" and a.sf_fc_norm:
                assert got.specforge_fc_norm is True and got.lr == 1e-4


def _smoke_results(jobs: list[dict]) -> dict:
    """The smoke run's shape of ``acceptance``: every job's draft measured on MT-bench at batch 1 and held-out at
    concurrency 8, at both settings (made-up values, distinct per job)."""
    return {j["name"]: {f"{m}_{c}": round(2.0 + 0.1 * i + 0.01 * k, 3)
                        for k, (m, c) in enumerate((m, c) for m in ("mtbench_batch1", "heldout_conc8")
                                                   for c in ("3-1-4", "5-1-6"))}
            for i, j in enumerate(jobs)}  # fmt: skip


def test_the_comparison_of_the_smoke_run_s_shape_gives_both_ratios_at_each_ttt():
    """TTT 3 has an equal wall-clock job (ours, 3 epochs in SpecForge's 2 epochs' time); at TTT 7 no whole epoch
    more fits (the dry run's equal.json had no equal wall-clock ratio there): the equal-epochs pair is also the
    equal wall-clock one. ``--no-wall-clock`` gives equal epochs only."""
    p = pov_equal.plan([3, 7], [0], 2)
    res = _smoke_results(p["jobs"])
    c = pov_equal.compare(res, p["jobs"], p["wall_clock"])
    measures = {f"{m}_{s}" for m in ("mtbench_batch1", "heldout_conc8") for s in ("3-1-4", "5-1-6")}
    assert sorted(c) == ["ttt3", "ttt7"]
    for ttt in c.values():
        assert set(ttt) == measures
        assert all(set(v) == {"equal_epochs", "equal_wall_clock"} for v in ttt.values())
    m = "mtbench_batch1_3-1-4"
    t3 = c["ttt3"][m]
    assert t3["equal_wall_clock"]["epochs"] == (3, 2) and t3["equal_epochs"]["epochs"] == (2, 2)
    assert t3["equal_wall_clock"]["ratio"] == [
        round(res["ours_ttt3_s0_e3"][m] / res["specforge_ttt3_s0_e2"][m], 4)
    ]
    t7 = c["ttt7"][m]
    assert (
        t7["equal_wall_clock"]["ratio"]
        == t7["equal_epochs"]["ratio"]
        == [round(res["ours_ttt7_s0_e2"][m] / res["specforge_ttt7_s0_e2"][m], 4)]
    )
    p0 = pov_equal.plan([3, 7], [0], 2, wall_clock=False)
    c0 = pov_equal.compare(res, p0["jobs"], p0["wall_clock"])
    assert all(set(v) == {"equal_epochs"} for ttt in c0.values() for v in ttt.values())


def test_sessions_that_each_ran_some_jobs_are_compared_together():
    """The plan does not fit one device session: each session's equal.json holds only the jobs it ran, and its
    own comparison lacks the other side; merged, both sides are there. Different plans are refused."""
    p = pov_equal.plan([3], [0], 2)
    res = _smoke_results(p["jobs"])
    s1 = {"plan": p, "acceptance": {"specforge_ttt3_s0_e2": res["specforge_ttt3_s0_e2"]}, "jobs_run": ["sf"]}
    s2 = {
        "plan": p,
        "acceptance": {k: v for k, v in res.items() if k.startswith("ours")},
        "jobs_run": ["ours"],
    }
    assert pov_equal.compare(s1["acceptance"], p["jobs"]) == {}
    m = pov_equal.merge([s1, s2])
    assert set(m["compare"]["ttt3"]["mtbench_batch1_3-1-4"]) == {"equal_epochs", "equal_wall_clock"}
    assert m["measured_twice"] == [] and m["sessions"] == [["sf"], ["ours"]]
    assert pov_equal.merge([s1, s1])["measured_twice"] == ["specforge_ttt3_s0_e2"]
    with pytest.raises(ValueError, match="different plans"):
        pov_equal.merge([s1, {**s2, "plan": pov_equal.plan([3], [1], 2)}])
