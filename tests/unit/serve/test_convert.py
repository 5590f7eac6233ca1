"""The converter's output checked against the REAL SGLang source of every version eagle3ops knows (0.5.17, 0.5.23;
read from each wheel, never imported: its runtime needs CUDA kernels).

- ``LlamaForCausalLMEagle3.load_weights`` is taken from ``sglang/srt/models/llama_eagle3.py`` with ``ast`` and
  executed as is on the converted weights. STAND-IN: the module it loads into. Its parameter names and shapes
  are written here from the source's module tree at tensor-parallel size 1 (each attribute name is asserted
  to be in the source), and the sharded weight loaders of ``QKVParallelLinear`` / ``MergedColumnParallelLinear``
  are replaced by slice copies (q|k|v rows, gate|up rows: their TP=1 behaviour).
- The config keys SGLang reads, the architecture name (``EntryClass``) and the layer-id convention of each
  target model file (``set_eagle3_layers_to_capture``) are read from the source too.
- The checkpoints are made by speculators' own code (``eagle3_draft_fixture``: the trainer's construction and
  ``save_pretrained``) with random decoder weights.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eagle3_draft_fixture import edit_config, make_draft_checkpoint
from eagle3ops.serve import convert as cv_convert
from eagle3ops.sglang.versions import KNOWN
from eagle3ops.train.fixtures import make_tiny_verifier
from proc_helpers import HEAVY, cli_imports
from sglang_loader import _load_weights_fn, _sglang_source, sglang_params


@pytest.fixture(scope="module", params=KNOWN)  # every version in eagle3ops' table, each on its real wheel
def sglang_version(request):
    return request.param


@pytest.fixture(scope="module")
def eagle3_src(sglang_version):
    return _sglang_source("sglang/srt/models/llama_eagle3.py", sglang_version)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    verifier = make_tiny_verifier(root / "verifier", vocab_size=512)
    return {
        "root": root,
        "verifier": verifier,
        "ckpt1": make_draft_checkpoint(root / "ckpt1", verifier, num_layers=1),
        "ckpt2": make_draft_checkpoint(root / "ckpt2", verifier, num_layers=2, norm_before_fc=False, seed=1),
    }


def test_the_stand_in_module_tree_uses_the_sources_names(eagle3_src, sglang_version):
    """Each attribute the stand-in's parameter names use is one the real source defines."""
    llama = _sglang_source("sglang/srt/models/llama.py", sglang_version)
    for attr in ("embed_tokens", "fc", "layers", "norm", "input_norm", "hidden_norm", "lm_head"):
        assert re.search(rf"self\.{attr} = ", eagle3_src), attr
    assert "self.self_attn.qkv_proj = QKVParallelLinear(" in eagle3_src
    assert "hidden_size = 2 * self.hidden_size if self.is_input_layer else self.hidden_size" in eagle3_src
    # layers >= 1 use hidden_norm (fused with the residual) as their pre-attention norm
    assert "hidden_states, residual = self.hidden_norm(hidden_states, residual)" in eagle3_src
    for attr in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"):
        assert re.search(rf"self\.{attr} = ", llama), attr
    for attr in ("gate_up_proj", "down_proj", "o_proj"):
        assert re.search(rf"self\.{attr} = \w+", llama), attr
    assert re.search(r'prefix=add_prefix\("model", prefix\)', eagle3_src)


@pytest.mark.parametrize("which", ["ckpt1", "ckpt2"])
def test_converted_draft_loads_completely_through_the_real_load_weights(base, eagle3_src, tmp_path, which):
    import torch
    from safetensors.torch import load_file

    res = cv_convert.convert(base[which], tmp_path / "draft")
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert res["changed"] and cfg == res["config"]
    weights = load_file(str(tmp_path / "draft" / "model.safetensors"))
    src = load_file(str(Path(base[which]) / "model.safetensors"))

    params = sglang_params(cfg)
    model = SimpleNamespace(named_parameters=lambda: list(params.items()), hot_token_id=None)
    _load_weights_fn(eagle3_src)(model, list(weights.items()))

    # every parameter SGLang's forward uses was loaded (layers >= 1 never call their input_layernorm)
    unused = {f"model.layers.{i}.input_layernorm.weight" for i in range(1, cfg["num_hidden_layers"])}
    for name, p in params.items():
        if name not in unused:
            assert not torch.isnan(p).any(), f"{name} was not loaded: a converted name was silently ignored"
    # ... with the right values, written in bf16 (one dtype with the target: serve passes --dtype bfloat16)
    assert cfg["torch_dtype"] == "bfloat16" and res["stamp"]["dtype"] == "bfloat16"
    assert {str(t.dtype) for n, t in weights.items() if n != "d2t"} == {"torch.bfloat16"}
    assert torch.equal(params["lm_head.weight"], src["lm_head.weight"].bfloat16().float())
    assert torch.equal(params["model.fc.weight"], src["fc.weight"].bfloat16().float())
    qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
    q, k, v = (src[f"layers.0.self_attn.{n}_proj.weight"].bfloat16().float() for n in "qkv")
    assert torch.equal(qkv, torch.cat([q, k, v]))  # q, k, v rounded to bf16 above
    gu = params["model.layers.0.mlp.gate_up_proj.weight"]
    assert torch.equal(
        gu,
        torch.cat([src["layers.0.mlp.gate_proj.weight"], src["layers.0.mlp.up_proj.weight"]])
        .bfloat16()
        .float(),
    )
    if cfg["num_hidden_layers"] > 1:
        assert torch.equal(
            params["model.layers.1.hidden_norm.weight"],
            src["layers.1.input_layernorm.weight"].bfloat16().float(),
        )
    # d2t becomes the hot token ids: draft id i -> target id i + d2t[i]
    hot = model.hot_token_id
    assert hot is not None and torch.equal(hot, src["d2t"] + torch.arange(src["d2t"].shape[0]))
    t2d = src["t2d"]
    assert torch.equal(torch.nonzero(t2d).flatten(), hot)  # the same tokens speculators kept
    assert not any(n.startswith("verifier_") for n in weights)


def test_config_has_what_sglang_reads(base, eagle3_src, tmp_path, sglang_version):
    res = cv_convert.convert(base["ckpt1"], tmp_path / "draft", sglang_version=sglang_version)
    assert res["stamp"]["sglang_version"] == sglang_version
    cfg = res["config"]
    entry = re.search(r"^EntryClass = \[(.*)\]", eagle3_src, re.M).group(1)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and "LlamaForCausalLMEagle3" in entry
    # keys the 0.5.23 draft model reads
    assert "config.draft_vocab_size" in eagle3_src and cfg["draft_vocab_size"] == 200
    assert 'eagle_config.get("eagle_aux_hidden_state_layer_ids")' in eagle3_src
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert 'eagle_config.get("norm_before_fc"' in eagle3_src and cfg["eagle_config"]["norm_before_fc"] is True
    assert 'getattr(config, "norm_output", False)' in eagle3_src and cfg["norm_output"] is True
    assert "self.config.tie_word_embeddings" in eagle3_src and cfg["tie_word_embeddings"] is False
    assert cfg["vocab_size"] == 512 and cfg["model_type"] == "llama"
    # the worker reads the ids from eagle_config too (which layers the target captures)
    aux = _sglang_source(
        "sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py", sglang_version
    )
    assert re.search(r'eagle_config\[\s*"eagle_aux_hidden_state_layer_ids"\s*\]', aux)


def _rule_in_source(src: str, cls_name: str) -> str:
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "set_eagle3_layers_to_capture":
                    text = ast.unparse(fn)
                    if "layer_ids[0] == 1" in text and "list(layer_ids)" in text:
                        return "as_is_unless_first_is_1"
                    if "[val + 1 for val in layer_ids]" in text:
                        return "plus_one"
                    return "other"
    return "missing"


def test_layer_id_rules_match_the_real_model_files(sglang_version):
    """eagle3ops' table of SGLang's layer-id conventions is what each model file of that version does."""
    from eagle3ops.sglang import versions as sglang_versions

    checked = 0
    for arch, (fname, rule) in sglang_versions.get(sglang_version).layer_id_rules.items():
        if arch == "KimiK25ForConditionalGeneration":
            src = _sglang_source("sglang/srt/models/kimi_k25.py", sglang_version)
            assert "DeepseekV3ForCausalLM" in src  # the wrapper holds the DeepSeek language model
            continue
        src = _sglang_source(f"sglang/srt/models/{fname}", sglang_version)
        # DeepseekV3ForCausalLM subclasses DeepseekV2ForCausalLM without overriding the method
        cls = "DeepseekV2ForCausalLM" if arch == "DeepseekV3ForCausalLM" else arch
        assert re.search(rf"^class {arch}\(", src, re.M), f"{arch} not in {fname}"
        assert _rule_in_source(src, cls) == rule, f"{arch} ({fname})"
        checked += 1
    assert checked >= 6


def test_layer_ids_per_target_convention():
    assert cv_convert.sglang_layer_ids([2, 4, 5], "DeepseekV3ForCausalLM") == (
        [2, 4, 5],
        "as_is_unless_first_is_1",
    )
    assert cv_convert.sglang_layer_ids([2, 30, 58], "LlamaForCausalLM")[0] == [1, 29, 57]
    with pytest.raises(cv_convert.ConvertError, match="shifts ids that start with 1"):
        cv_convert.sglang_layer_ids([1, 4, 5], "DeepseekV3ForCausalLM")
    with pytest.raises(cv_convert.ConvertError, match="layer id 0"):
        cv_convert.sglang_layer_ids([0, 4, 5], "Qwen3ForCausalLM")
    with pytest.raises(cv_convert.ConvertError, match="--sglang-layer-ids"):
        cv_convert.sglang_layer_ids([2, 4, 5], "MysteryForCausalLM")
    assert cv_convert.sglang_layer_ids([2, 4, 5], "DeepseekV3ForCausalLM", sglang_version="0.5.17")[0] == [
        2,
        4,
        5,
    ]
    with pytest.raises(cv_convert.ConvertError, match="known versions: " + re.escape(", ".join(KNOWN))):
        cv_convert.sglang_layer_ids([2, 4, 5], "DeepseekV3ForCausalLM", sglang_version="0.6.0")


def test_unservable_checkpoints_are_refused_with_what_to_do(base, tmp_path):
    ck = base["ckpt1"]
    cases = {
        "nbr": ({"norm_before_residual": True}, "norm_before_residual false"),
        "emb": ({"embed_requires_grad": True}, "replaces the draft's embedding"),
        "mix": (
            {"tl_layer_types": ["full_attention", "sliding_attention"], "tl_num_hidden_layers": 2},
            "mix full",
        ),
        "swa": (
            {"tl_layer_types": ["sliding_attention"], "tl_sliding_window": 512},
            "--speculative-draft-window-size 512",
        ),
        "qwen": ({"tl_model_type": "qwen3"}, "Llama layer"),
    }
    for name, (changes, needle) in cases.items():
        bad = edit_config(ck, tmp_path / name, **changes)
        with pytest.raises(cv_convert.ConvertError) as e:
            cv_convert.convert(bad, tmp_path / f"{name}-out")
        assert needle in str(e.value) and str(bad) in str(e.value), (name, str(e.value))
        assert not (tmp_path / f"{name}-out").exists()
    # a sliding-window draft is servable with the matching window, and says how
    swa = tmp_path / "swa"
    with pytest.raises(cv_convert.ConvertError, match="serve window 256 != the trained sliding window 512"):
        cv_convert.convert(swa, tmp_path / "swa-out", serve_window=256)
    res = cv_convert.convert(swa, tmp_path / "swa-out", serve_window=512)
    assert res["serve_args"][-2:] == ["--speculative-draft-window-size", "512"]


def test_idempotent_check_mode_and_cli(base, tmp_path, capsys):
    from eagle3ops.cli import main

    out = tmp_path / "draft"
    argv = ["serve-convert", "--checkpoint", str(base["ckpt1"].parent / "ckpt1"), "--out", str(out), "--json"]
    assert main([*argv, "--check"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["changed"] is True and not out.exists()
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["changed"] is True and (out / "model.safetensors").is_file()
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["changed"] is False and (out / "model.safetensors").stat().st_mtime_ns == mtime
    # the serve phase runs this on every site.yml run: an up-to-date draft, or --check, imports no torch
    for extra in ([], ["--check"]):
        r, imported = cli_imports(*argv, *extra)
        assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1])["changed"] is False, r.stderr
        assert "eagle3ops" in imported and not imported & HEAVY, (extra, imported & HEAVY)
    assert res["serve_args"] == [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(out),
    ]
    # a refused checkpoint: exit 2, JSON with the message
    bad = edit_config(base["ckpt1"], tmp_path / "bad", norm_before_residual=True)
    assert main(["serve-convert", "--checkpoint", str(bad), "--out", str(tmp_path / "o"), "--json"]) == 2
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["failed"] and "norm_before_residual" in res["msg"]


def test_kimi_draft_takes_token_ids_and_verifier_from_the_target(kimi, tmp_path, capsys):
    """On the Kimi-K2.5-format fixture: speculators' own construction (without the train phase's shim) builds the
    draft's decoder config as a LlamaConfig (bos 1, eos 2: Llama's defaults); the converted draft carries the target's ids (from its text_config) and names the
    wrapper as its verifier, with the target given (the serve role's --target) or found through the checkpoint's
    own verifier record; an unreadable --target is refused, nothing written."""
    from eagle3ops.cli import main

    model = Path(kimi["model_path"])
    wrapper = json.loads((model / "config.json").read_text())
    text = wrapper["text_config"]
    ck = make_draft_checkpoint(tmp_path / "ck", model, layer_ids=(0, 2, 3), draft_vocab=64)
    tl = json.loads((ck / "config.json").read_text())["transformer_layer_config"]
    assert (tl["bos_token_id"], tl["eos_token_id"]) == (1, 2)  # what speculators wrote
    assert (text["bos_token_id"], text["eos_token_id"]) != (1, 2)
    for name, given in (("given", model), ("named", None)):
        res = cv_convert.convert(ck, tmp_path / name, target=given)
        cfg = json.loads((tmp_path / name / "config.json").read_text())
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            assert cfg[k] == text[k], (name, k)
        assert cfg["verifier"] == {
            "name_or_path": str(model),
            "architectures": ["KimiK25ForConditionalGeneration"],
            "model_type": "kimi_k25",
            "text_model_type": "kimi_k2",
        }
        assert res["target_arch"] == "KimiK25ForConditionalGeneration" and res["token_ids_from"] == str(model)
        assert cv_convert.convert(ck, tmp_path / name, target=given)["changed"] is False
    # an unreadable target: exit 2 naming its config.json, no draft written
    argv = ["serve-convert", "--checkpoint", str(ck), "--out", str(tmp_path / "o"), "--json"]
    assert main([*argv, "--target", str(tmp_path / "nowhere")]) == 2
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert str(tmp_path / "nowhere" / "config.json") in res["msg"] and not (tmp_path / "o").exists()


def test_the_layer_id_rule_is_the_served_targets(base, tmp_path):
    """SGLang applies the layer-id rule of the model file it serves: with ``--target`` the converter reads the
    rule from that target's architecture, not from the verifier the checkpoint recorded; ``--target-arch`` still
    wins; a checkpoint whose verifier record names no architecture converts once a target says what is served."""
    ck = base["ckpt1"]  # trained on the tiny DeepSeek-V3 verifier, aux ids 2, 4, 5
    served = tmp_path / "served"
    served.mkdir()
    (served / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "eos_token_id": 1}))  # fmt: skip
    alone = cv_convert.plan(ck)  # the verifier the checkpoint names is here: its own config
    assert (alone["target_arch"], alone["layer_id_rule"]) == (
        "DeepseekV3ForCausalLM",
        "as_is_unless_first_is_1",
    )
    assert alone["sglang_layer_ids"] == [2, 4, 5]
    assert alone["target_arch_from"] == f"the target {base['verifier']}"
    p = cv_convert.plan(ck, target=served)  # Llama's llama.py adds 1 to each id it reads
    assert (p["target_arch"], p["layer_id_rule"]) == ("LlamaForCausalLM", "plus_one")
    assert p["sglang_layer_ids"] == [1, 3, 4] and p["target_arch_from"] == f"the target {served}"
    assert p["config"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    given = cv_convert.plan(ck, target=served, target_arch="DeepseekV3ForCausalLM")
    assert (given["sglang_layer_ids"], given["target_arch_from"]) == ([2, 4, 5], "given")
    sc = json.loads((ck / "config.json").read_text())["speculators_config"]
    sc["verifier"] = {**sc["verifier"], "architectures": [], "name_or_path": str(tmp_path / "gone")}
    bare = edit_config(ck, tmp_path / "bare", speculators_config=sc)
    with pytest.raises(cv_convert.ConvertError, match=r"architecture is unknown.*give --target"):
        cv_convert.plan(bare)
    res = cv_convert.plan(bare, target=served)
    assert res["sglang_layer_ids"] == [1, 3, 4] and res["target_arch_from"] == f"the target {served}"


def test_the_served_drafts_bytes_are_known_before_it_is_converted(base, tmp_path, capsys):
    """``eagle3ops memory-fit --draft`` weighs the draft before ``serve-convert`` writes it: from a speculators
    checkpoint (its header: the tensors the conversion keeps, floats in bf16) the figure equals the converted
    draft's tensor bytes; the converted draft counts its files; a run with no checkpoint yet counts 0, said so;
    a truncated checkpoint is refused by the CLI with exit 2 naming it."""
    from eagle3ops.cli import main
    from eagle3ops.serve.draft_bytes import served_bytes
    from eagle3ops.store.sample import read_safetensors_header

    ck = base["ckpt2"]
    before, source = served_bytes(ck)
    out = tmp_path / "draft"
    cv_convert.convert(ck, out)
    header = read_safetensors_header(out / "model.safetensors")
    written = sum(
        v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"
    )
    assert before == written and source == f"the speculators checkpoint {ck} (the converted tensors, bf16)"
    assert served_bytes(out) == ((out / "model.safetensors").stat().st_size, f"the converted draft {out}")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert served_bytes(tmp_path / "run")[0] == 0 and "no checkpoint yet" in served_bytes(tmp_path / "run")[1]
    broken = edit_config(ck, tmp_path / "broken")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    argv = ["memory-fit", "--model", str(base["verifier"]), "--phase", "serve", "--gpu-memory-mib", "81920",
            "--server-args=--mem-fraction-static 0.5", "--draft", str(broken)]  # fmt: skip
    assert main([*argv, "--json"]) == 2
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["failed"] and f"--draft {broken}: cannot read the draft's size" in res["msg"]
    assert main([*argv[:-1], str(ck), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["draft"] == {"bytes": before, "from": source}
