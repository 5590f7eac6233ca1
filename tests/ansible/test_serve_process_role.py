"""The serve phase on a host where PID 1 is not systemd (``serve_launcher: process``), through site.yml
(ansible-runner, connection local): the draft is converted, the server is started detached from the role's one
command line, health-checked and probed by the guard; a second run changes nothing; a server that accepts no
draft token (acceptance 1.00) fails the phase with the likely causes; ``serve_state: stopped`` stops it.

STAND-IN: the server. SGLang needs CUDA, so the ``sglang`` package on the server's PYTHONPATH
(``serve_environment``) is two lines whose ``launch_server`` runs ``tests/fixtures/sglang_standin_server.py`` (serve mode: the real launch_server flags, ``/health``, ``/generate`` with ``spec_verify_ct``, a fixed acceptance
length). The role's own default server command is used, as on a real host: the live box run of 2026-12-02 found
that a registered stat of the interpreter overwrote ``serve_sglang_python`` when ``serve_server_enabled`` is true. Inputs as in test_serve_benchmark_roles: a tiny random
DeepseekV3 target and a speculators checkpoint made by speculators' own code. The capture-patch query is off
(``serve_check_capture_patch: false``: no SGLang is installed here; tests/ansible/test_extract_sglang covers it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.request
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "hosts"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
from eagle3_draft_fixture import make_draft_checkpoint
from eagle3ops.serve import process as sp
from eagle3ops.train.fixtures import make_tiny_verifier
from runner import run_playbook
from serve_flags import BOX_BACKEND_FLAGS

INVENTORY = REPO / "inventory" / "local"
GUARD = "Serve | Guard against silent no-speed-up (acceptance on probe prompts >= 1.3)"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-process")
    verifier = make_tiny_verifier(root / "verifier", vocab_size=512)
    make_draft_checkpoint(root / "run" / "checkpoints" / "0", verifier)
    port, bport = _port(), _port()
    # "python -m sglang.launch_server FLAGS" runs the stand-in with FLAGS: a package named sglang on PYTHONPATH
    fake = root / "fake-sglang" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    standin = REPO / "tests" / "fixtures" / "sglang_standin_server.py"
    (fake / "launch_server.py").write_text(
        f"import runpy\nrunpy.run_path({str(standin)!r}, run_name='__main__')\n"
    )
    # SGLang's own venv (the stand-in needs only the standard library); serve_sglang_python is left to the role's
    # default ({{ serve_sglang_venv_dir }}/bin/python), as an inventory leaves it
    venv.create(root / "sglang-venv", with_pip=False, symlinks=True)
    ev = {
        "eagle3ops_workdir": str(root / "work"),
        "eagle3ops_checkpoint": str(root / "run"),
        "serve_server_enabled": True,
        "serve_launcher": "process",
        "serve_check_capture_patch": False,
        "serve_sglang_venv_dir": str(root / "sglang-venv"),
        "eagle3ops_model_path": str(verifier),
        "serve_tp_size": 1,
        "serve_port": port,
        "serve_baseline_port": bport,
        # the lent H200 box's flags (docs/serve-benchmark.md), as variables
        "serve_attention_backend": "triton",
        "serve_draft_attention_backend": "triton",
        "serve_sampling_backend": "pytorch",
        "serve_grammar_backend": "none",
        "serve_disable_cuda_graph": True,
        "serve_environment": {"PYTHONPATH": str(fake.parent), "SGLANG_ENABLE_JIT_DEEPGEMM": "0"},
        "serve_health_timeout": 60,
        "serve_probe_prompts": "",
        "serve_probe_max_new_tokens": 40,  # 16 verify steps of 2.5 tokens: acceptance exactly 2.5
    }
    yield root, ev
    st = sp.read_state(root / "work" / "serve" / "run", "eagle3ops-sglang-serve")
    pid = sp.running_pid(st)
    if pid:  # whatever a failed assertion left running
        os.killpg(pid, signal.SIGKILL)


@pytest.mark.slow  # minutes in the CI run (the mark also starts it early: tests/conftest.py)
def test_serve_as_a_process_guard_idempotence_and_stop(env):
    root, ev = env
    run_dir = root / "work" / "serve" / "run"
    r = run_playbook(REPO / "site.yml", INVENTORY, extravars=ev, tags="serve")
    h = r.host("localhost")
    assert r.rc == 0 and h["failed"] == 0, r.stdout[-4000:]
    (guard,) = r.task_results(GUARD)
    assert guard["acceptance_length"] == 2.5 and guard["prompts"] == 4 and not guard["changed"]
    st = sp.status(run_dir, "eagle3ops-sglang-serve")
    assert st["running"] and os.getsid(st["pid"]) == st["pid"]
    with urllib.request.urlopen(f"http://127.0.0.1:{ev['serve_port']}/get_server_info", timeout=5) as f:
        info = json.loads(f.read())
    joined = " ".join(info["argv"])
    for flag in (
        *BOX_BACKEND_FLAGS,
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path "
        + str(root / "work" / "serve" / "draft"),
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
    ):
        assert flag in joined, flag
    assert info["environ"] == {"PYTHONPATH": str(root / "fake-sglang"), "SGLANG_ENABLE_JIT_DEEPGEMM": "0"}
    servers = json.loads((run_dir / "servers.json").read_text())
    sglang_python = str(root / "sglang-venv" / "bin" / "python")
    assert servers["serve"]["argv"][:3] == [sglang_python, "-m", "sglang.launch_server"]
    assert servers["launcher"] == "process" and servers["serve"]["argv"][3:] == info["argv"]
    assert "--speculative-algorithm" not in servers["baseline"]["argv"]
    assert f"--port {ev['serve_baseline_port']}" in " ".join(servers["baseline"]["argv"])

    again = run_playbook(REPO / "site.yml", INVENTORY, extravars=ev, tags="serve")
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.changed_tasks()
    assert sp.status(run_dir, "eagle3ops-sglang-serve")["pid"] == st["pid"]  # not restarted

    # a draft that is never accepted (sglang#21272's 1.00): the serve phase fails, saying why
    bad = {**ev, "serve_draft_extra_args": ["--standin-accept-length", "1.0"]}
    r = run_playbook(REPO / "site.yml", INVENTORY, extravars=bad, tags="serve")
    assert r.rc != 0 and r.host("localhost")["failed"] == 1
    (res,) = r.task_results(GUARD)
    assert res["acceptance_length"] == 1.0
    for words in (
        "below the floor 1.3",
        "serve_min_accept_length",
        "--speculative-algorithm",
        "dtype",
        "sglang#21272",
    ):
        assert words in res["msg"], words

    r = run_playbook(REPO / "site.yml", INVENTORY, extravars={**ev, "serve_state": "stopped"}, tags="serve")
    assert r.rc == 0, r.stdout[-3000:]
    assert not sp.status(run_dir, "eagle3ops-sglang-serve")["running"]
    assert not (run_dir / "eagle3ops-sglang-serve.pid").exists()


@pytest.mark.slow  # minutes in the CI run (the mark also starts it early: tests/conftest.py)
def test_benchmark_live_with_and_without_the_draft_then_nothing_to_do(env):
    """The benchmark phase against the serve phase's process servers: per prompt set and concurrency, tok/s with
    and without the draft (the baseline is started from servers.json while the draft server is stopped, then the
    draft server is started again as the serve phase left it), in interleaved rounds, with the lossless check of
    both servers' greedy ids (the stand-in's); a second serve+benchmark run changes nothing;
    an MT-bench question found in the training data fails the phase."""
    root, ev = env
    mt = root / "question.jsonl"
    mt.write_text(
        json.dumps(
            {
                "question_id": 81,
                "category": "writing",
                "turns": ["Write a haiku about rain.", "Now in French."],
            }
        )
        + "\n"
    )
    held = root / "heldout.jsonl"
    held.write_text(
        "".join(json.dumps({"id": f"h{i}", "prompt": f"Tell me about item {i}."}) + "\n" for i in range(3))
    )
    train = root / "train.jsonl"
    train.write_text(json.dumps({"conversations": [{"from": "human", "value": "Say hi."}]}) + "\n")
    bv = {
        **ev,
        "benchmark_offline": False,
        "benchmark_prompt_sets": {"heldout": str(held), "mtbench": str(mt)},
        "benchmark_mtbench_turns": "both",
        "benchmark_concurrency": [1, 2],
        "benchmark_num_requests": 2,
        "benchmark_output_len": 20,
        "benchmark_chat_template": False,
        "benchmark_training_data": [str(train)],
        "benchmark_health_timeout": 60,
    }
    r = run_playbook(REPO / "site.yml", INVENTORY, extravars=bv, tags="serve,benchmark")
    assert r.rc == 0 and r.host("localhost")["failed"] == 0, r.stdout[-4000:]
    bench = root / "work" / "benchmark"
    rep = json.loads((bench / "report.json").read_text())["live"]
    assert set(rep["sets"]) == {"heldout", "mtbench"} and rep["contamination"]["clean"] is True
    for name, s in rep["sets"].items():
        assert [row["concurrency"] for row in s["rows"]] == [1, 2], name
        for row in s["rows"]:
            assert row["with_draft_tok_s"] and row["without_draft_tok_s"] and row["acceptance_length"] == 2.5
            assert row["speedup"] == round(row["with_draft_tok_s"] / row["without_draft_tok_s"], 3)
    without = json.loads((bench / "live_without_draft.json").read_text())
    assert all(run["acceptance_length"] is None for run in without["runs"])  # the baseline has no draft
    run_dir = root / "work" / "serve" / "run"
    assert sp.status(run_dir, "eagle3ops-sglang-serve")["running"]  # started again after the baseline
    assert not sp.status(run_dir, "eagle3ops-sglang-baseline")["running"]
    assert "| mtbench (mtbench) | 2 |" in (bench / "report.md").read_text()
    # the role's defaults: 3 interleaved rounds, and the lossless check over the distinct prompts sent (first
    # turns: 2 held-out, benchmark_num_requests 2, and the one MT-bench question)
    assert {row["rounds"] for s in rep["sets"].values() for row in s["rows"]} == {3}
    ll = rep["lossless"]
    assert (ll["compared"], ll["identical"], ll["lossless"]) == (3, 3, True) and ll["servers"]["dtype"][
        "same"
    ]

    again = run_playbook(REPO / "site.yml", INVENTORY, extravars=bv, tags="serve,benchmark")
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.changed_tasks()

    train.write_text(
        json.dumps({"messages": [{"role": "user", "content": "write a HAIKU about rain"}]}) + "\n"
    )
    r = run_playbook(REPO / "site.yml", INVENTORY, extravars=bv, tags="benchmark")
    assert r.rc != 0 and "81 turn 1 (exact)" in r.stdout and "benchmark_contamination: warn" in r.stdout
    run_playbook(REPO / "site.yml", INVENTORY, extravars={**ev, "serve_state": "stopped"}, tags="serve")
