"""How a bench result file in bench/results is named: ``<script>_<YYYY-MM-DD>_<card>[_<suffix>].<ext>``.

``script`` is the bench script that wrote it (bench/<script>.py), the date the day it ran (UTC), ``card`` the
accelerator it ran on (``h100``, ``h200``, ...) or ``cpu`` where no GPU took part, and the suffix whatever tells
two runs of one day apart (``run2``, ``w1_shm_640rows``, ``fp8``). Scripts import it from bench/ (their own
directory is on ``sys.path`` when run as ``python bench/<script>.py``):

    from result_name import result_name
    (out / result_name("fp8_gpu")).write_text(...)          # fp8_gpu_2026-12-07_h100.json on an H100
"""

from __future__ import annotations

import datetime
import re

PATTERN = re.compile(
    r"^(?P<script>[a-z0-9_]+?)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<card>[a-z0-9]+)"
    r"(?:_(?P<suffix>[A-Za-z0-9][A-Za-z0-9_.-]*?))?\.(?P<ext>json|jsonl\.gz|log)$"
)
# words of a device name that say nothing about the card: the vendor, memory size and kind, form factor
_NOISE = re.compile(r"^(nvidia|\d+gb|hbm\d*e?|gddr\d*x?|pcie|sxm\d*|nvl)$")


def card_name(device_name: str | None) -> str:
    """``cpu`` for no device; else the card's model in lower case, e.g. ``NVIDIA H100 80GB HBM3`` -> ``h100``,
    ``NVIDIA RTX PRO 6000 Blackwell Server Edition`` -> ``rtxpro6000`` (words up to the first with a digit)."""
    words = [w.lower() for w in re.split(r"[^A-Za-z0-9]+", device_name or "") if w]
    words = [w for w in words if not _NOISE.match(w)]
    for i, w in enumerate(words):
        if any(c.isdigit() for c in w):
            return "".join(words[: i + 1])
    return "".join(words) or "cpu"


def this_card() -> str:
    """The card of this machine's first CUDA device (torch's name for it), ``cpu`` without one or without torch."""
    try:
        import torch
    except ImportError:
        return "cpu"
    return card_name(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu"


def result_name(
    script: str, suffix: str | None = None, *, card: str | None = None, day: datetime.date | None = None,
    ext: str = "json",
) -> str:  # fmt: skip
    """The file name for a result of ``script`` run today (UTC) on this machine's card."""
    day = day or datetime.datetime.now(datetime.timezone.utc).date()
    name = f"{script}_{day.isoformat()}_{card or this_card()}{f'_{suffix}' if suffix else ''}.{ext}"
    if not PATTERN.match(name):
        raise ValueError(
            f"bench result name {name!r} does not follow <script>_<YYYY-MM-DD>_<card>[_<suffix>]"
        )
    return name
