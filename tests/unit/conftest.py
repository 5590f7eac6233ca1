"""Fixtures for unit tests: a tiny DeepSeek-V3-architecture target and a prepared dataset, built locally."""

from __future__ import annotations

import os

import pytest
import run_cache

# the gpu_free tests' fixtures (tests/unit/test_gpu_free*.py): a stand-in /dev, real holders, the injected clock
from gpu_free_fixtures import clock, dev, spawn  # noqa: F401

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """Built once per run for every xdist worker (tests/run_cache.py); read-only: copy it to change it."""
    return run_cache.tiny_target(tmp_path_factory)
