"""The batch curve (issue 45, item 4) and the stratified speed prompts (item 3) on synthetic inputs: a point's
medians and per-round spread, the crossover interpolated between the measured points or said to be beyond /
below the range, the setting recommended per concurrency (or off), and the MT-bench sampler: N per category,
seeded, deterministic, in the file's order."""

from __future__ import annotations

import json
import math

import pytest
from eagle3ops.benchmark import curve
from eagle3ops.benchmark import promptsets as ps


def _curve(speedups: dict[int, float], spread: float = 0.0) -> list[dict]:
    return [
        {"concurrency": c, "speedup": s, "ratio_min": s - spread, "ratio_max": s + spread}
        for c, s in speedups.items()
    ]


def test_a_point_is_the_ratio_of_the_medians_with_the_per_round_spread():
    p = curve.point(4, [300.0, 310.0, 290.0], [200.0, 205.0, 100.0])
    assert p["with_median"] == 300.0 and p["without_median"] == 200.0 and p["speedup"] == 1.5
    assert p["ratio_min"] == 1.5 and p["ratio_max"] == 2.9 and p["rounds"] == 3  # 300/200, 290/100
    with pytest.raises(ValueError, match="concurrency 4: no rounds"):
        curve.point(4, [], [1.0])


def test_the_crossover_is_interpolated_in_log2_concurrency():
    x = curve.crossover(_curve({1: 1.8, 4: 1.4, 16: 1.2, 64: 0.8}))
    # between 16 (1.2) and 64 (0.8): half way in log2 -> 2 ** 5 = 32
    assert x["where"] == "interpolated" and x["between"] == [16, 64] and x["at"] == 32.0
    assert x["rises_again"] is False
    y = curve.crossover(_curve({16: 1.1, 1: 1.9, 64: 0.95, 4: 1.5}))  # any order
    assert y["between"] == [16, 64] and y["at"] == round(2 ** (4 + (0.1 / 0.15) * 2), 2)
    assert math.isclose(y["at"], 2 ** (4 + 4 / 3), rel_tol=1e-3)


def test_beyond_and_below_the_range():
    assert curve.crossover(_curve({1: 1.8, 64: 1.05})) == {
        "at": None,
        "where": "beyond the range",
        "above": 64,
    }
    assert curve.crossover(_curve({1: 0.9, 4: 0.8})) == {"at": None, "where": "below the range", "below": 1}
    assert curve.crossover([])["where"] == "not measured"


def test_the_recommendation_per_concurrency_is_the_best_setting_or_off():
    rec = curve.recommend(
        {
            "3/1/4": _curve({1: 1.70, 16: 1.10, 64: 0.90}, 0.02),
            "5/1/6": _curve({1: 1.86, 16: 1.02, 64: 0.80}, 0.03),
        }
    )
    assert [(r["concurrency"], r["setting"]) for r in rec] == [(1, "5/1/6"), (16, "3/1/4"), (64, "off")]
    assert "serve without the draft" in rec[2]["why"] and rec[2]["best_setting"] == "3/1/4"
    # a median above 1.0 with a round below it does not pay in every round: off
    shaky = curve.recommend({"3/1/4": _curve({8: 1.01}, 0.05)})
    assert shaky[0]["setting"] == "off" and "lowest round 0.960" in shaky[0]["why"]


def _mtbench(tmp_path, per=10):
    rows = [
        {"question_id": 81 + 10 * j + i, "category": cat, "turns": [f"{cat} question {i}", "again"]}
        for j, cat in enumerate(ps.MTBENCH_CATEGORIES)
        for i in range(per)
    ]
    p = tmp_path / "question.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ps.load_set(p)["items"]


def test_the_stratified_sample_takes_n_of_every_category_seeded_and_in_file_order(tmp_path):
    items = _mtbench(tmp_path)
    s = ps.stratified(items, 3, seed=0)
    assert s["counts"] == {c: 3 for c in ps.MTBENCH_CATEGORIES} and len(s["items"]) == 24
    assert s["missing"] == [] and s["short"] == {}
    lines = [it["line"] for it in s["items"]]
    assert lines == sorted(lines)  # the file's order
    assert [it["id"] for it in ps.stratified(items, 3, seed=0)["items"]] == [it["id"] for it in s["items"]]
    other = ps.stratified(items, 3, seed=1)["items"]
    assert [it["id"] for it in other] != [it["id"] for it in s["items"]]
    # a category's pick does not depend on the others: dropping "math" leaves "coding"'s choice as it was
    no_math = ps.stratified([it for it in items if it["category"] != "math"], 3, seed=0)
    assert no_math["missing"] == ["math"]
    assert [it["id"] for it in no_math["items"] if it["category"] == "coding"] == [
        it["id"] for it in s["items"] if it["category"] == "coding"
    ]


def test_a_short_category_gives_what_it_has_and_bad_requests_are_refused(tmp_path):
    items = _mtbench(tmp_path, per=2)
    s = ps.stratified(items, 3, seed=0)
    assert s["short"] == {c: 2 for c in ps.MTBENCH_CATEGORIES} and len(s["items"]) == 16
    with pytest.raises(ps.PromptSetError, match="per_category 0"):
        ps.stratified(items, 0)
    with pytest.raises(ps.PromptSetError, match="no item has a category"):
        ps.stratified([{"id": 1, "category": None, "turns": ["x"], "line": 1}], 3)
