"""Shared helpers and fixtures of the fault-injection suite (issue #10): a fork server for fast ``eagle3ops`` runs, a tiny
deterministic target, a prepared dataset and its uninterrupted reference extraction, and the suite's figures.

Set ``E3_RELIABILITY_REPORT=path.json`` to get the figures (faults injected, runs resumed, bytes compared,
files lost) of a run as JSON: docs/reliability.md quotes them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import run_cache

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE / "faulthook"))
sys.path.insert(0, str(REPO / "tests" / "unit"))  # tinymodels

from store_helpers import hs_files  # noqa: F401 - the suite imports it from here
from tinymodels import build_prepared_dataset

# 40 rows of 3..120 tokens, fixed by the seed
LENGTHS = [random.Random(10).randint(3, 120) for _ in range(40)]
# byte-identical output needs identical batch shapes on every run (see test_extract_killed.py)
EXTRACT_ARGS = ["--max-batch-size", "1", "--json", "--no-progress"]
ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

EAGLE3OPS = str(Path(sys.executable).parent / "eagle3ops")  # the entry point, as a user runs it

FIGURES: dict = {
    "faults_injected": 0,
    "runs_resumed": 0,
    "files_compared": 0,
    "bytes_compared": 0,
    "files_lost": 0,
    "bad_inputs_refused": 0,
}


@pytest.fixture(scope="session")
def figures():
    yield FIGURES
    out = os.environ.get("E3_RELIABILITY_REPORT")
    if out:
        Path(out).write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")


class RunResult:
    def __init__(self, rc: int, stdout: str, stderr: str, counts: dict | None, pid: int):
        self.rc, self.stdout, self.stderr, self.counts, self.pid = rc, stdout, stderr, counts, pid

    @property
    def json(self) -> dict:
        lines = [ln for ln in self.stdout.strip().splitlines() if ln.startswith("{")]
        assert lines, f"no JSON result (rc {self.rc}): {self.stdout[-2000:]}{self.stderr[-3000:]}"
        return json.loads(lines[-1])

    @property
    def killed(self) -> bool:
        return self.rc == -signal.SIGKILL


class Zygote:
    """Client of faulthook/zygote.py: ``run(argv, fault=..., kill_after=...)`` -> RunResult."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.n = 0
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "faulthook" / "zygote.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **ENV},
        )
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}
        self._lock = threading.Lock()

    def run(
        self, argv: list[str], *, fault: str = "", kill_after: float | None = None, killer=None, env=None
    ) -> RunResult:
        """``kill_after``: SIGKILL the run that many seconds after the fork; ``killer(pid)``: a function run
        in a thread once the pid is known (it decides when to kill)."""
        with self._lock:
            self.n += 1
            base = self.workdir / f"run{self.n}"
            req = {
                "argv": [str(a) for a in argv],
                "env": {**ENV, **(env or {})},
                "fault": fault,
                "stdout": f"{base}.out",
                "stderr": f"{base}.err",
                "counts": f"{base}.counts",
            }
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
            timer = None
            if kill_after is not None:
                timer = threading.Timer(kill_after, kill_quietly, (pid,))
                timer.start()
            if killer is not None:
                threading.Thread(target=killer, args=(pid,), daemon=True).start()
            done = json.loads(self.proc.stdout.readline())
            if timer:
                timer.cancel()
            assert done["pid"] == pid
            counts = (
                json.loads(Path(f"{base}.counts").read_text()) if Path(f"{base}.counts").exists() else None
            )
            return RunResult(
                done["rc"], Path(f"{base}.out").read_text(), Path(f"{base}.err").read_text(), counts, pid
            )

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # our own forked child, by pid


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    z = Zygote(tmp_path_factory.mktemp("zygote"))
    yield z
    z.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return run_cache.tiny_target(tmp_path_factory)  # once per run, shared with tests/unit's tiny_target


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """The prepared (Arrow) dataset, without hidden states: copy it before extracting into it."""
    return build_prepared_dataset(tmp_path_factory.mktemp("rel-data") / "data", LENGTHS)


@pytest.fixture(scope="module")
def demo(zygote, tmp_path_factory):
    """The demo target and its conversations (the same path as tests/unit/prepare/test_prepare.py: built once)."""
    demo_dir = run_cache.demo_dir(tmp_path_factory)  # built once per run (tests/run_cache.py)
    with run_cache.run_lock(tmp_path_factory, run_cache.DEMO):
        r = zygote.run(["demo", "--out", demo_dir, "--json"])
        if r.rc == 0:
            run_cache.keep_demo(tmp_path_factory)
    assert r.rc == 0, r.stderr[-3000:]
    return {"model": Path(r.json["model_path"]), "convs": Path(r.json["conversations_path"])}


def fresh_data(prepared: Path, dest: Path) -> Path:
    shutil.copytree(prepared, dest)
    return dest


@pytest.fixture(scope="session")
def reference(zygote, tiny_model, prepared, tmp_path_factory):
    """One uninterrupted extraction: the bytes every interrupted run must end up with, and its call counts."""
    data = fresh_data(prepared, tmp_path_factory.mktemp("rel-ref") / "data")
    t0 = time.monotonic()
    r = zygote.run(["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS])
    assert r.rc == 0, r.stderr[-3000:]
    res = r.json
    assert res["written"] == len(LENGTHS)
    return {"data": data, "counts": r.counts, "seconds": time.monotonic() - t0, "result": res}


def leftovers(data: Path) -> list[str]:
    """Temp or partial files: anything in hidden_states/ that is not a final sample, a manifest or the meta."""
    d = data / "hidden_states"
    keep = ("extract_meta.json",)
    return sorted(
        p.name
        for p in d.iterdir()
        if not (
            p.name in keep
            or (p.name.startswith("hs_") and p.name.endswith(".safetensors"))
            or (p.name.startswith("manifest-rank") and p.name.endswith(".jsonl"))
        )
    )


def manifest_entries(store) -> dict:
    """A store's manifest entries, without the inode change time ``t`` (a fact of each run's file, not of its
    content), for comparing two runs' stores."""
    import dataclasses

    return {i: dataclasses.replace(e, ctime_ns=None) for i, e in store.scan_manifest().entries.items()}


def fault_env(tmp_path: Path, spec: str) -> tuple[dict, Path]:
    """The environment of an ``eagle3ops`` run that faulthook makes fail or pause as ``spec`` says
    (``pause:replace:N``: it waits at its Nth os.replace until GO exists, and creates ``GO.paused`` when it gets
    there), and that GO path (under ``tmp_path``, one per spec)."""
    go = tmp_path / f"go-{spec.replace(':', '-')}"
    env = {
        **os.environ,
        **ENV,
        # faulthook first, then whatever eagle3ops the test runs (PYTHONPATH of the worktree under test)
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(HERE / "faulthook"), os.environ.get("PYTHONPATH")) if p
        ),
        "E3_FAULT": spec,
        "E3_FAULT_GO": str(go),
    }
    return env, go


def start_paused(
    argv: list, tmp_path: Path, spec: str, timeout: float = 120
) -> tuple[subprocess.Popen, Path]:
    """Start ``eagle3ops ARGV`` (a plain subprocess, its output piped) with the ``pause:...`` fault ``spec`` and
    return it and its GO path once it is paused at the fault point (a run holds its lock then). When it ends
    first, or is not there within ``timeout`` s, it is killed and the test fails with its output."""
    env, go = fault_env(tmp_path, spec)
    proc = subprocess.Popen(
        [EAGLE3OPS, *map(str, argv)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + timeout
    while not Path(f"{go}.paused").exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(
                f"eagle3ops {argv[0]} ended (rc {proc.returncode}) before its pause ({spec}): {out[-2000:]}{err[-3000:]}"
            )
        if time.monotonic() > deadline:
            proc.kill()  # our own child, by its Popen handle
            out, err = proc.communicate()
            pytest.fail(
                f"eagle3ops {argv[0]} never reached its pause ({spec}) in {timeout} s: {out[-2000:]}{err[-3000:]}"
            )
        time.sleep(0.05)
    return proc, go


@contextlib.contextmanager
def paused_run(argv: list, tmp_path: Path, spec: str, timeout: float = 120):
    """:func:`start_paused` for a ``with`` block: ``(proc, go)``; the run is killed if it still runs at its end."""
    proc, go = start_paused(argv, tmp_path, spec, timeout)
    try:
        yield proc, go
    finally:
        kill_child(proc)


def finish(proc: subprocess.Popen, go: Path, timeout: float = 180) -> tuple[int, str, str]:
    """Let a paused run go on (GO created) and wait for its end (killed after ``timeout`` s): its exit code, stdout
    and stderr."""
    go.touch()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_child(proc)
    return proc.returncode, out, err


def kill_child(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()  # our own child, by its Popen handle
        proc.wait()


@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(size, opts="")``: a REAL tmpfs of that size (``"72m"``; ``opts`` such as ``ro`` added to its
    mount options) mounted under ``tmp_path``, unmounted at the end of the test (root only)."""
    mounts = []

    def mount(size: str, opts: str = "") -> Path:
        mnt = tmp_path / f"fs{len(mounts)}"
        mnt.mkdir()
        o = f"size={size}" + (f",{opts}" if opts else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", o, "tmpfs", str(mnt)], check=True)
        mounts.append(mnt)
        return mnt

    yield mount
    for m in mounts:
        subprocess.run(["umount", str(m)], check=False)


def fill_fs(path: Path) -> int:
    """Write zeros to ``path`` until its file system is full (ENOSPC), down to 4 KiB pieces; the bytes written."""
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        chunk = b"\0" * (1 << 20)
        while True:
            try:
                n += os.write(fd, chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 4096:
                    return n
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
