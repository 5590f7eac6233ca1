"""Named prompt sets (MT-bench's question.jsonl, held-out rows), the contamination check, ``eagle3ops
benchmark-live`` against a real local server process, and the report that carries both servers' numbers.

STAND-IN: the server is ``tests/fixtures/sglang_standin_server.py`` in serve mode (SGLang needs CUDA): real
processes and real HTTP timings, a fixed acceptance length, a sleep per forward step as its GPU time. The MT-bench
file is written here in FastChat's ``question.jsonl`` format (two of its real first turns, shortened); the
real 80 questions come from the real-profile asset cache.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from eagle3ops.benchmark import promptsets as ps
from eagle3ops.benchmark import report as rp
from eagle3ops.cli import main
from eagle3ops.serve import process as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from report_inputs import acceptance_result
from serve_standin import start_with_and_without

MT = [
    {
        "question_id": 81,
        "category": "writing",
        "turns": [
            "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences.",
            "Rewrite your previous response. Start every sentence with the letter A.",
        ],
    },
    {
        "question_id": 101,
        "category": "reasoning",
        "turns": [
            "Imagine you are participating in a race with a group of people. If you have just overtaken the second "
            "person, what's your current position?",
            'If the "second person" is changed to "last person" in the above question, what would the answer be?',
        ],
    },
]


def _last(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture
def files(tmp_path):
    mt = tmp_path / "question.jsonl"
    mt.write_text("".join(json.dumps(q) + "\n" for q in MT))
    held = tmp_path / "heldout.jsonl"
    held.write_text(
        json.dumps(
            {
                "id": "h0",
                "conversations": [
                    {"from": "human", "value": "Name three rivers."},
                    {"from": "gpt", "value": "x"},
                ],
            }
        )
        + "\n"
        + json.dumps({"id": "h1", "prompt": "Count to five."})
        + "\n"
    )
    return mt, held


def test_mtbench_first_and_both_turns_and_bad_rows(files, tmp_path):
    mt, held = files
    first = ps.load_set(mt)
    assert first["format"] == "mtbench" and [it["id"] for it in first["items"]] == [81, 101]
    assert first["items"][0]["turns"] == [MT[0]["turns"][0]] and first["items"][1]["category"] == "reasoning"
    both = ps.load_set(mt, turns="both")
    assert both["items"][1]["turns"] == MT[1]["turns"]
    h = ps.load_set(held)
    assert h["format"] == "heldout" and [it["turns"] for it in h["items"]] == [
        ["Name three rivers."],
        ["Count to five."],
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": []}\n')
    with pytest.raises(ps.PromptSetError, match=r"bad.jsonl:1: 'turns' must be a non-empty list"):
        ps.load_set(bad)
    bad.write_text('{"id": 1, "input_ids": [1, 2]}\n')
    with pytest.raises(ps.PromptSetError, match=r"bad.jsonl:1: only input_ids; a live server needs text"):
        ps.load_set(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ps.PromptSetError, match=r"bad.jsonl:1: not valid JSON"):
        ps.load_set(bad)
    with pytest.raises(ps.PromptSetError, match="expected NAME=PATH"):
        ps.parse_set_arg("mtbench")


def test_contamination_check_finds_mtbench_turns_in_training_data(files, tmp_path, capsys):
    mt, held = files
    train = tmp_path / "train"
    train.mkdir()
    clean = train / "a.jsonl"
    clean.write_text(
        json.dumps(
            {"conversations": [{"from": "human", "value": "Tell me a joke."}, {"from": "gpt", "value": "no"}]}
        )
        + "\n"
    )
    argv = [
        "benchmark-contamination",
        "--set",
        f"mtbench={mt}",
        "--set",
        f"heldout={held}",
        "--training",
        str(train),
    ]
    assert main([*argv, "--json"]) == 0
    res = _last(capsys)
    assert res["clean"] and res["training_user_turns"] == 1 and res["changed"] is False
    # an OpenAI-style row holds MT-bench's second turn of q81, re-cased and re-punctuated (exact after normalising)
    # and a ShareGPT row quotes q101's first turn inside a longer message (contained)
    dirty = train / "b.jsonl"
    dirty.write_text(
        json.dumps(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "REWRITE your previous response -- start every sentence "
                        "with the letter a!",
                    }
                ]
            }
        )
        + "\n"
        + json.dumps(
            {"conversations": [{"from": "human", "value": "Please answer: " + MT[1]["turns"][0] + " Thanks"}]}
        )
        + "\n"
    )
    assert main([*argv, "--json"]) == 2
    out = _last(capsys)
    hits = {(h["id"], h["turn"], h["match"]) for h in out["contaminated"]["mtbench"]}
    assert hits == {(81, 2, "exact"), (101, 1, "contained")}
    assert (
        f"{dirty}:1" in out["msg"]
        and f"{dirty}:2" in out["msg"]
        and "benchmark_contamination: warn" in out["msg"]
    )
    assert main([*argv, "--mode", "warn", "--out", str(tmp_path / "c.json"), "--json"]) == 0
    assert _last(capsys)["msg"].startswith("WARNING: 2 benchmark prompt turn(s)")
    assert json.loads((tmp_path / "c.json").read_text())["clean"] is False
    # a ShareGPT .json array file is read as well
    arr = tmp_path / "sharegpt.json"
    arr.write_text(json.dumps([{"conversations": [{"from": "human", "value": MT[0]["turns"][0]}]}]))
    assert ps.contamination({"mt": ps.load_set(mt)}, [arr])["contaminated"]["mt"][0]["where"] == f"{arr}[0]"
    gone = ps.contamination({"mt": ps.load_set(mt)}, [tmp_path / "nope"])
    assert gone["training_missing"] == [str(tmp_path / "nope")] and gone["training_user_turns"] == 0
    assert (
        main(["benchmark-contamination", "--set", f"mt={mt}", "--training", str(tmp_path / "nope"), "--json"])
        == 0
    )
    assert "training data not found, not checked" in _last(capsys)["msg"]


def test_live_benchmark_and_report_with_and_without_the_draft(files, tmp_path, capsys):
    mt, held = files
    run_dir = tmp_path / "run"
    (tmp_path / "config.json").write_text("{}")  # the stand-in's "model" and "draft" directory
    sets = ["--set", f"heldout={held}", "--set", f"mtbench={mt}"]
    common = [*sets, "--concurrency", "1", "4", "--num-requests", "4", "--max-new-tokens", "30"]
    try:
        uw, uo = start_with_and_without(run_dir, tmp_path, tmp_path, step_seconds=0.01)
        ow, oo = tmp_path / "live_with.json", tmp_path / "live_without.json"
        base = ["benchmark-live", *common, "--mtbench-turns", "both", "--server-key", "k1"]
        assert main([*base, "--url", uw, "--out", str(ow), "--check", "--json"]) == 0
        assert _last(capsys)["changed"] is True and not ow.exists()
        assert main([*base, "--url", uw, "--out", str(ow), "--json"]) == 0
        summary = _last(capsys)["summary"]
        assert [(r["set"], r["concurrency"]) for r in summary] == [
            ("heldout", 1),
            ("heldout", 4),
            ("mtbench", 1),
            ("mtbench", 4),
        ]
        assert main([*base, "--url", uo, "--out", str(oo), "--label", "without_draft", "--json"]) == 0
        capsys.readouterr()
        assert main([*base, "--url", uw, "--out", str(ow), "--json"]) == 0
        assert _last(capsys)["changed"] is False  # same inputs: not measured again
        assert main([*base[:-1], "k2", "--url", uw, "--out", str(ow), "--check", "--json"]) == 0
        assert _last(capsys)["changed"] is True  # another server (new draft / flags): measure again
        w = json.loads(ow.read_text())
        mt_run = next(r for r in w["runs"] if r["set"] == "mtbench" and r["concurrency"] == 1)
        assert mt_run["turns"] == 8 and mt_run["completion_tokens"] == 240  # 4 requests x 2 turns x 30 tokens
        assert mt_run["acceptance_length"] == 2.5 and mt_run["format"] == "mtbench"
    finally:
        sp.stop(run_dir, "w", grace=10)
        sp.stop(run_dir, "o", grace=10)

    acceptance = acceptance_result(2.2, [0.7, 0.4, 0.1], [0.7, 0.57, 0.25], prompts_file=str(held))
    (tmp_path / "acc.json").write_text(json.dumps(acceptance))
    cont = tmp_path / "cont.json"
    assert (
        main(
            ["benchmark-contamination", *sets, "--training", str(held), "--mode", "warn", "--out", str(cont)]
        )
        == 0
    )
    capsys.readouterr()
    rep_args = [
        "benchmark-report",
        "--out-dir",
        str(tmp_path / "r"),
        "--acceptance",
        str(tmp_path / "acc.json"),
        "--live-with",
        str(ow),
        "--live-without",
        str(oo),
        "--contamination",
        str(cont),
        "--json",
    ]
    assert main(rep_args) == 0
    res = _last(capsys)
    assert res["changed"] is True
    live = res["report"]["live"]
    rows = {(n, r["concurrency"]): r for n, s in live["sets"].items() for r in s["rows"]}
    for key, r in rows.items():
        assert r["with_draft_tok_s"] and r["without_draft_tok_s"], key
        assert r["speedup"] == round(r["with_draft_tok_s"] / r["without_draft_tok_s"], 3)
        assert r["speedup"] > 1.3, key  # 2.5 tokens per step vs 1, from real timings
        assert r["acceptance_length"] == 2.5 and set(r["acceptance_per_request"]) == {2.5}
        assert r["acceptance_length_request_mean"] == 2.5  # every request alike: pooled = mean
    ov = live["offline_vs_server"]
    assert ov == {
        "offline_acceptance_length": 2.2,
        "server_acceptance_length": 2.5,
        "server_concurrency": 1,
        "difference": 0.3,
        "offline_k": 3,
    }
    assert live["contamination"]["clean"] is False and live["contamination"]["contaminated"] == {"heldout": 2}
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| heldout (heldout) | 1 |" in md and "| mtbench (mtbench) | 4 |" in md
    assert "Held-out acceptance length: server 2.500 vs offline estimate 2.200" in md
    assert "CONTAMINATED {'heldout': 2}" in md and "| trained | 2.200 |" in md
    assert (tmp_path / "r" / "report.png").stat().st_size > 1000
    assert main(rep_args) == 0 and _last(capsys)["changed"] is False
    assert (
        rp.build(None, live={"with_draft": json.loads(ow.read_text())})["live"]["sets"]["heldout"]["rows"][0][
            "speedup"
        ]
        is None
    )
