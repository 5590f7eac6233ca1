"""Extraction (transformers backend) of a Kimi-K2.5-format target (the kimi fixture: a KimiK25ForConditionalGeneration
wrapper, ``language_model.`` weights in three shards + index, INT4 compressed-tensors routed experts, a vision
tower beside them): the text model's layers, resolved through ``text_config``; the INT4 experts dequantised on
load; no vision tensor read; and the refusals (exit 2, the thing named, nothing written), by extract-sglang too."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from eagle3ops import int4
from eagle3ops.cli import main
from eagle3ops.extract import text_model
from eagle3ops.extract.errors import ExtractError
from eagle3ops.extract.session import ExtractConfig
from eagle3ops.extract.transformers_backend import run_extraction
from eagle3ops.kimi_fixture import spec, weights
from eagle3ops.store import HiddenStateStore
from safetensors.torch import load_file
from tinymodels import build_prepared_dataset

LENGTHS = [7, 19, 12]
IDS = [1, 2, 3]  # input-of-layer ids of the fixture's 4 text layers


def _run(data_dir, model, **kw):
    cfg = ExtractConfig(
        data_dir=str(data_dir),
        model_path=str(model),
        progress=False,
        dtype="float32",
        trust_remote_code=True,
        **kw,
    )
    return run_extraction(cfg)


def test_the_text_model_is_extracted_with_int4_experts_dequantised_and_no_vision_read(
    tmp_path, kimi, monkeypatch
):
    import safetensors

    read: list[str] = []
    real_open = safetensors.safe_open

    class Recording:
        def __init__(self, *a, **k):
            self._f = real_open(*a, **k)

        def __enter__(self):
            self._f.__enter__()
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def keys(self):
            return self._f.keys()

        def get_tensor(self, name):
            read.append(name)
            return self._f.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    model_dir = Path(kimi["model_path"])
    data = build_prepared_dataset(tmp_path / "data", LENGTHS, vocab=spec.VOCAB_SIZE)
    res = _run(data, model_dir, layer_ids=IDS, max_batch_size=2)
    assert res["written"] == len(LENGTHS) and res["layer_ids"] == IDS
    assert read and all(n.startswith("language_model.") for n in read), sorted(
        {n.split(".")[0] for n in read}
    )

    ck = text_model.describe(model_dir)
    assert (ck.prefix, ck.quantized, ck.text_config["num_hidden_layers"]) == ("language_model.", True, 4)
    model = text_model.load(ck, "cpu", torch.float32)
    # a routed expert is the fixture's float weight through INT4 group 32 and back; a bf16 tensor is its bf16 copy
    ref = weights.per_expert(weights.text_model(kimi.get("seed", 0)).state_dict())
    gate = ref["model.layers.1.mlp.experts.0.gate_proj.weight"]
    packed = int4.compress(gate, spec.GROUP_SIZE)
    want = int4.dequantize(packed["weight_packed"], packed["weight_scale"], packed["weight_shape"].tolist())
    got = model.model.layers[1].mlp.experts.gate_up_proj[0][: gate.shape[0]]
    torch.testing.assert_close(got, want)
    q_a = ref["model.layers.0.self_attn.q_a_proj.weight"].to(torch.bfloat16).float()
    torch.testing.assert_close(model.model.layers[0].self_attn.q_a_proj.weight, q_a)
    # the stored states are that model's: hidden_states[i] for the aux ids, the pre-norm last state last
    import datasets

    ids = torch.tensor(datasets.load_from_disk(str(data))[1]["input_ids"])
    hs = load_file(str(HiddenStateStore(data).path(1)))["hidden_states"]
    with torch.no_grad():
        out = model(ids[None], output_hidden_states=True)
    for k, lid in enumerate(IDS):
        torch.testing.assert_close(hs[:, k], out.hidden_states[lid][0], rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(
            model.lm_head(model.model.norm(hs[:, 3])), out.logits[0], rtol=1e-4, atol=1e-4
        )


def _copy(kimi, tmp_path) -> Path:
    return Path(shutil.copytree(kimi["model_path"], tmp_path / "model"))


def _refused(data: Path, model: Path, match: str, **kw) -> None:
    """Refused by both backends before anything is written: the transformers one (in this process) and
    ``extract-sglang`` (exit 2, the message; no server runs here, none is asked: the refusal comes first)."""
    with pytest.raises(ExtractError, match=match):
        _run(data, model, **kw)
    assert not (data / "hidden_states").exists() and not list(data.glob("extract*")), sorted(data.iterdir())
    before = sorted(p.name for p in data.iterdir())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["extract-sglang", "--data", str(data), "--model", str(model), "--url", "http://127.0.0.1:9",
                   "--layer-ids", *map(str, kw["layer_ids"]), "--trust-remote-code", "--health-timeout", "1", "--json"])  # fmt: skip
    out = json.loads(buf.getvalue().splitlines()[-1])
    assert rc == 2 and re.search(match, out["msg"]), out
    assert sorted(p.name for p in data.iterdir()) == before


def test_broken_or_wrong_checkpoints_are_refused_before_anything_is_written(tmp_path, kimi):
    data = build_prepared_dataset(tmp_path / "data", LENGTHS, vocab=spec.VOCAB_SIZE)
    model = _copy(kimi, tmp_path)
    # layer ids beyond text_config.num_hidden_layers (the wrapper's top level has none)
    _refused(data, model, r"out of range for a target with 4 layers", layer_ids=[2, 30, 58])
    shards = sorted(model.glob("model-*.safetensors"))
    first = shards[0].read_bytes()
    shards[0].write_bytes(first[: len(first) // 2])
    _refused(data, model, rf"{shards[0].name}: .* truncated", layer_ids=IDS)
    shards[0].unlink()
    _refused(data, model, rf"lists 3 shards but 1 are missing \({shards[0].name}\)", layer_ids=IDS)
    shards[0].write_bytes(first)
    # a vision-only checkpoint: the wrapper's config, only the vision tower's shard
    index = json.loads((model / "model.safetensors.index.json").read_text())
    vision = {k: v for k, v in index["weight_map"].items() if not k.startswith("language_model.")}
    assert vision and len(set(vision.values())) == 1, (
        "the fixture keeps the vision tower in a shard of its own"
    )
    (model / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": vision}))
    _refused(
        data, model, r"no model\.layers\.0\.\* tensors .* a vision tower or an encoder alone", layer_ids=IDS
    )
    # an encoder-only checkpoint
    (model / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "num_hidden_layers": 4,
                                                   "hidden_size": 128}))  # fmt: skip
    _refused(data, model, r"names \['BertModel'\]: not a decoder language model", layer_ids=IDS)
    # the command line: exit 2, the message, nothing written
    p = subprocess.run(
        [sys.executable, "-m", "eagle3ops", "extract", "--data", str(data), "--model", str(model), "--layer-ids",
         "1", "2", "3", "--device", "cpu", "--trust-remote-code", "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (
        p.returncode == 2 and "not a decoder language model" in json.loads(p.stdout.splitlines()[-1])["msg"]
    )
    assert not (data / "hidden_states").exists()
