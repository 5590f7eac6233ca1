"""The one tiny DeepSeek-V3 builder (eagle3ops.tinymodel): the widening to servable MLA dims is exact, the saved
checkpoint is bf16 with the config fields real DeepSeek-V3/Kimi checkpoints carry, and every ``config.<field>``
SGLang's deepseek_v2.py reads directly exists in it (checked in the REAL 0.5.17 and 0.5.23 source)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
from eagle3ops import tinymodel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from sglang_standin import VERSIONS, sglang_source


@pytest.fixture(scope="module")
def compact():
    import torch

    m = tinymodel.build(200, mla=tinymodel.COMPACT_MLA, seed=3)
    with torch.no_grad():  # non-trivial norms and router bias (random init leaves them at 1 / 0)
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.mul_(torch.rand_like(p) + 0.5)
            if "e_score_correction_bias" in n:
                p.normal_()
    for n, b in m.named_buffers():
        if "e_score_correction_bias" in n:
            b.normal_()
    return m


@pytest.fixture(scope="module")
def wide(compact):
    return tinymodel.widen_mla(compact)


@pytest.fixture(scope="module")
def saved(wide, tmp_path_factory):
    import copy

    return tinymodel.save(copy.deepcopy(wide), tmp_path_factory.mktemp("m") / "m")  # save() casts in place


def test_widening_to_the_servable_mla_dims_is_exact(compact, wide):
    import torch

    assert {k: getattr(wide.config, k) for k in tinymodel.SERVABLE_MLA} == tinymodel.SERVABLE_MLA
    assert wide.config.head_dim == 64 and wide.config.qk_head_dim == 192
    ids = torch.randint(0, 200, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = compact(ids, output_hidden_states=True)
        b = wide(ids, output_hidden_states=True)
    scale = a.logits.abs().max()
    assert (a.logits - b.logits).abs().max() < 1e-5 * scale
    for ha, hb in zip(a.hidden_states, b.hidden_states, strict=True):  # the states extract captures
        assert (ha - hb).abs().max() < 1e-5 * ha.abs().max().clamp(min=1)
    with pytest.raises(ValueError, match="cannot widen"):
        tinymodel.widen_mla(wide, tinymodel.COMPACT_MLA)


def test_saved_checkpoint_is_bf16_with_the_real_checkpoint_fields(saved):
    from eagle3ops.store import read_safetensors_header

    out = saved
    cfg = json.loads((out / "config.json").read_text())
    for k, v in tinymodel.CHECKPOINT_FIELDS.items():
        assert cfg[k] == v, k
    assert cfg["torch_dtype"] == cfg["dtype"] == "bfloat16"
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]) == (
        512,
        64,
        128,
        128,
    )
    header = read_safetensors_header(out / "model.safetensors")
    # all bf16; the router's e_score_correction_bias stays float32 as in real DeepSeek-V3 checkpoints
    # (transformers keeps it in fp32; SGLang's gate holds it in fp32 too)
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__" and "e_score" not in k} == {"BF16"}
    assert {v["dtype"] for k, v in header.items() if "e_score" in k} <= {"F32", "BF16"}


def _config_reads(src: str) -> set[str]:
    """``config.X`` / ``self.config.X`` read directly (not through getattr/hasattr) in deepseek_v2.py."""
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            v = node.value
            if (isinstance(v, ast.Name) and v.id == "config") or (
                isinstance(v, ast.Attribute) and v.attr == "config" and isinstance(v.value, ast.Name)
            ):
                names.add(node.attr)
    return names


@pytest.mark.parametrize("version", VERSIONS)
def test_every_config_field_sglang_reads_is_in_the_saved_config(saved, version):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(saved)
    reads = _config_reads(sglang_source("sglang/srt/models/deepseek_v2.py", version))
    assert {"moe_layer_freq", "topk_method", "scoring_func", "n_group", "topk_group"} <= reads
    # what the demo-like target lacks is only what is optional there (quantization, DSA/V3.2, methods)
    missing = sorted(n for n in reads if not hasattr(cfg, n))
    optional = {
        "quantization_config",  # only read for fp8 shared experts
        "rope_theta",  # only read when the config has no rope_parameters (transformers 5 writes them)
        "rope_scaling",
        "weight_block_size",
        "index_topk",  # DeepSeek-V3.2 (DSA) only
        "index_n_heads",
        "index_head_dim",
    }
    assert set(missing) <= optional, missing
