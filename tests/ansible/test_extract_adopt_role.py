"""The extract role with ``extract_adopt_from``: a dump that already holds every prepared row is adopted where it
lies (no row extracted), and the second run changes nothing.

Real: the phase playbook (playbooks/extract.yml) through ansible-runner on this machine (inventory/local), the role,
the extract module and CLI with a tiny model on the CPU, the adoption of real ``torch.save`` files. STAND-IN: the
dump's writer is this test (``torch.save`` of the transformers backend's states of the same rows in SpecForge's
offline layout; SpecForge on GPUs cannot run here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from eagle3ops.extract.session import ExtractConfig
from eagle3ops.extract.transformers_backend import run_extraction
from eagle3ops.store import adopted
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
from extract_local import extract_vars, run_extract_local
from tinymodels import build_prepared_dataset, build_tiny_target

LENGTHS = [5, 17, 33, 9]
PLAN_TASK = "Extract | Work out what is left to extract (reads the manifests only)"
COLLECT = "Extract | Collect the extraction's result (a host lost meanwhile drops out; the others go on)"


def _dump(model: Path, tmp: Path) -> Path:
    """Every row of a prepared dataset of LENGTHS, extracted by the transformers backend and saved as SpecForge's
    per-sample files, with a sidecar declaring the layers."""
    ref = build_prepared_dataset(tmp / "ref", LENGTHS)
    run_extraction(ExtractConfig(data_dir=str(ref), model_path=str(model), progress=False))
    meta = json.loads((ref / "hidden_states/extract_meta.json").read_text())
    dump = tmp / "dump"
    (dump / "rows_0-2000").mkdir(parents=True)
    for i in range(len(LENGTHS)):
        d = load_file(ref / "hidden_states" / f"hs_{i}.safetensors")
        hs, t = d["hidden_states"], d["hidden_states"].shape[0]
        torch.save({"input_ids": d["token_ids"], "aux_hidden_state": hs[:, :-1].reshape(1, t, -1).clone(),
                    "hidden_state": hs[:, -1][None].clone()}, dump / "rows_0-2000" / f"data_{i}.ckpt")  # fmt: skip
    side = {"layer_ids": meta["layer_ids"], "layer_convention": "input", "last_state": "pre-norm"}
    (dump / "eagle3ops-dump.json").write_text(json.dumps(side))
    return dump


def test_a_dump_of_every_row_is_adopted_by_the_role_and_a_rerun_changes_nothing(tmp_path):
    model = build_tiny_target(tmp_path / "model")
    dump = _dump(model, tmp_path)
    data = build_prepared_dataset(tmp_path / "data", LENGTHS)
    xv = extract_vars(model, data, extract_adopt_from=str(dump))
    r = run_extract_local(xv, tmp_path / "runner")
    assert r.rc == 0, r.summary()
    (plan,) = r.task_results(PLAN_TASK)
    assert plan["to_extract"] == 0 and plan["dump_rows"] == len(LENGTHS), plan
    (res,) = r.task_results(COLLECT)  # run although nothing is left to extract: the dump is to be adopted
    assert res["written"] == 0 and res["dump"]["adopted"] == len(LENGTHS), res
    assert set(adopted.read_rows(data / "hidden_states")) == set(range(len(LENGTHS)))
    assert not list((data / "hidden_states").glob("hs_*.safetensors"))  # nothing copied
    again = run_extract_local(xv, tmp_path / "runner2")
    assert again.rc == 0 and again.stats["localhost"]["changed"] == 0, again.summary()
