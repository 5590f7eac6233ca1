"""The in-server hook: fed SGLang-shaped batches, it writes the same bytes as the transformers backend.

SGLang's forward cannot run here (CUDA kernels), so the batches come from documented stand-ins
(tests/fixtures/sglang_standin.py): a ForwardBatch stand-in with SGLang 0.5.23's field names and flat layout,
several requests of different lengths per batch, padding rows, a foreign request, chunked prefills. The hook is
called exactly as the patched deepseek_v2.py calls it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from eagle3ops.extract.session import ExtractConfig, build_meta, model_facts
from eagle3ops.extract.transformers_backend import run_extraction
from eagle3ops.extract.writer import PinnedPool
from eagle3ops.sglang import hook as sglang_hook
from eagle3ops.sglang import versions
from eagle3ops.sglang.hook import DumpHook, HookError, make_rid
from eagle3ops.store import HiddenStateStore
from tinymodels import build_prepared_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from sglang_standin import RowStates, StandInModel, run_patched_calls, sglang_like_forward

LENGTHS = [5, 17, 33, 9, 12, 2, 21]
LAYERS = [2, 4, 5]  # the 8-layer target's default [2, N//2, N-3]


def _hidden(states) -> int:
    return states.model.config.hidden_size


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_target):
    """The transformers backend's files for these rows (bf16 store, fp32 compute on CPU)."""
    d = build_prepared_dataset(tmp_path_factory.mktemp("ref") / "data", LENGTHS)
    res = run_extraction(
        ExtractConfig(data_dir=str(d), model_path=str(tiny_target), progress=False, max_batch_size=1)
    )
    assert res["written"] == len(LENGTHS) and res["layer_ids"] == LAYERS
    return d


@pytest.fixture(scope="module")
def reference_fp8(tmp_path_factory, tiny_target):
    """The transformers backend's fp8 files (e4m3 + a float32 scale a token and state) for these rows."""
    d = build_prepared_dataset(tmp_path_factory.mktemp("ref8") / "data", LENGTHS)
    cfg = ExtractConfig(
        data_dir=str(d), model_path=str(tiny_target), progress=False, max_batch_size=1, dtype="float8_e4m3fn"
    )
    assert run_extraction(cfg)["written"] == len(LENGTHS)
    return d


@pytest.fixture(scope="module")
def states(tiny_target):
    return RowStates(tiny_target, LAYERS)


def _rows(data_dir):
    import datasets

    return [list(r) for r in datasets.load_from_disk(str(data_dir))["input_ids"]]


def _fresh_store(tmp_path, tiny_target, dtype="bfloat16"):
    d = build_prepared_dataset(tmp_path / "data", LENGTHS)
    cfg = ExtractConfig(data_dir=str(d), model_path=str(tiny_target), dtype=dtype)
    meta = build_meta(cfg, model_facts(tiny_target), LAYERS, len(LENGTHS))
    meta["backend"] = "sglang"
    HiddenStateStore(d).ensure_meta(meta)
    return d


def _req(rows, i, prefix=0, n=None, attempt=0):
    n = len(rows[i]) - prefix if n is None else n
    return (make_rid(i, len(rows[i]), attempt), (rows[i], prefix, n))


def test_batched_requests_write_the_transformers_backends_bytes(tmp_path, tiny_target, reference, states):
    d = _fresh_store(tmp_path, tiny_target)
    rows = _rows(d)
    assert rows == _rows(reference)
    hook = DumpHook(d, LAYERS)
    model = StandInModel(LAYERS)
    # batch 1: three requests of different lengths + a foreign request (warmup) + 3 padding rows
    fb, aux, last = sglang_like_forward(
        [_req(rows, 0), ("warmup-abc", (rows[3], 0, 9)), _req(rows, 1), _req(rows, 2)], states, pad_rows=3
    )
    run_patched_calls(hook, model, fb, aux, last)
    # batch 2: four more; batch 3: a decode batch (ignored)
    fb, aux, last = sglang_like_forward([_req(rows, i, attempt=2) for i in (3, 4, 5, 6)], states)
    run_patched_calls(hook, model, fb, aux, last)
    fb.forward_mode.name = "DECODE"
    assert hook.capture_last(fb) is None
    hook.flush(timeout=60)
    hook.close()
    assert hook.stats.errors == 0, hook.stats.last_error
    ref, got = HiddenStateStore(reference), HiddenStateStore(d)
    for i in range(len(LENGTHS)):
        assert got.path(i).read_bytes() == ref.path(i).read_bytes(), f"row {i} differs"
    entries = got.scan_manifest().entries
    assert sorted(entries) == list(range(len(LENGTHS)))
    assert {i: e.seq_len for i, e in entries.items()} == dict(enumerate(LENGTHS))
    assert [p.name for p in got.dir.iterdir() if p.name.endswith(".tmp")] == []


def test_chunked_prefill_is_stitched(tmp_path, tiny_target, reference, states):
    d = _fresh_store(tmp_path, tiny_target)
    rows = _rows(d)
    hook, model = DumpHook(d, LAYERS), StandInModel(LAYERS)
    # row 2 (33 tokens) in chunks of 16/16/1, interleaved with whole requests, as a chunked prefill schedules
    plan = [
        [_req(rows, 2, 0, 16), _req(rows, 0)],
        [_req(rows, 2, 16, 16)],
        [_req(rows, 1), _req(rows, 2, 32, 1)],
    ]
    for batch in plan:
        run_patched_calls(hook, model, *sglang_like_forward(batch, states))
        if batch is plan[0]:
            hook.flush(timeout=60)
            assert not HiddenStateStore(d).path(2).exists()  # incomplete: nothing under the final name
    hook.flush(timeout=60)
    hook.close()
    assert hook.stats.errors == 0, hook.stats.last_error
    for i in (0, 1, 2):
        assert HiddenStateStore(d).path(i).read_bytes() == HiddenStateStore(reference).path(i).read_bytes()


def test_a_cached_prefix_is_refused(tmp_path, tiny_target, states):
    d = _fresh_store(tmp_path, tiny_target)
    rows = _rows(d)
    hook = DumpHook(d, LAYERS)
    with pytest.raises(HookError, match="--disable-radix-cache"):
        run_patched_calls(hook, StandInModel(LAYERS), *sglang_like_forward([_req(rows, 1, 4)], states))
    hook.close()
    assert not HiddenStateStore(d).path(1).exists()


def test_wrong_layers_or_no_aux_are_refused(tmp_path, tiny_target, states):
    d = _fresh_store(tmp_path, tiny_target)
    rows = _rows(d)
    fb, aux, last = sglang_like_forward([_req(rows, 0)], states)
    hooks = [DumpHook(d, LAYERS), DumpHook(d, LAYERS)]
    try:
        with pytest.raises(HookError, match=r"adds 1 to every id"):
            run_patched_calls(hooks[0], StandInModel([3, 5, 6]), fb, aux, last)
        with pytest.raises(HookError, match="--enable-return-aux-hidden-states") as e:
            run_patched_calls(hooks[1], StandInModel([], capture_aux_hidden_states=False), fb, None, last)
        assert all(v in str(e.value) for v in versions.KNOWN), e.value  # each version's way, from the table
    finally:
        for hook in hooks:  # their writer threads end
            hook.close()


def test_only_tp_rank_0_writes_and_foreign_batches_cost_nothing(tmp_path, tiny_target, states):
    d = _fresh_store(tmp_path, tiny_target)
    rows = _rows(d)
    fb, aux, last = sglang_like_forward([_req(rows, 0)], states)
    rank1 = DumpHook(d, LAYERS, rank_fn=lambda: 1)
    run_patched_calls(rank1, StandInModel(LAYERS), fb, aux, last)
    assert rank1._queue is None and not HiddenStateStore(d).path(0).exists()
    foreign, aux, last = sglang_like_forward([("cmpl-1", (rows[0], 0, 5))], states)
    hook = DumpHook(d, LAYERS)
    assert hook.capture_last(foreign) is None
    hook.on_forward(StandInModel(LAYERS), foreign, aux)
    assert hook._queue is None  # never started: no writer thread, no store


def test_env_configuration_and_inactive_default(tmp_path, monkeypatch):
    monkeypatch.setattr(sglang_hook, "_ACTIVE", None)
    assert sglang_hook.active_hook({}) is None  # the patch is inert without a dump dir
    h = sglang_hook.active_hook(
        {sglang_hook.ENV_DUMP_DIR: str(tmp_path), sglang_hook.ENV_LAYER_IDS: "2, 30,58"}
    )
    assert h.layer_ids == [2, 30, 58] and sglang_hook.active_hook({sglang_hook.ENV_DUMP_DIR: "x"}) is h
    with pytest.raises(HookError, match="LAYER_IDS is empty"):
        DumpHook.from_env({sglang_hook.ENV_DUMP_DIR: str(tmp_path)})
    with pytest.raises(HookError, match="ascending"):
        DumpHook(tmp_path, [5, 2, 4])
    assert sglang_hook.parse_rid(make_rid(12, 40, 3)) == (12, 40)
    assert sglang_hook.parse_rid("e3o-12") is None and sglang_hook.parse_rid(None) is None


def test_missing_store_meta_is_refused(tmp_path, tiny_target, states):
    d = build_prepared_dataset(tmp_path / "data", LENGTHS)
    rows = _rows(d)
    with pytest.raises(HookError, match=r"extract_meta\.json is missing"):
        run_patched_calls(
            DumpHook(d, LAYERS), StandInModel(LAYERS), *sglang_like_forward([_req(rows, 0)], states)
        )


def test_a_prefill_that_skipped_the_final_norm_capture_is_refused(tmp_path, tiny_target, states):
    """As when a prefill CUDA graph replays the model without calling Python: on_forward alone is an error."""
    d = _fresh_store(tmp_path, tiny_target)
    rows = _rows(d)
    fb, aux, _last = sglang_like_forward([_req(rows, 0)], states)
    with pytest.raises(HookError, match="--disable-prefill-cuda-graph"):
        DumpHook(d, LAYERS).on_forward(StandInModel(LAYERS), fb, aux)


def test_pinned_pool_hands_back_the_smallest_fitting_buffer_by_identity():
    """Seen on the live server (0.5.17, H200): with free buffers of two sizes, taking one out of the free list
    compared tensors elementwise (list.remove) and the RuntimeError killed the scheduler."""
    pool = PinnedPool(pin=False)
    small1, big, small2 = pool.acquire(10), pool.acquire(3 << 20), pool.acquire(10)
    assert (small1.numel(), big.numel(), small2.numel()) == (1 << 20, 4 << 20, 1 << 20)
    for b in (small1, small2, big):
        pool.release(b)
    assert pool.acquire(2 << 20) is big  # the only one that fits, not first in the list
    got = pool.acquire(10)
    assert got is small1 or got is small2
    assert len(pool._free) == 1 and pool._free[0] is (small2 if got is small1 else small1)


def test_a_fault_inside_the_hook_fails_its_rows_and_the_server_goes_on(tmp_path, tiny_target, states):
    """A bug of ours in the forward path must not take the serving process down: the batch's rows are recorded
    in the errors file (the client fails exactly those rows, naming the error) and the next batch is written."""
    d = _fresh_store(tmp_path, tiny_target)
    rows = _rows(d)
    hook, model = DumpHook(d, LAYERS), StandInModel(LAYERS)
    run_patched_calls(hook, model, *sglang_like_forward([_req(rows, 0), _req(rows, 1)], states))
    real_acquire = hook._pool.acquire

    def broken(nbytes):
        raise RuntimeError("pool broke")

    hook._pool.acquire = broken
    run_patched_calls(hook, model, *sglang_like_forward([_req(rows, 2), _req(rows, 3)], states))  # no raise
    hook._pool.acquire = real_acquire
    run_patched_calls(hook, model, *sglang_like_forward([_req(rows, 4)], states))
    hook.flush(timeout=60)
    hook.close()
    assert hook.stats.errors == 1 and "pool broke" in hook.stats.last_error
    import json

    errs = [json.loads(x) for x in (d / "hidden_states" / sglang_hook.ERRORS_NAME).read_text().splitlines()]
    assert [e["rows"] for e in errs] == [[2, 3]] and "RuntimeError: pool broke" in errs[0]["error"]
    store = HiddenStateStore(d)
    assert sorted(store.scan_manifest().entries) == [0, 1, 4]
    assert not store.path(2).exists() and not store.path(3).exists()


def test_a_row_with_non_finite_states_is_failed_not_written_and_its_later_chunks_dropped(
    tmp_path, tiny_target, reference, states
):
    """NaN/Inf in a row's states (here one aux value of row 1, and an Inf in the first chunk of row 2's chunked
    prefill): the row is recorded in the errors file as not to be retried, nothing is written for it, its later
    chunks are dropped without a chunk-order error, and the batch's other rows are written as usual. A padding
    row's garbage is not looked at."""
    import json

    d = _fresh_store(tmp_path, tiny_target)
    rows = _rows(d)
    hook, model = DumpHook(d, LAYERS), StandInModel(LAYERS)
    fb, aux, last = sglang_like_forward([_req(rows, 0), _req(rows, 1)], states, pad_rows=2)
    aux[len(rows[0]) + 3, 5] = float("nan")
    aux[-1, 0] = float("nan")  # padding
    run_patched_calls(hook, model, fb, aux, last)
    fb, aux, last = sglang_like_forward([_req(rows, 2, 0, 16), _req(rows, 4)], states)
    last[7, 1] = float("inf")
    run_patched_calls(hook, model, fb, aux, last)
    for batch in ([_req(rows, 2, 16, 16)], [_req(rows, 2, 32, 1), _req(rows, 5)]):
        run_patched_calls(hook, model, *sglang_like_forward(batch, states))
    hook.flush(timeout=60)
    hook.close()
    errs = [json.loads(x) for x in (d / "hidden_states" / sglang_hook.ERRORS_NAME).read_text().splitlines()]
    assert [(e["rows"], e.get("retry")) for e in errs] == [([1], False), ([2], False)]
    assert (
        "row 1: non-finite hidden states (NaN/Inf) at 1 of its tokens 0..16 (first at token 3)"
        in errs[0]["error"]
    )
    assert "at 1 of its tokens 0..15 (first at token 7)" in errs[1]["error"]
    assert hook.stats.errors == 2 and not hook._partial and not hook._nonfinite
    store, ref = HiddenStateStore(d), HiddenStateStore(reference)
    assert sorted(store.scan_manifest().entries) == [0, 4, 5]
    for i in (0, 4, 5):
        assert store.path(i).read_bytes() == ref.path(i).read_bytes()
    assert not store.path(1).exists() and not store.path(2).exists()


def test_an_fp8_store_gets_the_transformers_backends_fp8_bytes(tmp_path, tiny_target, reference_fp8, states):
    """extract_dtype float8_e4m3fn through SGLang (users' pain 1: the production path could not halve the bytes):
    the hook quantises on the device, a state at a time, and writes what the transformers backend writes for the
    same rows, byte for byte, whole requests and a chunked prefill alike; a row with a NaN is failed through its
    scale's flag, the others of its batch written."""
    import json

    from eagle3ops.store.sample import load_sample

    d = _fresh_store(tmp_path, tiny_target, dtype="float8_e4m3fn")
    rows = _rows(d)
    hook, model = DumpHook(d, LAYERS), StandInModel(LAYERS)
    plan = [
        [_req(rows, 2, 0, 16), _req(rows, 0), _req(rows, 1)],
        [_req(rows, 2, 16, 16), _req(rows, 3)],
        [_req(rows, 4), _req(rows, 2, 32, 1), _req(rows, 5)],
    ]
    for batch in plan:
        run_patched_calls(hook, model, *sglang_like_forward(batch, states, pad_rows=2))
    fb, aux, last = sglang_like_forward([_req(rows, 6)], states)
    aux[4, 1] = float("nan")
    run_patched_calls(hook, model, fb, aux, last)
    hook.flush(timeout=60)
    hook.close()
    errs = [json.loads(x) for x in (d / "hidden_states" / sglang_hook.ERRORS_NAME).read_text().splitlines()]
    assert [(e["rows"], e.get("retry")) for e in errs] == [([6], False)]
    assert (
        "row 6: non-finite hidden states (NaN/Inf) at 1 of its tokens 0..20 (first at token 4)"
        in errs[0]["error"]
    )
    store, ref = HiddenStateStore(d), HiddenStateStore(reference_fp8)
    assert sorted(store.scan_manifest().entries) == [0, 1, 2, 3, 4, 5]
    for i in range(6):
        assert store.path(i).read_bytes() == ref.path(i).read_bytes(), f"row {i} differs"
        assert store.validate_header(i, LENGTHS[i], len(LAYERS) + 1, _hidden(states), "float8_e4m3fn") is None
    # about half the bf16 bytes (e4m3 + a float32 scale per token and state), and it loads as states again
    loaded = load_sample(store.path(2))
    assert loaded["hidden_states"].shape == (LENGTHS[2], len(LAYERS) + 1, _hidden(states))
    assert not store.path(6).exists()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_finite_flag_marks_exactly_the_rows_with_nan_or_inf(dtype):
    """hook_copy.rows_finite (min and max of a row, both finite) flags the same rows as the plain isfinite
    reduction it replaced: NaN, +Inf, -Inf, and both infinities in one row; a batch of no rows gives no flags."""
    import torch
    from eagle3ops.sglang.hook_copy import rows_finite

    block = torch.randn(40, 4, 24, generator=torch.Generator().manual_seed(3)).to(getattr(torch, dtype))
    planted = {2: float("nan"), 11: float("inf"), 29: float("-inf")}
    for row, value in planted.items():
        block[row, row % 4, row % 24] = value
    block[35, 0, 0], block[35, 3, 23] = float("inf"), float("-inf")
    flags = rows_finite(block)
    assert torch.equal(flags, torch.isfinite(block).flatten(1).all(dim=1))
    assert torch.nonzero(~flags).flatten().tolist() == [2, 11, 29, 35]
    assert rows_finite(block[:0]).shape == (0,)
