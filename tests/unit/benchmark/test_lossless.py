"""The lossless check's comparison logic (issue 45, item 2) on synthetic server answers: identical ids, a
divergence that is a numerical near-tie (a small logit gap), a real mismatch (a large gap), a divergence with no
log probabilities to judge it, a gap known only as a lower bound, and answers of different lengths. The parse of
SGLang's answer follows 0.5.17's tokenizer manager: ``output_ids`` at the top, ``meta_info.output_top_logprobs`` a
list per position of ``[logprob, token_id, text]``. Then the wiring: the benchmark phase's live runs against
STAND-IN servers, one of them with a planted mismatch, and the report that compares them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from eagle3ops.benchmark import lossless as ll
from eagle3ops.cli import main
from eagle3ops.serve import process as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_standin import free_port, standin_argv


def _answer(ids, tops=None):
    meta = {"completion_tokens": len(ids)}
    if tops is not None:
        meta["output_top_logprobs"] = [[[lp, tok, None] for tok, lp in pos] for pos in tops]
    return {"text": "x", "output_ids": ids, "meta_info": meta}


def _entry(ids, tops=None, *, id_=0, set_="mtbench"):
    return {"set": set_, "id": id_, **ll.sample_entry(_answer(ids, tops))}


def test_sample_entry_reads_ids_and_top_logprobs_as_sglang_returns_them():
    e = ll.sample_entry(_answer([5, 7], [[(5, -0.1), (9, -2.5)], [(7, -0.01), (3, -4.0)]]))
    assert e == {"output_ids": [5, 7], "top_logprobs": [{"5": -0.1, "9": -2.5}, {"7": -0.01, "3": -4.0}]}
    assert ll.sample_entry({"text": "x", "meta_info": {}}) == {"output_ids": None, "top_logprobs": None}


def test_identical_answers_are_lossless():
    res = ll.compare([_entry([1, 2, 3]), _entry([4, 5], id_=1)], [_entry([1, 2, 3]), _entry([4, 5], id_=1)])
    assert (res["identical"], res["compared"], res["match_rate"], res["lossless"]) == (2, 2, 1.0, True)
    assert res["divergences"] == [] and "2/2 identical (100.0 %): lossless" in ll.summary_line(res)


def test_a_near_tie_is_reported_with_its_gap_and_still_counts_as_lossless():
    # position 2: the plain server picked 30 at -0.70, 31 was at -0.74 (gap 0.04 nats); the draft server took 31
    plain = _entry([10, 20, 30, 40], [[(10, -0.1)], [(20, -0.2)], [(30, -0.70), (31, -0.74)], [(40, -0.1)]])
    spec = _entry([10, 20, 31, 41], [[(10, -0.1)], [(20, -0.2)], [(31, -0.71), (30, -0.72)], [(41, -0.1)]])
    res = ll.compare([plain], [spec])
    (d,) = res["divergences"]
    assert (d["position"], d["plain_token"], d["spec_token"], d["gap_from"]) == (2, 30, 31, "plain")
    assert d["gap"] == pytest.approx(0.04) and d["verdict"] == "near_tie"
    assert res["match_rate"] == 0.0 and res["near_ties"] == 1 and res["lossless"] is True
    line = ll.summary_line(res)
    assert "0/1 identical" in line and "at token 2: 30 vs 31, gap 0.040 nats (plain), near tie" in line


def test_a_large_gap_is_a_mismatch_and_no_logprobs_leave_it_unexplained():
    plain = _entry([1, 2, 3], [[(1, -0.1)], [(2, -0.05), (9, -3.0)], [(3, -0.1)]])
    spec = _entry([1, 9, 3])
    res = ll.compare([plain], [spec])
    assert res["divergences"][0]["verdict"] == "mismatch" and res["divergences"][0]["gap"] == pytest.approx(
        2.95
    )
    assert res["lossless"] is False and res["mismatches"] == 1
    bare = ll.compare([_entry([1, 2])], [_entry([1, 3])])
    assert bare["divergences"][0]["verdict"] == "unexplained" and bare["divergences"][0]["gap"] is None
    assert bare["lossless"] is False and "without log probabilities to judge" in ll.summary_line(bare)


def test_a_token_outside_the_top_list_gives_a_lower_bound_from_the_lists_lowest():
    # the speculative token 8 is not among the plain server's top 2: its logprob is at most -3.0, so the gap is
    # at least 3.0 - 0.1 = 2.9: a mismatch, said as a bound
    plain = _entry([7], [[(7, -0.1), (6, -3.0)]])
    d = ll.compare([plain], [_entry([8])])["divergences"][0]
    assert (
        d["gap_from"] == "plain_lower_bound" and d["gap"] == pytest.approx(2.9) and d["verdict"] == "mismatch"
    )
    # a bound below the tie gap proves nothing either way
    close = ll.compare([_entry([7], [[(7, -0.1), (6, -0.2)]])], [_entry([8])])["divergences"][0]
    assert close["verdict"] == "unexplained"


def test_different_lengths_and_different_samples():
    res = ll.compare([_entry([1, 2, 3])], [_entry([1, 2])])
    d = res["divergences"][0]
    assert (d["position"], d["plain_token"], d["spec_token"]) == (2, 3, None)
    assert ll.first_divergence([1, 2], [1, 2]) is None and ll.first_divergence([1], [2]) == 0
    with pytest.raises(ValueError, match="not the same prompts"):
        ll.compare([_entry([1], id_=0)], [_entry([1], id_=1)])
    none = ll.compare([{"set": "s", "id": 0, "output_ids": None}], [_entry([1], set_="s")])
    assert none["compared"] == 0 and none["lossless"] is False and "not possible" in ll.summary_line(none)


# ---------------------------------------------------------------------------------------------------- wiring

MT_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def _start(run_dir, name, model_dir, *extra, draft=None) -> str:
    """STAND-IN SGLang server (tests/fixtures/sglang_standin_server.py, serve mode) through the real process
    launcher; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = standin_argv(model_dir, port, draft, "--standin-step-seconds", "0.004", *extra)
    sp.start(run_dir, name, sp.make_spec(argv, {}, url), health_timeout=30, interval=0.1)
    return url


def test_the_benchmark_phase_compares_both_servers_greedy_ids_and_finds_a_planted_mismatch(tmp_path, capsys):
    """benchmark-live against three STAND-IN servers (no GPU here: real processes and HTTP, stand-in tokens):
    the plain one (runner-up 0.05 nats below each token), one with the draft, and one with the draft that
    answers the runner-up from token 3 on (planted). Per-category sample, 2 interleaved rounds, 2 concurrencies;
    the report gives the match rate, the first divergence with its gap (a near-tie here), acceptance per
    category with and without the prefill token, and the batch curve."""
    mt = tmp_path / "question.jsonl"
    rows = [
        {
            "question_id": 81 + 10 * j + i,
            "category": c,
            "turns": [f"A {c} question number {i}, please answer."],
        }
        for j, c in enumerate(MT_CATEGORIES)
        for i in range(2)
    ]
    mt.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.json").write_text("{}")  # the stand-in's "model" and "draft" directory
    run_dir = tmp_path / "run"
    names = ("o", "w", "d")
    try:
        urls = {
            "o": _start(run_dir, "o", tmp_path, "--standin-top-gap", "0.05"),
            "w": _start(run_dir, "w", tmp_path, draft=tmp_path),
            "d": _start(run_dir, "d", tmp_path, "--standin-diverge-at", "3", draft=tmp_path),
        }
        common = ["benchmark-live", "--set", f"mtbench={mt}", "--concurrency", "1", "4", "--rounds", "2",
                  "--per-category", "1", "--seed", "3", "--lossless-sample", "4", "--max-new-tokens", "12", "--json"]  # fmt: skip
        outs = {k: tmp_path / f"live_{k}.json" for k in names}
        for k in names:
            label = "without_draft" if k == "o" else "with_draft"
            assert main([*common, "--url", urls[k], "--out", str(outs[k]), "--label", label]) == 0
    finally:
        for k in names:
            sp.stop(run_dir, k, grace=10)
    capsys.readouterr()
    w = json.loads(outs["w"].read_text())
    assert w["sampled"]["mtbench"]["counts"] == {c: 1 for c in MT_CATEGORIES}
    assert [r["round"] for r in w["runs"]] == [1, 1, 2, 2] and [r["concurrency"] for r in w["runs"]] == [
        1,
        4,
        1,
        4,
    ]
    assert w["lossless"]["sample"] == 4 and all(len(it["output_ids"]) == 12 for it in w["lossless"]["items"])
    assert w["server"]["speculative_num_steps"] == 3 and w["server"]["attention_backend"] == "standin"

    def report(with_key):
        out = tmp_path / f"r_{with_key}"
        argv = ["benchmark-report", "--out-dir", str(out), "--live-with", str(outs[with_key]),
                "--live-without", str(outs["o"]), "--json"]  # fmt: skip
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["report"]["live"], out

    live, out = report("w")
    ll = live["lossless"]
    assert (ll["identical"], ll["compared"], ll["match_rate"], ll["lossless"]) == (4, 4, 1.0, True)
    assert ll["servers"]["dtype"]["same"] is True and ll["servers"]["attention_backend"]["same"] is True
    st = live["sets"]["mtbench"]
    pc = st["per_category"]["categories"]
    assert set(pc) == set(MT_CATEGORIES) and st["per_category"]["concurrency"] == 1
    # 12 tokens in round(12 / 2.5) = 5 verify steps: 2.4 with the prefill token, 11 / 5 = 2.2 without it
    assert {c["acceptance_length"] for c in pc.values()} == {2.4}
    assert {c["acceptance_length_without_prefill"] for c in pc.values()} == {2.2}
    assert all(c["speedup"] > 1.0 for c in pc.values())
    row = st["rows"][0]
    assert (
        row["rounds"] == 2
        and len(row["with_draft_tok_s_rounds"]) == 2
        and row["ratio_min"] <= row["ratio_max"]
    )
    b = st["batch"]
    assert [p["concurrency"] for p in b["points"]] == [1, 4] and b["setting"] == "3/1/4"
    assert b["crossover"]["where"] in ("beyond the range", "interpolated", "below the range")
    assert [r["concurrency"] for r in b["recommendation"]] == [1, 4]
    md = (out / "report.md").read_text()
    assert "4/4 identical (100.0 %): lossless" in md and "| humanities | 2.400 | 2.200 |" in md
    assert "Batch curve, mtbench, draft 3/1/4" in md and "Recommended per concurrency: c=1:" in md

    live, out = report("d")  # the planted mismatch
    ll = live["lossless"]
    assert (ll["identical"], ll["match_rate"], ll["near_ties"], ll["mismatches"]) == (0, 0.0, 4, 0)
    d = ll["divergences"][0]
    assert d["position"] == 3 and d["spec_token"] == d["plain_token"] + 1
    assert d["gap"] == pytest.approx(0.05) and d["gap_from"] == "plain" and d["verdict"] == "near_tie"
    md = (out / "report.md").read_text()
    assert "0/4 identical (0.0 %); every divergence a numerical near-tie" in md and "gap 0.050 nats" in md


def test_the_report_refuses_to_compare_samples_of_different_lengths_and_says_when_the_check_was_off():
    from eagle3ops.benchmark import report_sections as rs

    def side(n, items):
        return {"runs": [], "lossless": {"sample": len(items or []), "max_new_tokens": n, "items": items}}

    items = [_entry([1, 2])]
    assert (
        "different lengths (12 / 16 tokens)"
        in rs.lossless_check({"with_draft": side(16, items), "without_draft": side(12, items)})["error"]
    )
    off = {"with_draft": {"runs": [], "lossless": None}, "without_draft": {"runs": [], "lossless": None}}
    assert rs.lossless_check(off) == {"off": True}
    assert (
        rs.lossless_check({"with_draft": {"runs": []}, "without_draft": {"runs": []}}) is None
    )  # older results
