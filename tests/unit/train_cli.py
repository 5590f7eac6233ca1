"""Shared by tests/unit/train/test_content_check.py and test_train_run.py: the ``eagle3ops train`` command line."""

from __future__ import annotations


def train_argv(data, verifier, run_dir, *extra: str) -> list[str]:
    """``train --data DATA --verifier VERIFIER --run-dir RUN_DIR`` and ``extra`` (no program name)."""
    return ["train", "--data", str(data), "--verifier", str(verifier), "--run-dir", str(run_dir), *extra]
