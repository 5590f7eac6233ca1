"""Warm start (``train_init_from``): fine-tune an existing speculators EAGLE-3 draft with its own vocabulary maps
(users' pain 14: rebuilt d2t/t2d silently misalign a warm-started draft).

The pretrained draft is made by speculators' own code without a training run (tests/unit/eagle3_draft_fixture.py:
the trainer's layout, random decoder weights); the verifier and the store are ``eagle3ops.train.fixtures``
stand-ins (a tiny random DeepseekV3 and random-valued hidden states through the real store). The last test runs
the real speculators trainer on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from eagle3_draft_fixture import make_draft_checkpoint
from eagle3ops import checkpoints as train_checkpoints
from eagle3ops import cli
from eagle3ops.train import planning as train_planning
from eagle3ops.train import spec as train_spec
from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier
from eagle3ops.train.warm_start import write_init_maps
from safetensors.numpy import load_file
from train_cli import train_argv

LAYERS = (2, 4, 5)  # the store's (eagle3ops.train.fixtures)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("warm_start")
    verifier = make_tiny_verifier(base / "verifier")
    data = make_data_dir(base / "data", verifier, num_samples=16, real=False)
    draft = make_draft_checkpoint(base / "draft", verifier, layer_ids=LAYERS, draft_vocab=120, seed=3)
    return verifier, data, draft


def _spec(inputs, tmp_path, **kw) -> train_spec.TrainSpec:
    verifier, data, draft = inputs
    kw.setdefault("init_from", str(draft))
    return train_spec.TrainSpec(
        data_dir=str(data), verifier_path=str(verifier), run_dir=str(tmp_path / "run"), **kw
    )


def test_the_config_hands_speculators_the_draft_and_the_run_its_own_maps(inputs, tmp_path):
    _, _, draft = inputs
    p = train_planning.plan(_spec(inputs, tmp_path, draft_vocab_size=50))
    cfg = yaml.safe_load(p.config_text)["train"]
    assert cfg["draft"]["from_pretrained"] == str(draft)
    # speculators 0.9.0 refuses the decoder-shaping keys beside from_pretrained; the draft keeps its own
    assert not {"num_layers", "sliding_window", "full_attention_indices"} & set(cfg["draft"])
    assert cfg["draft"]["draft_vocab_size"] == 120 and cfg["draft"]["target_layer_ids"] == list(LAYERS)
    assert any("draft_vocab_size 50 does not apply to a warm start" in w for w in p.warnings)
    assert f"model.safetensors sha256 {p.values['init_sha256']}" in p.config_text
    # speculators' own resolution (the one the shim runs: schema, sources, draft-init conflicts) accepts it
    from speculators.train.config import TrainConfig

    path = tmp_path / "c.yaml"
    path.write_text(p.config_text)
    tc = TrainConfig.resolve(["--config", str(path)])
    assert tc.flatten()["from_pretrained"] == str(draft)
    # the maps the launch writes are the draft's, bit for bit, not ones rebuilt from this store's token counts
    d2t_path, t2d_path = Path(p.values["d2t_path"]), Path(p.values["t2d_path"])
    write_init_maps(p.init, d2t_path, t2d_path)
    own = load_file(str(draft / "model.safetensors"))
    assert np.array_equal(np.load(d2t_path), own["d2t"]) and np.array_equal(np.load(t2d_path), own["t2d"])
    fresh = train_planning.plan(_spec(inputs, tmp_path, init_from=None, draft_vocab_size=120))
    assert Path(fresh.values["d2t_path"]).parent != d2t_path.parent  # a new draft's maps live apart
    # another draft (or the same path rewritten) is another configuration: resume refuses it
    other = make_draft_checkpoint(tmp_path / "other", inputs[0], layer_ids=LAYERS, draft_vocab=120, seed=4)
    assert train_planning.plan(_spec(inputs, tmp_path, init_from=str(other))).config_sha256 != p.config_sha256


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda tmp, verifier: make_draft_checkpoint(tmp / "d", verifier, layer_ids=(2, 3, 5)),
            "the draft was trained on the aux states of layers [2, 3, 5], but this store's hidden states come "
            "from layers [2, 4, 5]",
        ),
        (
            lambda tmp, _verifier: make_draft_checkpoint(
                tmp / "d", make_tiny_verifier(tmp / "v32", hidden_size=32), layer_ids=LAYERS
            ),
            "its hidden_size is 32, the verifier's is 64: the draft was made for another target model",
        ),
        (lambda tmp, _verifier: (tmp / "empty").mkdir() or tmp / "empty", "no speculators checkpoint"),
    ],
    ids=["other-layers", "other-target", "not-a-checkpoint"],
)
def test_a_draft_that_does_not_fit_is_refused_before_launch_naming_both(inputs, tmp_path, capsys, make, said):
    verifier, data, _ = inputs
    bad = make(tmp_path, verifier)
    argv = train_argv(data, verifier, tmp_path / "run", "--init-from", str(bad), "--json")
    assert cli.main(argv) == 2
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["failed"] and said in res["msg"] and "train init_from" in res["msg"]
    assert not (tmp_path / "run" / train_spec.STATE).exists()  # nothing launched
    with pytest.raises(train_spec.TrainError, match="init_from is for trainer speculators"):
        train_planning.plan(_spec(inputs, tmp_path, trainer="specforge"))


def test_speculators_fine_tunes_the_draft_itself_with_its_maps(inputs, tmp_path):
    """A real speculators run (CPU, 2 steps at a learning rate of 1e-12): the saved draft's weights are the
    pretrained draft's (a new draft's random init would differ everywhere) and its maps are the same tensors."""
    verifier, data, draft = inputs
    run_dir = tmp_path / "run"
    argv = train_argv(data, verifier, run_dir, "--init-from", str(draft), "--epochs", "1", "--max-steps", "2")
    argv += ["--lr", "1e-12", "--total-seq-len", "256", "--wait", "--timeout", "600", "--json"]
    r = subprocess.run(
        [sys.executable, "-m", "eagle3ops", *argv], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    saved = train_checkpoints.newest_checkpoint(run_dir / "checkpoints")
    assert saved is not None, r.stdout[-2000:]
    import torch
    from safetensors.torch import load_file as load_torch

    got, want = load_torch(str(saved / "model.safetensors")), load_torch(str(draft / "model.safetensors"))
    assert torch.equal(got["d2t"], want["d2t"]) and torch.equal(got["t2d"], want["t2d"])
    trained = [k for k in want if k.startswith(("layers.", "fc.", "lm_head."))]
    assert trained and all(got[k].shape == want[k].shape for k in trained)
    # the trainer saves bf16: the pretrained fp32 weights, rounded once (a new draft's init differs by O(1))
    for k in trained:
        torch.testing.assert_close(
            got[k].float(), want[k].to(got[k].dtype).float(), rtol=2**-7, atol=0, msg=k
        )
