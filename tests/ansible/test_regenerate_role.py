"""The regenerate phase through ansible-playbook (ansible-runner) on the embedded local default, with the phase
turned on: it regenerates a few demo conversations, prepare then reads the regenerated file (the inventory's
``prepare_inputs`` follows ``regenerate_enabled``), a second run is changed=0 without a single request, and
check mode on a fresh work dir predicts the work and writes nothing.

STAND-IN: the OpenAI-compatible server (``tests/fixtures/openai_standin.py``; SGLang needs a GPU). The demo
target's real tokenizer renders the rows in prepare; the transformers backend on that target is
``tests/unit/regenerate/test_regenerate.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import run_cache

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from hosts.runner import LOCAL_INVENTORY, run_playbook
from openai_standin import StandinServer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    demo = run_cache.session_demo(tmp_path_factory)
    root = tmp_path_factory.mktemp("regen-role")
    lines = Path(demo["conversations_path"]).read_text().splitlines()[:5]
    src = root / "conversations.jsonl"
    src.write_text("\n".join([*lines, "{not json"]) + "\n")
    server = StandinServer()
    yield demo, root, src, server
    server.close()


def _vars(demo, work: Path, src: Path, server) -> dict:
    return {
        "eagle3ops_workdir": str(work),
        "prepare_build_demo": False,
        "prepare_model_path": demo["model_path"],
        "regenerate_enabled": True,
        "regenerate_backend": "openai",
        "regenerate_urls": [server.url],
        "eagle3ops_conversations": [str(src)],
        "regenerate_on_error": "skip",
        "regenerate_max_new_tokens": 16,
        "regenerate_poll_interval": 1,
    }


@pytest.mark.slow  # minutes in the CI run (the mark also starts it early: tests/conftest.py)
def test_regenerate_then_prepare_then_nothing_to_do(setup):
    demo, root, src, server = setup
    work = root / "work"
    ev = _vars(demo, work, src, server)
    r = run_playbook(REPO / "site.yml", LOCAL_INVENTORY, extravars=ev, tags="regenerate,prepare")
    h = r.host("localhost")
    assert r.rc == 0 and h["failed"] == 0, r.stdout[-4000:]
    changed = r.changed_tasks()
    assert any("Regenerate the assistant turns" in t for t in changed), changed
    assert any("Tokenise the conversations" in t for t in changed), changed
    out = work / "conversations" / "regenerated.jsonl"
    (res,) = r.task_results("Regenerate | Regenerate the assistant turns with the target")
    assert (res["num_written"], res["num_failed"], res["num_skipped"], res["num_input"]) == (5, 0, 1, 6)
    assert res["failures"][0]["loc"] == f"{src}:6" and "not valid JSON" in res["failures"][0]["reason"]
    assert res["tok_per_s"] > 0 and res["output_tokens"] > 0
    regenerated = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(regenerated) == 5
    turns = sum(1 for c in regenerated for t in c["conversations"] if t["from"] == "gpt")
    assert len(server.requests) == turns
    # prepare read the regenerated conversations, not the originals
    meta = json.loads((work / "data" / "prepare_meta.json").read_text())
    assert [i["path"] for i in meta["inputs"]] == [str(out)]
    assert meta["num_rows"] == turns

    n = len(server.requests)
    again = run_playbook(REPO / "site.yml", LOCAL_INVENTORY, extravars=ev, tags="regenerate,prepare")
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.changed_tasks()
    assert len(server.requests) == n

    # its own resume state is not trusted blindly: a damaged done.log line (not a kill's torn tail) is moved
    # aside, its conversation regenerated, and the task says so (changed, a count, a warning)
    done_log = out.with_name(out.name + ".regenerate") / "done.log"
    lines = done_log.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"i":', b'"I":', 1)  # the JSON body no longer matches its CRC
    done_log.write_bytes(b"".join(lines))
    fixed = run_playbook(REPO / "site.yml", LOCAL_INVENTORY, extravars=ev, tags="regenerate")
    assert fixed.rc == 0 and fixed.host("localhost")["failed"] == 0, fixed.stdout[-4000:]
    (res,) = fixed.task_results("Regenerate | Regenerate the assistant turns with the target")
    assert res["changed"] and res["unreadable_done_lines"] == 1 and res["num_readable"] == 5
    assert "1 unreadable line(s) (line 2" in fixed.stdout and len(server.requests) > n
    assert [json.loads(x) for x in out.read_text().splitlines()] == regenerated


def test_check_mode_predicts_and_writes_nothing(setup):
    demo, root, src, server = setup
    work = root / "fresh"
    n = len(server.requests)
    r = run_playbook(
        REPO / "site.yml",
        LOCAL_INVENTORY,
        extravars=_vars(demo, work, src, server),
        tags="regenerate",
        check=True,
    )
    assert r.rc == 0 and r.host("localhost")["failed"] == 0, r.stdout[-4000:]
    (plan,) = r.task_results("Regenerate | Work out what is left to regenerate")
    assert plan["changed"] and plan["left"] == 5 and plan["num_skipped"] == 1 and plan["turns_left"] > 5
    assert not work.exists() and len(server.requests) == n
