"""Fixtures for unit tests: a tiny DeepSeek-V3-architecture target and a prepared dataset, built locally; the
embedded demo (its model path and tokenizer); the stand-in OpenAI-compatible server of the regenerate tests."""

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


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The default demo (test_demo.build_session_demo): built once per run for every xdist worker, so whichever
    module asks second gets the idempotent no-op."""
    from test_demo import build_session_demo

    return build_session_demo(tmp_path_factory)


@pytest.fixture(scope="session")
def model(demo):
    """The demo's tiny target (its path)."""
    return demo["model_path"]


@pytest.fixture(scope="session")
def tokenizer(model):
    """The demo's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


@pytest.fixture
def server():
    """The STAND-IN OpenAI-compatible server (tests/fixtures/openai_standin.py) of tests/unit/test_regenerate*.py,
    closed after the test."""
    from regenerate_inputs import StandinServer

    s = StandinServer()
    yield s
    s.close()
