"""Processes the tests start, wait for and look at.

:func:`run_together` runs several commands side by side that need each other (the torchrun nodes of one
rendezvous) and waits for all of them; :func:`probe_records` reads what ``eagle3ops.train.ddp_probe`` wrote per rank;
:func:`alive` says whether a PID still runs; :func:`cli_imports` runs the ``eagle3ops`` console script and says
which packages it imported (a command that needs no torch must not pay seconds of CPU for it); :func:`run_infra`
runs testinfra checks of tests/infra against a host, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = frozenset({"torch", "transformers", "datasets", "numpy", "safetensors"})


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
    """Every ``rank*.json`` that ``eagle3ops.train.ddp_probe --out DIR`` wrote in ``dirs``, in order of rank."""
    recs = (json.loads(f.read_text()) for d in dirs for f in sorted(Path(d).glob("rank*.json")))
    return sorted(recs, key=lambda d: d["rank"])


def cli_imports(*args, **run_kw) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``eagle3ops ARGS`` (the venv's console script) under ``python -X importtime``: the finished process (stdout
    and stderr as text; the import lines are taken out of stderr) and the top-level packages it imported.
    ``HEAVY & imported`` is what a cheap command must leave empty."""
    script = Path(sys.executable).parent / "eagle3ops"
    p = subprocess.run(
        [sys.executable, "-X", "importtime", script, *args], capture_output=True, text=True, **run_kw
    )
    lines = p.stderr.splitlines()
    imported = {ln.split("|")[-1].strip().split(".")[0] for ln in lines if ln.startswith("import time:")}
    p.stderr = "\n".join(ln for ln in lines if not ln.startswith("import time:"))
    return p, imported


def run_infra(*args: str, **run_kw) -> subprocess.CompletedProcess:
    """``pytest -q ARGS`` (a tests/infra file or test and its ``--hosts=...``) in a child pytest run from the
    repository, as a user runs the testinfra checks; its output captured, its exit code left to the caller."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
        **run_kw,
    )
