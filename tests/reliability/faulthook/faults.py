"""Test-only fault injection for ``eagle3ops extract`` processes (tests/reliability). Not shipped.

``install(spec)`` (the zygote's forked children call it; ``sitecustomize.py`` next to this file calls it from
``$E3_FAULT`` for a plain ``eagle3ops`` run with this directory on PYTHONPATH) wraps ``os.write``,
``os.replace`` and two eagle3ops methods; the spec selects one point and the call number at which the
process SIGKILLs ITSELF (a real SIGKILL: no cleanup, no atexit, no finally)::

    E3_FAULT=write:7         the 7th os.write to a *.tmp file writes half its buffer, then SIGKILL (torn temp)
    E3_FAULT=replace:3       the 3rd os.replace: SIGKILL before the rename (temp complete, never renamed)
    E3_FAULT=renamed:3       the 3rd os.replace: rename done, then SIGKILL (file final, no manifest line)
    E3_FAULT=manifest:2      the 2nd manifest append writes half of its lines, then SIGKILL (torn line)
    E3_FAULT=compute:4       the 4th batch: SIGKILL right after its forward pass (nothing of it written)
    E3_FAULT=pause:replace:5 the 5th os.replace waits until the file $E3_FAULT_GO exists (e.g. while the test
                             fills the disk from outside), then goes on

``counts()`` is the number of calls seen per point (the clean reference run's counts tell the test which call
numbers fall inside a run). Only wrappers: eagle3ops itself has no test hooks.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import threading
import time

_SPEC = ""
_point = ""
_nth = 0
_pause = False
_counts = {"write": 0, "replace": 0, "manifest": 0, "compute": 0}
_lock = threading.Lock()
_installed = False


def counts() -> dict:
    return dict(_counts)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # not reached


def _tick(point: str) -> bool:
    """Count one call at ``point``; True when it is the selected one."""
    with _lock:
        _counts[point] += 1
        n = _counts[point]
    return bool(_SPEC) and n == _nth and (_point == point or (point == "replace" and _point == "renamed"))


def _wait_go() -> None:
    go = os.environ["E3_FAULT_GO"]
    print(f"E3_FAULT paused at {_SPEC}", file=sys.stderr, flush=True)
    with open(go + ".paused", "w") as f:
        f.write(str(os.getpid()))
    while not os.path.exists(go):
        time.sleep(0.05)


def _patch_store(mod) -> None:
    real_append = mod.HiddenStateStore.append_manifest

    def append_manifest(self, entries, *, fsync=False):
        entries = list(entries)
        if _tick("manifest") and _point == "manifest" and not _pause:
            text = "".join(e.to_line() for e in entries)
            with open(self.manifest_path(), "a") as f:
                f.write(text[: max(1, len(text) // 2)])
            _die()
        return real_append(self, entries, fsync=fsync)

    mod.HiddenStateStore.append_manifest = append_manifest


def _patch_extract(mod) -> None:
    real_stacked = mod.StateCapture.stacked

    def stacked(self):
        out = real_stacked(self)
        if _tick("compute") and _point == "compute" and not _pause:
            _die()
        return out

    mod.StateCapture.stacked = stacked


_PATCHES = {"eagle3ops.store": _patch_store, "eagle3ops.extract.transformers_backend": _patch_extract}


class _PostImport(importlib.abc.MetaPathFinder):
    """Patch a module right after its first import (so start-up imports neither torch nor eagle3ops)."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


def install(spec: str = "") -> None:
    """Count calls at every point; with ``spec`` (see above) die or pause at the selected one. Once."""
    global _SPEC, _point, _nth, _pause, _installed
    if _installed:
        raise RuntimeError("faults.install() called twice")
    _installed = True
    _SPEC = spec
    _pause = spec.startswith("pause:")
    _point, _, nth = (spec[len("pause:") :] if _pause else spec).partition(":")
    _nth = int(nth) if nth else 0
    real_write, real_replace = os.write, os.replace

    def write(fd, data):
        try:
            is_tmp = os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp")
        except OSError:
            is_tmp = False
        if is_tmp and _tick("write") and not _pause:
            view = memoryview(data).cast("B")
            real_write(fd, view[: max(1, len(view) // 2)])
            _die()
        return real_write(fd, data)

    def replace(src, dst, *a, **kw):
        hit = _tick("replace")
        if hit and _pause:
            _wait_go()
        elif hit and _point == "replace":
            _die()
        r = real_replace(src, dst, *a, **kw)
        if hit and _point == "renamed":
            _die()
        return r

    os.write, os.replace = write, replace
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not all(name in sys.modules for name in _PATCHES):
        sys.meta_path.insert(0, _PostImport())
