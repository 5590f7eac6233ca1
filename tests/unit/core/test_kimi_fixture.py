"""The Kimi-K2.5-format fixture (eagle3ops.kimi_fixture, ``eagle3ops demo-kimi``): the published checkpoint's
structure, read back with the real readers (safetensors, transformers' Auto classes with and without remote code,
tiktoken, the compressed-tensors package), built once per run (the ``kimi`` fixture)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from eagle3ops import int4
from eagle3ops.cli import main as cli_main
from eagle3ops.kimi_fixture import bpe, spec, weights


@pytest.fixture(scope="module")
def model_dir(kimi) -> Path:
    return Path(kimi["model_path"])


def _config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def test_config_is_the_published_wrapper_shape(model_dir):
    cfg = _config(model_dir)
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"] and cfg["model_type"] == "kimi_k25"
    text = cfg["text_config"]
    assert text["model_type"] == "kimi_k2"
    # DeepSeek-V3's MLA head dims (SGLang's MLA kernels), Marlin's INT4 MoE alignment
    assert [text[k] for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")] == [
        512,
        64,
        128,
        128,
    ]
    assert text["hidden_size"] % 128 == 0 and text["moe_intermediate_size"] % 64 == 0
    assert text["first_k_dense_replace"] == 1 < text["num_hidden_layers"]
    for key in (
        "moe_layer_freq",
        "topk_method",
        "scoring_func",
        "routed_scaling_factor",
        "n_group",
        "topk_group",
    ):
        assert key in text, key
    assert (text["topk_method"], text["scoring_func"]) == ("noaux_tc", "sigmoid")
    ranks = len((model_dir / "tiktoken.model").read_text().splitlines())
    assert text["vocab_size"] == ranks + 256
    assert cfg["media_placeholder_token_id"] == ranks + 21  # <|media_pad|> at the published offset
    vision = cfg["vision_config"]
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vt_hidden_size",
    ):
        assert key in vision, key
    for q in (cfg["quantization_config"], text["quantization_config"]):
        weights_cfg = q["config_groups"]["group_0"]["weights"]
        assert (q["quant_method"], q["format"]) == ("compressed-tensors", "pack-quantized")
        assert (weights_cfg["num_bits"], weights_cfg["group_size"], weights_cfg["symmetric"]) == (4, 32, True)
        assert "lm_head" in q["ignore"] and any("shared_experts" in i for i in q["ignore"])


def test_index_names_every_tensor_once_in_shards_that_exist(model_dir):
    from safetensors import safe_open

    index = json.loads((model_dir / weights.INDEX).read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) >= 2
    seen: dict[str, str] = {}
    for shard in shards:
        assert re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", shard)
        with safe_open(str(model_dir / shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118
                assert name not in seen, f"{name} in {seen.get(name)} and {shard}"
                seen[name] = shard
    assert seen == index
    names = set(index)
    assert "language_model.lm_head.weight" in names and "language_model.model.embed_tokens.weight" in names
    assert any(n.startswith("vision_tower.encoder.blocks.") for n in names)
    assert any(n.startswith("mm_projector.") for n in names)
    experts = [n for n in names if ".mlp.experts." in n]
    assert experts and all(n.endswith(("weight_packed", "weight_scale", "weight_shape")) for n in experts)
    # layer 0 is dense (bf16 gate/up/down), the shared experts stay bf16
    assert "language_model.model.layers.0.mlp.gate_proj.weight" in names
    assert "language_model.model.layers.1.mlp.shared_experts.down_proj.weight" in names


def test_int4_experts_are_compressed_tensors_pack_quantized(model_dir):
    """The stored experts read back by the compressed-tensors package itself equal this module's reading, and
    the dequantised weights are the float model's within half a quantisation step."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
    from safetensors import safe_open

    shard = json.loads((model_dir / weights.INDEX).read_text())["weight_map"]
    stem = "language_model.model.layers.2.mlp.experts.1.down_proj."
    with safe_open(str(model_dir / shard[stem + "weight_packed"]), framework="pt") as f:
        packed, scale, shape = (
            f.get_tensor(stem + s) for s in ("weight_packed", "weight_scale", "weight_shape")
        )
    assert packed.dtype == torch.int32 and scale.dtype == torch.bfloat16 and shape.dtype == torch.int32
    out_dim, in_dim = shape.tolist()
    assert packed.shape == (out_dim, in_dim // 8) and scale.shape == (out_dim, in_dim // spec.GROUP_SIZE)
    q_theirs = unpack_from_int32(packed, 4, torch.Size([out_dim, in_dim]))
    q_ours = int4.unpack(packed, shape)
    assert torch.equal(q_ours, q_theirs) and int(q_ours.min()) >= -8 and int(q_ours.max()) <= 7
    assert torch.equal(int4.pack(q_ours), pack_to_int32(q_theirs, 4))

    reference = weights.reference_text_state_dict(model_dir)
    expected = (q_theirs.float().view(out_dim, -1, spec.GROUP_SIZE) * scale.float().unsqueeze(-1)).view(
        out_dim, in_dim
    )
    assert torch.equal(reference["model.layers.2.mlp.experts.1.down_proj.weight"], expected)
    original = weights.per_expert(weights.text_model(0).state_dict())[
        "model.layers.2.mlp.experts.1.down_proj.weight"
    ]
    step = scale.float().repeat_interleave(spec.GROUP_SIZE, dim=1)
    assert bool(((original - expected).abs() <= step / 2 + 1e-6).all())


def test_remote_code_tokenizer_loads_through_auto_map(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    assert type(tok).__name__ == "TikTokenTokenizer" and "tokenization_kimi" in type(tok).__module__
    assert len(tok) == spec.VOCAB_SIZE
    for token in ("<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<think>", "<|tool_call_begin|>"):
        assert tok.convert_tokens_to_ids(token) == spec.special_id(token)
    text = "Hello, we'll see. It's 42 — 中文!"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_native_tokenizer_differs_on_contractions(model_dir, kimi):
    """The hazard the fixture exists to show: without trust_remote_code, transformers builds its own tokenizer
    from tiktoken.model with another pre-tokenisation split: same vocabulary, other ids for contractions."""
    from transformers import AutoTokenizer

    remote = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    native = AutoTokenizer.from_pretrained(model_dir)
    assert type(native).__name__ != type(remote).__name__ and len(native) == len(remote)

    def ids(tok, text):
        return tok.encode(text, add_special_tokens=False)

    assert ids(native, "the tokens of a draft") == ids(remote, "the tokens of a draft")
    for text in ("I don't know", "and we'll see"):
        assert ids(native, text) != ids(remote, text), text
    conv = json.loads(Path(kimi["conversations_path"]).read_text().splitlines()[1])["messages"]
    rendered = remote.apply_chat_template(conv, tokenize=False)
    assert ids(native, rendered) != ids(remote, rendered)


def test_chat_template_has_the_published_structure(model_dir, kimi):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    weather = json.loads(Path(kimi["conversations_path"]).read_text().splitlines()[2])
    text = tok.apply_chat_template(weather["messages"], tools=weather["tools"], tokenize=False)
    for marker in (
        "<|im_system|>tool_declare<|im_middle|>",
        "<|im_user|>user<|im_middle|>",
        "<|im_assistant|>assistant<|im_middle|><think>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>",
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0",
    ):
        assert marker in text, marker
    prompt = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True).endswith(
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    instant = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, thinking=False)
    assert instant.endswith("<think></think>")
    # an assistant turn before the last user message loses its reasoning; the last one keeps it
    chat = json.loads(Path(kimi["conversations_path"]).read_text().splitlines()[1])["messages"]
    rendered = tok.apply_chat_template(chat, tokenize=False)
    assert chat[2]["reasoning_content"] not in rendered and chat[-1]["reasoning_content"] in rendered


def test_processor_side_loads_as_sglang_reads_it(model_dir):
    from PIL import Image
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(model_dir, trust_remote_code=True)
    assert type(proc.tokenizer).__name__ == "TikTokenTokenizer"
    cfg = proc.media_processor.media_proc_cfg
    for key in ("patch_size", "merge_kernel_size", "in_patch_limit", "patch_limit_on_one_side", "image_mean"):
        assert key in cfg, key
    image = Image.new("RGB", (100, 60), (10, 20, 30))
    n = proc.media_processor.media_tokens_calculator({"type": "image", "image": image})
    out = proc(text=["<|media_pad|>" * n + " what is it?"], medias=[{"type": "image", "image": image}])
    (t, rows, cols) = out["grid_thws"][0].tolist()
    merge = cfg["merge_kernel_size"]
    assert t == 1 and rows * cols == n * merge * merge == len(out["pixel_values"])
    assert out["input_ids"][0][:n] == [spec.special_id(spec.MEDIA_PAD)] * n


def test_bpe_file_and_tokenizer_class_share_the_split():
    """The vocabulary was trained with the split the remote tokenizer class applies (its own copy: the class is
    shipped in the model folder and imports nothing of eagle3ops)."""
    from eagle3ops.kimi_fixture.files import REMOTE, TOKENIZER_CODE

    src = (REMOTE / TOKENIZER_CODE).read_text()
    namespace: dict = {}
    exec(src[src.index("_LETTERS_NOT_HAN") : src.index("def _sorted_deep")], namespace)
    assert namespace["PATTERN"] == bpe.PATTERN
    assert bpe.pretokens(" we'll don't 中文") == [" we'll", " don't", " ", "中文"]


def test_cli_builds_deterministically_and_refuses_a_foreign_dir(tmp_path, kimi, capsys):
    out = tmp_path / "kimi"
    assert cli_main(["demo-kimi", "--out", str(out), "--json"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["changed"] and first["fingerprint"] == kimi["fingerprint"]  # same seed, same bytes
    assert cli_main(["demo-kimi", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["changed"] is False

    foreign = tmp_path / "busy"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    assert cli_main(["demo-kimi", "--out", str(foreign)]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
