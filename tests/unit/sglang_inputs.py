"""Shared by tests/unit/sglang/test_sglang_client.py and test_sglang_shards.py: the transformers backend's store of a
prepared dataset (the bytes the SGLang backend must give) and the SGLang client's config against the loopback
stand-in servers."""

from __future__ import annotations

from pathlib import Path

from eagle3ops.extract.session import ExtractConfig
from eagle3ops.extract.transformers_backend import run_extraction
from eagle3ops.sglang.client import SGLangExtractConfig
from tinymodels import build_prepared_dataset


def transformers_reference(tmp_path_factory, model, lengths: list[int], dtype: str = "bfloat16") -> Path:
    """A prepared dataset of ``lengths`` whose every row the transformers backend extracted from ``model``."""
    d = build_prepared_dataset(tmp_path_factory.mktemp("ref") / "data", lengths)
    cfg = ExtractConfig(data_dir=str(d), model_path=str(model), progress=False, max_batch_size=1, dtype=dtype)
    run_extraction(cfg)
    return d


def sglang_cfg(data_dir, model, url, **kw) -> SGLangExtractConfig:
    """The client's config for ``url`` (one server or a list): waits 180 s for health, retries after 0.05 s."""
    kw.setdefault("health_timeout", 180)
    kw.setdefault("backoff", 0.05)
    return SGLangExtractConfig(data_dir=str(data_dir), model_path=str(model), url=url, progress=False, **kw)
