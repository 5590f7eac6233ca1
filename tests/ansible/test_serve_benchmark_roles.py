"""The serve and benchmark phases through ansible-playbook (ansible-runner) on the embedded local default, for
real: the draft is converted, the SGLang server is skipped with its message (no GPU / SGLang here), the offline
acceptance runs (transformers target, speculators draft) and the report is written; a second run changes
nothing; an unservable checkpoint fails the play with what to change.

STAND-IN inputs (to stay fast): a tiny random DeepseekV3 target (``train_fixtures``) and a speculators checkpoint
made by speculators' own code with random decoder weights (``tests/unit/eagle3_draft_fixture``), prompts given
as token ids. ``make run`` runs the same roles on the really trained demo draft.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
from eagle3_draft_fixture import edit_config, make_draft_checkpoint
from eagle3ops.train.fixtures import make_tiny_verifier
from hosts.runner import LOCAL_INVENTORY, run_playbook


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-bench")
    verifier = make_tiny_verifier(root / "verifier", vocab_size=512)
    ckpt = make_draft_checkpoint(root / "run" / "checkpoints" / "0", verifier)
    prompts = root / "heldout.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"h{i}", "input_ids": list(range(10 + i, 30 + i))}) + "\n" for i in range(3)
        )
    )
    return root, verifier, ckpt, prompts


def _vars(root, verifier, prompts, checkpoint):
    return {
        "eagle3ops_workdir": str(root / "work"),
        "eagle3ops_checkpoint": str(checkpoint),  # what serve converts and benchmark measures
        "eagle3ops_model_path": str(
            verifier
        ),  # the target serve-convert takes token ids and architecture from
        "benchmark_target_path": str(verifier),
        "benchmark_prompts": str(prompts),
        "benchmark_k": 2,
        "benchmark_limit": 2,
        "benchmark_max_new_tokens": 6,
        "benchmark_random_baseline": False,
    }


def test_serve_and_benchmark_on_the_local_default(inputs):
    root, verifier, ckpt, prompts = inputs
    ev = _vars(root, verifier, prompts, root / "run")  # the train run dir: the newest checkpoint is found
    r = run_playbook(REPO / "site.yml", LOCAL_INVENTORY, extravars=ev, tags="serve,benchmark")
    h = r.host("localhost")
    assert r.rc == 0 and h["failed"] == 0, r.stdout[-4000:]
    assert h["changed"] >= 4, r.changed_tasks()
    work = root / "work"
    cfg = json.loads((work / "serve" / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert "the SGLang server is skipped on localhost" in r.stdout
    for name in ("report.json", "report.md", "report.png", "acceptance.json"):
        assert (work / "benchmark" / name).is_file(), name
    rep = json.loads((work / "benchmark" / "report.json").read_text())
    assert rep["offline"]["k"] == 2 and rep["offline"]["checkpoint"] == str(ckpt) and rep["sglang"] is None
    assert "| trained |" in r.stdout  # the table is printed at the end of the play

    again = run_playbook(REPO / "site.yml", LOCAL_INVENTORY, extravars=ev, tags="serve,benchmark")
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.changed_tasks()


def test_unservable_checkpoint_fails_the_play_with_what_to_do(inputs):
    root, verifier, ckpt, prompts = inputs
    bad = edit_config(ckpt, root / "bad", norm_before_residual=True)
    r = run_playbook(
        REPO / "site.yml", LOCAL_INVENTORY, extravars=_vars(root, verifier, prompts, bad), tags="serve"
    )
    assert r.rc != 0 and r.host("localhost")["failed"] == 1
    assert "norm_before_residual" in r.stdout and "retrain with norm_before_residual false" in r.stdout
