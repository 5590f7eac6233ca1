"""What one pytest run builds once for all its xdist workers (docs/conventions.md, "Test time budget").

A session-scoped fixture is built once *per worker* (``make test`` runs 4): a deterministic input that costs
minutes (the demo target trained on 300 conversations) would be built up to four times side by side on two
cores. :func:`run_dir` is a directory shared by every worker of this run (the controller's base temp dir;
the base temp dir itself without xdist), removed with pytest's own temp dirs; :func:`run_lock` serialises the
workers on one name (``fcntl.flock`` on a file there): the first one builds, the others wait and then find it
built. The builders used under it are idempotent (they check what is there, e.g. ``demo.build_demo`` by its
fingerprints), so a worker that finds the thing built still runs the real code path that says so.

Nothing else here outlives the run: a cache across runs belongs under ``hosts.nspawn.CACHE_DIR``, keyed by its recipe
(:func:`demo_cache`, the default demo).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
from pathlib import Path


def run_dir(tmp_path_factory) -> Path:
    """``<this run's base temp dir>/e3t-run-shared``: the same directory in every xdist worker of one run."""
    base = Path(tmp_path_factory.getbasetemp())
    # xdist gives worker gwN the base temp dir <controller's base temp>/popen-gwN
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    d = root / "e3t-run-shared"
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def run_lock(tmp_path_factory, name: str):
    """Hold the run-wide lock ``name`` (blocks while another worker holds it)."""
    path = run_dir(tmp_path_factory) / f".{name}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


DEMO = "eagle3ops-demo"


def demo_dir(tmp_path_factory) -> Path:
    """Where this run's default demo (300 conversations, seed 0) is built: take ``run_lock(.., DEMO)`` around
    every build (``demo.build_demo``, ``eagle3ops demo --out``) so that one worker builds it and the others find
    it current. A demo an earlier run built from the same recipe (:func:`demo_cache`) is copied there first: the
    builder still checks it (parameters and every file's sha256) and rebuilds what does not match; call
    :func:`keep_demo` after a build."""
    d = run_dir(tmp_path_factory) / DEMO
    cached = demo_cache()
    # not DEMO: a caller may hold that one (flock is per open file)
    with run_lock(tmp_path_factory, "demo-seed"):
        if cached.is_dir() and not d.exists():
            shutil.copytree(cached, d, symlinks=True)
    return d


@functools.cache  # the sources do not change during a run
def demo_cache() -> Path:
    """``<hosts.nspawn.CACHE_DIR>/demo-<recipe>``: the default demo of an earlier run, keyed by the sha256 of
    eagle3ops' Python sources (the build and everything it imports) and the versions of the packages that shape
    its bytes. ~90 s of CPU a build on the 2-core box, 11 MB."""
    import hashlib
    from importlib import metadata

    src = Path(__file__).resolve().parents[1] / "python" / "eagle3ops"
    h = hashlib.sha256()
    for f in sorted(src.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(f.relative_to(src).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    for pkg in ("torch", "transformers", "tokenizers", "safetensors", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            h.update(f"{pkg}=={metadata.version(pkg)}\0".encode())
    from hosts import nspawn

    return nspawn.CACHE_DIR / f"demo-{h.hexdigest()[:12]}"


def keep_demo(tmp_path_factory) -> None:
    """Keep this run's complete default demo for later runs (:func:`demo_cache`; written under a temporary name
    and renamed). Call it holding ``run_lock(.., DEMO)`` after the build. Nothing when it is kept already or the
    cache directory cannot be written."""
    cached = demo_cache()
    d = run_dir(tmp_path_factory) / DEMO
    if cached.exists() or not (d / "demo.json").is_file():
        return
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
    try:
        shutil.copytree(d, tmp, symlinks=True)
        os.replace(tmp, cached)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def session_demo(tmp_path_factory) -> dict:
    """The default demo (``eagle3ops.demo.build_demo``), built once per run for every xdist worker under
    :func:`demo_dir` and kept for later runs (:func:`keep_demo`); later calls are the real idempotent no-op. Used by
    tests/unit's ``demo`` fixture, tests/unit/core/test_demo.py and tests/ansible/test_regenerate_role.py."""
    from eagle3ops import demo as demo_mod

    with run_lock(tmp_path_factory, DEMO):
        res = demo_mod.build_demo(demo_dir(tmp_path_factory), log=lambda m: None)
        keep_demo(tmp_path_factory)
        return res


def build_once(tmp_path_factory, name: str, build) -> Path:
    """``run_dir/name``, made by ``build(path)`` by the first worker that asks, found there by the others (a
    ``.name.ready`` stamp beside it says the build finished). For read-only inputs only: a test that changes
    what it gets must copy it first."""
    path = run_dir(tmp_path_factory) / name
    ready = path.parent / f".{name}.ready"
    with run_lock(tmp_path_factory, name):
        if not ready.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
            ready.write_text("ok\n")
    return path


def tiny_target(tmp_path_factory) -> Path:
    """The default tiny DeepSeek-V3 target of tests/unit/tinymodels.py (8 layers, vocab 300, seed 0), built once
    per run: tests/unit's ``tiny_target``, tests/reliability's ``tiny_model`` and tests/ansible/test_extract_sglang.py
    share it (read-only)."""
    import sys

    unit = str(Path(__file__).resolve().parent / "unit")
    if unit not in sys.path:
        sys.path.insert(0, unit)
    from tinymodels import build_tiny_target

    return build_once(tmp_path_factory, "tiny-target", lambda d: build_tiny_target(d / "model")) / "model"


def kimi_fixture(tmp_path_factory) -> dict:
    """The Kimi-K2.5-format fixture (``eagle3ops.kimi_fixture.build``, seed 0), built once per run for every
    xdist worker (read-only: a test that changes it copies it first); later calls are the builder's idempotent
    no-op, whose result (paths, shape) is returned."""
    from eagle3ops import kimi_fixture

    path = build_once(tmp_path_factory, "kimi-fixture", lambda d: kimi_fixture.build(d))
    return kimi_fixture.build(path)
