"""bench/proof_of_value.py's plan of our trainer's epochs (issue #31): the run is planned from measured figures,
so a plan that does not fit its budget says so before any training (run 4's 4 epochs needed ~666 s for 650 s;
run 5 was planned at run 4's 8.25 steps/s, ran at 7.48 and stopped at 92 % of its fifth epoch)."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
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
