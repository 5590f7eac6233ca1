"""The train phase's pure parts: config rendering, input checks, the run-dir state machine's pieces.

No trainer is started here (see test_train_run.py for real speculators runs). The verifier and the data
directory are built by ``eagle3ops.train.fixtures`` (STAND-IN for demo/prepare/extract: a tiny random
DeepseekV3ForCausalLM and random-valued hidden states written through the real HiddenStateStore).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from eagle3ops import checkpoints as train_checkpoints
from eagle3ops.train import inputs as train_inputs
from eagle3ops.train import launch as train_launch
from eagle3ops.train import metrics as train_metrics
from eagle3ops.train import planning as train_planning
from eagle3ops.train import run as train_run
from eagle3ops.train import spec as train_spec
from eagle3ops.train import speculators_shim
from eagle3ops.train.fixtures import make_data_dir, make_tiny_verifier

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("train_inputs")
    verifier = make_tiny_verifier(base / "verifier")
    data = make_data_dir(base / "data", verifier, num_samples=12, real=False)
    return verifier, data


def spec(inputs, tmp_path, **kw) -> train_spec.TrainSpec:
    verifier, data = inputs
    return train_spec.TrainSpec(
        data_dir=str(data), verifier_path=str(verifier), run_dir=str(tmp_path / "run"), **kw
    )


def test_rendered_config_reads_layer_ids_and_vocab_and_is_sglang_servable(inputs, tmp_path):
    p = train_planning.plan(spec(inputs, tmp_path, draft_vocab_size=100000, epochs=2, lr=3e-4, ttt_steps=4))
    cfg = yaml.safe_load(p.config_text)["train"]
    assert cfg["draft"]["target_layer_ids"] == [2, 4, 5]  # from extract_meta.json
    distinct = len(p.token_freq)
    assert 0 < distinct < 100000
    assert cfg["draft"]["draft_vocab_size"] == distinct and p.values["draft_vocab_capped"]
    assert cfg["draft"]["norm_before_residual"] is False
    assert cfg["draft"]["full_attention_indices"] == [0]  # every draft layer full attention
    assert cfg["generation"]["on_missing"] == "raise"
    assert cfg["trainer"]["epochs"] == 2 and cfg["optimizer"]["lr"] == 3e-4 and cfg["loss"]["ttt_steps"] == 4
    assert cfg["trainer"]["save_path"] == str((tmp_path / "run" / "checkpoints").resolve())
    # CPU conditions of the shim
    assert p.device == "cpu" and cfg["draft"]["draft_attn_impl"] == "sdpa"
    assert cfg["loss"]["loss_implementation"] == "eager" and cfg["data"]["num_workers"] == 0
    # speculators' own schema accepts the file (flag > yaml > default resolution)
    from speculators.train.config import TrainConfig

    path = tmp_path / "c.yaml"
    path.write_text(p.config_text)
    tc = TrainConfig.from_sources(
        cli={"verifier_name_or_path": cfg["verifier"]["verifier_name_or_path"]},
        config_path=str(path),
        argv=[],
    )
    flat = tc.flatten()
    assert flat["target_layer_ids"] == [2, 4, 5] and flat["norm_before_residual"] is False
    assert flat["draft_vocab_size"] == distinct and flat["on_missing"] == "raise"


def test_config_is_deterministic_and_sensitive(inputs, tmp_path):
    a = train_planning.plan(spec(inputs, tmp_path, epochs=2))
    b = train_planning.plan(spec(inputs, tmp_path, epochs=2))
    c = train_planning.plan(spec(inputs, tmp_path, epochs=3))
    assert a.config_sha256 == b.config_sha256 != c.config_sha256


def test_sliding_window_is_reported_for_serve(inputs, tmp_path):
    p = train_planning.plan(spec(inputs, tmp_path, attention="sliding", sliding_window=1024))
    cfg = yaml.safe_load(p.config_text)["train"]
    assert cfg["draft"]["full_attention_indices"] == [] and cfg["draft"]["sliding_window"] == 1024


def test_user_layer_ids_must_match_extraction(inputs, tmp_path):
    with pytest.raises(
        train_spec.TrainError, match=r"differ from the ids the hidden states were extracted with, \[2, 4, 5\]"
    ):
        train_planning.plan(spec(inputs, tmp_path, layer_ids=[1, 3, 5]))
    assert train_planning.plan(spec(inputs, tmp_path, layer_ids=[2, 4, 5])).values["layer_ids"] == [2, 4, 5]


def test_verifier_of_another_shape_is_refused(inputs, tmp_path):
    other = make_tiny_verifier(tmp_path / "other", num_layers=6)
    s = spec(inputs, tmp_path)
    s.verifier_path = str(other)
    with pytest.raises(train_spec.TrainError, match="num_layers=6 but the hidden states"):
        train_planning.plan(s)


def test_a_verifier_with_a_truncated_or_missing_shard_is_refused_before_the_run(inputs, tmp_path, capsys):
    """The trainer reads the verifier's embedding and lm_head: a shard cut off or absent stops ``train`` (exit 2)
    naming it, before the run directory or a trainer exists (safetensors headers only)."""
    from eagle3ops.cli import main

    verifier, data = inputs
    copy = Path(shutil.copytree(verifier, tmp_path / "verifier"))
    shard = copy / "model.safetensors"
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) - 64])
    run = tmp_path / "run"
    argv = ["train", "--data", str(data), "--verifier", str(copy), "--run-dir", str(run), "--json"]
    assert main(argv) == 2
    msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
    assert f"{shard}: " in msg and "truncated" in msg and "train_verifier_path" in msg, msg
    assert not run.exists()
    shard.write_bytes(whole)  # whole again, but the index lists a second shard that is not there
    names = list(json.loads(whole[8 : 8 + int.from_bytes(whole[:8], "little")]))
    wm = {n: "model.safetensors" for n in names if n != "__metadata__"}
    wm["lm_head.extra"] = "model-00002-of-00002.safetensors"
    (copy / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    assert main(argv) == 2
    msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
    assert "1 are missing (model-00002-of-00002.safetensors)" in msg and not run.exists(), msg


def test_missing_meta_and_incomplete_extraction_are_explained(inputs, tmp_path):
    verifier, data = inputs
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(train_spec.TrainError, match=r"extract_meta\.json is missing"):
        train_planning.plan(
            train_spec.TrainSpec(
                data_dir=str(empty), verifier_path=str(verifier), run_dir=str(tmp_path / "r")
            )
        )
    # a copy of the data dir whose manifest lists only some rows
    import shutil

    partial = tmp_path / "partial"
    shutil.copytree(data, partial)
    man = partial / "hidden_states" / "manifest-rank0.jsonl"
    lines = man.read_text().splitlines(True)
    man.write_text("".join(lines[:5]))
    s = train_spec.TrainSpec(data_dir=str(partial), verifier_path=str(verifier), run_dir=str(tmp_path / "r"))
    with pytest.raises(train_spec.TrainError, match=r"extraction is incomplete .*: 5 of 12 rows"):
        train_planning.plan(s)
    s.on_missing = "skip"
    assert train_planning.plan(s).samples["samples_with_states"] == 5


def test_extra_config_cannot_override_managed_keys(inputs, tmp_path):
    with pytest.raises(train_spec.TrainError, match="manages"):
        train_planning.plan(spec(inputs, tmp_path, extra={"draft": {"target_layer_ids": [1, 2, 3]}}))
    with pytest.raises(train_spec.TrainError, match="unknown group"):
        train_planning.plan(spec(inputs, tmp_path, extra={"nope": {"a": 1}}))
    p = train_planning.plan(
        spec(
            inputs,
            tmp_path,
            extra={"trainer": {"save_best": True}, "scheduler": {"scheduler_type": "cosine"}},
        )
    )
    cfg = yaml.safe_load(p.config_text)["train"]
    assert cfg["trainer"]["save_best"] is True and cfg["scheduler"]["scheduler_type"] == "cosine"


def test_draft_vocab_cap():
    assert train_inputs.draft_vocab(None, 500, 1000) == (500, True)
    assert train_inputs.draft_vocab(64, 500, 1000) == (64, False)
    assert train_inputs.draft_vocab(50000, 90000, 1000) == (1000, True)
    with pytest.raises(train_spec.TrainError):
        train_inputs.draft_vocab(0, 10, 10)


def test_a_small_store_is_warned_about_before_training(inputs, tmp_path):
    """Users' pain 5/16 (low acceptance from too little data, found after training and serving): a store under
    DATA_LIMITED_TOKENS carries a warning in the plan and the check-mode result (the module turns it into an
    Ansible warning), naming its token count and the measured curve; one at the bound carries none."""
    limit = train_inputs.DATA_LIMITED_TOKENS
    assert train_inputs.data_limited_warning({"tokens": limit, "samples_with_states": 9}) is None
    w = train_inputs.data_limited_warning({"tokens": limit - 1, "samples_with_states": 9})
    assert (
        f"{limit - 1:,} tokens in 9 samples" in w
        and "data-limited draft" in w
        and "1.55 M tokens gave 1.66" in w
    )
    p = train_planning.plan(spec(inputs, tmp_path))
    (small,) = [x for x in p.warnings if "data-limited" in x]
    assert f"{p.samples['tokens']:,} tokens in {p.samples['samples_with_states']} samples" in small
    r = train_run.ensure_run(spec(inputs, tmp_path), check=True)
    assert small in r["warnings"]


def test_vocab_maps_match_speculators_algorithm(inputs, tmp_path):
    import numpy as np
    import torch

    p = train_planning.plan(spec(inputs, tmp_path, draft_vocab_size=50))
    d2t_path, t2d_path = train_inputs.write_vocab_maps(p.token_freq, 50, p.target_vocab, tmp_path / "v")
    d2t, t2d = np.load(d2t_path), np.load(t2d_path)
    assert d2t.shape == (50,) and t2d.shape == (p.target_vocab,) and t2d.sum() == 50
    # the 50 most frequent tokens are the draft vocabulary
    top = sorted(p.token_freq, key=lambda t: (-p.token_freq[t], t))[:50]
    assert sorted(top) == (np.arange(50) + d2t).tolist()
    assert torch.from_numpy(t2d).nonzero().flatten().tolist() == sorted(top)


def test_shim_refuses_other_speculators_versions():
    assert speculators_shim.check_version() == "0.9.0"
    with pytest.raises(speculators_shim.UnsupportedSpeculatorsVersion, match=r"pinned to 0\.9\.0"):
        speculators_shim.check_version("0.10.0")


def test_shim_exits_clearly_on_a_bad_version(tmp_path):
    """The shim as a process, with the installed version faked by a sitecustomize (STAND-IN for another wheel)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import importlib.metadata as m\n_v = m.version\n"
        "m.version = lambda n: '0.10.1' if n == 'speculators' else _v(n)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "EAGLE3OPS_EXIT": str(tmp_path / "exit.json")}
    r = subprocess.run(
        [sys.executable, "-m", "eagle3ops.train.speculators_shim", "--config", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "speculators 0.10.1 is installed" in r.stderr and "pinned to 0.9.0" in r.stderr
    assert json.loads((tmp_path / "exit.json").read_text())["status"] == "failed"


def _write_ckpt(d: Path, *, truncate_model=False, training_state=True):
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    save_file({"w": torch.zeros(64)}, str(d / "model.safetensors"))
    if truncate_model:
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[:-40])
    torch.save({"state": {}}, d / "optimizer_state_dict.pt")
    torch.save({"last_epoch": 1}, d / "scheduler_state_dict.pt")
    if training_state:
        (d / "training_state.json").write_text(
            json.dumps({"epoch": int(d.name), "local_step": 0, "global_step": 9})
        )


def test_incomplete_newest_checkpoint_is_moved_aside(tmp_path):
    save = tmp_path / "ckpt"
    _write_ckpt(save / "0")
    _write_ckpt(save / "1", truncate_model=True)
    _write_ckpt(save / "2", training_state=False)
    _write_ckpt(save / "3")
    (save / "3" / "optimizer_state_dict.pt").unlink()  # a save cut between the weights and the optimizer
    moved = train_run.quarantine_incomplete(save)
    assert [m["epoch"] for m in moved] == [3, 2, 1]
    assert moved[0]["reason"] == f"{save / '3' / 'optimizer_state_dict.pt'}: missing or truncated"
    moved = moved[1:]
    assert "training_state.json" in moved[0]["reason"] and "truncated" in moved[1]["reason"]
    assert train_checkpoints.epoch_dirs(save) == [0]
    assert all(Path(m["moved_to"]).is_dir() for m in moved)
    assert train_run.resume_point(save)["global_step"] == 9
    assert train_run.quarantine_incomplete(save) == []  # complete now: nothing to do


def test_newest_checkpoint_is_a_stopped_runs_last_save_not_the_best_validated(tmp_path):
    save = tmp_path / "run" / "checkpoints"
    for name in ("0", "1", "interrupted", "2"):
        _write_ckpt(save / name, training_state=name != "interrupted", truncate_model=name == "2")
        (save / name / "config.json").write_text("{}")
        time.sleep(0.01)
    (save / "checkpoint_best").symlink_to("0")
    # "2" is newest but its weights are cut short: the interrupted save (later in the LR decay than "1") wins
    assert train_checkpoints.newest_checkpoint(tmp_path / "run") == save / "interrupted"
    assert (
        train_checkpoints.resolve_checkpoint(tmp_path / "run") == (save / "0").resolve()
    )  # convert's default
    shutil.rmtree(save / "2")
    _write_ckpt(save / "2")  # a later epoch saved after a resume: newer than an old interrupted save
    (save / "2" / "config.json").write_text("{}")
    assert train_checkpoints.newest_checkpoint(save) == save / "2"
    assert train_checkpoints.newest_checkpoint(tmp_path / "nothing") is None


def test_metrics_summary_per_attempt(tmp_path):
    lines = [
        {"kind": "attempt", "attempt": 1, "time": 100.0},
        {"kind": "hparams", "time": 104.0, "step": None},
        *[
            {
                "kind": "train",
                "time": 110.0 + i,
                "step": i,
                "data": {
                    "train": {"loss": 1.0 - i / 10},
                    "global_step": i,
                    "epoch": 0,
                    "profile": {"tokens_per_s": 50.0 + i},
                },
            }
            for i in range(4)
        ],
        {"kind": "attempt", "attempt": 2, "time": 200.0},
        {
            "kind": "train",
            "time": 230.0,
            "step": 4,
            "data": {"train": {"loss": 0.5}, "global_step": 4, "epoch": 1},
        },
        {
            "kind": "val",
            "time": 231.0,
            "step": 5,
            "data": {
                "val": {
                    "loss_epoch": 0.4,
                    "cond_acc_0_epoch": 0.5,
                    "cond_acc_1_epoch": 0.25,
                    "full_acc_0_epoch": 0.5,
                    "full_acc_1_epoch": 0.125,
                },
                "epoch": 1,
            },
        },
    ]
    (tmp_path / train_spec.METRICS).write_text("\n".join(json.dumps(x) for x in lines) + '\n{"kind": "tra')
    m = train_metrics.read_metrics(tmp_path)
    a1, a2 = m["attempts"]
    assert a1["time_to_first_step_s"] == 10.0 and a1["steps"] == 4 and a1["steps_per_s"] == 1.0
    assert a1["median_tokens_per_s_per_rank"] == 52.0
    assert a2["first_global_step"] == 4 and a2["time_to_first_step_s"] == 30.0
    assert m["val_loss"] == 0.4 and m["val_cond_acc"] == [0.5, 0.25] and m["val_full_acc"] == [0.5, 0.125]
    assert m["global_step"] == 4


def test_liveness_needs_matching_command_line_and_ignores_zombies(tmp_path):
    cfg = tmp_path / "config.yaml"
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert not train_launch.is_our_trainer(other.pid, cfg)  # alive, but not our trainer
    finally:
        other.kill()
    other.wait()
    # a process whose argv names the shim and this config, then exits and is left a zombie
    fake = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(300)",
            "eagle3ops.train.speculators_shim",
            "--config",
            str(cfg),
        ]
    )
    deadline = time.monotonic() + 60  # a guard: its command line is there from the exec
    while not train_launch.is_our_trainer(fake.pid, cfg) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert train_launch.is_our_trainer(fake.pid, cfg)  # it sleeps 300 s: still there however slow this is
    assert not train_launch.is_our_trainer(fake.pid, tmp_path / "other.yaml")
    fake.kill()
    deadline = time.monotonic() + 60  # not reaped yet: a zombie once the kill has taken effect
    while train_launch._proc_state(fake.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert train_launch._proc_state(fake.pid) == "Z"
    assert not train_launch.is_our_trainer(fake.pid, cfg)
    fake.wait()


def test_check_mode_predicts_launch_and_writes_nothing(inputs, tmp_path):
    r = train_run.ensure_run(spec(inputs, tmp_path), check=True)
    assert r["changed"] is True and r["would"] == "launch" and r["status"] == "launched"
    assert not (tmp_path / "run").exists()


def test_check_modes_summary_says_what_would_happen_not_pid_none(inputs, tmp_path, capsys):
    """Issue 32: ``train --check`` printed ``PID None`` (no trainer exists before a launch)."""
    from eagle3ops.cli import main as cli_main

    verifier, data = inputs
    argv = ["train", "--data", str(data), "--verifier", str(verifier), "--run-dir", str(tmp_path / "run")]
    assert cli_main([*argv, "--device", "cpu", "--check"]) == 0
    out = capsys.readouterr().out
    assert "PID None" not in out and "None" not in out.splitlines()[0], out
    assert out.startswith("train --check: would launch (now new) (changed=True)"), out
    assert not (tmp_path / "run").exists()


def test_check_mode_before_the_inputs_exist_predicts_a_launch(inputs, tmp_path):
    """`site.yml --check` on a fresh host: prepare/extract wrote nothing, so train cannot read its inputs."""
    verifier, _ = inputs
    empty = tmp_path / "nodata"
    empty.mkdir()
    s = train_spec.TrainSpec(data_dir=str(empty), verifier_path=str(verifier), run_dir=str(tmp_path / "run"))
    r = train_run.ensure_run(s, check=True)
    assert (
        r["changed"] is True
        and r["would"] == "launch"
        and "extract_meta.json is missing" in r["inputs_pending"]
    )
    with pytest.raises(train_spec.TrainError) as e:
        train_run.ensure_run(s)
    assert e.value.details["inputs_pending"] is True
    assert not (tmp_path / "run" / train_spec.STATE).exists()


def test_a_trainer_known_only_from_the_pid_file_is_never_doubled(inputs, tmp_path):
    """The launcher died between starting the trainer (train.pid written) and writing state.json."""
    p = train_planning.plan(spec(inputs, tmp_path))
    run = p.run_dir
    run.mkdir(parents=True)
    (run / train_spec.CONFIG).write_text(p.config_text)
    # STAND-IN trainer: a sleeping process whose argv is the shim's on this config
    fake = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "eagle3ops.train.speculators_shim",
            "--config",
            str(run / train_spec.CONFIG),
        ],
        start_new_session=True,
    )
    try:
        (run / train_spec.PIDFILE).write_text(f"{fake.pid}\n")
        deadline = time.monotonic() + 60  # a guard: its command line is there from the exec
        while (
            not train_launch.is_our_trainer(fake.pid, run / train_spec.CONFIG) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        r = train_run.ensure_run(spec(inputs, tmp_path))
        assert r["changed"] is False and r["status"] == "running" and r["pid"] == fake.pid
        assert not (run / train_spec.STATE).exists()
    finally:
        fake.kill()
        fake.wait()


def test_gpu_config_defaults_to_eager_loss_and_flex_attention(inputs, tmp_path, monkeypatch):
    """GPU branch of the rendering on this GPU-less machine: only the device resolution is faked (2 GPUs);
    the GPU run itself is proven by bench/train_gpu.py (docs/performance.md, Training)."""
    monkeypatch.setattr(train_planning, "resolve_device", lambda spec: ("gpu", 2))
    p = train_planning.plan(spec(inputs, tmp_path))
    cfg = yaml.safe_load(p.config_text)["train"]
    assert p.device == "gpu"
    # speculators 0.9.0's fused KL loss failed under torch 2.11 dynamo on the H200: never the silent default
    assert cfg["loss"]["loss_implementation"] == "eager"
    assert cfg["draft"]["draft_attn_impl"] == "simple_flex_attention"
    chosen = train_planning.plan(spec(inputs, tmp_path, loss_implementation="fused", draft_attn_impl="sdpa"))
    chosen_cfg = yaml.safe_load(chosen.config_text)["train"]
    assert (
        chosen_cfg["loss"]["loss_implementation"] == "fused"
        and chosen_cfg["draft"]["draft_attn_impl"] == "sdpa"
    )


def test_a_run_that_ran_out_of_gpu_memory_says_which_variable_to_lower(tmp_path):
    """Users' pain 9 (training side): a trainer that died of a CUDA out-of-memory error, seen in its exit record
    or only in its own part of the log (another rank's error reaches rank 0 as a torchrun failure), gets a hint
    naming train_total_seq_len and its value; an OOM of an earlier attempt says nothing about the last one."""
    from eagle3ops.train.launch import ATTEMPT_MARK

    rd = tmp_path / "run"
    rd.mkdir()
    (rd / train_spec.CONFIG).write_text("train:\n  data:\n    total_seq_len: 8192\n")
    (rd / train_spec.STATE).write_text(json.dumps({"pid": 2**22 + 7, "attempt": 2}))
    exit_oom = {
        "status": "failed",
        "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    }
    (rd / train_spec.EXIT).write_text(json.dumps(exit_oom))
    st = train_run.status(str(rd))
    assert st["status"] == "failed"
    assert "lower train_total_seq_len (the tokens of one packed batch a GPU, now 8192)" in st["hint"]
    # the exit record says only that torchrun failed; the OOM is in this attempt's part of the log
    (rd / train_spec.EXIT).write_text(json.dumps({"status": "failed", "error": "ChildFailedError: rank 1"}))
    log = f"{ATTEMPT_MARK}1 at x\nok\n{ATTEMPT_MARK}2 at y\n[rank1] torch.OutOfMemoryError: CUDA out of memory.\n"
    (rd / train_spec.LOG).write_text(log)
    assert "train_total_seq_len" in train_run.status(str(rd))["hint"]
    # an earlier attempt's OOM, then a failure of another kind: no hint
    (rd / train_spec.LOG).write_text(
        f"{ATTEMPT_MARK}1 at x\nCUDA out of memory\n{ATTEMPT_MARK}2 at y\nKeyError\n"
    )
    assert train_run.status(str(rd))["hint"] is None
