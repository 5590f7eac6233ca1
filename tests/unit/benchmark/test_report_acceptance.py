"""Which acceptance length the benchmark report gives (users' pain 12: tools count it differently, per-request
means against tokens pooled over the requests): the table's value is the pooled one and says so, and the
per-request mean stands beside it. Inputs: two measured runs as ``eagle3ops benchmark-live`` writes them (the
real server path, where every request accepts alike, is tests/unit/benchmark/test_benchmark_live.py)."""

from __future__ import annotations

from eagle3ops.benchmark import loadgen
from eagle3ops.benchmark import report as rp


def _run(tok_s: float, per_request: list[float] | None, pooled: float | None) -> dict:
    return {
        "set": "mtbench",
        "format": "mtbench",
        "concurrency": 1,
        "output_tok_s": tok_s,
        "acceptance_length": pooled,
        "acceptance_per_request": per_request,
        "latency_s": {"median": 1.0},
        "turns": 2,
        "completion_tokens": 110,
    }


def test_the_report_gives_the_pooled_length_and_the_per_request_mean_and_says_which():
    # a short answer accepted well (10 tokens in 2 verify steps: 5.0), a long one poorly (100 in 50: 2.0)
    per, pooled = [5.0, 2.0], round(110 / 52, 4)
    live = {
        "with_draft": {"runs": [_run(200.0, per, pooled)]},
        "without_draft": {"runs": [_run(100.0, None, None)]},
    }
    rep = rp.build(None, live=live)
    (row,) = rep["live"]["sets"]["mtbench"]["rows"]
    assert row["acceptance_length"] == 2.1154 and row["acceptance_length_request_mean"] == 3.5
    md = rp.markdown(rep)
    assert (
        "| speed-up | acceptance with / without prefill token |" in md and "acceptance pooled over the" in md
    )
    assert "| mtbench (mtbench) | 1 | 1 | 200.0 | 100.0 | 2.000 | 2.115 / – |" in md
    # (the median of an even count is the middle two's mean: it read the upper one, 5.00, before)
    assert (
        "Acceptance per request, mtbench, concurrency 1: min 2.00, median 3.50, max 5.00, mean 3.500 (2 requests; "
        "the table's pooled value 2.115 weighs each request by its verify steps, the mean weighs each request once)"
    ) in md


def test_request_mean_is_none_without_a_verified_request():
    assert loadgen.request_mean([]) is None and loadgen.request_mean(None) is None
    assert loadgen.request_mean([2.0, 3.0, 4.5]) == 3.1667
