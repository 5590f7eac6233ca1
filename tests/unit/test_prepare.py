"""``prepare`` against real parts: the demo's tokenizer, speculators 0.9.0's own preprocessing and its
``ArrowDataset`` loader, real files on disk. The demo is built once per run (test_demo.build_session_demo,
shared by the xdist workers, so whichever runs second gets the idempotent no-op).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from eagle3ops import demo as demo_mod
from eagle3ops import speculators_pin
from eagle3ops.cli import main as cli_main
from eagle3ops.prepare import dataset as prep_dataset
from eagle3ops.prepare import render as prep_render
from eagle3ops.prepare.dataset import load_rows_lengths, prepare
from eagle3ops.prepare.errors import PrepareError


def quiet(msg: str) -> None:
    pass


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    from test_demo import build_session_demo

    return build_session_demo(tmp_path_factory)


@pytest.fixture(scope="session")
def model(demo):
    return demo["model_path"]


@pytest.fixture(scope="session")
def tokenizer(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


@pytest.fixture(scope="session")
def prepared(demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "data"
    result = prepare(demo["model_path"], [demo["conversations_path"]], out, max_length=512, log=quiet)
    return out, result


def rows_of(data_dir) -> list[dict]:
    from datasets import load_from_disk

    return list(load_from_disk(str(data_dir)).with_format(None))


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def sharegpt(*pairs: tuple[str, str], system: str | None = None) -> dict:
    """A ShareGPT record: a system turn if given, then a human and a gpt turn per (question, answer) pair."""
    turns = [{"from": "system", "value": system}] if system else []
    for question, answer in pairs:
        turns += [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    return {"conversations": turns}


ADD = ("What is 2 + 3?", "2 + 3 = 5.")
# three assistant turns; the last pair in the OpenAI schema (one record may mix both)
THREE_TURNS = sharegpt(ADD, ("Now add 4 to that.", "5 + 4 = 9."), system="You are a helpful assistant.")
THREE_TURNS["conversations"] += [
    {"role": "user", "content": "Spell the word cat."},
    {"role": "assistant", "content": "c-a-t"},
]


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


def _tokenizer_variant(src_model: str, dst: Path, template: str) -> Path:
    dst.mkdir()
    for f in Path(src_model).iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, dst / f.name)
    (dst / "chat_template.jinja").write_text(template)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


# A Qwen3-like template: the generation prompt pre-fills "<think>", history reasoning is dropped.
PREFILL_THINK = (
    "{{ bos_token }}{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}"
    "{% endfor %}"
    "{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' }}"
    "{% if m['role'] == 'assistant' and loop.index0 > ns.last_user and m.get('reasoning_content') %}"
    "{{ '<think>' ~ m['reasoning_content'] ~ '</think>' }}{% endif %}"
    "{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|><think>' }}{% endif %}"
)


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


_INHERITED_HANDLER = """
import signal
from speculators.data_generation import preprocessing  # imported before the fork, as prepare() has it
from eagle3ops.conversations import Problem
from eagle3ops.prepare import render

seen = []
signal.signal(signal.SIGTERM, lambda *a: seen.append(a[0]))  # records the signal and goes on
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
def records(n):
    return ((f"c.jsonl:{i}", Problem(f"c.jsonl:{i}", "not a conversation")) for i in range(n))
with render._results(None, records(300), 64, False, 2) as results:
    assert sum(1 for _ in results) == 300
try:
    with render._results(None, records(300), 64, False, 2) as results:
        next(results)
        raise RuntimeError("the consumer failed")
except RuntimeError:
    pass
print("ended", seen)
"""


def test_render_workers_end_under_a_parent_that_keeps_sigterm(tmp_path):
    """Rendering processes end, on completion and on an error, in a parent whose SIGTERM handler only records
    the signal and whose mask blocks it: the forked children do not inherit either (CI hung 900 s in pool.join
    of the test above, in a test worker where such a handler was left). Real: the pool, fork, signals; the
    records are Problems, which render without a tokenizer. Run in a child process: a regression hangs there,
    to the timeout."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", _INHERITED_HANDLER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # it keeps SIGTERM, and so would the workers of a regression
        child.communicate()
        pytest.fail("the rendering pool did not end within 120 s")
    assert child.returncode == 0, err[-2000:]
    assert out.strip() == "ended []"


def _supervised(row) -> list[int]:
    return [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]


def test_conversation_rows_supervise_every_turn_once(tmp_path, model, tokenizer):
    """rows=conversation: one row per conversation; its tokens are the longest turn row's, its supervised tokens
    every turn's supervised tokens; fewer tokens in all, the same supervised ones."""
    src = write_jsonl(tmp_path / "c.jsonl", [THREE_TURNS, sharegpt(ADD)])
    per_turn = prepare(model, [src], tmp_path / "turn", log=quiet)
    merged = prepare(model, [src], tmp_path / "conv", rows="conversation", log=quiet)
    turn_rows, conv_rows = rows_of(tmp_path / "turn"), rows_of(tmp_path / "conv")
    assert per_turn["num_rows"] == len(turn_rows) == 4 and merged["num_rows"] == len(conv_rows) == 2
    assert merged["rows"] == {
        "layout": "conversation",
        "conversations_merged": 1,
        "conversations_kept_per_turn": 0,
    }
    assert per_turn["rows"] == {"layout": "turn"}
    assert merged["num_supervised_tokens"] == per_turn["num_supervised_tokens"]
    assert merged["num_tokens"] < per_turn["num_tokens"]
    assert merged["fingerprint"] != per_turn["fingerprint"]
    longest = max(turn_rows, key=lambda r: len(r["input_ids"]))
    three = max(conv_rows, key=lambda r: len(r["input_ids"]))
    assert three["input_ids"] == longest["input_ids"]
    # the three turns of THREE_TURNS, in order, and nothing else (the user turns and the system prompt are not)
    spans = sorted((r for r in turn_rows if r["input_ids"] == longest["input_ids"][: len(r["input_ids"])]),
                   key=lambda r: len(r["input_ids"]))  # fmt: skip
    assert len(spans) == 3
    assert _supervised(three) == [t for r in spans for t in _supervised(r)]
    text = tokenizer.decode(_supervised(three))
    assert all(a in text for a in ("2 + 3 = 5.", "5 + 4 = 9.", "c-a-t")) and "Spell" not in text
    # the single-turn conversation is the same row either way
    (single,) = [r for r in conv_rows if r is not three]
    assert single in turn_rows


def test_a_template_that_rewrites_history_keeps_per_turn_rows(tmp_path, model, tokenizer):
    """A Qwen3-like template drops the first answer's reasoning once a later user turn follows: the second turn's
    row does not extend the first's, so merging would train on a history the target never sees; that
    conversation keeps its two rows and is counted."""
    variant = _tokenizer_variant(model, tmp_path / "tok", PREFILL_THINK)
    rec = {
        "conversations": [
            {"role": "user", "content": "What is 6 * 7?"},
            {"role": "assistant", "content": "6 * 7 = 42.", "reasoning_content": "six sevens"},
            {"role": "user", "content": "And 6 * 8?"},
            {"role": "assistant", "content": "48."},
        ]
    }
    src = write_jsonl(tmp_path / "t.jsonl", [rec, THREE_TURNS])
    result = prepare(variant, [src], tmp_path / "out", rows="conversation", log=quiet)
    assert result["rows"] == {
        "layout": "conversation",
        "conversations_merged": 1,
        "conversations_kept_per_turn": 1,
    }
    rows = rows_of(tmp_path / "out")
    assert len(rows) == 3
    texts = sorted(tokenizer.decode(_supervised(r)) for r in rows)
    # (the generation prompt pre-fills <think>: the first answer is supervised from the reasoning on)
    assert "six sevens</think>6 * 7 = 42.<|end|>" in texts and "48.<|end|>" in texts


def test_rows_and_workers_are_checked(tmp_path, model, demo):
    for kw, what in (
        ({"rows": "session"}, "rows must be one of turn, conversation"),
        ({"workers": 0}, "workers 0"),
    ):
        with pytest.raises(PrepareError, match=what):
            prepare(model, [demo["conversations_path"]], tmp_path / "x", log=quiet, **kw)
    assert not (tmp_path / "x").exists()


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
