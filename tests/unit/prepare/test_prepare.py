"""``prepare`` against real parts: the demo's tokenizer, speculators 0.9.0's own preprocessing and its
``ArrowDataset`` loader, real files on disk. The demo is built once per run (run_cache.session_demo,
shared by the xdist workers, so whichever runs second gets the idempotent no-op).

Rendering rows per conversation and the render workers: tests/unit/prepare/test_prepare_rows.py; the command line and
the speculators pin: tests/unit/prepare/test_prepare_cli.py; the shared inputs: tests/unit/prepare_inputs.py; the
``demo``, ``model`` and ``tokenizer`` fixtures: tests/unit/conftest.py.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from eagle3ops import demo as demo_mod
from eagle3ops.prepare import dataset as prep_dataset
from eagle3ops.prepare.dataset import load_rows_lengths, prepare
from eagle3ops.prepare.errors import PrepareError
from prepare_inputs import (
    ADD,
    PREFILL_THINK,
    THREE_TURNS,
    _tokenizer_variant,
    quiet,
    rows_of,
    sharegpt,
    write_jsonl,
)


@pytest.fixture(scope="session")
def prepared(demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "data"
    result = prepare(demo["model_path"], [demo["conversations_path"]], out, max_length=512, log=quiet)
    return out, result


# --------------------------------------------------------------------------------------------------
def test_output_is_speculators_offline_contract(prepared):
    import torch
    from datasets import load_from_disk

    out, result = prepared
    ds = load_from_disk(str(out))
    assert ds.column_names == ["input_ids", "loss_mask", "seq_len"]
    assert ds.format["type"] == "torch"
    row = ds[0]
    assert row["input_ids"].dtype == torch.int64 and row["loss_mask"].dtype == torch.int64
    assert set(row["loss_mask"].unique().tolist()) <= {0, 1}
    assert int(row["seq_len"]) == len(row["input_ids"]) == len(row["loss_mask"])
    assert result["changed"] is True
    assert result["num_rows"] == len(ds)
    assert result["num_tokens"] == sum(load_rows_lengths(out))
    meta = json.loads((out / prep_dataset.META_NAME).read_text())
    assert meta["num_rows"] == len(ds) and meta["fingerprint"] == result["fingerprint"]
    assert meta["speculators_version"] == "0.9.0"

    freq = torch.load(out / prep_dataset.TOKEN_FREQ, weights_only=True)
    assert sum(freq.values()) == result["num_supervised_tokens"]
    supervised = torch.cat([r["input_ids"][r["loss_mask"].bool()] for r in ds])
    assert freq == dict(zip(*[t.tolist() for t in supervised.unique(return_counts=True)], strict=True))


def test_speculators_arrow_dataset_loads_it(prepared, model):
    """speculators' own loader; row 0 gets a hidden-state file (random values: a stand-in for extract)."""
    import torch
    from safetensors.torch import save_file
    from speculators.train.data import ArrowDataset

    src, _ = prepared
    out = src.parent / "with-hs"
    shutil.copytree(src, out)
    lengths = load_rows_lengths(out)
    ds = ArrowDataset(max_len=512, datapath=out, on_missing="skip")
    assert len(ds) == len(lengths) and ds.approx_lengths == lengths
    assert type(ds[1]).__name__ == "SampleUnavailable"

    ids = ds.data[0]["input_ids"]
    (out / "hidden_states").mkdir()
    save_file(
        {"token_ids": ids.clone(), "hidden_states": torch.randn(len(ids), 4, 64, dtype=torch.bfloat16)},
        str(out / "hidden_states" / "hs_0.safetensors"),
    )
    sample = ArrowDataset(max_len=512, datapath=out, on_missing="raise")[0]
    assert sample["hidden_states"].shape == (len(ids), 3 * 64)
    assert torch.equal(sample["input_ids"], ids)
    assert torch.equal(sample["loss_mask"], ds.data[0]["loss_mask"])
    val = ArrowDataset(max_len=512, datapath=out, on_missing="skip", train_ratio=0.9, split="val")
    assert len(val) == len(lengths) - int(len(lengths) * 0.9)


def test_fan_out_one_row_per_assistant_turn(prepared, demo):
    _, result = prepared
    with open(demo["conversations_path"]) as f:
        convs = [json.loads(line)["conversations"] for line in f]
    assistant_turns = sum(1 for c in convs for j, t in enumerate(c) if t["from"] == "gpt" and j > 0)
    assert result["num_rows"] == assistant_turns
    assert result["num_conversations"] == len(convs)
    assert result["dropped"] == {"turns_context_over_max_length": 0, "rows_unsupervised_after_truncation": 0}


def test_loss_mask_is_exactly_the_last_assistant_turn(tmp_path, model, tokenizer):
    src = write_jsonl(tmp_path / "one.jsonl", [THREE_TURNS])
    result = prepare(model, [src], tmp_path / "out", log=quiet)
    rows = rows_of(tmp_path / "out")
    assert result["num_rows"] == len(rows) == 3
    turns = THREE_TURNS["conversations"]
    expected = {  # supervised text -> the generation-prompt render that must precede it
        "2 + 3 = 5.": turns[:2],
        "5 + 4 = 9.": turns[:4],
        "c-a-t": turns[:6],
    }
    seen = set()
    for r in rows:
        ids, mask = r["input_ids"], r["loss_mask"]
        first = mask.index(1)
        assert mask == [0] * first + [1] * (len(mask) - first)  # one contiguous supervised span at the end
        answer = tokenizer.decode(ids[first:])
        assert answer.endswith(tokenizer.eos_token)
        text = answer[: -len(tokenizer.eos_token)]
        prompt = demo_mod.render(tokenizer, expected[text], add_generation_prompt=True)
        assert tokenizer.decode(ids[:first]) == prompt
        # the first assistant token is supervised (SpecForge#885): it sits right after <|assistant|>
        assert ids[first - 1] == tokenizer.convert_tokens_to_ids("<|assistant|>")
        assert tokenizer.decode(ids[first : first + 1]) == tokenizer.decode(
            tokenizer.encode(text, add_special_tokens=False)[:1]
        )
        seen.add(text)
    assert seen == set(expected)


def test_think_blocks_are_supervised_with_the_answer(tmp_path, model, tokenizer):
    rec = {
        "conversations": [
            {"role": "user", "content": "What is 6 * 7?"},
            {"role": "assistant", "content": "6 * 7 = 42.", "reasoning_content": "six sevens"},
        ]
    }
    prepare(model, [write_jsonl(tmp_path / "t.jsonl", [rec])], tmp_path / "out", log=quiet)
    (row,) = rows_of(tmp_path / "out")
    first = row["loss_mask"].index(1)
    assert tokenizer.decode(row["input_ids"][first:]) == "<think>six sevens</think>6 * 7 = 42.<|end|>"


def test_prefilled_think_uses_the_common_prefix_boundary(tmp_path, model, tokenizer):
    """speculators' fallback: the gen prompt ends in '<think>' but the recorded turn has no reasoning."""
    variant = _tokenizer_variant(model, tmp_path / "tok", PREFILL_THINK)
    rec = sharegpt(ADD, ("Spell the word cat.", "c-a-t"))
    prepare(variant, [write_jsonl(tmp_path / "t.jsonl", [rec])], tmp_path / "out", log=quiet)
    rows = rows_of(tmp_path / "out")
    assert len(rows) == 2
    for r, answer in zip(
        sorted(rows, key=lambda r: len(r["input_ids"])), ["2 + 3 = 5.", "c-a-t"], strict=True
    ):
        first = r["loss_mask"].index(1)
        assert r["input_ids"][first - 1] == tokenizer.convert_tokens_to_ids("<|assistant|>")
        assert tokenizer.decode(r["input_ids"][first:]) == f"{answer}<|end|>"


def test_unstable_template_is_reported_by_file_and_line(tmp_path, model):
    unstable = demo_mod.CHAT_TEMPLATE.replace("{{ bos_token }}", "{{ bos_token }}{{ messages|length }}")
    variant = _tokenizer_variant(model, tmp_path / "tok", unstable)
    src = write_jsonl(tmp_path / "t.jsonl", [THREE_TURNS])
    with pytest.raises(PrepareError, match=r"t\.jsonl:1: the chat template is not prefix-stable"):
        prepare(variant, [src], tmp_path / "out", log=quiet)
    assert not (tmp_path / "out").exists()


BAD_ROWS = [
    THREE_TURNS,
    '{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt"',  # 2: truncated JSON
    {"id": 7, "text": "no conversations here"},  # 3
    {"conversations": []},  # 4
    "",  # 5: blank lines are not rows
    {"conversations": [{"value": "who am I?"}, {"from": "gpt", "value": "x"}]},  # 6
    {"conversations": [{"from": "human", "value": [{"type": "image"}]}, {"from": "gpt", "value": "x"}]},  # 7
    {"conversations": [{"from": "human", "value": "only a question"}]},  # 8
    [1, 2, 3],  # 9
]
BAD_MESSAGES = {
    2: "not valid JSON",
    3: "no 'conversations' field (keys: id, text)",
    4: "empty conversation",
    6: "turn 0: no 'from' or 'role'",
    7: "turn 0: content is a list, only text is supported",
    8: "no assistant turn after the first message",
    9: "expected a JSON object with 'conversations', got list",
}


def test_bad_rows_fail_with_file_line_and_nothing_written(tmp_path, model):
    src = write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    out = tmp_path / "sub" / "data"
    with pytest.raises(PrepareError) as e:
        prepare(model, [src], out, log=quiet)
    problems = e.value.problems
    assert len(problems) == len(BAD_MESSAGES)
    for (line, what), msg in zip(sorted(BAD_MESSAGES.items()), problems, strict=True):
        assert msg.startswith(f"{src}:{line}: {what}"), msg
    assert "nothing was written" in str(e.value) and "--on-error skip" in str(e.value)
    assert not (tmp_path / "sub").exists()  # not even the parent directory


def test_skip_policy_lists_every_skipped_row(tmp_path, model):
    src = write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    out = tmp_path / "data"
    result = prepare(model, [src], out, on_error="skip", log=quiet)
    assert result["num_rows"] == 3
    assert [s.split(": ")[0] for s in result["skipped"]] == [f"{src}:{n}" for n in sorted(BAD_MESSAGES)]
    assert json.loads((out / prep_dataset.META_NAME).read_text())["skipped"] == result["skipped"]
    # the same data under the default policy: the bad rows are still an error, and nothing changes
    with pytest.raises(PrepareError, match=r"bad\.jsonl:2"):
        prepare(model, [src], out, log=quiet)
    assert prepare(model, [src], out, on_error="skip", log=quiet)["changed"] is False


def test_json_array_file_lines_and_directories(tmp_path, model):
    d = tmp_path / "in"
    (d / "nested").mkdir(parents=True)
    (d / "a.json").write_text(
        "[\n" + json.dumps(THREE_TURNS) + ",\n\n" + json.dumps({"conversations": []}) + "\n]\n"
    )
    write_jsonl(d / "nested" / "b.jsonl", [THREE_TURNS])
    (d / "ignored.txt").write_text("not an input")
    with pytest.raises(PrepareError, match=r"a\.json:4: empty conversation"):
        prepare(model, [d], tmp_path / "out", log=quiet)
    result = prepare(model, [d], tmp_path / "out", on_error="skip", log=quiet)
    assert result["num_rows"] == 6 and len(result["skipped"]) == 1


def test_hf_dataset_directory_gives_the_same_rows_as_jsonl(tmp_path, model, demo):
    from datasets import Dataset

    with open(demo["conversations_path"]) as f:
        recs = [json.loads(line) for line in f][:40]
    jsonl = write_jsonl(tmp_path / "c.jsonl", recs)
    Dataset.from_list(recs).save_to_disk(str(tmp_path / "hf"))
    a = prepare(model, [jsonl], tmp_path / "a", log=quiet)
    b = prepare(model, [tmp_path / "hf"], tmp_path / "b", log=quiet)
    assert a["num_rows"] == b["num_rows"] > 40
    assert rows_of(tmp_path / "a") == rows_of(tmp_path / "b")


def test_second_run_is_a_no_op(prepared, model, demo):
    out, first = prepared
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = prepare(model, [demo["conversations_path"]], out, max_length=512, log=quiet)
    assert again["changed"] is False
    assert again["fingerprint"] == first["fingerprint"] and again["num_rows"] == first["num_rows"]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    check = prepare(model, [demo["conversations_path"]], out, max_length=256, check=True, log=quiet)
    assert check["changed"] is True
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes


def test_deterministic_shuffle_by_conversation(tmp_path, model, demo):
    with open(demo["conversations_path"]) as f:
        recs = [json.loads(line) for line in f][:60]
    jsonl = write_jsonl(tmp_path / "c.jsonl", recs)
    prepare(model, [jsonl], tmp_path / "a", log=quiet)
    prepare(model, [jsonl], tmp_path / "b", log=quiet)
    prepare(model, [jsonl], tmp_path / "c", seed=1, log=quiet)
    arrow = "data-00000-of-00001.arrow"
    assert (tmp_path / "a" / arrow).read_bytes() == (tmp_path / "b" / arrow).read_bytes()
    a, c = rows_of(tmp_path / "a"), rows_of(tmp_path / "c")
    assert a != c and sorted(map(str, a)) == sorted(map(str, c))
    # rows of one conversation stay adjacent: each row either starts a conversation or extends the
    # previous row's conversation (its prefix up to its own boundary is the previous row's full text)
    starts = 0
    for prev, row in itertools.pairwise(a):
        first = row["loss_mask"].index(1)
        starts += row["input_ids"][:first][: len(prev["input_ids"])] != prev["input_ids"]
    assert starts + 1 == len(recs)


def test_truncation_and_max_samples(tmp_path, model, demo):
    out = tmp_path / "short"
    result = prepare(model, [demo["conversations_path"]], out, max_length=48, max_samples=100, log=quiet)
    lengths = load_rows_lengths(out)
    assert result["num_rows"] == len(lengths) == 100
    assert max(lengths) == 48
    assert result["dropped"]["turns_context_over_max_length"] > 0
    assert all(1 in r["loss_mask"] for r in rows_of(out))


def test_workers_render_the_same_rows_in_the_same_order(prepared, tmp_path, model, demo):
    """Two forked rendering processes give the dataset one process gave, byte for byte."""
    out, first = prepared
    result = prepare(
        model, [demo["conversations_path"]], tmp_path / "w2", max_length=512, workers=2, log=quiet
    )
    assert result["fingerprint"] == first["fingerprint"] and result["num_rows"] == first["num_rows"]
    one = json.loads((out / "prepare_meta.json").read_text())["checksums"]
    two = json.loads((tmp_path / "w2" / "prepare_meta.json").read_text())["checksums"]
    assert one == two and any(name.endswith(".arrow") for name in one)


def _with_extracted_state(src: Path, out: Path) -> Path:
    """A copy of the prepared data directory ``src`` at ``out`` whose ``hidden_states/`` holds one file (STAND-IN
    bytes, not a real sample: prepare only counts and keeps or removes it)."""
    shutil.copytree(src, out)
    (out / "hidden_states").mkdir()
    (out / "hidden_states" / "hs_0.safetensors").write_bytes(b"x" * 64)
    return out


def test_refuses_to_orphan_hidden_states_unless_forced(prepared, tmp_path, model, demo):
    src, _ = prepared
    out = _with_extracted_state(src, tmp_path / "data")
    (out / "d2t-32.npy").write_bytes(b"stale")
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(PrepareError, match=r"hidden_states holds 1 files.*--force"):
        prepare(model, [demo["conversations_path"]], out, max_length=256, log=quiet)
    assert sorted(p.name for p in out.rglob("*")) == before
    # same fingerprint: nothing to do, the states stay valid
    assert prepare(model, [demo["conversations_path"]], out, max_length=512, log=quiet)["changed"] is False
    res = prepare(model, [demo["conversations_path"]], out, max_length=256, force=True, log=quiet)
    assert res["changed"] is True and res["removed_hidden_states"] == 1
    assert not (out / "hidden_states").exists() and not (out / "d2t-32.npy").exists()
    assert max(load_rows_lengths(out)) <= 256
    assert not list(tmp_path.glob(".data.prepare-*"))


def test_missing_file_is_repaired_keeping_hidden_states(prepared, tmp_path, model, demo):
    src, first = prepared
    out = _with_extracted_state(src, tmp_path / "data")
    arrow = out / "data-00000-of-00001.arrow"
    good = arrow.read_bytes()
    arrow.write_bytes(good[:100])  # damaged: its size no longer matches prepare_meta.json
    (out / prep_dataset.TOKEN_FREQ).unlink()
    res = prepare(model, [demo["conversations_path"]], out, max_length=512, log=quiet)
    assert res["changed"] is True and res["removed_hidden_states"] == 0
    assert res["fingerprint"] == first["fingerprint"]
    assert arrow.read_bytes() == good and (out / prep_dataset.TOKEN_FREQ).exists()
    assert (out / "hidden_states" / "hs_0.safetensors").read_bytes() == b"x" * 64
    assert prepare(model, [demo["conversations_path"]], out, max_length=512, log=quiet)["changed"] is False


def test_altered_shard_of_same_size_is_found_and_rebuilt(prepared, tmp_path, model, demo):
    """Issue 16 §1: an arrow shard altered in place (same size, one byte flipped) was reported "already done"
    before prepare_meta.json recorded the shards' checksums; now it is rebuilt (hidden states kept)."""
    src, _ = prepared
    out = tmp_path / "data"
    shutil.copytree(src, out)
    arrow = out / "data-00000-of-00001.arrow"
    good = arrow.read_bytes()
    pos = len(good) // 2
    arrow.write_bytes(good[:pos] + bytes([good[pos] ^ 0x01]) + good[pos + 1 :])
    res = prepare(model, [demo["conversations_path"]], out, max_length=512, log=quiet)
    assert res["changed"] is True and res["damaged_files"] == ["data-00000-of-00001.arrow"], res
    assert arrow.read_bytes() == good
    assert prepare(model, [demo["conversations_path"]], out, max_length=512, log=quiet)["changed"] is False


def test_refuses_to_replace_foreign_directory(tmp_path, model):
    out = tmp_path / "data"
    out.mkdir()
    (out / "checkpoint").mkdir()
    src = write_jsonl(tmp_path / "c.jsonl", [THREE_TURNS])
    with pytest.raises(PrepareError, match=r"holds checkpoint that prepare did not make"):
        prepare(model, [src], out, log=quiet)
    assert (out / "checkpoint").is_dir()


def test_stale_temp_dirs_of_a_killed_run_are_cleaned(tmp_path, model):
    src = write_jsonl(tmp_path / "c.jsonl", [THREE_TURNS])
    dead = tmp_path / ".data.prepare-new-999999999"
    dead.mkdir()
    (dead / "data-00000-of-00001.arrow").write_bytes(b"half")
    prepare(model, [src], tmp_path / "data", log=quiet)
    assert not dead.exists()
    assert len(rows_of(tmp_path / "data")) == 3
