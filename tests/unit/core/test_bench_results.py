"""Every raw result in bench/results is named ``<script>_<YYYY-MM-DD>_<card>[_<suffix>].<ext>``
(bench/result_name.py), so a figure in the docs says where, when and by which script it was measured; and the
bench scripts' default names follow that scheme."""

from __future__ import annotations

import datetime
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))

from result_name import PATTERN, card_name, result_name

# cards results were measured on; a result from a new card adds its name here
CARDS = {"cpu", "h100", "h200"}
# results of one-off runs whose commands are recorded in the file itself, not a bench script
ONE_OFF = {"diag_fp8", "fp8_train_demo"}


def test_every_result_file_follows_the_naming_scheme():
    scripts = {p.stem for p in (REPO / "bench").glob("*.py")} | {
        p.stem for p in (REPO / "bench").glob("*.sh")
    }
    files = sorted(p.name for p in (REPO / "bench" / "results").iterdir())
    assert len(files) > 50  # the folder is read, not an empty glob
    bad = []
    for name in files:
        m = PATTERN.match(name)
        if not m:
            bad.append(f"{name}: not <script>_<YYYY-MM-DD>_<card>[_<suffix>].json|jsonl.gz|log")
        elif m["script"] not in scripts | ONE_OFF:
            bad.append(f"{name}: no bench/{m['script']}.py")
        elif m["card"] not in CARDS:
            bad.append(f"{name}: card {m['card']!r} is none of {sorted(CARDS)}")
        else:
            datetime.date.fromisoformat(m["date"])
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize(
    ("device", "card"),
    [
        (None, "cpu"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtxpro6000"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
    ],
)
def test_card_name_from_the_device_name(device, card):
    assert card_name(device) == card


def test_result_name_dates_and_names_the_card():
    day = datetime.date(2026, 12, 7)
    assert result_name("fp8_gpu", card="h100", day=day) == "fp8_gpu_2026-12-07_h100.json"
    assert (
        result_name("extract_throughput", "w2", card="h200", day=day)
        == "extract_throughput_2026-12-07_h200_w2.json"
    )
    assert result_name("rerun").startswith(f"rerun_{datetime.datetime.now(datetime.timezone.utc).date()}_")
    with pytest.raises(ValueError, match="does not follow"):
        result_name("fp8_gpu", "two words", card="h100", day=day)


def test_bench_scripts_write_no_fixed_result_name():
    """A script that writes a result file names it through result_name, not a literal such as "rerun.json"."""
    offenders = [
        p.name
        for p in sorted((REPO / "bench").glob("*.py"))
        if re.search(rf"""["']{p.stem}(_[\w.-]*)?\.json["']""", p.read_text())
    ]
    assert offenders == []
