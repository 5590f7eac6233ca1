"""The sglang role's memory preflight (roles/sglang/tasks/memory.yml): the capture server's own flags, through
``eagle3ops memory-fit`` on the host, stop the play naming the numbers and the variable; flags that fit pass.

No GPU here: a stand-in ``nvidia-smi`` first on PATH answers as the real one does (one line a GPU, MiB), for a
12,000 MiB card; the model is a real (tiny) safetensors checkpoint in Kimi-K2.5's wrapper layout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hosts"))
from runner import REPO, run_playbook

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: The capture server's memory preflight
      ansible.builtin.include_tasks: {tasks}
"""


def _model(d: Path) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 8,
                        "num_attention_heads": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                        "max_position_embeddings": 4096},
    }))  # fmt: skip
    save_file({"language_model.model.layers.0.mlp.down_proj.weight": np.zeros((64, 64), np.float16)},
              str(d / "model.safetensors"))  # fmt: skip
    return d


def test_the_capture_server_that_does_not_fit_stops_the_play(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 12000\necho 12000\n")
    smi.chmod(0o755)
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(tasks=REPO / "roles" / "sglang" / "tasks" / "memory.yml"))
    base = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "sglang_eagle3ops_bin": str(Path(sys.executable).parent / "eagle3ops"),
        "sglang_model_path": str(_model(tmp_path / "model")),
        "sglang_tp_size": 2,
        "sglang_resolved_layer_ids": [2, 4, 5],
        "sglang_extract_dtype": "bfloat16",
        "sglang_layer_ids_run": {"rc": 0},
    }
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    fits = ["--mem-fraction-static", "0.5", "--max-prefill-tokens", "2048"]
    r = run_playbook(play, "localhost,", extravars={**base, "sglang_extra_args": fits}, envvars=env,
                     private_data_dir=tmp_path / "ok")  # fmt: skip
    assert r.rc == 0, r.summary()
    tight = ["--mem-fraction-static", "0.99", "--max-prefill-tokens", "2048"]
    r = run_playbook(play, "localhost,", extravars={**base, "sglang_extra_args": tight}, envvars=env,
                     private_data_dir=tmp_path / "tight")  # fmt: skip
    assert r.rc != 0
    assert "the capture server does not fit 2 GPUs of 12,000 MiB" in r.stdout, r.stdout[-2000:]
    assert "sglang_extra_args: --mem-fraction-static" in r.stdout
