"""The fp8 storage option (``dtype=float8_e4m3fn``): e4m3 states + a float32 scale per token and state, stored
as ``hidden_states`` + ``hidden_states_scales``, the layout speculators 0.9.0 reads through its own loader,
``hs_connectors.FP8Transfer`` (``data.hidden_states_backend: fp8``). Real parts only: the real extraction on the
tiny DeepSeek-V3 target, the real hs_connectors reader, the real safetensors loader."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from eagle3ops.extract.session import ExtractConfig, plan_extraction
from eagle3ops.extract.transformers_backend import run_extraction
from eagle3ops.store import (
    FP8_SCALES_KEY,
    HiddenStateStore,
    load_sample,
    quantize_fp8,
    read_safetensors_header,
    sample_nbytes,
    serialize_sample,
)
from safetensors.torch import load_file
from tinymodels import build_prepared_dataset

LENGTHS = [5, 17, 33, 9, 64, 2, 40, 23]


def _run(data_dir, model, **kw):
    return run_extraction(ExtractConfig(data_dir=str(data_dir), model_path=str(model), progress=False, **kw))


def _rel_err(x, ref):
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def test_quantize_per_row_scale_and_error():
    """One scale per (token, state) row; a row 1000x smaller than its neighbour keeps its precision (a single
    per-token scale, as hs_connectors' own writer uses, pushes it into e4m3's subnormal range: ~20 % error)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, 256, generator=g)
    x[:, 0] *= 1e-3  # early layers are far smaller than the last one in real targets
    x[:, 3] *= 50
    q, s = quantize_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert s.dtype == torch.float32 and s.shape == (16, 4, 1)
    back = q.float() * s
    for k in range(4):
        assert _rel_err(back[:, k], x[:, k]) < 0.04, k  # e4m3: 3 mantissa bits, ~2.5 % RMS on Gaussian data
    # the per-token alternative loses the small row entirely (the reason for per-row scales)
    amax = x.abs().amax(dim=(1, 2), keepdim=True) / 448.0
    per_token = (x / amax).to(torch.float8_e4m3fn).float() * amax
    assert _rel_err(per_token[:, 0], x[:, 0]) > 0.1


def test_the_scale_is_one_ieee_multiply_so_every_device_writes_the_same_bits():
    """scale = amax * float32(1/448), checked against numpy's float32 multiply (any IEEE device rounds one
    multiply alike). The division form it replaced (amax / 448) is rounded differently by CUDA, which divides by
    a scalar as a multiply by its reciprocal: on an H100 ~45 % of scales came out one float32 step away from the
    CPU's; here the two forms are shown to differ on the CPU too, so the test fails if the division comes back."""
    from eagle3ops.store.sample import FP8_INV_MAX

    x = torch.randn(512, 4, 96, generator=torch.Generator().manual_seed(5), dtype=torch.bfloat16)
    _q, s = quantize_fp8(x)
    amax = x.float().abs().amax(dim=-1, keepdim=True).numpy()
    want = np.maximum(amax * np.float32(FP8_INV_MAX), np.float32(1e-12))
    assert np.array_equal(s.numpy(), want)
    assert not np.array_equal(s.numpy(), amax / np.float32(448.0))


def test_non_finite_row_gives_non_finite_scale():
    x = torch.ones(3, 2, 8)
    x[1, 1, 5] = float("nan")
    x[2, 0, 0] = float("inf")
    _q, s = quantize_fp8(x)
    finite = torch.isfinite(s).flatten(1).all(dim=1)
    assert finite.tolist() == [True, False, False]


def test_file_is_read_by_speculators_fp8_loader(tmp_path):
    """hs_connectors.FP8Transfer (speculators 0.9.0's loader for backend fp8) dequantises our files; the plain
    FileTransfer would hand the trainer unscaled e4m3 values (the reason train must select backend fp8)."""
    from hs_connectors import FileTransfer, FP8Transfer

    g = torch.Generator().manual_seed(1)
    states = (
        torch.randn(12, 4, 64, generator=g, dtype=torch.float32)
        * torch.tensor([0.1, 1.0, 3.0, 40.0])[None, :, None]
    )
    tok = torch.arange(12)
    q, s = quantize_fp8(states)
    (tmp_path / "hs_0.safetensors").write_bytes(serialize_sample(tok, q, s))
    got = FP8Transfer(tmp_path).get_cached(0)
    assert set(got) == {"token_ids", "hidden_states"} and got["hidden_states"].dtype == torch.bfloat16
    assert torch.equal(got["token_ids"], tok)
    assert _rel_err(got["hidden_states"], states) < 0.04
    # our own reader gives the same bf16 tensor, and a float32 one closer still
    ours = load_sample(tmp_path / "hs_0.safetensors")
    assert torch.equal(ours["hidden_states"], got["hidden_states"])
    assert _rel_err(load_sample(tmp_path / "hs_0.safetensors", torch.float32)["hidden_states"], states) < 0.04
    raw = FileTransfer(tmp_path).get_cached(0)
    assert raw["hidden_states"].dtype == torch.float8_e4m3fn and FP8_SCALES_KEY in raw


def test_extract_fp8_halves_bytes_and_matches_bf16(tmp_path, tiny_target):
    """A real extraction in fp8 next to one in bf16 of the same rows: header/shape/dtype as planned, bytes
    0.5x + scales and token ids, reconstruction close to the bf16 states, resume and adoption work."""
    a = build_prepared_dataset(tmp_path / "bf16", LENGTHS)
    b = build_prepared_dataset(tmp_path / "fp8", LENGTHS)
    ra = _run(a, tiny_target, dtype="bfloat16", max_batch_size=3)
    rb = _run(b, tiny_target, dtype="float8_e4m3fn", max_batch_size=3)
    assert ra["written"] == rb["written"] == len(LENGTHS) and rb["dtype"] == "float8_e4m3fn"
    sa, sb = HiddenStateStore(a), HiddenStateStore(b)
    assert json.loads(sb.meta_path.read_text())["dtype"] == "float8_e4m3fn"
    tokens = sum(LENGTHS)
    # exact tensor bytes: fp8 states + 4 B scale per (token, state) + 8 B token id, plus one header per file
    tensor_b = tokens * (4 * 64 * 1 + 4 * 4 + 8)
    assert tensor_b < rb["bytes"] <= tensor_b + len(LENGTHS) * 256
    assert rb["bytes"] < 0.56 * ra["bytes"]  # hidden 64: token ids weigh; at H=7168 the ratio is 0.500
    errs = []
    for i, n in enumerate(LENGTHS):
        h = read_safetensors_header(sb.path(i))
        assert h["hidden_states"]["dtype"] == "F8_E4M3" and h["hidden_states"]["shape"] == [n, 4, 64]
        assert h[FP8_SCALES_KEY] == {**h[FP8_SCALES_KEY], "dtype": "F32", "shape": [n, 4, 1]}
        assert sb.path(i).stat().st_size <= sample_nbytes(n, 4, 64, "float8_e4m3fn")
        ref = load_file(str(sa.path(i)))
        got = load_sample(sb.path(i), torch.float32)
        assert torch.equal(got["token_ids"], ref["token_ids"])
        errs.append(_rel_err(got["hidden_states"], ref["hidden_states"]))
    assert max(errs) < 0.05, errs
    # resume: nothing left; an unlisted fp8 file is adopted by its header (scales checked too)
    cfg = ExtractConfig(data_dir=str(b), model_path=str(tiny_target), dtype="float8_e4m3fn", progress=False)
    assert plan_extraction(cfg)["to_extract"] == 0
    lines = sb.manifest_path().read_text().splitlines()
    sb.manifest_path().write_text("\n".join(lines[:-1]) + "\n")
    plan = plan_extraction(cfg)
    assert plan["to_extract"] == 0 and plan["adoptable"] == 1 and plan["done_before"] == len(LENGTHS)


def test_header_check_refuses_fp8_without_scales(tmp_path):
    store = HiddenStateStore(tmp_path)
    store.dir.mkdir(parents=True)
    q, s = quantize_fp8(torch.randn(4, 4, 8))
    store.path(0).write_bytes(serialize_sample(torch.arange(4), q))  # scales missing
    store.path(1).write_bytes(serialize_sample(torch.arange(4), q, s[:, :1]))  # wrong scale shape
    store.path(2).write_bytes(serialize_sample(torch.arange(4), q, s))
    assert "missing" in store.validate_header(0, 4, 4, 8, "float8_e4m3fn")
    assert "F32[4, 4, 1]" in store.validate_header(1, 4, 4, 8, "float8_e4m3fn")
    assert store.validate_header(2, 4, 4, 8, "float8_e4m3fn") is None
    assert "dtype F8_E4M3 != bfloat16" in store.validate_header(2, 4, 4, 8, "bfloat16")


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_sample_nbytes_is_an_upper_bound_within_one_percent(dtype):
    """The planner's per-sample estimate bounds the real file and stays within 1 % of it at real shapes."""
    n, k, h = 1024, 4, 7168
    states = torch.zeros(n, k, h, dtype=torch.bfloat16)
    parts = serialize_sample(
        torch.zeros(n, dtype=torch.int64), *(quantize_fp8(states) if "8" in dtype else (states,))
    )
    est = sample_nbytes(n, k, h, dtype)
    assert len(parts) <= est <= len(parts) * 1.01
