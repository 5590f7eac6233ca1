"""tests/run_cache.py: what one run builds once for all its xdist workers. Real processes racing on a real
directory: the builder runs once, every worker gets the same finished path, and a crashed build is redone."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import run_cache


class _Factory:
    """The one method of pytest's TempPathFactory that run_cache uses."""

    def __init__(self, base: Path):
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


def _worker(base: str, worker: str, log: str, out: str) -> None:
    os.environ["PYTEST_XDIST_WORKER"] = worker

    def build(path: Path) -> None:
        with open(log, "a") as f:
            f.write(f"{worker}\n")
        time.sleep(0.5)  # long enough for the other workers to be waiting on the lock
        path.mkdir()
        (path / "thing.txt").write_text("built\n")

    got = run_cache.build_once(_Factory(Path(base) / f"popen-{worker}"), "thing", build)
    Path(out).write_text(json.dumps({"path": str(got), "content": (got / "thing.txt").read_text()}))


def test_parallel_workers_build_once_and_share_the_result(tmp_path):
    log = tmp_path / "builds.log"
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_worker, args=(str(tmp_path), f"gw{i}", str(log), str(tmp_path / f"out{i}.json")))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(log.read_text().splitlines()) == 1  # one worker built it, the others found it
    outs = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(3)]
    assert {o["path"] for o in outs} == {str(tmp_path / "e3t-run-shared" / "thing")}
    assert {o["content"] for o in outs} == {"built\n"}


def test_a_failed_build_is_redone_by_the_next_caller(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # a serial run: the base temp dir itself
    f = _Factory(tmp_path)

    def broken(path: Path) -> None:
        path.mkdir()
        (path / "half").write_text("x")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError):
        run_cache.build_once(f, "thing", broken)
    calls = []

    def good(path: Path) -> None:
        calls.append(path)
        path.mkdir()
        (path / "whole").write_text("y")

    got = run_cache.build_once(f, "thing", good)
    assert got == tmp_path / "e3t-run-shared" / "thing" and calls == [got]
    assert sorted(p.name for p in got.iterdir()) == ["whole"]  # the half-built leftovers are gone
    assert run_cache.build_once(f, "thing", good) == got and len(calls) == 1
