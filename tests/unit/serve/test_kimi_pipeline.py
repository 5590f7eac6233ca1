"""The Kimi-K2.5-format fixture end to end on the CPU: prepare (the remote-code tokenizer and chat template, with
``--trust-remote-code``) -> extract (the wrapper's text model, INT4 experts dequantised) -> train (speculators on
the CPU, two steps) -> convert for SGLang. The draft must carry the text model's hidden size, the target's full
vocabulary with a draft-vocabulary mapping into it (d2t; the run's t2d), the aux ids as the wrapper's SGLang model file
captures them, and the result must name the wrapper as the target architecture. Each phase through its own
``eagle3ops`` command, in this process (the trainer is its own process, as always); ~1 minute, most of it the
trainer's start-up."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import torch
from eagle3ops import cli
from safetensors.torch import load_file

IDS = ["0", "2", "3"]  # input-of-layer ids of the fixture's 4 text layers; SGLang would shift a first id of 1


def _cli(*argv) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main([*map(str, argv), "--json"])
    out = json.loads(buf.getvalue().splitlines()[-1])
    assert rc == 0, out
    return out


def test_prepare_extract_train_convert_on_the_kimi_fixture(tmp_path, kimi):
    model = Path(kimi["model_path"])
    text = json.loads((model / "config.json").read_text())["text_config"]
    data, run, draft = tmp_path / "data", tmp_path / "run", tmp_path / "draft"
    prep = _cli("prepare", "--model", model, "--input", kimi["conversations_path"], "--out", data,
                "--max-length", 192, "--max-samples", 6, "--trust-remote-code")  # fmt: skip
    assert prep["num_rows"] == 6 and prep["num_supervised_tokens"] > 0
    ext = _cli("extract", "--data", data, "--model", model, "--layer-ids", *IDS, "--device", "cpu",
               "--trust-remote-code")  # fmt: skip
    assert ext["written"] == 6 and ext["hidden_size"] == text["hidden_size"] and ext["layer_ids"] == [0, 2, 3]
    # no --mask-token-id: for a remote-code verifier the plan takes the config's pad id (speculators would load
    # the wrapper's processor without trust_remote_code to find one, and fail)
    tr = _cli("train", "--data", data, "--verifier", model, "--run-dir", run, "--epochs", 1, "--max-steps", 2,
              "--total-seq-len", 192, "--draft-vocab-size", 64,
              "--device", "cpu", "--trust-remote-code", "--launcher", "setsid", "--no-gpu-free-check", "--wait",
              "--timeout", 600)  # fmt: skip
    assert tr["exit"]["status"] == "finished" and tr["layer_ids"] == [0, 2, 3], tr
    v = tr["draft_vocab_size"]  # capped at the tokens six rows contain
    assert 16 < v <= 64 and tr["draft_vocab_capped"] == (v < 64)
    conv = _cli("serve-convert", "--checkpoint", run, "--out", draft)
    assert conv["target_arch"] == "KimiK25ForConditionalGeneration" and conv["sglang_layer_ids"] == [0, 2, 3]
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["hidden_size"] == text["hidden_size"] == 128  # the text model's, not the wrapper's
    assert cfg["vocab_size"] == text["vocab_size"] == 1024 and cfg["draft_vocab_size"] == v
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    # the target's token ids (speculators' LlamaConfig would say Llama's 1 and 2: the shim sets the verifier's in
    # the trained draft, the converter in the served one), the wrapper as verifier
    tl = json.loads((Path(conv["checkpoint"]) / "config.json").read_text())["transformer_layer_config"]
    assert [tl["bos_token_id"], tl["eos_token_id"]] == [text["bos_token_id"], text["eos_token_id"]] != [1, 2]
    assert [cfg[k] for k in ("bos_token_id", "eos_token_id")] == [text["bos_token_id"], text["eos_token_id"]]
    assert cfg["verifier"]["architectures"] == ["KimiK25ForConditionalGeneration"]
    w = load_file(str(draft / "model.safetensors"))
    # SGLang loads d2t as hot_token_id = d2t + arange (t2d it skips): the draft's tokens in the target's vocabulary,
    # the ones the training run's own map (t2d over all 1024 target ids) marks
    d2t = w["d2t"]
    targets = torch.arange(v) + d2t
    (t2d_file,) = run.glob(f"vocab/*/t2d-{v}.npy")
    t2d = torch.from_numpy(np.load(t2d_file))
    assert d2t.shape == (v,) and t2d.shape == (1024,) and int(t2d.sum()) == v
    assert torch.equal(torch.nonzero(t2d).flatten(), targets) and int(targets.max()) < 1024
    assert w["embed_tokens.weight"].shape == (1024, 128)
    assert w["fc.weight"].shape == (128, 3 * 128) and w["lm_head.weight"].shape == (v, 128)
