"""Issue #10.1, the two leftovers the kill suite found (fixed in store.py): a SIGKILL during the very first
write left ``.extract_meta.json.<pid>.<tid>.tmp`` behind forever, and the clean-up at start must not delete
the temp file of a writer that is still alive (another rank writing into the same directory)."""

from __future__ import annotations

import subprocess
import sys

from eagle3ops.store import HiddenStateStore


def test_clean_removes_dead_writers_temps_and_keeps_live_ones(tmp_path):
    store = HiddenStateStore(tmp_path)
    store.dir.mkdir(parents=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)  # exited and reaped: no such process now
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        names = {
            f".extract_meta.json.{dead_pid}.1.tmp": False,  # torn meta of a killed run: removed
            f".hs_7.safetensors.{dead_pid}.2.tmp": False,  # torn sample of a killed run: removed
            f".hs_8.safetensors.{live.pid}.3.tmp": True,  # another rank, still writing: kept
            "hs_9.safetensors": True,  # a final name: never touched
            ".unrelated.tmp": True,  # not ours: never touched
        }
        for n in names:
            (store.dir / n).write_bytes(b"x")
        removed = store.clean_temp_files()
        assert sorted(removed) == sorted(n for n, keep in names.items() if not keep)
        assert sorted(p.name for p in store.dir.iterdir()) == sorted(n for n, keep in names.items() if keep)
    finally:
        live.kill()
        live.wait()
    assert store.clean_temp_files() == [f".hs_8.safetensors.{live.pid}.3.tmp"]  # its writer is gone now
