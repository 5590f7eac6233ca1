"""The process launcher (``eagle3ops serve-process``), the acceptance guard and the load generator, against a real
local HTTP server process.

STAND-IN: the server is ``tests/fixtures/sglang_standin_server.py`` in its serve mode (SGLang's launch_server
cannot run without CUDA): a real process, started, health-checked, probed and stopped through the real code, with
SGLang's ``/health`` and ``/generate`` ``meta_info`` (``completion_tokens``, ``spec_verify_ct`` only with
``--speculative-algorithm``) and a fixed acceptance length; its "GPU time" is a sleep per forward step.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from eagle3ops.benchmark import loadgen
from eagle3ops.cli import main
from eagle3ops.serve import process as sp
from proc_helpers import HEAVY, cli_imports
from serve_standin import free_port, standin_argv, start_with_and_without

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def model(tmp_path):
    """A target and a draft directory, each with an empty config.json (what the stand-in server reads)."""
    dirs = (tmp_path / "model", tmp_path / "draft")
    for d in dirs:
        d.mkdir()
        (d / "config.json").write_text("{}")
    return dirs


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    yield d
    for f in d.glob("*.json"):  # never leave a server behind, whatever the test did
        st = json.loads(f.read_text())
        pid = sp.running_pid(st) if isinstance(st, dict) and "spec" in st else None
        if pid:
            os.killpg(pid, signal.SIGKILL)


def _info(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
        return json.loads(r.read())


def test_process_launcher_start_idempotent_restart_stop(model, run_dir):
    m, d = model
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = sp.make_spec(standin_argv(m, port, d), {"SGLANG_ENABLE_JIT_DEEPGEMM": "0"}, url)
    assert sp.start(run_dir, "serve", spec, check=True)["changed"] is True
    assert not (run_dir / "serve.pid").exists()  # check mode wrote nothing
    r1 = sp.start(run_dir, "serve", spec, health_timeout=30, interval=0.1)
    assert r1["changed"] and r1["action"] == "start" and r1["healthy_after_s"] < 30
    pid = r1["pid"]
    assert int((run_dir / "serve.pid").read_text()) == pid
    assert os.getsid(pid) == pid  # its own session (setsid): it outlives the command that started it
    info = _info(port)
    assert info["argv"] == spec["argv"][2:] and info["environ"]["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    r2 = sp.start(run_dir, "serve", spec, health_timeout=30, interval=0.1)
    assert (r2["changed"], r2["action"], r2["pid"]) == (False, "none", pid)
    assert sp.start(run_dir, "serve", spec, check=True)["changed"] is False
    # another command line: the old server is stopped, the new one started
    spec2 = sp.make_spec(standin_argv(m, port, d, "--standin-accept-length", "1.0"), {}, url)
    assert sp.start(run_dir, "serve", spec2, check=True)["action"] == "restart"
    r3 = sp.start(run_dir, "serve", spec2, health_timeout=30, interval=0.1)
    assert r3["changed"] and r3["action"] == "restart" and r3["pid"] != pid
    assert sp._proc_start_time(pid) is None  # the old one is gone (or a reaped zombie)
    # a new stamp (another draft in the same directory) restarts too
    spec3 = sp.make_spec(spec2["argv"], {}, url, stamp="draft-v2")
    assert sp.start(run_dir, "serve", spec3, check=True)["changed"] is True
    st = sp.stop(run_dir, "serve", grace=10)
    assert st["changed"] and not sp.status(run_dir, "serve")["running"]
    assert not (run_dir / "serve.pid").exists()
    assert "stopped by SIGTERM" in (run_dir / "serve.log").read_text()
    assert sp.stop(run_dir, "serve")["changed"] is False


def test_dead_server_is_restarted_and_a_reused_pid_is_not_trusted(model, run_dir):
    m, _d = model
    port = free_port()
    spec = sp.make_spec(standin_argv(m, port), {}, f"http://127.0.0.1:{port}")
    pid = sp.start(run_dir, "base", spec, health_timeout=30, interval=0.1)["pid"]
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60  # a guard: gone once the kernel has done the kill and it is reaped
    while True:
        sp._reap(pid)
        if sp._proc_start_time(pid) is None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sp.status(run_dir, "base")["running"] is False
    r = sp.start(run_dir, "base", spec, health_timeout=30, interval=0.1)
    assert r["changed"] and r["action"] == "start"
    # a state file naming a live process that is not ours (our own PID, other cmdline) is not trusted
    st = json.loads((run_dir / "base.json").read_text())
    st["pid"], st["start_time"] = os.getpid(), sp._proc_start_time(os.getpid())
    assert sp.running_pid(st) is None
    sp.stop(run_dir, "base", grace=10)


def test_failures_name_the_log_lines_and_leave_nothing_running(model, run_dir, tmp_path, capsys):
    m, _d = model
    port = free_port()
    bad = sp.make_spec(standin_argv(tmp_path / "no-model", port), {}, f"http://127.0.0.1:{port}")
    with pytest.raises(sp.ServeProcessError) as e:
        sp.start(run_dir, "serve", bad, health_timeout=30, interval=0.1)
    msg = str(e.value)
    assert "exited" in msg and "no config.json" in msg and str(run_dir / "serve.log") in msg
    assert sp.status(run_dir, "serve")["running"] is False
    # no health within the timeout: the fresh start is stopped again, the log's last lines are shown
    slow = sp.make_spec(
        standin_argv(m, port, None, "--standin-load-seconds", "30"), {}, f"http://127.0.0.1:{port}"
    )
    with pytest.raises(sp.ServeProcessError, match=r"no 200 on .*/health within 1 s; last lines of"):
        sp.start(run_dir, "serve", slow, health_timeout=1, interval=0.1, stop_grace=5)
    assert sp.status(run_dir, "serve")["running"] is False
    # through the CLI: exit 2, one JSON line with the message, no traceback
    argv = ["serve-process", "start", "--run-dir", str(run_dir), "--name", "serve", "--interval", "0.1"]
    argv += ["--url", bad["url"], "--argv-json", json.dumps(bad["argv"]), "--json"]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert (
        "no config.json" in json.loads(out.out.strip().splitlines()[-1])["msg"] and "Traceback" not in out.err
    )
    assert main([*argv[:-3], "--argv-json", "not json", "--json"]) == 2


def test_a_port_held_by_another_server_is_refused(model, run_dir):
    m, d = model
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sp.start(run_dir, "other", sp.make_spec(standin_argv(m, port), {}, url), health_timeout=30, interval=0.1)
    try:
        with pytest.raises(sp.ServeProcessError, match="another process holds the port"):
            sp.start(run_dir, "serve", sp.make_spec(standin_argv(m, port, d), {}, url), health_timeout=5)
    finally:
        sp.stop(run_dir, "other", grace=10)


def test_guard_passes_fires_at_1_00_without_a_draft_and_on_eos_at_once(model, run_dir, capsys):
    m, d = model
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    probe = ["benchmark-spec-probe", "--url", url, "--limit", "3", "--max-new-tokens", "40"]
    try:
        sp.start(
            run_dir, "s", sp.make_spec(standin_argv(m, port, d), {}, url), health_timeout=30, interval=0.1
        )
        assert main([*probe, "--min-accept-length", "1.3", "--json"]) == 0
        res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        # 40 tokens in round(40 / 2.5) = 16 verify steps per request
        assert res["acceptance_length"] == 2.5 and res["per_request"] == [2.5] * 3 and res["prompts"] == 3
        assert res["changed"] is False and res["prompts_file"] == "(built-in probe prompts)"

        spec1 = sp.make_spec(standin_argv(m, port, d, "--standin-accept-length", "1.0"), {}, url)
        sp.start(run_dir, "s", spec1, health_timeout=30, interval=0.1)
        assert main([*probe, "--min-accept-length", "1.3", "--json"]) == 2
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["failed"] and out["acceptance_length"] == 1.0
        for words in (
            "acceptance length 1.00",
            "below the floor 1.3",
            "serve_min_accept_length",
            "--speculative-algorithm",
            "layer ids",
            "dtype",
            "sglang#21272",
        ):
            assert words in out["msg"], words
        assert main([*probe, "--json"]) == 0  # no floor given: only measured
        # a model directory without a chat template: prompts go as they are, and finding that out imports
        # neither transformers nor torch (the serve phase's guard runs on every site.yml run)
        r, imported = cli_imports(*probe, "--chat-template", m, "--json")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert r.returncode == 0 and res["chat_template"] is False, r.stderr
        assert "has no chat template: prompts were sent as they are" in res["chat_template_note"]
        assert "eagle3ops" in imported and not imported & HEAVY, imported & HEAVY

        sp.start(run_dir, "s", sp.make_spec(standin_argv(m, port), {}, url), health_timeout=30, interval=0.1)
        assert main([*probe, "--min-accept-length", "1.3", "--json"]) == 2
        msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
        assert "runs without a draft" in msg and "speculative_algorithm unset" in msg

        # Seen live (SmolLM2-Instruct on SGLang 0.5.17): raw prompts answered with EOS at once carry no
        # spec_verify_ct although the draft is loaded. The probe must not call that "no draft", and the chat
        # template (the tokenizer of the served model directory) makes the answers long enough to measure.
        spec_eos = sp.make_spec(standin_argv(m, port, d, "--standin-raw-prompt-eos"), {}, url)
        sp.start(run_dir, "s", spec_eos, health_timeout=30, interval=0.1)
        assert main([*probe, "--min-accept-length", "1.3", "--json"]) == 2
        msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
        assert "none of the 3 probe answers reached a verify step" in msg, msg
        assert (
            "runs a draft (EAGLE3, /server_info)" in msg and "completion tokens per prompt [1, 1, 1]" in msg
        )
        assert "--chat-template" in msg and "without a draft" not in msg
        from eagle3ops import demo

        demo.train_tokenizer(["hello world, a tiny corpus for a tiny tokenizer"] * 4, m)
        assert main([*probe, "--chat-template", str(m), "--min-accept-length", "1.3", "--json"]) == 0
        res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert res["acceptance_length"] == 2.5 and res["chat_template"] is True and res["no_verify"] == 0
        assert main([*probe, "--chat-template", str(m / "absent"), "--json"]) == 2
        assert (
            "absent: not a directory" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
        )
    finally:
        sp.stop(run_dir, "s", grace=10)


def test_chat_template_found_where_transformers_finds_it(tmp_path):
    """``loadgen.chat_template_render`` looks for a template itself before it imports transformers (and torch):
    for every place a tokenizer directory can hold one, or none, it answers as transformers does."""
    from eagle3ops import demo
    from transformers import AutoTokenizer

    def by_transformers(d):
        try:
            return AutoTokenizer.from_pretrained(str(d)).chat_template or None
        except (OSError, ValueError):
            return None

    full = tmp_path / "full"  # the template in chat_template.jinja and in tokenizer_config.json
    demo.train_tokenizer(["hello world, a tiny corpus for a tiny tokenizer"] * 4, full)
    assert (full / "chat_template.jinja").is_file()
    cfg = json.loads((full / "tokenizer_config.json").read_text())
    variants = {"full": (full, True)}
    for name, keep_jinja, keep_key, extra in (
        ("config_only", False, True, False),
        ("jinja_only", True, False, False),
        ("additional_only", False, False, True),
        ("no_template", False, False, False),
    ):
        d = tmp_path / name
        shutil.copytree(full, d)
        if not keep_jinja:
            (d / "chat_template.jinja").unlink()
        if not keep_key:
            (d / "tokenizer_config.json").write_text(
                json.dumps({k: v for k, v in cfg.items() if k != "chat_template"})
            )
        if extra:
            (d / "additional_chat_templates").mkdir()
            (d / "additional_chat_templates" / "tool_use.jinja").write_text(demo.CHAT_TEMPLATE)
        variants[name] = (d, keep_jinja or keep_key or extra)
    bare = tmp_path / "bare"  # a model directory with no tokenizer at all
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    variants["bare"] = (bare, False)
    for name, (d, has) in variants.items():
        try:
            render = loadgen.chat_template_render(str(d))
        except (
            loadgen.LiveError
        ) as e:  # a named template only, no default: found, but nothing renders by default
            assert name == "additional_only" and f"{d}: the chat template cannot be rendered" in str(e), (
                name,
                e,
            )
            render = "found, not renderable"
        assert (render is not None) == has == (by_transformers(d) is not None), name
    msgs = [{"role": "user", "content": "hi"}]
    assert loadgen.chat_template_render(str(full))(msgs) == "<|bos|><|user|>hi<|end|><|assistant|>"


def test_load_generator_numbers_come_from_real_timings(model, run_dir):
    """tok/s = completion tokens / wall time of the real requests: with 4 in flight against a server that runs
    them concurrently the wall time shrinks; with the draft (2.5 tokens per 20 ms step) a request is faster than
    without (1 token per 20 ms step). The steps are long enough that a busy CPU does not hide them."""
    m, d = model
    try:
        uw, uo = start_with_and_without(run_dir, m, d, step_seconds=0.02)
        reqs = [[f"question {i}"] for i in range(4)]
        w1 = loadgen.run_load(uw, reqs, concurrency=1, max_new_tokens=50)
        o1 = loadgen.run_load(uo, reqs, concurrency=1, max_new_tokens=50)
        w4 = loadgen.run_load(uw, reqs, concurrency=4, max_new_tokens=50)
        for r in (w1, o1, w4):
            assert r["turns"] == 4 and r["failed"] == 0 and r["completion_tokens"] == 200
            assert r["output_tok_s"] == pytest.approx(200 / r["wall_s"], rel=1e-3)
            assert r["latency_s"]["mean"] * 4 <= r["wall_s"] * r["concurrency"] + 0.05
        # without the draft: 50 steps of 20 ms = 1 s per request at least, 4 in a row >= 4 s
        assert (
            o1["wall_s"] >= 4 * 50 * 0.02 and o1["acceptance_length"] is None and o1["spec_verify_ct"] is None
        )
        assert w1["acceptance_length"] == 2.5 and w1["acceptance_per_request"] == [2.5] * 4
        assert w1["wall_s"] >= 4 * 20 * 0.02  # round(50 / 2.5) = 20 verify steps per request
        assert w1["output_tok_s"] > 1.5 * o1["output_tok_s"]  # the draft's speed-up, from real timings
        assert w4["output_tok_s"] > 2 * w1["output_tok_s"]  # 4 in flight: the server overlaps them
        # bounded: a time budget stops sending new requests
        capped = loadgen.run_load(
            uo, [[f"q{i}"] for i in range(50)], concurrency=1, max_new_tokens=50, time_budget=0.3
        )
        assert capped["time_budget_hit"] and capped["requests_sent"] < 50
        # two turns: the second request carries the server's own first answer
        two = loadgen.run_load(uw, [["first question", "and a follow-up"]], max_new_tokens=5)
        assert (
            two["turns"] == 2
            and two["per_turn"][1]["prompt_tokens"] > two["per_turn"][0]["prompt_tokens"] + 5
        )
    finally:
        sp.stop(run_dir, "w", grace=10)
        sp.stop(run_dir, "o", grace=10)
    with pytest.raises(loadgen.LiveError, match="no request succeeded"):
        loadgen.run_load(uo, [["x"]], timeout=2)
