"""Progress of a long run, as one line an Ansible poll shows (issue #32): done/total, the rate, an ETA, the log.

The long phases run detached from the task that started them (extract as an Ansible async job, train under
systemd-run or setsid); each poll of the role asks a read-only command how far the run is, and that command
describes it with :func:`describe`. Rates come from what the run left on disk (the manifests' file times, the
trainer's metrics), never from the poller's own clock, so two polls agree and a fresh poller knows as much as
an old one. Standard library only; imports nothing of eagle3ops (the modules import it on the target as
``module_utils/eagle3ops_progress.py``, for :func:`async_job_finished`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence


def rate_per_second(stamps: Sequence[float]) -> float | None:
    """Units per second from the times (seconds) at which units were finished, in any order: (n - 1) units
    over the span from the first to the last. None with fewer than two or no time between them (unknown yet)."""
    if len(stamps) < 2:
        return None
    span = max(stamps) - min(stamps)
    return (len(stamps) - 1) / span if span > 0 else None


def hms(seconds: float | None) -> str:
    """``1:02:03`` (``4d 1:02:03`` past a day); ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = round(seconds)
    days, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{days}d " if days else "") + f"{h}:{m:02d}:{s:02d}"


def describe(
    what: str,
    done: int,
    total: int | None,
    unit: str,
    rate: float | None,
    log: str | None,
    *,
    extra: str = "",
) -> dict:
    """The fields of a run's progress and its one line::

        extract: 312/867 rows (36%), 4.1 rows/s, ETA 0:02:15; log: /data/eagle3/data.extract.log

    ``total`` None: the total is not known yet (the line says so, no ETA); ``rate`` None: not measured yet."""
    left = None if total is None else max(total - done, 0)
    eta = (left / rate) if (rate and left is not None) else (0.0 if left == 0 else None)
    pct = f" ({100 * done // total}%)" if total else ""
    of = f"/{total} {unit}{pct}" if total is not None else f" {unit} (of a total not known yet)"
    speed = f"{rate:.3g} {unit}/s" if rate else f"{unit}/s not measured yet"
    line = f"{what}: {done}{of}, {speed}, ETA {hms(eta)}"
    line += f"; {extra}" if extra else ""
    line += f"; log: {log}" if log else ""
    return {
        "done": done,
        "total": total,
        "unit": unit,
        "rate_per_s": None if rate is None else round(rate, 4),
        "eta_s": None if eta is None else round(eta, 1),
        "log": log,
        "line": line,
    }


def async_job_finished(path):
    """Whether the Ansible async job whose results file is ``path`` has ended, read as ansible.builtin.async_status
    reads it: the wrapper writes ``started`` into the file while the job runs and replaces the file by the
    module's own result at the end. A file not written yet, or caught mid-write, is a job still running."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return bool(isinstance(data, dict) and ("started" not in data or data.get("finished")))
