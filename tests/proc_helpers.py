"""Processes the tests start, wait for and look at.

:func:`run_together` runs several commands side by side that need each other (the torchrun nodes of one
rendezvous) and waits for all of them; :func:`probe_records` reads what ``eagle3ops.ddp_probe`` wrote per rank;
:func:`alive` says whether a PID still runs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


def run_together(argvs: list[list[str]], *, timeout: float = 300, **popen_kw) -> list[str]:
    """Start every argv at once (``popen_kw`` for each: ``env=``...), wait up to ``timeout`` s for each in turn
    and return their outputs (stdout and stderr together). Whatever still runs when this returns or raises is
    killed (this test's own children). Fails unless every one exited 0, with the tail of every output."""
    procs = []
    try:
        for argv in argvs:
            procs.append(
                subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen_kw
                )
            )
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # our own child, by its handle
                p.wait()
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(x[-3000:] for x in logs)
    return logs


def probe_records(*dirs: Path) -> list[dict]:
    """Every ``rank*.json`` that ``eagle3ops.ddp_probe --out DIR`` wrote in ``dirs``, in order of rank."""
    recs = (json.loads(f.read_text()) for d in dirs for f in sorted(Path(d).glob("rank*.json")))
    return sorted(recs, key=lambda d: d["rank"])
