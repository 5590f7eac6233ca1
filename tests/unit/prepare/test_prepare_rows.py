"""``prepare``'s rows against real parts (the demo's tokenizer, speculators 0.9.0's preprocessing, real files;
tests/unit/prepare/test_prepare.py has the dataset contract): ``rows=conversation`` supervises every turn once, also with
a template that rewrites history; the forked render workers end under a parent that keeps SIGTERM; ``rows`` and
``workers`` are checked before any work.
"""

from __future__ import annotations

import os

import pytest
from eagle3ops.prepare.dataset import prepare
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

_POOL_RUN = """
import multiprocessing, signal, sys, time
from speculators.data_generation import preprocessing  # imported before the fork, as prepare() has it
from eagle3ops.conversations import Problem
from eagle3ops.prepare import render

how, stuck = sys.argv[1], sys.argv[2] == "stuck"
seen = []
signal.signal(signal.SIGTERM, lambda *a: seen.append(a[0]))  # records the signal and goes on
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
if stuck:  # the second worker never gets going: as a forked child stuck on a lock held at the fork
    render.STRAGGLER_GRACE_S = 1.0
    init = render._worker_init
    def stuck_init():
        if multiprocessing.current_process()._identity[0] == 2:
            time.sleep(3600)
        init()
    render._worker_init = stuck_init
def records(n):
    return ((f"c.jsonl:{i}", Problem(f"c.jsonl:{i}", "not a conversation")) for i in range(n))
if how in ("both", "completed"):
    with render._results(None, records(300), 64, False, 2) as results:
        assert sum(1 for _ in results) == 300
if how in ("both", "failed"):
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
    _ends(tmp_path, [_POOL_RUN, "both", "-"], 120, "the rendering pool did not end within 120 s")


def _ends(tmp_path, argv, timeout, why):
    """Run ``python -c argv...`` in its own session; it must print ``ended []`` (no SIGTERM recorded) and exit 0
    within ``timeout`` s, else the test fails with ``why`` (the child and its workers are SIGKILLed: they keep
    SIGTERM, as would the workers of a regression)."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path, start_new_session=True)  # fmt: skip
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        pytest.fail(why)
    assert child.returncode == 0, err[-2000:]
    assert out.strip() == "ended []"


@pytest.mark.parametrize("how", ["completed", "failed"])
def test_a_worker_stuck_before_its_start_does_not_hold_the_pool(tmp_path, how):
    """One rendering worker never starts (stuck before _worker_init, with SIGTERM blocked and a recording handler
    inherited: what a forked child stuck on a lock held at the fork looks like; the suite's run of 01ccc7b hung
    120 s in the test above, under load); the other renders every row. The pool must end all the same, when every
    row was read (the worker never takes the sentinel: before, ``pool.join`` waited for ever) and when the consumer
    failed (``terminate``'s SIGTERM stays blocked in it: before, the same). The stuck worker is killed after
    ``STRAGGLER_GRACE_S`` (1 s here)."""
    why = f"the pool did not end ({how}): a worker stuck before its start held it"
    _ends(tmp_path, [_POOL_RUN, how, "stuck"], 90, why)  # the stuck worker would sleep an hour


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
