"""The shared role's checks of a play's variables (eagle3ops.preflight, run by action_plugins/eagle3ops_preflight.py
from roles/eagle3ops/tasks/main.yml): the rules as plain functions, with the CLI's and the modules' words where
they have the same rule. The playbooks that run them: tests/ansible/test_refused_up_front.py and
tests/unit/core/test_options_bounds.py."""

from __future__ import annotations

from pathlib import Path

import yaml
from eagle3ops import preflight
from eagle3ops.train.options import TRAIN

REPO = Path(__file__).resolve().parents[3]

BOUNDS = yaml.safe_load((REPO / "roles/eagle3ops/vars/main.yml").read_text())["eagle3ops_option_bounds"]


def test_a_relative_path_is_named_with_the_modules_words():
    bad = preflight.relative_paths(
        {
            "eagle3ops_data_dir": "relative/path",
            "eagle3ops_workdir": "/abs",
            "eagle3ops_conversations": ["/a", "b"],
        },
        program="bin/eagle3ops",
    )
    assert [b.split(":")[0] for b in bad] == [
        "eagle3ops_data_dir",
        "eagle3ops_conversations",
        "eagle3ops_bin",
    ]
    assert "'relative/path' is a relative path: give an absolute one" in bad[0], bad
    # "" and None mean "not set"; a bare program name is looked up on PATH
    assert (
        preflight.relative_paths({"eagle3ops_checkpoint": "", "eagle3ops_model_path": None}, "eagle3ops")
        == []
    )


def test_the_phases_checked_follow_the_run_tags_in_preflight_and_the_roles_in_a_phase_play():
    phases = ["extract", "train", "benchmark"]
    run = dict(preflight=True, skip_tags=[], play_roles=["eagle3ops"])
    assert preflight.run_phases(phases, run_tags=["all"], **run) == phases
    assert preflight.run_phases(phases, run_tags=["all"], **{**run, "skip_tags": ["train"]}) == [
        "extract",
        "benchmark",
    ]
    assert preflight.run_phases(phases, run_tags=["services"], **run) == []
    play = dict(preflight=False, run_tags=["all"], skip_tags=[])
    assert preflight.run_phases(phases, play_roles=["eagle3ops", "train", "train"], **play) == ["train"]


def test_a_bound_says_what_the_cli_says():
    """train_epochs=-1 from -e arrives as text: read as the CLI reads --epochs, judged by the definition's rule."""
    option = TRAIN.option("epochs")
    got = preflight.bound_problem("train_epochs", BOUNDS["train"]["train_epochs"], "-1")
    assert got == f"train_epochs: {option.problem(-1)}", got
    assert preflight.bound_problem("train_epochs", BOUNDS["train"]["train_epochs"], 2) is None
    workers = BOUNDS["extract"]["extract_workers"]
    assert "'auto' or a whole number" in preflight.bound_problem("extract_workers", workers, "banana")
    for fine in ("auto", "3", 3, "", None):
        assert preflight.bound_problem("extract_workers", workers, fine) is None, fine
    for wrong in (True, "1.5", "0", 0):
        assert preflight.bound_problem("extract_workers", workers, wrong), wrong
    top_p = BOUNDS["regenerate"]["regenerate_top_p"]
    assert preflight.bound_problem("regenerate_top_p", top_p, "1e-1") is None
    assert preflight.bound_problem("regenerate_top_p", top_p, "0") and preflight.bound_problem(
        "x", top_p, 1.5
    )


def test_out_of_bounds_names_every_value_outside_at_once():
    rows = {**BOUNDS["train"], **BOUNDS["extract"]}
    bad = preflight.out_of_bounds(
        rows, {"train_epochs": "-1", "extract_workers": "banana", "extract_limit": 4}
    )
    assert [b.split(":")[0] for b in bad] == ["extract_workers", "train_epochs"], bad


def test_a_reassignment_that_cannot_be_done_is_named():
    hosts = ["a", "b", "c"]
    assert preflight.reassign_problems(["b"], {"b": "/data/b"}, hosts) == []
    assert preflight.reassign_problems([], {}, ["a"]) == []
    cases = [
        ("b", {}, hosts, "must be a list of host names"),
        (["x"], {}, hosts, "names x, not among the hosts that share the rows"),
        (["a", "b", "c"], {}, hosts, "nobody would be left"),
        (["a"], {}, ["a"], "nobody would be left"),
        (["b"], {"c": "/d"}, hosts, "extract_reassign_data names c, not re-assigned"),
        (["b"], {"b": "rel"}, hosts, "extract_reassign_data[b] = rel is not an absolute path"),
        (["b"], ["b"], hosts, "must map a lost host to its data directory"),
    ]
    for lost, data, shard_hosts, words in cases:
        bad = preflight.reassign_problems(lost, data, shard_hosts)
        assert len(bad) == 1 and words in bad[0], (lost, data, bad)
