"""Fixtures for unit tests: a tiny DeepSeek-V3-architecture target and a prepared dataset, built locally; the
embedded demo (its model path and tokenizer); the Kimi-K2.5-format fixture; the stand-in OpenAI-compatible server of the regenerate tests."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

# The tests live in one folder per package under test (tests/unit/<package>/test_*.py; docs/conventions.md "Where the
# tests are"); the helpers they share stay here, in tests/unit (tinymodels, *_inputs, options_defs, role_tasks, ...),
# and are imported as top-level modules. pytest's prepend import mode only puts a test file's own folder on
# sys.path, so this folder goes first, for every test below it however it is run (a folder, a file, a node id).
# What tests of two folders share is a helper here, never a test file of another folder; test files keep unique
# basenames (no __init__.py in tests/unit: a second test_x.py anywhere under it is refused at collection).
UNIT = str(Path(__file__).resolve().parent)
if UNIT not in sys.path:
    sys.path.insert(0, UNIT)

import pytest
import run_cache

# torch._dynamo refuses to import once ansible-core's module_utils has replaced sys.intern (its SysInternPatch,
# applied by importing ansible.module_utils.basic in a test module): `pytest tests/unit/core/test_options_generated.py
# tests/unit/core/test_role_argument_specs.py` failed at collection with "substitute_in_graph expects a function".
# Imported first, every order of the unit test modules works. Here, not in tests/conftest.py: that one is loaded by
# every pytest process (the xdist controller, the child pytest of each tests/infra check), ~3 s of CPU each.
with contextlib.suppress(ImportError):  # a venv without torch: nothing to collide with
    import torch._dynamo  # noqa: F401

# the gpu_free tests' fixtures (tests/unit/gpu_free/): a stand-in /dev, real holders, the injected clock
from gpu_free_fixtures import clock, dev, spawn  # noqa: F401

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """Built once per run for every xdist worker (tests/run_cache.py); read-only: copy it to change it."""
    return run_cache.tiny_target(tmp_path_factory)


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The default demo (run_cache.session_demo): built once per run for every xdist worker, so whichever
    module asks second gets the idempotent no-op."""
    return run_cache.session_demo(tmp_path_factory)


@pytest.fixture(scope="session")
def kimi(tmp_path_factory):
    """The Kimi-K2.5-format fixture target (run_cache.kimi_fixture: built once per run, read-only): the builder's
    result (model_path, conversations_path, heldout_path, ...)."""
    return run_cache.kimi_fixture(tmp_path_factory)


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
    """The STAND-IN OpenAI-compatible server (tests/fixtures/openai_standin.py) of tests/unit/regenerate/,
    closed after the test."""
    from regenerate_inputs import StandinServer

    s = StandinServer()
    yield s
    s.close()
