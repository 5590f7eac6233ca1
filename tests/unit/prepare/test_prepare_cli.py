"""``prepare`` from the command line and its speculators pin (tests/unit/prepare/test_prepare.py has the dataset itself):
the installed speculators version is checked; the CLI's JSON result and errors; a missing model named as
``extract`` names it; a failed first prepare into a new directory leaves nothing; the summary says what was left
out. Real parts: the demo's tokenizer, real files.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from eagle3ops import speculators_pin
from eagle3ops.cli import main as cli_main
from eagle3ops.prepare import dataset as prep_dataset
from eagle3ops.prepare import render as prep_render
from eagle3ops.prepare.errors import PrepareError
from prepare_inputs import THREE_TURNS, write_jsonl


def test_pinned_to_speculators_0_9_0(monkeypatch):
    """The installed version is read through importlib.metadata (eagle3ops.speculators_pin); patched here to play
    a newer release."""
    real = speculators_pin.importlib.metadata.version
    monkeypatch.setattr(
        speculators_pin.importlib.metadata, "version", lambda n: "0.10.0" if n == "speculators" else real(n)
    )
    with pytest.raises(
        PrepareError, match=r"speculators 0\.10\.0 is installed.*pinned to speculators 0\.9\.0"
    ):
        prep_render.speculators_preprocessing()


def test_cli_json_result_and_error(tmp_path, model, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", [THREE_TURNS])
    argv = ["prepare", "--model", model, "--input", str(src), "--out", str(tmp_path / "d"), "--json"]
    assert cli_main(argv) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"changed", "out", "num_rows", "num_tokens", "num_supervised_tokens", "skipped", "seconds"} <= set(
        res
    )
    assert res["changed"] is True and res["num_rows"] == 3 and res["skipped"] == []
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{oops"])
    assert cli_main([*argv[:4], str(bad), "--out", str(tmp_path / "e"), "--json"]) == 2
    err = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert err["failed"] is True and len(err["problems"]) == 1
    assert err["problems"][0].startswith(f"{bad}:1: not valid JSON (Expecting property name")


def test_a_missing_model_is_named_as_extract_names_it(tmp_path, capsys):
    """Issue 32: ``prepare --model /nonexistent/model`` said ``Repo id must be in the form 'repo_name'...``
    (transformers' hub lookup); now the words of extract's check (one function, eagle3ops.target_model), before
    the lock: nothing is made."""
    from eagle3ops.extract.errors import ExtractError
    from eagle3ops.extract.session import model_facts

    src = write_jsonl(tmp_path / "c.jsonl", [THREE_TURNS])
    out = tmp_path / "new" / "data"
    argv = ["prepare", "--model", "/nonexistent/model", "--input", str(src), "--out", str(out), "--json"]
    for check in ([], ["--check"]):
        assert cli_main([*argv, *check]) == 2
        msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
        assert msg.startswith("target model path /nonexistent/model does not exist") and "Repo id" not in msg
        assert "prepare_model_path (or --model)" in msg, msg
    assert sorted(tmp_path.iterdir()) == [src]
    with pytest.raises(ExtractError) as e:
        model_facts("/nonexistent/model")
    assert str(e.value).replace("extract_model_path", "prepare_model_path") == msg


def test_a_failed_first_prepare_into_a_new_directory_leaves_nothing(tmp_path, model, capsys):
    """Issue 32: a first prepare into a new directory that failed (a bad row) left the new parent folder and the
    lock file behind (the lock is taken before the rows are read). Now nothing is left."""
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{oops"])
    out = tmp_path / "new" / "parent" / "data"
    argv = ["prepare", "--model", model, "--input", str(bad), "--out", str(out), "--json"]
    assert cli_main(argv) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["failed"] is True
    assert sorted(tmp_path.iterdir()) == [bad]
    # a parent that existed stays, with its lock left as a successful run leaves it (empty)
    good = write_jsonl(tmp_path / "c.jsonl", [THREE_TURNS])
    assert cli_main([*argv[:4], str(good), "--out", str(tmp_path / "data"), "--json"]) == 0
    assert (tmp_path / ".data.lock").read_text() == "" and (tmp_path / "data").is_dir()


def test_the_summary_says_what_was_left_out(tmp_path, model, demo, capsys):
    """Issue 32: the summary said "37 rows" where 40 conversations went in; the 110 assistant turns over
    max_length were only in prepare_meta.json. The CLI's line, the result's ``summary`` (the module's msg) and
    the meta say the same counts."""
    out = tmp_path / "d"
    argv = ["prepare", "--model", model, "--input", demo["conversations_path"], "--out", str(out)]
    assert cli_main([*argv, "--max-length", "48", "--max-samples", "5"]) == 0
    human = capsys.readouterr().out
    meta = json.loads((out / prep_dataset.META_NAME).read_text())
    over = meta["dropped"]["turns_context_over_max_length"]
    assert over > 0 and meta["rows_cut_by_max_samples"] > 0 and meta["num_rows"] == 5
    for said in (
        f"5 rows ({meta['num_tokens']} tokens",
        f"from {meta['num_input_rows']} input conversations ({meta['num_conversations']} gave rows)",
        f"{over} assistant turns whose context exceeds max_length 48",
        f"{meta['dropped']['rows_unsupervised_after_truncation']} rows with no supervised token",
        "0 bad input rows skipped",
        f"{meta['rows_cut_by_max_samples']} rows over max_samples",
    ):
        assert said in human, (said, human)
    assert cli_main([*argv, "--max-length", "48", "--max-samples", "5", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        res["changed"] is False
        and res["summary"] in human
        and res["num_input_rows"] == meta["num_input_rows"]
    )
