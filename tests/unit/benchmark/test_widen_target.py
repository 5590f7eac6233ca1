"""bench/widen_target.py: the zero-widened target computes exactly what the original computes (issue #31's 8B-class
stand-in for SmolLM2, checked here on the tiny demo-shaped DeepSeek-V3 target and a tiny Llama in float32)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))
import widen_target
from eagle3ops.train.fixtures import make_tiny_verifier


def _forward(path: Path, ids):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        out = m(ids, output_hidden_states=True)
    return m, out


def _llama(out: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(out)
    (out / "tokenizer.json").write_text("{}")  # stands for the files copied as they are
    return out


@pytest.mark.parametrize("kind", ["deepseek_demo", "llama"])
def test_widened_model_gives_the_same_states_and_logits(tmp_path, kind):
    if kind == "llama":
        src, moe = _llama(tmp_path / "src"), None
    else:
        src, moe = make_tiny_verifier(tmp_path / "src", num_layers=4, vocab_size=256), 256
    res = widen_target.widen(src, tmp_path / "wide", intermediate=512, moe_intermediate=moe, shard_gb=0.0005)
    assert res["shards"] > 1 and res["tensors_widened"] > 0
    cfg = json.loads((tmp_path / "wide" / "config.json").read_text())
    assert cfg["intermediate_size"] == 512 and (moe is None or cfg["moe_intermediate_size"] == 256)
    ids = torch.randint(3, 250, (2, 19), generator=torch.Generator().manual_seed(1))
    m0, a = _forward(src, ids)
    m1, b = _forward(tmp_path / "wide", ids)
    n0 = sum(p.numel() for p in m0.parameters())
    n1 = sum(p.numel() for p in m1.parameters())
    assert n1 > 2 * n0, "the widened model must really be bigger"
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states, strict=True)):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5, msg=f"hidden state {i} changed")
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(b.logits.argmax(-1), a.logits.argmax(-1))
    if kind == "llama":
        assert (tmp_path / "wide" / "tokenizer.json").read_text() == "{}"


def test_narrowing_is_refused(tmp_path):
    src = _llama(tmp_path / "src")
    with pytest.raises(ValueError, match="cannot narrow"):
        widen_target.widen(src, tmp_path / "w", intermediate=32)
    assert widen_target.main([str(src), str(tmp_path / "w2"), "--intermediate", "32"]) == 2
