"""The regenerate phase's output and command line (tests/unit/regenerate/test_regenerate.py has the runs themselves): every
record written reads back as exactly one record (line separators inside turns and answers, an output with
unreadable lines found and rewritten, one that does not read back never put in place); the CLI's JSON and exit
codes; the real CLI SIGKILLed at random moments and resumed gives the uninterrupted output, byte for byte.

Real parts: the real CLI and files, real HTTP over loopback. STAND-IN: the OpenAI-compatible server
(``tests/fixtures/openai_standin.py``).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from eagle3ops import jsonl
from eagle3ops.cli import main as cli_main
from eagle3ops.conversations import Problem, iter_records, resolve_sources
from eagle3ops.regenerate.config import RegenerateError
from eagle3ops.regenerate.run import iter_output, regenerate
from eagle3ops.regenerate.workdir import paths_for, read_done
from regenerate_inputs import _cfg, _expected, _messages, _sharegpt, _write

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
    assert cli_main([*base, "--on-error", "skip", "--check"]) == 0
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
