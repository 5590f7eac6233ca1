"""Issue #10.5: bad inputs get an error that names the thing and what to do, and lose nothing.

Every case runs the real CLI (``eagle3ops.cli.main`` in a process forked from the zygote, see rel_common.py)
against a data directory whose hidden states are already extracted, and asserts on the message text AND on
every file of that directory being untouched (size, mtime, sha256). Covered elsewhere, not repeated here:
malformed manifest lines (tests/unit/store/test_store.py), a changed layer set or model on resume
(tests/unit/extract/test_extract.py, test_store.py), bad rows into a NEW output directory and truncation at
--max-length (tests/unit/prepare/test_prepare.py). The storage phase pointed at a mounted filesystem:
test_storage_mounted_disk.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from rel_common import EXTRACT_ARGS, fresh_data, hs_files
from tinymodels import build_prepared_dataset


def snapshot(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (
            p.stat().st_size,
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def demo_done(zygote, demo, tmp_path_factory):
    """The demo target, its conversations prepared and extracted: a finished data directory."""
    base = tmp_path_factory.mktemp("bad-inputs")
    model, convs = demo["model"], demo["convs"]  # rel_common's demo: built once per run
    argv = ["prepare", "--model", model, "--input", convs, "--out", base / "data", "--max-samples", "24"]
    r = zygote.run([*argv, "--json"])
    assert r.rc == 0, r.stderr[-3000:]
    r = zygote.run(["extract", "--data", base / "data", "--model", model, "--json", "--no-progress"])
    assert r.rc == 0, r.stderr[-3000:]
    assert r.json["written"] > 0
    return {"base": base, "model": model, "convs": convs, "data": base / "data"}


def _refused(r, figures) -> str:
    assert r.rc == 2, f"rc {r.rc}: {r.stdout[-1000:]}{r.stderr[-3000:]}"
    res = r.json
    assert res["failed"] is True
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    figures["bad_inputs_refused"] += 1
    return res["msg"]


@pytest.mark.slow  # builds the demo target (shared with tests/unit/prepare/test_prepare.py in a full run)
def test_bad_jsonl_rows_into_a_finished_dataset_lose_nothing(zygote, demo_done, figures, tmp_path):
    data = demo_done["data"]
    before = snapshot(data)
    good = demo_done["convs"].read_text().splitlines()[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "\n".join(
            [
                good,
                '{"conversations": [{"from": "human", "value": "cut off',  # malformed JSON
                '{"conversations": []}',  # empty conversation
                '{"id": 7}',  # no conversation at all
                '{"conversations": [{"from": "human", "value": "hi"}]}',  # nothing to supervise
            ]
        )
        + "\n"
    )
    argv = ["prepare", "--model", demo_done["model"], "--input", bad, "--out", data, "--json"]
    # without --force: the extracted states are protected, whatever the rows
    msg = _refused(zygote.run(argv), figures)
    assert str(data / "hidden_states") in msg and "--force" in msg and "Nothing was changed" in msg, msg
    assert snapshot(data) == before
    # with --force the rows are checked first; every bad one is named by file:line, nothing is replaced
    msg = _refused(zygote.run([*argv, "--force"]), figures)
    assert "4 bad input row(s); nothing was written" in msg and "--on-error skip" in msg, msg
    for line, what in [
        (2, "not valid JSON"),
        (3, "empty conversation"),
        (4, "no 'conversations' field"),
        (5, "no assistant turn"),
    ]:
        assert f"{bad}:{line}: {what}" in msg, msg
    assert snapshot(data) == before


def test_unknown_model_path_and_out_of_range_layer_ids_lose_nothing(
    zygote, tiny_model, reference, figures, tmp_path
):
    data = fresh_data(reference["data"], tmp_path / "data")  # a finished extraction
    before = snapshot(data)
    missing = tmp_path / "no-such-model"
    msg = _refused(zygote.run(["extract", "--data", data, "--model", missing, *EXTRACT_ARGS]), figures)
    assert f"target model path {missing} does not exist" in msg and "extract_model_path" in msg, msg
    assert snapshot(data) == before

    model = tiny_model
    n = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    for ids, conv in (([2, 4, n], "input"), ([1, n - 1, n + 5], "output"), ([-1, 3, 5], "input")):
        argv = ["extract", "--data", data, "--model", model, "--layer-ids", *ids, "--layer-convention", conv]
        msg = _refused(zygote.run([*argv, *EXTRACT_ARGS]), figures)
        assert f"aux layer ids {ids} ({conv} convention) are out of range" in msg, msg
        assert f"{n} layers" in msg and f"0..{n - 1}" in msg, msg
        assert snapshot(data) == before
    # a dataset directory that was never prepared
    msg = _refused(
        zygote.run(["extract", "--data", tmp_path / "nope", "--model", model, *EXTRACT_ARGS]), figures
    )
    assert str(tmp_path / "nope") in msg and "prepare" in msg, msg


def test_rows_longer_than_the_targets_context_are_refused_before_any_write(
    zygote, tiny_model, figures, tmp_path
):
    max_pos = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    data = build_prepared_dataset(tmp_path / "long", [12, max_pos + 76, 30, max_pos + 1])
    msg = _refused(zygote.run(["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS]), figures)
    assert f"2 rows are longer than the target's max_position_embeddings {max_pos}" in msg, msg
    assert "rows [1, 3]" in msg and f"up to {max_pos + 76} tokens" in msg, msg
    assert f"--max-length {max_pos} or less" in msg and "prepare_max_length" in msg, msg
    assert hs_files(data) == {}, "no row may be extracted when some cannot be"


def test_token_ids_outside_the_targets_vocabulary_are_named(zygote, tiny_model, prepared, figures, tmp_path):
    """Data prepared with another (bigger) tokenizer: an IndexError traceback before; now the rows, the
    vocabulary and the fix. Rows extracted before stay (here: a finished run's files are untouched)."""
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    data = build_prepared_dataset(tmp_path / "oov", [10, 12, 14], vocab=vocab + 100, seed=3)
    msg = _refused(zygote.run(["extract", "--data", data, "--model", tiny_model, *EXTRACT_ARGS]), figures)
    assert "hold token ids up to" in msg and f"has a vocabulary of {vocab}" in msg, msg
    assert "Re-run prepare with this model" in msg, msg
    assert hs_files(data) == {}
    shutil.rmtree(data)
