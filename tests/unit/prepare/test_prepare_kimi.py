"""``prepare`` on the Kimi-K2.5-format fixture (the ``kimi`` fixture: remote-code tiktoken tokenizer, the published
template's structure): what is supervised in a conversation with thinking and tool calls, and the check that the
rows equal what the tokenizer SGLang serves with gives for the same conversation. Real tokenizers, speculators'
own rendering, real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from eagle3ops.cli import main
from eagle3ops.prepare import tokcheck
from prepare_inputs import rows_of, write_jsonl


@pytest.fixture(scope="module")
def conversations(kimi) -> list[dict]:
    return [json.loads(line) for line in Path(kimi["conversations_path"]).read_text().splitlines()]


@pytest.fixture(scope="module")
def remote(kimi):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(kimi["model_path"], trust_remote_code=True)


def _spans(tok, ids, mask, value: int) -> list[str]:
    """The decoded runs of tokens whose mask is ``value``."""
    out, run = [], []
    for i, m in zip(ids, mask, strict=True):
        if m == value:
            run.append(i)
        elif run:
            out.append(tok.decode(run))
            run = []
    return [*out, tok.decode(run)] if run else out


def test_thinking_and_tool_calls_are_trained_tool_results_are_not(kimi, conversations, remote, tmp_path):
    """The choice (docs/data-format.md): every token the target generates in an assistant turn is supervised -
    its reasoning, the tool-call section and the answer, up to <|im_end|>; the prompt side is not - the
    generation prompt (with its opening <think>), system, user and tool-result messages."""
    weather = conversations[
        2
    ]  # user -> assistant (thinking + tool call) -> tool -> assistant (thinking + answer)
    src = write_jsonl(tmp_path / "w.jsonl", [weather])
    out = tmp_path / "data"
    argv = ["prepare", "--model", kimi["model_path"], "--input", str(src), "--out", str(out)]
    assert main([*argv, "--trust-remote-code", "--rows", "conversation"]) == 0
    (row,) = rows_of(out)  # this template keeps the history as rendered: one row for the conversation
    trained = _spans(remote, row["input_ids"], row["loss_mask"], 1)
    context = "".join(_spans(remote, row["input_ids"], row["loss_mask"], 0))
    call, answer = weather["messages"][1], weather["messages"][3]
    args = call["tool_calls"][0]["function"]["arguments"]
    assert trained == [
        f"{call['reasoning_content']}</think><|tool_calls_section_begin|><|tool_call_begin|>"
        f"functions.get_weather:0<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>"
        "<|im_end|>",
        f"{answer['reasoning_content']}</think>{answer['content']}<|im_end|>",
    ]
    assert context.count("<|im_assistant|>assistant<|im_middle|><think>") == 2  # the generation prompts
    assert weather["messages"][2]["content"] in context and weather["messages"][0]["content"] in context


def test_rows_that_differ_from_the_serving_tokenizer_stop_the_run(kimi, conversations, tmp_path, capsys):
    """A key the renderer drops but the chat template reads (``reasoning`` instead of ``reasoning_content``:
    speculators keeps only the latter) gives rows the server never sees: stopped naming the row and the first
    differing token, nothing written."""
    rec = json.loads(json.dumps(conversations[0]))
    rec["messages"][1]["reasoning"] = rec["messages"][1].pop("reasoning_content")
    src = write_jsonl(tmp_path / "r.jsonl", [conversations[3], rec])
    out = tmp_path / "data"
    argv = ["prepare", "--model", kimi["model_path"], "--input", str(src), "--out", str(out), "--json"]
    assert main([*argv, "--trust-remote-code"]) == 2
    msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
    assert f"{src}:2: row 0 of this conversation differs from the serving tokenizer's ids at token" in msg, (
        msg
    )
    assert "'</think>'" in msg  # prepare's empty think block ends where the server's reasoning begins
    assert not out.exists()


def test_the_check_names_the_first_token_where_tokenizers_disagree(kimi, conversations, remote):
    """The same rendered conversation through transformers' native tokenizer (no trust_remote_code) and the remote
    one: the check, handed rows made by the native one, reports the first differing token."""
    from transformers import AutoTokenizer

    native = AutoTokenizer.from_pretrained(kimi["model_path"])
    conv = conversations[1]["messages"]
    messages = tokcheck.client_messages(conv)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    text = remote.apply_chat_template(messages[: last + 1], tokenize=False)
    ids = native.encode(text, add_special_tokens=False)
    assert ids != remote.encode(text, add_special_tokens=False)  # the contractions ("I've", "You're", ...)
    why = tokcheck.check_conversation(remote, "chat:1", conv, None, [(ids, [1] * len(ids))])
    assert why is not None and why.startswith("chat:1: row 0 of this conversation differs"), why
    same = remote.encode(text, add_special_tokens=False)
    assert tokcheck.check_conversation(remote, "chat:1", conv, None, [(same, [1] * len(same))]) is None
