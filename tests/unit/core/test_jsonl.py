"""The one JSON Lines definition (``eagle3ops.jsonl``) and every reader of record files that uses it.

Real files, no stand-ins. The characters are the ones that broke the live SGLang run of 2026-12-01: U+2028
from ShareGPT's human turns, and whatever a small model answers (U+2029, U+0085, half a surrogate pair).
"""

from __future__ import annotations

import json

import pytest
from eagle3ops import jsonl
from eagle3ops.benchmark.promptsets import load_set
from eagle3ops.benchmark.report import read_sglang_bench
from eagle3ops.conversations import Problem, iter_records, resolve_sources
from eagle3ops.runtime.sharegpt import load_mtbench_turns, read_json_rows

# every character str.splitlines() breaks at, a lone surrogate, and plain non-ASCII text
NASTY = "a\nb\rc\r\nd\x0be\x0cf\x1cg\x1dh\x1ei\x85j\u2028k\u2029l \ud83d m \U0001f600 é 中文"


def _other_tool(path, rows):
    """A JSONL file as another tool writes it: json.dumps(ensure_ascii=False), raw U+2028/U+2029/U+0085."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert len(path.read_text(encoding="utf-8").splitlines()) > len(rows)  # str.splitlines breaks them
    return path


@pytest.mark.parametrize("compact", [False, True])
def test_a_record_is_one_line_and_reads_back_the_same(compact, tmp_path):
    obj = {NASTY: [NASTY, {"k": NASTY}], "n": 1}
    s = jsonl.dumps(obj, compact=compact)
    assert not any(ch in s for ch in jsonl.SPLITLINES_BREAKS)
    assert len((s + "\n").splitlines()) == 1 and json.loads(s) == obj
    assert "é 中文" in s and "\U0001f600" in s  # readable UTF-8, not \\u escapes for everything
    jsonl.write(tmp_path / "x.jsonl", [obj, {"b": 2}])
    assert list(jsonl.read(tmp_path / "x.jsonl")) == [obj, {"b": 2}]
    check = jsonl.check_file(tmp_path / "x.jsonl")
    assert check.records == 2 and check.bad == []


def test_check_file_names_every_line_that_is_not_one_record(tmp_path):
    p = tmp_path / "bad.jsonl"
    raw = (json.dumps({"v": "x\u2028y"}, ensure_ascii=False) + "\n").encode()
    p.write_bytes(b'{"ok":1}\n' + raw + b"\n" + b"\xff\xfe\n" + b'{"cut"')
    c = jsonl.check_file(p)
    assert c.records == 1 and [n for n, _ in c.bad] == [2, 3, 4, 5]
    assert "raw U+2028 at column 9" in c.bad[0][1] and "blank" in c.bad[1][1]
    assert "not UTF-8" in c.bad[2][1] and "torn" in c.bad[3][1]
    assert c.first(p, 1) == f"{p}:2: {c.bad[0][1]}"


def test_prepare_reads_one_record_per_line_from_any_writer(tmp_path):
    rows = [{"conversations": [{"from": "human", "value": f"q{i} \u2028 x\u2029\x85"}]} for i in range(3)]
    src = _other_tool(tmp_path / "in.jsonl", rows)
    (source,) = resolve_sources([str(src)])
    got = list(iter_records(source))
    assert [rec for _, rec in got] == rows and [loc.rsplit(":", 1)[1] for loc, _ in got] == ["1", "2", "3"]
    # CRLF files: same records, same line numbers; a bad line is still named by its line
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(src.read_bytes().replace(b"\n", b"\r\n") + b"{bad\r\n")
    got = list(iter_records(resolve_sources([str(crlf)])[0]))
    assert [rec for _, rec in got[:3]] == rows
    assert isinstance(got[3][1], Problem) and got[3][1].loc.endswith("crlf.jsonl:4")


def test_the_other_record_readers_split_where_the_writer_does(tmp_path):
    mt = _other_tool(tmp_path / "question.jsonl", [{"question_id": 1, "turns": ["Tell\u2028me", "more"]}])
    assert load_mtbench_turns(mt) and len(load_set(mt)["items"]) == 1
    rows, cut = read_json_rows(_other_tool(tmp_path / "sharegpt.jsonl", [{"id": "a\u2028b"}, {"id": "c"}]))
    assert rows == [{"id": "a\u2028b"}, {"id": "c"}] and cut is None
    bench = _other_tool(tmp_path / "bench.jsonl", [{"note": "x\u2029y", "completed": 7}])
    assert read_sglang_bench(bench)["completed"] == 7
