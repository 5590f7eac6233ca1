"""The regenerate phase: the target's own answers replace every assistant turn, turn by turn.

Real parts: the real CLI and files (done.log, the atomic output, OUT.failures), real HTTP over loopback, the
real tiny demo target (transformers backend, built once per session at the path test_demo.py/test_prepare.py
use) and the real ``prepare`` reading the output. STAND-IN: the OpenAI-compatible server
(``tests/fixtures/openai_standin.py``): SGLang cannot run on these CPU-only machines; its answers are a
deterministic function of the messages, so every turn can be recomputed here.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from eagle3ops import jsonl
from eagle3ops.cli import main as cli_main
from eagle3ops.conversations import Problem, iter_records, resolve_sources
from eagle3ops.regenerate.config import RegenerateConfig, RegenerateError
from eagle3ops.regenerate.run import iter_output, regenerate
from eagle3ops.regenerate.turns import strip_think
from eagle3ops.regenerate.workdir import paths_for, read_done
from openai_standin import StandinServer, answer_for


@pytest.fixture
def server():
    s = StandinServer()
    yield s
    s.close()


# the two schemas of the inputs: the role key, the text key, the system/user/assistant role names, and how a
# question and an old answer start
_SCHEMAS = {
    "sharegpt": ("from", "value", ("system", "human", "gpt"), "question", "old answer"),
    "messages": ("role", "content", ("system", "user", "assistant"), "ask", "old"),
}


def _turns(schema: str, i: int, turns: int, system: bool) -> list[dict]:
    """Conversation ``i``'s turns in ``schema``: a system prompt if asked, then ``turns`` question/answer pairs."""
    role, text, (system_role, user, assistant), ask, old = _SCHEMAS[schema]
    out = [{role: system_role, text: f"system prompt {i}"}] if system else []
    for t in range(turns):
        out += [{role: user, text: f"{ask} {i}.{t}"}, {role: assistant, text: f"{old} {i}.{t}"}]
    return out


def _sharegpt(i: int, turns: int = 2, system: bool = False) -> dict:
    return {"id": f"sg{i}", "conversations": _turns("sharegpt", i, turns, system)}


def _messages(i: int, turns: int = 2, system: bool = False) -> dict:
    return {"id": f"m{i}", "messages": _turns("messages", i, turns, system), "meta": {"keep": i}}


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _cfg(server, inputs, out, **kw) -> RegenerateConfig:
    kw.setdefault("backoff", 0.001)
    kw.setdefault("log", lambda m: None)
    return RegenerateConfig(
        model="standin-model",
        inputs=[str(p) for p in inputs],
        out=str(out),
        backend="openai",
        urls=[server.url],
        **kw,
    )


def _norm(t: dict) -> str:
    r = t.get("from", t.get("role"))
    return {"human": "user", "gpt": "assistant"}.get(r, r)


def _expected(
    rec: dict,
    key: str,
    *,
    think: bool = False,
    strip: bool = False,
    drop_system: bool = False,
    suffix: str = "",
) -> dict:
    """What the stand-in's target makes of ``rec``: every assistant turn answered from the regenerated history."""
    out, history = [], []
    for t in rec[key]:
        role = _norm(t)
        text = t.get("value", t.get("content"))
        if role == "system" and drop_system:
            continue
        if role == "assistant":
            ans = answer_for(history, think) + suffix
            text = strip_think(ans) if strip else ans
            t = {**t, ("value" if "value" in t else "content"): text}
        out.append(t)
        history.append({"role": role, "content": text})
    return {**rec, key: out}


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


# ---------------------------------------------------------------------------------------------------
# every record written is read back as exactly one record (the live run's 4 lost conversations)
# ---------------------------------------------------------------------------------------------------
# ShareGPT V3's human turns hold U+2028 (37 times in 12 conversations, as \u2028 escapes in its JSON:
# "Daily Success RITUAL \u2028 That Shuts ..."); a 135M model's answers hold any Unicode, a server's JSON
# even half a surrogate pair. json.dumps(ensure_ascii=False) wrote U+0085/U+2028/U+2029 raw and prepare's
# str.splitlines() broke the record there ("Unterminated string", then "Expecting value at column 2").
ODD_ANSWER = " \u2029\u2029 Next\x85 and\u2028 end"


def _odd(i: int) -> dict:
    rec = _sharegpt(i, 2)
    rec["conversations"][0]["value"] = f"Daily Success RITUAL {i} \u2028 That Shuts\u2028\u2028 down"
    return rec


def _read_like_prepare(out: Path) -> list:
    (source,) = resolve_sources([str(out)])
    return [rec for _, rec in iter_records(source)]


def test_line_separators_in_turns_and_answers_stay_inside_their_record(server, tmp_path):
    rows = [_odd(i) if i % 3 == 0 else _sharegpt(i) for i in range(24)]
    src = _write(tmp_path / "in.jsonl", rows)  # ASCII escapes, like the live run's original.jsonl
    server.append_text = ODD_ANSWER + "\ud83d"
    out = tmp_path / "regenerated.jsonl"
    r = regenerate(_cfg(server, [src], out, concurrency=16))
    assert r["num_written"] == 24 and r["num_readable"] == 24 and r["num_failed"] == 0
    # half a surrogate pair cannot be tokenized (prepare would drop the conversation): U+FFFD, as a detokenizer
    want = [_expected(row, "conversations", suffix=ODD_ANSWER + "\ufffd") for row in rows]
    got = _read_like_prepare(out)
    assert not [g for g in got if isinstance(g, Problem)] and got == want
    assert list(iter_output(out)) == want
    text = out.read_text(encoding="utf-8")
    assert len(text.splitlines()) == 24 and "\\u2028" in text and "\u2028" not in text  # any line reader
    assert jsonl.check_file(out).records == 24 and not jsonl.check_file(out).bad


def test_an_output_with_unreadable_lines_is_found_and_rewritten(server, tmp_path):
    """An OUT from before the fix (raw separators, its meta matching those bytes) is not trusted: the plan
    predicts the rewrite, the run rewrites it from done.log (no request) and says how many lines it fixed."""
    import hashlib

    rows = [_odd(i) for i in range(5)] + [_sharegpt(5)]
    src = _write(tmp_path / "in.jsonl", rows)
    server.append_text = ODD_ANSWER
    out = tmp_path / "regenerated.jsonl"
    regenerate(_cfg(server, [src], out))
    good = out.read_bytes()
    old = b"".join((json.dumps(r, ensure_ascii=False) + "\n").encode() for r in iter_output(out))
    assert len(old.decode().splitlines()) > 6  # what prepare used to read: more lines than records
    out.write_bytes(old)
    meta_path = paths_for(out)[3]
    meta = json.loads(meta_path.read_text())
    keep = ("indices", "skipped", "conversations")  # what the older version's meta held
    meta["assembled"] = {k: meta["assembled"][k] for k in keep}
    meta["assembled"].update(sha256=hashlib.sha256(old).hexdigest(), size=len(old))
    meta_path.write_text(json.dumps(meta))
    n = len(server.requests)
    plan = regenerate(_cfg(server, [src], out, plan=True))
    assert plan["changed"] and not plan["up_to_date"] and plan["unreadable_out_lines"] == 6
    r = regenerate(_cfg(server, [src], out))
    assert r["changed"] and r["generated"] == 0 and r["unreadable_out_lines"] == 6 and r["num_readable"] == 6
    assert any("6 unreadable line" in w for w in r["warnings"]) and len(server.requests) == n
    assert out.read_bytes() == good
    again = regenerate(_cfg(server, [src], out))
    assert not again["changed"] and again["unreadable_out_lines"] == 0 and len(server.requests) == n


def test_an_output_that_does_not_read_back_is_never_put_in_place(server, tmp_path, monkeypatch):
    """The check after writing can fail: with the old writer put back, the run refuses to rename its OUT."""
    src = _write(tmp_path / "in.jsonl", [_odd(0), _sharegpt(1)])
    out = tmp_path / "regenerated.jsonl"
    monkeypatch.setattr(
        jsonl, "line", lambda obj, **kw: (json.dumps(obj, ensure_ascii=False) + "\n").encode()
    )
    with pytest.raises(RegenerateError, match=r"regenerated\.jsonl:1: a raw U\+2028 .* kept in .*done\.log"):
        regenerate(_cfg(server, [src], out))
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
    assert len(read_done(paths_for(out)[4]).entries) == 2  # nothing generated is lost
    monkeypatch.undo()
    r = regenerate(_cfg(server, [src], out))
    assert r["changed"] and r["generated"] == 0 and r["num_readable"] == 2


def test_cli_json_and_exit_code(server, tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", [_sharegpt(0), "{bad"])
    out = tmp_path / "out.jsonl"
    base = ["regenerate", "--model", "m", "--input", str(src), "--out", str(out), "--backend", "openai"]
    base += ["--url", server.url, "--json"]
    assert cli_main(base) == 2
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["failed"] is True and f"{src}:2: not valid JSON" in res["msg"] and res["num_skipped"] == 1
    assert cli_main([*base, "--on-error", "skip", "--plan"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["plan"] and res["left"] == 1 and not out.exists()
    assert cli_main([*base, "--on-error", "skip"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["num_written"] == 1 and res["num_skipped"] == 1 and res["changed"]


def _run_cli(server, src, out, extra=()):
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    cmd = [
        sys.executable,
        "-m",
        "eagle3ops",
        "regenerate",
        "--model",
        "m",
        "--input",
        str(src),
        "--out",
        str(out),
    ]
    cmd += ["--backend", "openai", "--url", server.url, "--concurrency", "4", "--json", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_kill9_anywhere_then_resume_gives_the_uninterrupted_output(server, tmp_path):
    """The real CLI as a subprocess, SIGKILLed at seeded random moments while it writes, resumed each time."""
    rows = [
        _sharegpt(i, 1 + i % 3, system=i % 4 == 0) if i % 2 else _messages(i, 1 + i % 2) for i in range(40)
    ]
    src = _write(tmp_path / "in.jsonl", rows)
    ref = tmp_path / "ref" / "out.jsonl"
    regenerate(_cfg(server, [src], ref, concurrency=4))
    server.delay = 0.1  # ~80 requests, 4 in flight: a whole run takes about 2 s of requests
    out = tmp_path / "run" / "out.jsonl"
    done_path = paths_for(out)[4]
    rng = random.Random(18)
    kills = 0
    progress: list[int] = []  # conversations done after each killed run
    for k in range(6):
        before = len(read_done(done_path).entries) if done_path.exists() else 0
        p = _run_cli(server, src, out)
        t0 = time.monotonic()
        if k == 0:  # anywhere in the first second: start-up, the meta write, the first requests
            time.sleep(rng.uniform(0, 1.0))
        else:  # once this run has appended its first conversation, after a seeded delay
            while time.monotonic() - t0 < 30 and p.poll() is None:
                if (len(read_done(done_path).entries) if done_path.exists() else 0) > before:
                    break
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.3))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait()
        p.stdout.close()
        p.stderr.close()
        done = read_done(done_path) if done_path.exists() else None
        if done is not None:
            assert done.duplicates == 0
        progress.append(len(done.entries) if done else 0)
    assert kills >= 4, progress
    assert len(set(progress[1:])) >= 3 and progress[-1] < 40, progress  # killed at different points, mid-run
    p = _run_cli(server, src, out)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr.decode()[-2000:]
    res = json.loads(stdout.decode().strip().splitlines()[-1])
    assert res["num_written"] == 40 and res["num_failed"] == 0
    assert out.read_bytes() == ref.read_bytes()  # byte-identical to the uninterrupted run
    done = read_done(done_path)
    assert sorted(done.entries) == list(range(40)) and done.duplicates == 0 and not done.torn
    assert len(done_path.read_bytes().splitlines()) == 40  # one line per conversation: none doubled
    assert not list(out.parent.glob(".*.tmp"))


# ---------------------------------------------------------------------------------------------------
# the transformers backend on the real tiny demo target
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    from test_demo import build_session_demo

    return build_session_demo(tmp_path_factory)


def test_transformers_backend_on_the_demo_target(demo, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    convs = [json.loads(line) for line in Path(demo["conversations_path"]).read_text().splitlines()[:2]]
    src = _write(tmp_path / "demo.jsonl", convs)
    out = tmp_path / "regen.jsonl"
    cfg = RegenerateConfig(
        model=demo["model_path"],
        inputs=[str(src)],
        out=str(out),
        max_new_tokens=12,
        concurrency=2,
        threads=1,  # 2 threads on a loaded 2-core box are 10x slower for this tiny model
        log=lambda m: None,
    )
    r = regenerate(cfg)
    assert r["changed"] and r["num_written"] == 2 and r["output_tokens"] > 0 and r["tok_per_s"] > 0
    got = list(iter_output(out))
    # every generated token is a greedy choice of an independent forward (one conversation at a time, no padding),
    # up to ties: the batched, padded forward of the run rounds differently, and the random demo model has near-ties
    # that the two break differently on some CPUs (CI of 2026-12-04: '9 + 12' vs '2 + 12', logits 1e-6 apart).
    # Checked along the run's own tokens (teacher-forced), so one tie cannot hide what follows it.
    tie = 1e-3
    tok = AutoTokenizer.from_pretrained(demo["model_path"])
    model = AutoModelForCausalLM.from_pretrained(demo["model_path"]).eval()
    eos = tok.eos_token_id
    n_turns = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the run above (threads=1); restored below
    for before, after in zip(convs, got, strict=True):
        key = "conversations" if "conversations" in before else "messages"
        assert len(before[key]) == len(after[key])
        history = []
        for t_old, t_new in zip(before[key], after[key], strict=True):
            role = _norm(t_old)
            if role == "assistant":
                ids = tok.encode(
                    tok.apply_chat_template(history, add_generation_prompt=True, tokenize=False),
                    add_special_tokens=False,
                )
                text = t_new.get("value", t_new.get("content"))
                new = tok.encode(text, add_special_tokens=False)
                assert tok.decode(new, skip_special_tokens=False) == text
                assert len(new) <= 12
                with torch.no_grad():
                    logits = model(torch.tensor([ids + new])).logits[0, len(ids) - 1 :]
                for k, chosen in enumerate(new):
                    top = float(logits[k].max())
                    assert float(logits[k, chosen]) >= top - tie, (
                        f"token {k} of turn {n_turns}: {chosen} is {top - float(logits[k, chosen]):.2e} below "
                        "the greedy choice"
                    )
                if len(new) < 12:  # it stopped: end of sequence was the greedy choice there
                    assert float(logits[len(new), eos]) >= float(logits[len(new)].max()) - tie
                n_turns += 1
            else:
                assert t_new == t_old
                text = t_new.get("value", t_new.get("content"))
            history.append({"role": role, "content": text})
    torch.set_num_threads(threads)
    assert r["turns_generated"] == n_turns
    again = regenerate(cfg)  # second run: unchanged, no model loaded
    assert not again["changed"] and again["fingerprint"] == r["fingerprint"] and again["num_written"] == 2
    # prepare reading the output unchanged: tests/ansible/test_regenerate_role.py (site.yml regenerate,prepare)
