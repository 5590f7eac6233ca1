"""The regenerate phase: the target's own answers replace every assistant turn, turn by turn.

Real parts: the real CLI and files (done.log, the atomic output, OUT.failures), real HTTP over loopback, the
real tiny demo target (transformers backend, built once per session at the path test_demo.py/test_prepare.py
use) and the real ``prepare`` reading the output. STAND-IN: the OpenAI-compatible server
(``tests/fixtures/openai_standin.py``): SGLang cannot run on these CPU-only machines; its answers are a
deterministic function of the messages, so every turn can be recomputed here.

The output read back and the CLI: tests/unit/regenerate/test_regenerate_output.py; the transformers backend:
tests/unit/regenerate/test_regenerate_transformers.py; the shared inputs: tests/unit/regenerate_inputs.py.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from eagle3ops.regenerate.config import RegenerateConfig, RegenerateError
from eagle3ops.regenerate.run import iter_output, regenerate
from eagle3ops.regenerate.turns import strip_think
from eagle3ops.regenerate.workdir import paths_for, read_done
from regenerate_inputs import _cfg, _expected, _messages, _norm, _sharegpt, _write


def test_openai_backend_turn_by_turn_in_both_formats(server, tmp_path):
    rows = [_sharegpt(0, 3, system=True), _messages(1, 2, system=True), _sharegpt(2, 1), _messages(3, 3)]
    src = _write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out" / "regen.jsonl"
    r = regenerate(_cfg(server, [src], out, concurrency=3))
    assert r["changed"] and (r["num_written"], r["num_failed"], r["num_skipped"], r["num_input"]) == (
        4,
        0,
        0,
        4,
    )
    got = list(iter_output(out))
    keys = ["conversations", "messages", "conversations", "messages"]
    assert got == [_expected(rec, k) for rec, k in zip(rows, keys, strict=True)]  # input order, schema kept
    # turn k was asked with the earlier answers already the target's own (and nothing else was asked)
    asked = sorted(json.dumps(m) for m in server.requests)
    want = []
    for rec, k in zip(rows, keys, strict=True):
        exp = _expected(rec, k)[k]
        for j, t in enumerate(exp):
            if t.get("from", t.get("role")) in ("gpt", "assistant"):
                hist = [
                    {
                        "role": _norm(x),
                        "content": x.get("value", x.get("content")),
                    }
                    for x in exp[:j]
                ]
                want.append(json.dumps(hist))
    assert asked == sorted(want) and len(asked) == 9
    assert r["turns_generated"] == 9 and r["output_tokens"] == sum(
        len(t.split())
        for t in [
            t.get("value", t.get("content"))
            for rec in got
            for t in rec.get("conversations", rec.get("messages"))
            if t.get("from", t.get("role")) in ("gpt", "assistant")
        ]
    )
    assert r["tok_per_s"] > 0 and r["wall_seconds"] > 0
    assert server.max_in_flight <= 3
    assert server.connections <= 1 + 3  # keep-alive: /v1/models once, then one connection per worker thread
    assert out.with_name("regen.jsonl.failures").read_text() == ""


def test_think_strip_and_system_drop(server, tmp_path):
    server.think = True
    rows = [_sharegpt(0, 2, system=True), _messages(1, 2, system=True)]
    src = _write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "regen.jsonl"
    regenerate(_cfg(server, [src], out, think="strip", system="drop"))
    got = list(iter_output(out))
    assert got == [
        _expected(rows[0], "conversations", think=True, strip=True, drop_system=True),
        _expected(rows[1], "messages", think=True, strip=True, drop_system=True),
    ]
    text = out.read_text()
    assert "<think>" not in text and "system prompt" not in text
    assert all(m[0]["role"] == "user" for m in server.requests)  # the system turn was not sent either
    kept = tmp_path / "kept.jsonl"
    regenerate(_cfg(server, [src], kept, think="keep"))
    assert kept.read_text().count("<think>thinking about") == 4


@pytest.mark.parametrize(
    "text, want",
    [
        ("<think>a\nb</think>\n\nanswer", "answer"),
        ("pre-filled reasoning</think>answer", "answer"),  # the template opened <think> in the prompt
        ("answer <think>x</think> more", "answer more"),
        ("<think>ran out of tokens inside", ""),
        ("plain", "plain"),
    ],
)
def test_strip_think(text, want):
    assert strip_think(text) == want


def _bad_rows(tmp_path: Path) -> tuple[Path, Path]:
    sg = _write(
        tmp_path / "sharegpt.jsonl",
        [
            _sharegpt(0),
            "{not json",
            {"conversations": [{"from": "human", "value": "no answer here"}]},
            {
                "conversations": [
                    {"from": "human", "value": [{"type": "image"}]},
                    {"from": "gpt", "value": "x"},
                ]
            },
            _sharegpt(4),
        ],
    )
    msgs = _write(
        tmp_path / "messages.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": "a"},
                ]
            },
            _messages(1),
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "", "tool_calls": [{"id": "t"}]},
                ]
            },
            {"messages": []},
            {"input_ids": [1, 2], "loss_mask": [0, 1]},
        ],
    )
    return sg, msgs


def test_bad_rows_are_named_and_the_accounting_adds_up(server, tmp_path):
    sg, msgs = _bad_rows(tmp_path)
    out = tmp_path / "out.jsonl"
    with pytest.raises(RegenerateError) as e:
        regenerate(_cfg(server, [sg, msgs], out))
    msg = str(e.value)
    assert "7 input row(s) cannot be regenerated; nothing was generated" in msg and "--on-error skip" in msg
    assert f"{sg}:2: not valid JSON" in msg and f"{msgs}:1: turn 0: content is a list" in msg
    assert not server.requests and not out.exists()

    r = regenerate(_cfg(server, [sg, msgs], out, on_error="skip"))
    assert (r["num_written"], r["num_failed"], r["num_skipped"], r["num_input"]) == (3, 0, 7, 10)
    assert r["num_written"] + r["num_failed"] + r["num_skipped"] == r["num_input"]
    reasons = {f["loc"]: f["reason"] for f in r["failures"]}
    assert set(reasons) == {f"{sg}:{n}" for n in (2, 3, 4)} | {f"{msgs}:{n}" for n in (1, 3, 4, 5)}
    assert "not valid JSON" in reasons[f"{sg}:2"]
    assert "nothing to supervise" in reasons[f"{sg}:3"]
    assert "only text is supported" in reasons[f"{sg}:4"] and "only text is supported" in reasons[f"{msgs}:1"]
    assert "tool calls" in reasons[f"{msgs}:3"]
    assert "empty conversation" in reasons[f"{msgs}:4"]
    assert "pre-tokenized" in reasons[f"{msgs}:5"]
    filed = [json.loads(line) for line in Path(r["failures_file"]).read_text().splitlines()]
    assert filed == r["failures"] and {f["kind"] for f in filed} == {"skipped"}
    assert [rec["id"] for rec in iter_output(out)] == ["sg0", "sg4", "m1"]


def _request_timeout_for(server) -> float:
    """A request timeout that an ordinary request of ``server`` does not reach on this machine now: 20 times the
    slowest of five measured ones, at least 2 s. (The hung request waits for exactly this timeout: the stand-in
    holds it until the client gives up; a fixed 0.5 s timed ordinary requests out on a loaded machine.)"""
    slowest = 0.0
    for i in range(5):
        t0 = time.monotonic()
        with urllib.request.urlopen(
            urllib.request.Request(
                server.url + "/v1/chat/completions",
                json.dumps({"messages": [{"role": "user", "content": f"calibrate {i}"}]}).encode(),
                {"Content-Type": "application/json"},
            ),
            timeout=60,
        ) as r:
            assert r.status == 200
        slowest = max(slowest, time.monotonic() - t0)
    server.requests.clear()
    server.statuses.clear()
    return max(2.0, 20 * slowest)


def test_retries_timeouts_and_failed_conversations(server, tmp_path):
    timeout = _request_timeout_for(server)
    rows = [_sharegpt(i) for i in range(6)]
    rows[1]["conversations"][2] = {"from": "human", "value": "FAIL this one"}
    rows[2]["conversations"][0] = {"from": "human", "value": "REJECT this one"}
    rows[3]["conversations"][0] = {"from": "human", "value": "HANG once"}
    rows[4]["conversations"][2] = {"from": "human", "value": "EMPTY answer"}
    src = _write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    server.fail_first, server.fail_when, server.reject_when = 2, "FAIL", "REJECT"
    server.hang_when, server.empty_when = "HANG", "EMPTY"
    delays: list[float] = []
    cfg = _cfg(
        server,
        [src],
        out,
        concurrency=2,
        retries=3,
        backoff=0.01,
        request_timeout=timeout,
        sleep=delays.append,
    )
    with pytest.raises(RegenerateError) as e:
        regenerate(cfg)
    d = e.value.details
    assert (d["num_written"], d["num_failed"], d["num_skipped"]) == (3, 3, 0)
    reasons = {f["loc"]: f["reason"] for f in d["failures"]}
    assert set(reasons) == {f"{src}:2", f"{src}:3", f"{src}:5"}
    assert (
        "turn 3:" in reasons[f"{src}:2"]
        and "failed 4 attempts" in reasons[f"{src}:2"]
        and "HTTP 500" in reasons[f"{src}:2"]
    )
    assert "turn 1:" in reasons[f"{src}:3"] and "refused the request (HTTP 400" in reasons[f"{src}:3"]
    assert "turn 3: the target's answer is empty" in reasons[f"{src}:5"]
    assert "Re-run to retry them" in str(e.value) and not out.exists()  # on_error fail: OUT not assembled
    # 2 x 500 at the start, 3 retries of the FAIL request, 1 timeout of HANG: 6 backoffs; REJECT is never retried
    assert len(delays) == 6 and server.hangs_abandoned == 1  # the one timeout was HANG's, no other request's
    assert sorted(delays)[-1] <= 0.04 and min(delays) >= 0.005  # 0.01 * 2**k with jitter in [0.5, 1)
    assert server.statuses.count(400) == 1
    done = read_done(paths_for(out)[4])
    assert sorted(done.entries) == [0, 3, 5]  # the conversation whose first attempt hung was retried and done

    # on_error skip writes OUT without them; their reasons are in OUT.failures
    r = regenerate(_cfg(server, [src], out, on_error="skip", request_timeout=timeout))
    assert (r["num_written"], r["num_failed"], r["num_skipped"]) == (3, 3, 0) and r["generated"] == 0
    assert [x["id"] for x in iter_output(out)] == ["sg0", "sg3", "sg5"]
    assert [json.loads(x)["kind"] for x in Path(r["failures_file"]).read_text().splitlines()] == [
        "failed"
    ] * 3

    # the server fixed: the re-run regenerates only the failed ones and OUT is complete, in input order
    server.fail_when = server.reject_when = server.empty_when = None
    n_before = len(server.requests)
    r = regenerate(_cfg(server, [src], out))
    assert r["changed"] and r["generated"] == 3 and r["resumed"] == 3 and r["num_failed"] == 0
    assert len(server.requests) - n_before == 6  # 3 conversations x 2 turns, nothing redone
    assert list(iter_output(out)) == [_expected(x, "conversations") for x in rows]


def test_a_dead_server_stops_the_run(server, tmp_path):
    src = _write(tmp_path / "in.jsonl", [_sharegpt(i, 1) for i in range(40)])
    out = tmp_path / "out.jsonl"
    cfg = _cfg(server, [src], out, concurrency=2, retries=1, abort_after=5)
    server.delay = 0.0
    regenerate(RegenerateConfig(**{**cfg.__dict__, "limit": 3}))  # the server works; 3 are done
    server.down = True
    server.requests.clear()
    with pytest.raises(RegenerateError) as e:
        regenerate(RegenerateConfig(**{**cfg.__dict__, "health_timeout": 0.1}))
    assert "does not answer GET /v1/models" in str(e.value) and not server.requests
    server.down = False
    server.fail_when = "question"  # every completion 500s from now on
    with pytest.raises(RegenerateError) as e:
        regenerate(cfg)
    assert "the server seems down" in str(e.value) and "re-run to resume" in str(e.value)
    d = e.value.details
    assert d["num_written"] == 3 and d["num_failed"] >= 5 and d["left"] > 0
    assert d["num_written"] + d["num_failed"] + d["left"] == 40
    assert len(server.requests) < 40


def test_plan_predicts_and_writes_nothing(server, tmp_path):
    rows = [_sharegpt(0, 2), _messages(1, 3), "{bad", _sharegpt(3, 1)]
    src = _write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "sub" / "out.jsonl"
    plan = regenerate(_cfg(server, [src], out, plan=True, on_error="skip"))
    assert plan["changed"] and (plan["selected"], plan["left"], plan["turns_left"], plan["num_skipped"]) == (
        3,
        3,
        6,
        1,
    )
    assert not (tmp_path / "sub").exists() and not server.requests
    regenerate(_cfg(server, [src], out, on_error="skip", limit=2))
    assert [x["id"] for x in iter_output(out)] == ["sg0", "m1"]
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "sub").rglob("*")}
    plan = regenerate(_cfg(server, [src], out, plan=True, on_error="skip"))
    assert (plan["done"], plan["left"], plan["turns_left"]) == (2, 1, 1) and plan["changed"]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "sub").rglob("*")} == before
    regenerate(_cfg(server, [src], out, on_error="skip"))
    plan = regenerate(_cfg(server, [src], out, plan=True, on_error="skip"))
    assert not plan["changed"] and plan["left"] == 0


def test_second_run_does_nothing_and_changed_settings_are_refused(server, tmp_path):
    src = _write(tmp_path / "in.jsonl", [_sharegpt(i) for i in range(3)])
    out = tmp_path / "out.jsonl"
    first = regenerate(_cfg(server, [src], out, max_new_tokens=64))
    mtime, n = out.stat().st_mtime_ns, len(server.requests)
    again = regenerate(
        _cfg(server, [src], out, max_new_tokens=64, concurrency=1)
    )  # concurrency is no setting
    assert not again["changed"] and again["num_written"] == 3 and len(server.requests) == n
    assert out.stat().st_mtime_ns == mtime and again["fingerprint"] == first["fingerprint"]
    with pytest.raises(RegenerateError) as e:
        regenerate(_cfg(server, [src], out, max_new_tokens=32, think="strip"))
    assert "max_new_tokens 64 -> 32" in str(e.value) and "think 'keep' -> 'strip'" in str(e.value)
    assert "--force" in str(e.value) and out.stat().st_mtime_ns == mtime and len(server.requests) == n
    _write(src, [_sharegpt(i) for i in range(4)])
    with pytest.raises(RegenerateError, match=r"changed: inputs \(.*in\.jsonl\)"):
        regenerate(_cfg(server, [src], out, max_new_tokens=64))
    r = regenerate(_cfg(server, [src], out, max_new_tokens=64, force=True))
    assert r["changed"] and r["generated"] == 4 and r["resumed"] == 0
    # OUT edited by hand: re-assembled from done.log, nothing regenerated
    out.write_text("edited\n")
    n = len(server.requests)
    r = regenerate(_cfg(server, [src], out, max_new_tokens=64))
    assert r["changed"] and r["generated"] == 0 and len(server.requests) == n
    assert len(list(iter_output(out))) == 4
    # the meta lost: what done.log was made with is unknown, so it is refused; --force starts over
    paths_for(out)[3].unlink()
    with pytest.raises(RegenerateError, match=r"meta is missing or unreadable.*--force"):
        regenerate(_cfg(server, [src], out, max_new_tokens=64))
    r = regenerate(_cfg(server, [src], out, max_new_tokens=64, force=True))
    assert r["generated"] == 4 and r["resumed"] == 0 and len(read_done(paths_for(out)[4]).entries) == 4


def test_a_torn_done_log_line_is_cut_and_redone_never_doubled(server, tmp_path):
    src = _write(tmp_path / "in.jsonl", [_sharegpt(i) for i in range(4)])
    out = tmp_path / "out.jsonl"
    regenerate(_cfg(server, [src], out, limit=2))
    done_path = paths_for(out)[4]
    whole = done_path.read_bytes()
    lines = whole.splitlines(keepends=True)
    done_path.write_bytes(lines[0] + lines[1][: len(lines[1]) // 2])  # a kill -9 in the middle of line 2
    r = regenerate(_cfg(server, [src], out))
    assert r["resumed"] == 1 and r["generated"] == 3
    done = read_done(done_path)
    assert sorted(done.entries) == [0, 1, 2, 3] and not done.torn and done.duplicates == 0
    assert len(done_path.read_bytes().splitlines()) == 4
    assert list(iter_output(out)) == [_expected(_sharegpt(i), "conversations") for i in range(4)]
    # a corrupt line in the middle is not a kill's doing (a disk, a hand, an older version): its conversation is
    # redone, the line moved aside (not dropped), and the run says so
    data = done_path.read_bytes().splitlines(keepends=True)
    bad = bytearray(data[1])
    bad[20] = (
        ord("X") if bad[20] != ord("X") else ord("Y")
    )  # a byte of the JSON body: the CRC no longer matches
    done_path.write_bytes(data[0] + bytes(bad) + data[2] + data[3])
    lost = json.loads(data[1][9:])["i"]  # the conversation on line 2 (done.log is in finishing order)
    assert read_done(done_path).unreadable == [2] and lost not in read_done(done_path).entries
    n = len(server.requests)
    plan = regenerate(_cfg(server, [src], out, plan=True))
    assert plan["changed"] and plan["left"] == 1 and plan["unreadable_done_lines"] == 1
    r = regenerate(_cfg(server, [src], out))
    assert r["changed"] and r["generated"] == 1 and r["resumed"] == 3 and r["unreadable_done_lines"] == 1
    assert len(server.requests) == n + 2 and r["num_readable"] == 4  # its two turns, again
    assert any("done.log: 1 unreadable line(s) (line 2" in w for w in r["warnings"])
    assert paths_for(out)[2].joinpath("done.log.unreadable").read_bytes() == bytes(bad)
    done = read_done(done_path)
    assert sorted(done.entries) == [0, 1, 2, 3] and not done.unreadable and done.duplicates == 0
    assert list(iter_output(out)) == [_expected(_sharegpt(i), "conversations") for i in range(4)]
    again = regenerate(_cfg(server, [src], out))
    assert not again["changed"] and again["unreadable_done_lines"] == 0 and len(server.requests) == n + 2
