"""The GPU running out of memory during extraction (users' pain 9): the batch is split, the run goes on, and the
report says what to set; a row that does not fit alone stops the run naming it, with every finished row kept.

This machine has no GPU, so the out-of-memory error comes from the smallest honest stand-in: a forward pre-hook
on the tiny target's decoder raises ``torch.OutOfMemoryError`` (the class CUDA's caching allocator raises) when a
batch holds more padded tokens than a set budget, which is what a GPU with that much free memory does. The
batch loop, the writer, the store and the CLI are the real code.
"""

from __future__ import annotations

import json

import pytest
import torch
from eagle3ops import cli
from eagle3ops.extract import transformers_backend
from eagle3ops.store import HiddenStateStore
from tinymodels import build_prepared_dataset

BUDGET = 100  # padded tokens the stand-in "GPU" holds in one forward (``small_gpu.budget`` changes it)


@pytest.fixture
def small_gpu(monkeypatch):
    """``load_model`` whose decoder raises like CUDA when a batch is over BUDGET; records every forward's size
    and whether it ran."""

    class Forwards(list):
        budget = BUDGET

    forwards = Forwards()
    load = transformers_backend.load_model

    def load_small(model_path, device, compute_dtype, checkpoint=None):
        model = load(model_path, device, compute_dtype, checkpoint)

        def pre_hook(_module, _args, kwargs):
            n = int(kwargs["input_ids"].numel())
            forwards.append((n, n <= forwards.budget))
            if n > forwards.budget:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} tokens' activations")

        model.model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        return model

    monkeypatch.setattr(transformers_backend, "load_model", load_small)
    return forwards


def _extract(capsys, data, model, *extra) -> tuple[int, dict]:
    rc = cli.main(["extract", "--data", str(data), "--model", str(model), "--no-progress", *extra, "--json"])
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_batch_the_gpu_cannot_hold_is_split_once_and_later_ones_before_they_fail(
    tmp_path, tiny_target, small_gpu, capsys
):
    """24 rows of 20 tokens in batches of 8 (160 padded tokens, over the budget of 100): the first batch fails
    and is done as two of 4; the two later batches of 160 are split before they are tried. One failed forward
    in the whole run, every row written, and the files are the bytes a run planned with batches of 4 writes."""
    data = build_prepared_dataset(tmp_path / "data", [20] * 24)
    rc, res = _extract(capsys, data, tiny_target, "--max-batch-size", "8", "--max-batch-tokens", "1000")
    assert rc == 0, res
    assert res["written"] == 24 and res["oom_splits"] == 1 and res["max_batch_tokens_used"] == 159
    assert small_gpu == [(160, False)] + [(80, True)] * 6
    (warning,) = res["warnings"]
    assert "ran out of memory on 1 batch(es)" in warning and "extract_max_batch_tokens" in warning
    assert "at most 159 padded tokens a batch (planned: 1000)" in warning
    ref = build_prepared_dataset(tmp_path / "ref", [20] * 24)
    small_gpu.clear()
    rc, again = _extract(capsys, ref, tiny_target, "--max-batch-size", "4", "--max-batch-tokens", "1000")
    assert rc == 0 and again["oom_splits"] == 0 and "warnings" not in again
    assert small_gpu == [(80, True)] * 6
    got, want = HiddenStateStore(data), HiddenStateStore(ref)
    for i in range(24):
        assert got.path(i).read_bytes() == want.path(i).read_bytes(), f"row {i} differs"


def test_a_row_the_gpu_cannot_hold_alone_stops_the_run_naming_it_before_any_write(
    tmp_path, tiny_target, small_gpu, capsys
):
    """Rows of 5, 9, 120 and 12 tokens in one planned batch (480 padded; rows go longest first): halves, then the
    120-token row alone, which no split can help. Exit 2 before anything is written, the message names the row,
    its length and what to change; the store is left clean, and on a GPU that holds the row the same command
    writes every row."""
    data = build_prepared_dataset(tmp_path / "data", [5, 9, 120, 12])
    rc, res = _extract(capsys, data, tiny_target, "--max-batch-size", "8", "--max-batch-tokens", "1000")
    assert rc == 2 and res["failed"] is True
    assert "row 2 (120 tokens) does not fit in GPU memory even alone" in res["msg"]
    assert "prepare_max_length" in res["msg"] and "CUDA out of memory" in res["msg"]
    assert "Traceback" not in capsys.readouterr().err
    assert small_gpu == [(480, False), (240, False), (120, False)]  # the batch, the half with row 2, row 2
    store = HiddenStateStore(data)
    assert store.scan_manifest().entries == {} and not list(store.dir.glob("*.tmp"))
    small_gpu.budget = 120
    rc, res = _extract(capsys, data, tiny_target, "--max-batch-size", "8", "--max-batch-tokens", "1000")
    assert rc == 0 and res["written"] == 4 and res["oom_splits"] == 2, res
    assert sorted(store.scan_manifest().entries) == [0, 1, 2, 3]
