"""SpecForge as the second trainer (eagle3ops.train.specforge): what runs without a GPU.

The real SpecForge 0.2.0 package is imported (installed --no-deps, requirements/speculators.txt): its own feature
reader (``load_feature_file``), its own EAGLE-3 offline normaliser and collator, its own config schema, its own draft
model class and exporter. Its training itself needs a GPU (FSDP on an accelerator, a Triton loss kernel): that part
runs on the H200 box only (bench/proof_of_value.py), never here.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("specforge")

from eagle3ops.train import specforge as sf
from eagle3ops.train.fixtures import make_data_dir
from eagle3ops.train.inputs import write_vocab_maps
from eagle3ops.train.spec import TrainError, TrainSpec

LAYERS = (2, 4, 5)


def _llama_target(out: Path, tied: bool = True) -> Path:
    """A tiny Llama target in the SmolLM2 layout (tied embeddings, one safetensors file, no index)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tied,
                      rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a final norm that is not all ones, so applying it is visible
        model.model.norm.weight.uniform_(0.5, 1.5)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("specforge")
    target = _llama_target(root / "target")
    data = make_data_dir(
        root / "data", target, num_samples=20, min_len=12, max_len=40, layer_ids=LAYERS, real=True
    )
    freq = {int(k): int(v) for k, v in torch.load(data / "token_freq.pt").items()}
    d2t, t2d = write_vocab_maps(freq, 64, 300, root / "vocab")
    values = {
        "specforge_dir": str(root / "run" / sf.INPUTS),
        "draft_vocab_size": 64,
        "layer_ids": list(LAYERS),
        "num_layers": 1,
        "d2t_path": str(d2t),
        "t2d_path": str(t2d),
        "train_data_ratio": 0.9,
        "epochs": 2,
        "specforge_lr": 1e-4,
        "specforge_ttt": 7,
        "seed": 42,
        "log_freq": 1,
        "max_steps": None,
        "lm_head_key": sf.lm_head_key(target),
        "max_length": 2048,
        "num_workers": 2,
        "extra": {"training": {"batch_size": 4}},
    }
    res = sf.prepare_inputs(values, data, target, 20)
    return SimpleNamespace(
        root=root, target=target, data=data, values=values, res=res, inputs=root / "run" / sf.INPUTS
    )


def test_pointer_files_give_specforge_the_rows_it_expects(run):
    """SpecForge's own reader opens each pointer file and gets the sample dict of its offline layout: ids and loss
    mask of the prepared row, the aux layers side by side, and the last state after the target's own final norm
    (checked against the target's RMSNorm module, not our formula)."""
    from datasets import load_from_disk
    from eagle3ops.store.sample import load_sample
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import list_feature_files
    from transformers import AutoModelForCausalLM

    assert run.res["features"] == {"dir": str(run.inputs / sf.FEATURES), "rows": 18, "written": 18, "kept": 0}
    files = list_feature_files(str(run.inputs / sf.FEATURES))
    assert len(files) == 18  # the training split only (the speculators trainer validates on the last 10 %)
    assert all(Path(f).stat().st_size < 4096 for f in files)  # pointers, not copies of the states
    ds = load_from_disk(str(run.data))
    norm = AutoModelForCausalLM.from_pretrained(str(run.target), dtype=torch.float32).model.norm
    for i, f in enumerate(files):
        raw = load_feature_file(f)
        row = ds[i]
        ours = load_sample(run.data / "hidden_states" / f"hs_{i}.safetensors")
        hs = ours["hidden_states"]
        t = len(row["input_ids"])
        assert torch.equal(raw["input_ids"], torch.as_tensor(row["input_ids"]).long())
        assert torch.equal(raw["loss_mask"], torch.as_tensor(row["loss_mask"]).long())
        assert (
            raw["aux_hidden_state"].shape == (1, t, 3 * 64)
            and raw["aux_hidden_state"].dtype == torch.bfloat16
        )
        assert torch.equal(raw["aux_hidden_state"][0, :, 64:128], hs[:, 1, :])
        with torch.no_grad():
            want = norm.to(torch.bfloat16)(hs[:, 3, :])
        assert raw["hidden_state"].shape == (1, t, 64)
        assert torch.equal(raw["hidden_state"][0], want), f"row {i}: not the target's final norm"


def test_specforges_normaliser_and_collator_take_the_rows(run):
    from specforge.algorithms.eagle3.data import build_offline_collator, normalize_offline_sample
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import list_feature_files

    files = list_feature_files(str(run.inputs / sf.FEATURES))[:4]
    batch = build_offline_collator()(
        [normalize_offline_sample(load_feature_file(f), max_len=2048) for f in files]
    )
    assert batch["hidden_state"].shape[0] == 4 and batch["hidden_state"].shape[-1] == 192
    assert batch["target"].shape[-1] == 64 and batch["input_ids"].shape == batch["loss_mask"].shape


def test_a_second_prepare_writes_nothing_and_a_damaged_row_is_refused(run, tmp_path):
    again = sf.write_features(run.data, run.inputs / sf.FEATURES, run.inputs / sf.NORM_FILE, 1e-5, 18)
    assert again["written"] == 0 and again["kept"] == 18
    # a pointer whose mask does not fit its file (the dataset was re-prepared under it) fails loudly
    with pytest.raises(sf.SpecForgeError, match="loss mask has 3"):
        sf.load_row(str(run.data / "hidden_states" / "hs_0.safetensors"), b"\x00\x01\x01",
                    str(run.inputs / sf.NORM_FILE), 1e-5)  # fmt: skip


def test_the_target_view_has_the_index_specforge_needs(run):
    from specforge.modeling.target.target_head import TargetHead

    index = json.loads((run.inputs / "target" / "model.safetensors.index.json").read_text())
    assert "model.embed_tokens.weight" in index["weight_map"] and "model.norm.weight" in index["weight_map"]
    assert not (run.target / "model.safetensors.index.json").exists()  # the user's directory is untouched
    head = TargetHead(str(run.inputs / "target"))
    head.load_weights(str(run.inputs / "target"), lm_head_key=sf.lm_head_key(run.target))
    tied = json.loads((run.target / "config.json").read_text())["tie_word_embeddings"]
    assert tied and sf.lm_head_key(run.target) == "model.embed_tokens.weight"


def test_draft_config_is_specforges_derivation_with_our_vocabulary_and_layers(run):
    from specforge.modeling.auto import AutoDraftModelConfig
    from specforge.training import model_loading

    assert sf.TARGET_FIELDS == model_loading._TARGET_ARCHITECTURE_FIELDS  # our copy of SpecForge's list
    cfg = json.loads((run.inputs / sf.DRAFT_CONFIG).read_text())
    assert cfg["draft_vocab_size"] == 64 and cfg["vocab_size"] == 300 and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    loaded = AutoDraftModelConfig.from_file(str(run.inputs / sf.DRAFT_CONFIG))
    assert loaded.architectures == ["LlamaForCausalLMEagle3"] and loaded.hidden_size == 64


def test_draft_config_takes_the_targets_rope_from_rope_parameters(tmp_path):
    """A transformers 5 target config (the converted SmolLM2's) states its rope only in ``rope_parameters``; the
    draft gets that theta, not LlamaConfig's 10,000 (what SpecForge's own derivation gave in run 2)."""
    from specforge.modeling.auto import AutoDraftModelConfig

    target = {"vocab_size": 300, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 512,
              "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(target))
    cfg = sf.draft_config(tmp_path, 64, [1, 2, 3])
    assert cfg["rope_theta"] == 100000.0 and cfg["rope_parameters"]["rope_theta"] == 100000.0
    (tmp_path / "draft.json").write_text(json.dumps(cfg))
    loaded = AutoDraftModelConfig.from_file(str(tmp_path / "draft.json"))
    theta = getattr(loaded, "rope_theta", None) or loaded.rope_parameters["rope_theta"]
    assert theta == 100000.0
    # a config with the top-level key keeps it (SpecForge's own derivation)
    (tmp_path / "config.json").write_text(json.dumps({**target, "rope_parameters": None, "rope_theta": 5e5}))
    assert sf.draft_config(tmp_path, 64, [1, 2, 3])["rope_theta"] == 5e5


def test_vocab_mapping_is_the_speculators_runs(run):
    import numpy as np

    m = torch.load(run.inputs / sf.VOCAB_FILE)
    assert torch.equal(m["d2t"], torch.from_numpy(np.load(run.values["d2t_path"])).long())
    assert torch.equal(m["t2d"], torch.from_numpy(np.load(run.values["t2d_path"])).bool())


def test_specforge_accepts_the_run_config_and_refuses_a_bad_one(run):
    cfg = sf.run_config(run.values)
    sf.validate(cfg)  # SpecForge's own pydantic schema
    assert cfg["training"]["batch_size"] == 4 and cfg["training"]["ttt_length"] == 7
    assert cfg["data"]["hidden_states_path"].endswith(sf.FEATURES)
    bad = json.loads(json.dumps(cfg))
    bad["training"]["warmup_ratio"] = 3.0
    with pytest.raises(TrainError, match="warmup_ratio"):
        sf.validate(bad)
    capped = sf.run_config({**run.values, "max_steps": 50})
    assert capped["training"]["max_steps"] == capped["training"]["total_steps"] == 50
    # torchrun's world (the launcher's) is the topology SpecForge checks WORLD_SIZE against
    assert cfg["deployment"]["trainer"] == {"nnodes": 1, "nproc_per_node": 1}
    two = sf.run_config({**run.values, "nproc": 4, "nnodes": 2, "rdzv_host": "10.0.0.1"})
    sf.validate(two)
    assert two["deployment"]["trainer"] == {"nnodes": 2, "nproc_per_node": 4, "master_addr": "10.0.0.1"}


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"training": {"learning_rate": 1.0}}, "derives for SpecForge"),
        ({"optimizer": {"lr": 1}}, "unknown group"),
    ],
)
def test_extra_config_cannot_override_what_the_phase_derives(extra, match):
    with pytest.raises(TrainError, match=match):
        sf.check_extra(extra)


def test_the_train_phase_refuses_specforge_on_cpu_before_writing_anything(run, tmp_path):
    from eagle3ops.train.planning import plan

    spec = TrainSpec(data_dir=str(run.data), verifier_path=str(run.target), run_dir=str(tmp_path / "r"),
                     trainer="specforge", device="cpu")  # fmt: skip
    with pytest.raises(TrainError, match="needs a GPU host"):
        plan(spec)
    assert not (tmp_path / "r").exists()


def test_specforge_fc_norm_is_refused_with_another_trainer_before_writing_anything(run, tmp_path):
    from eagle3ops.train.planning import plan

    spec = TrainSpec(data_dir=str(run.data), verifier_path=str(run.target), run_dir=str(tmp_path / "r"),
                     specforge_fc_norm=True)  # fmt: skip
    with pytest.raises(TrainError, match="specforge_fc_norm is for trainer specforge"):
        plan(spec)
    assert not (tmp_path / "r").exists()


def test_the_fc_norm_draft_normalises_each_aux_state(run):
    """SpecForge's own draft model, built from the config the phase derives with ``fc_norm``: its first projection
    sees each aux state at unit RMS, so a state 1,000 times larger (SmolLM2's first token) projects the same."""
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    cfg = sf.draft_config(run.target, 64, list(LAYERS), fc_norm=True)
    assert cfg["fc_norm"] is True and "fc_norm" not in sf.draft_config(run.target, 64, list(LAYERS))
    path = run.root / "fc_norm_draft.json"
    path.write_text(json.dumps(cfg))
    model = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(str(path)))
    x = torch.randn(1, 5, 3 * 64)
    with torch.no_grad():
        assert torch.allclose(
            model.project_hidden_states(x), model.project_hidden_states(1000 * x), atol=1e-4
        )


def test_each_trainer_gets_its_own_defaults(run, tmp_path):
    from eagle3ops.train.planning import plan

    p = plan(TrainSpec(data_dir=str(run.data), verifier_path=str(run.target), run_dir=str(tmp_path / "s")))
    assert p.values["lr"] == 1e-3 and p.values["ttt_steps"] == 3 and "lr: 0.001" in p.config_text


def test_metrics_lines_are_read_from_the_log():
    text = "noise\nstep 10: {'loss': 1.5, 'acc': [0.5, 0.4]}\nstep 20: {'loss': 1.25}\nstep x: {}\n"
    assert sf.metrics_from_log(text) == [
        {"step": 10, "loss": 1.5, "acc": [0.5, 0.4]},
        {"step": 20, "loss": 1.25},
    ]


def _specforge_checkpoint(run, out: Path, step: int = 7, config: Path | None = None) -> Path:
    """A checkpoint in SpecForge's layout (``{run_id}-step{N}/training_state.pt`` + ``{run_id}-latest``), of a draft
    built by SpecForge's own model class from the run's draft config (random weights: the export is what is tested)."""
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    torch.manual_seed(1)
    model = AutoDraftModel.from_config(
        AutoDraftModelConfig.from_file(str(config or run.inputs / sf.DRAFT_CONFIG))
    )
    sd = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
    d = out / f"eagle3ops-step{step}"
    d.mkdir(parents=True)
    torch.save({"draft_state_dict": sd, "strategy": "eagle3", "global_step": step}, d / sf.STATE_FILE)
    (out / "eagle3ops-latest").symlink_to(d.name)
    return d


@pytest.mark.parametrize("fc_norm", [False, True])
def test_convert_exports_a_specforge_run_that_sglangs_loader_takes(run, tmp_path, fc_norm):
    """``eagle3ops serve-convert`` of a SpecForge run: SpecForge's exporter, our layer-id translation and stamp; every
    parameter of SGLang's LlamaForCausalLMEagle3 (0.5.17's real load_weights) gets a weight. With ``fc_norm``
    (train_specforge_fc_norm), the per-state norms SpecForge's draft trains reach SGLang's ``fc_norm`` too."""
    import shutil

    from eagle3ops.serve import convert as cv
    from safetensors.torch import load_file
    from sglang_loader import _load_weights_fn, _sglang_source, sglang_params

    rundir = tmp_path / "run"
    shutil.copytree(run.inputs, rundir / sf.INPUTS, symlinks=True, ignore=shutil.ignore_patterns(sf.FEATURES))
    config = rundir / sf.INPUTS / sf.DRAFT_CONFIG
    if fc_norm:
        config.unlink()  # (a copy of the module fixture's file: rewritten here only)
        config.write_text(json.dumps(sf.draft_config(run.target, 64, list(LAYERS), fc_norm=True)))
    _specforge_checkpoint(run, rundir / sf.INPUTS / sf.OUTPUT, config=config)
    assert cv.is_specforge_run(rundir)
    from eagle3ops.serve.draft_bytes import served_bytes

    weighed, source = served_bytes(rundir)  # memory-fit's figure, before the export
    assert source.startswith("the SpecForge checkpoint")
    res = cv.convert_specforge(rundir, tmp_path / "draft", sglang_version="0.5.17")
    assert (
        res["changed"]
        and res["stamp"]["sglang_version"] == "0.5.17"
        and res["stamp"]["trainer"] == "specforge"
    )
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    # Llama targets: SGLang's llama.py adds 1 to each id (id i = output of layer i); ours are inputs of layer i
    assert res["sglang_layer_ids"] == [1, 3, 4] == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    weights = {}
    for f in (tmp_path / "draft").glob("*.safetensors"):
        weights.update(load_file(str(f)))
    exported = sum(t.numel() * t.element_size() for t in weights.values())
    assert weighed == exported
    params = sglang_params(cfg)
    model = SimpleNamespace(named_parameters=lambda: list(params.items()), hot_token_id=None)
    _load_weights_fn(_sglang_source("sglang/srt/models/llama_eagle3.py", "0.5.17"))(
        model, list(weights.items())
    )
    for name, p in params.items():
        if name != "model.embed_tokens.weight":  # the target's, set at load
            assert not torch.isnan(p).any(), f"{name} was not loaded"
    assert bool(cfg.get("fc_norm")) == fc_norm
    assert ("model.fc_norm.2.weight" in params) == fc_norm
    again = cv.convert_specforge(rundir, tmp_path / "draft", sglang_version="0.5.17")
    assert not again["changed"]
    # the target the run trained against, through its linked view: its token ids and the verifier record
    target = json.loads((run.target / "config.json").read_text())
    assert cfg["verifier"]["name_or_path"] == str(run.target.resolve())
    assert cfg["verifier"]["architectures"] == target["architectures"]
    assert res["target_arch_from"] == f"the target {run.target.resolve()}"
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (target["bos_token_id"], target["eos_token_id"])


def test_the_draft_config_takes_a_wrappers_token_ids_from_its_top_level_too(tmp_path):
    """A multimodal wrapper's ``text_config`` may leave the special token ids to the top level: the draft gets
    them from there (``text_config`` first), not the Llama defaults."""
    text = {"vocab_size": 64, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
            "eos_token_id": 9}  # fmt: skip
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["W"], "text_config": text, "bos_token_id": 7, "eos_token_id": 8})
    )
    out = sf.draft_config(tmp_path, 16, [0, 1, 2])
    assert (out["bos_token_id"], out["eos_token_id"], out["hidden_size"]) == (7, 9, 32)


def test_convert_without_a_checkpoint_says_train_first(run, tmp_path):
    import shutil

    from eagle3ops.serve import convert as cv

    rundir = tmp_path / "run"
    shutil.copytree(run.inputs, rundir / sf.INPUTS, symlinks=True, ignore=shutil.ignore_patterns(sf.FEATURES))
    with pytest.raises(cv.ConvertError, match="no complete SpecForge checkpoint"):
        cv.convert_specforge(rundir, tmp_path / "draft")


def _shim_run(tmp_path, monkeypatch, fake):
    """Run eagle3ops.train.specforge_shim with SpecForge's CLI entry replaced by ``fake`` (STAND-IN: SpecForge's
    training needs a GPU; what is tested is the shim's own work around it: resume, metrics, the exit record)."""
    import specforge.cli
    from eagle3ops.train import specforge_shim

    run = tmp_path / "run"
    (run / sf.INPUTS / sf.OUTPUT).mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    monkeypatch.setenv("EAGLE3OPS_METRICS", str(run / "metrics.jsonl"))
    monkeypatch.setenv("EAGLE3OPS_EXIT", str(run / "exit.json"))
    seen = {}

    def cli_main(argv):
        seen["argv"] = argv
        return fake(run / sf.INPUTS / sf.OUTPUT)

    monkeypatch.setattr(specforge.cli, "main", cli_main)
    rc = specforge_shim.main(["--config", str(run / "config.yaml")])
    ex = json.loads((run / "exit.json").read_text())
    metrics = (
        [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        if (run / "metrics.jsonl").exists()
        else []
    )
    return rc, ex, metrics, seen, run


def test_shim_records_a_finished_run_its_metrics_and_step_times(tmp_path, monkeypatch):
    def fake(out):
        print("step 10: {'loss': 2.0}")
        print("step 20: {'loss': 1.5}")
        d = out / "eagle3ops-step20"
        d.mkdir()
        (d / sf.STATE_FILE).write_bytes(b"x")
        (out / "eagle3ops-latest").symlink_to(d.name)
        return 0

    rc, ex, metrics, seen, _ = _shim_run(tmp_path, monkeypatch, fake)
    assert rc == 0 and ex["status"] == "finished" and ex["checkpoint"].endswith("eagle3ops-step20")
    assert [m["step"] for m in metrics] == [10, 20] and all(m["time"] for m in metrics)
    assert metrics[1]["data"]["loss"] == 1.5
    assert not any(a.startswith("training.resume_from") for a in seen["argv"])


def test_shim_resumes_from_the_latest_checkpoint_and_reports_a_stop(tmp_path, monkeypatch):
    def fake(out):
        return 128 + 15  # SpecForge's answer to SIGTERM

    import specforge.cli
    from eagle3ops.train import specforge_shim

    # a first attempt left a complete checkpoint: the relaunch resumes from it
    out = tmp_path / "run" / sf.INPUTS / sf.OUTPUT
    (out / "eagle3ops-step5").mkdir(parents=True)
    (out / "eagle3ops-step5" / sf.STATE_FILE).write_bytes(b"x")
    (out / "eagle3ops-latest").symlink_to("eagle3ops-step5")
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    monkeypatch.setenv("EAGLE3OPS_EXIT", str(tmp_path / "run" / "exit.json"))
    seen = {}
    monkeypatch.setattr(specforge.cli, "main", lambda argv: seen.setdefault("argv", argv) and fake(out))
    rc = specforge_shim.main(["--config", str(tmp_path / "run" / "config.yaml")])
    ex = json.loads((tmp_path / "run" / "exit.json").read_text())
    assert rc == 143 and ex["status"] == "interrupted"
    assert f"training.resume_from={(out / 'eagle3ops-step5').resolve()}" in seen["argv"]


def test_shim_calls_a_run_without_checkpoint_failed(tmp_path, monkeypatch):
    rc, ex, _, _, _ = _shim_run(tmp_path, monkeypatch, lambda out: 0)
    assert rc == 1 and ex["status"] == "failed" and "without a checkpoint" in ex["error"]
