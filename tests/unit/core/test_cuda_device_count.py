"""``eagle3ops.cuda.cuda_device_count``: the CUDA devices torch sees, without importing torch where it
could see none. Real parts: the real torch of the venv, real files standing in for a driver node (a path that
exists is all the check reads), and a fresh interpreter to see what was imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from eagle3ops import cuda

PROBE = """
import json, sys
from eagle3ops.cuda import cuda_device_count
from eagle3ops.extract.workers import num_workers
from eagle3ops.train.planning import resolve_device
from eagle3ops.train.spec import TrainSpec
nodes = json.loads(sys.argv[1])
out = {"count": cuda_device_count(nodes), "workers": num_workers("auto"),
       "device": list(resolve_device(TrainSpec(data_dir="d", verifier_path="v", run_dir="r", device="auto")))}
out["torch"] = "torch" in sys.modules
print(json.dumps(out))
"""


def _probe(nodes: list[str], **env) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    full.update(env)
    res = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(nodes)],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.skipif(
    any(os.path.exists(p) for p in cuda.GPU_DRIVER_NODES), reason="this machine has a GPU driver node"
)
def test_no_driver_node_is_no_gpu_and_torch_is_not_imported(tmp_path):
    # the extraction's workers=auto and the trainer's device=auto as the phases ask, on a machine with no GPU
    out = _probe([str(tmp_path / "no-such-node")])
    assert out == {"count": 0, "workers": 1, "device": ["cpu", 1], "torch": False}


def test_an_empty_cuda_visible_devices_is_no_gpu_without_torch(tmp_path):
    node = tmp_path / "nvidiactl"
    node.write_text("")
    out = _probe([str(node)], CUDA_VISIBLE_DEVICES="")
    assert out["count"] == 0 and out["torch"] is False


def test_with_a_driver_node_torch_is_asked(tmp_path):
    node = tmp_path / "nvidiactl"
    node.write_text("")
    import torch

    want = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert cuda.cuda_device_count([str(node)]) == want
    assert "torch" in sys.modules
