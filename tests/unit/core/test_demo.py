"""The embedded demo: a real tiny DeepSeek-V3 target, a real locally trained tokenizer, real files.

The demo is built once per run under pytest's base temp dir, shared by the xdist workers (the ``demo`` fixture
of tests/unit/conftest.py, tests/run_cache.py); test_prepare.py, test_regenerate.py,
tests/ansible/test_regenerate_role.py and tests/reliability build at the same path, so every later build is the
idempotent no-op.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import run_cache

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from eagle3ops import demo as demo_mod
from eagle3ops.cli import main as cli_main
from eagle3ops.durable import sha256_file
from eagle3ops.store import read_safetensors_header


@pytest.fixture(scope="session")
def conversations(demo):
    with open(demo["conversations_path"]) as f:
        return [json.loads(line) for line in f]


def test_model_is_a_small_deepseek_v3_loadable_offline(demo):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(demo["model_path"])
    assert cfg.model_type == "deepseek_v3"
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (8, 64) == (demo["num_layers"], demo["hidden_size"])
    assert cfg.n_routed_experts == 4 and cfg.n_shared_experts == 1
    assert 0 < cfg.first_k_dense_replace < cfg.num_hidden_layers  # dense first layers, then MoE
    assert cfg.kv_lora_rank and cfg.q_lora_rank  # MLA
    # speculators' default layer ids [2, N//2, N-3] must be distinct (formats.md)
    n = cfg.num_hidden_layers
    assert len({2, n // 2, n - 3}) == 3

    # what SGLang needs to serve it (shared/notes/gpu-box-sglang.md): DeepSeek-V3's MLA head dims (smaller ones
    # fail its Triton MLA decode kernel), the fields real checkpoints carry, bf16 weights and config dtype
    raw = json.loads((Path(demo["model_path"]) / "config.json").read_text())
    assert (raw["kv_lora_rank"], raw["qk_rope_head_dim"], raw["qk_nope_head_dim"], raw["v_head_dim"]) == (
        512,
        64,
        128,
        128,
    )
    assert raw["qk_head_dim"] == 192 and raw["head_dim"] == 64
    for k, v in {
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "ep_size": 1,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 2,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "num_nextn_predict_layers": 0,
    }.items():
        assert raw[k] == v, k
    assert raw["torch_dtype"] == raw["dtype"] == "bfloat16"
    assert raw["architectures"] == ["DeepseekV3ForCausalLM"]

    model = AutoModelForCausalLM.from_pretrained(demo["model_path"], dtype=torch.float32)
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert model.get_output_embeddings().weight.shape[0] == demo["vocab_size"]
    header = read_safetensors_header(Path(demo["model_path"]) / "model.safetensors")
    dtypes = {
        v["dtype"] for k, v in header.items() if k != "__metadata__" and "e_score_correction_bias" not in k
    }
    assert dtypes == {"BF16"}  # the router bias stays fp32 (as in real DeepSeek-V3 checkpoints)
    assert header["model.layers.0.self_attn.kv_b_proj.weight"]["shape"] == [4 * (128 + 128), 512]
    kinds = {type(layer.mlp).__name__ for layer in model.model.layers}
    assert kinds == {"DeepseekV3MLP", "DeepseekV3MoE"}
    with torch.no_grad():
        out = model(torch.tensor([[1, 5, 9]]))
    assert out.logits.shape == (1, 3, demo["vocab_size"])


def test_target_was_trained_on_the_demo_text(demo, tokenizer, conversations):
    """The saved weights predict the demo text far better than chance (ln V): structured predictions."""
    import torch
    from transformers import AutoModelForCausalLM

    meta = json.loads(Path(demo["demo_json"]).read_text())
    assert meta["final_lm_loss"] < meta["initial_lm_loss"] - 2.5
    model = AutoModelForCausalLM.from_pretrained(demo["model_path"], dtype=torch.float32).eval()
    losses = []
    with torch.no_grad():
        for conv in conversations[:6]:
            ids = tokenizer(demo_mod.render(tokenizer, conv["conversations"]), add_special_tokens=False)
            x = torch.tensor([ids["input_ids"]])
            losses.append(float(model(x, labels=x).loss))
    mean = sum(losses) / len(losses)
    assert mean < 0.6 * math.log(demo["vocab_size"]), (mean, losses)
    # and the end-of-turn token is what it predicts after a complete answer
    text = demo_mod.render(tokenizer, conversations[0]["conversations"][:2])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:-1]
    with torch.no_grad():
        nxt = model(torch.tensor([ids])).logits[0, -1].argmax().item()
    assert nxt == tokenizer.eos_token_id, tokenizer.decode([nxt])


def test_tokenizer_special_tokens_and_size(demo, tokenizer):
    assert type(tokenizer).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert 1000 <= len(tokenizer) <= 2000
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|bos|>",
        "<|end|>",
        "<|pad|>",
    )
    for tok in demo_mod.ROLE_TOKENS + demo_mod.THINK_TOKENS:
        assert len(tokenizer.encode(tok, add_special_tokens=False)) == 1, tok
    cfg = json.loads((Path(demo["model_path"]) / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == demo_mod.CHAT_TEMPLATE
    text = "Repeat these words: apple river 42"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_is_prefix_stable(tokenizer, conversations):
    """render(conv[:j], add_generation_prompt) is a text and token prefix of render(conv[:j+1])."""
    checked = 0
    for conv in conversations[:80]:
        turns = conv["conversations"]
        for j, t in enumerate(turns):
            if t["from"] != "gpt":
                continue
            prompt = demo_mod.render(tokenizer, turns[:j], add_generation_prompt=True)
            full = demo_mod.render(tokenizer, turns[: j + 1])
            assert full.startswith(prompt)
            p_ids = tokenizer.encode(prompt, add_special_tokens=False)
            f_ids = tokenizer.encode(full, add_special_tokens=False)
            assert f_ids[: len(p_ids)] == p_ids
            assert tokenizer.decode(f_ids[len(p_ids) :]) == t["value"] + tokenizer.eos_token
            checked += 1
    assert checked > 150


def test_conversations_and_heldout(demo, tokenizer, conversations):
    assert len(conversations) == demo["num_conversations"] == 300
    lengths = []
    for c in conversations:
        turns = c["conversations"]
        assert turns and all(set(t) == {"from", "value"} for t in turns)
        roles = [t["from"] for t in turns if t["from"] != "system"]
        assert roles[0::2] == ["human"] * len(roles[0::2]) and roles[1::2] == ["gpt"] * len(roles[1::2])
        lengths.append(len(tokenizer.encode(demo_mod.render(tokenizer, turns), add_special_tokens=False)))
    assert min(lengths) >= 25 and max(lengths) <= 400, (min(lengths), max(lengths))
    assert max(lengths) > 200  # varied lengths
    assert sum(len(c["conversations"]) > 4 for c in conversations) > 50  # multi-turn
    with open(demo["heldout_path"]) as f:
        held = [json.loads(line) for line in f]
    assert len(held) == demo["num_heldout"] == 32
    seen = {t["value"] for c in conversations for t in c["conversations"] if t["from"] == "human"}
    assert not {h["prompt"] for h in held} & seen
    assert all(h["conversations"] == [{"from": "human", "value": h["prompt"]}] for h in held)


def test_demo_json_fingerprints_match_files(demo):
    meta = json.loads(Path(demo["demo_json"]).read_text())
    root = Path(demo["out"])
    assert set(meta["files"]) >= {"model/model.safetensors", "model/tokenizer.json", "conversations.jsonl"}
    for rel, sha in meta["files"].items():
        assert sha256_file(root / rel) == sha, rel
    assert meta["params"] == {"demo_version": demo_mod.DEMO_VERSION, "num_conversations": 300, "seed": 0}


def test_second_build_is_a_no_op(demo, tmp_path_factory):
    weights = Path(demo["model_path"]) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = run_cache.session_demo(tmp_path_factory)
    assert again["changed"] is False
    assert again["fingerprint"] == demo["fingerprint"]
    assert weights.stat().st_mtime_ns == before


def test_cli_json_and_check(demo, capsys):
    assert cli_main(["demo", "--out", demo["out"], "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["changed"] is False and res["model_path"] == demo["model_path"]
    assert cli_main(["demo", "--out", demo["out"], "--check", "--json", "--seed", "1"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["changed"] is True  # another seed would rebuild ...
    assert json.loads(Path(demo["demo_json"]).read_text())["seed"] == 0  # ... but --check wrote nothing
    # so would other train steps; the default's, given explicitly, is this demo (demos built before the option
    # existed stay current: the default is not recorded); no step at all is refused, exit 2
    assert cli_main(["demo", "--out", demo["out"], "--check", "--json", "--train-steps", "30"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["changed"] is True
    assert cli_main(["demo", "--out", demo["out"], "--check", "--json", "--train-steps", "120"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["changed"] is False
    assert "train_steps" not in json.loads(Path(demo["demo_json"]).read_text())["params"]
    assert cli_main(["demo", "--out", demo["out"], "--json", "--train-steps", "0"]) == 2
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["failed"] and "--train-steps 0: the target needs at least 1 training step" in res["msg"]


def test_generation_is_deterministic_and_seeded():
    a, ha = demo_mod.generate_conversations(40, 0)
    b, hb = demo_mod.generate_conversations(40, 0)
    c, _ = demo_mod.generate_conversations(40, 1)
    assert (a, ha) == (b, hb)
    assert a != c


def test_tokenizer_training_is_deterministic(tmp_path):
    convs, _ = demo_mod.generate_conversations(60, 0)
    texts = [t["value"] for c in convs for t in c["conversations"]]
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        demo_mod.train_tokenizer(texts, tmp_path / d)
    assert (tmp_path / "a/tokenizer.json").read_bytes() == (tmp_path / "b/tokenizer.json").read_bytes()


def test_refuses_to_replace_a_directory_with_foreign_content(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(demo_mod.DemoError, match=r"notes\.txt.*Move those aside"):
        demo_mod.build_demo(out, log=lambda m: None)
    assert (out / "notes.txt").read_text() == "keep me"


def test_kill_mid_build_leaves_no_demo(tmp_path):
    """SIGKILL during the model training: DIR never appears; the next run removes the dead temp dir."""
    out = tmp_path / "demo"
    code = (
        "import sys; from eagle3ops.demo import build_demo; "
        f"build_demo({str(out)!r}, num_conversations=40, log=lambda m: print(m, file=sys.stderr, flush=True))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        for line in proc.stderr:
            if "training the target" in line or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    leftovers = list(tmp_path.glob(".demo.demo-*"))
    assert leftovers, "the killed build should have been working in a temp dir beside DIR"
    assert (leftovers[0] / "conversations.jsonl").exists() and not (leftovers[0] / "demo.json").exists()
    demo_mod._clean_stale_builds(out)
    assert not list(tmp_path.glob(".demo.demo-*"))
