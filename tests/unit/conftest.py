"""Fixtures for unit tests: a tiny DeepSeek-V3-architecture target and a prepared dataset, built locally."""

from __future__ import annotations

import os

import pytest
from tinymodels import build_tiny_target

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    return build_tiny_target(tmp_path_factory.mktemp("tiny-target") / "model")
