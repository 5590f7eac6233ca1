"""The SGLang backend's client against a loopback STAND-IN of a patched SGLang server.

The stand-in (tests/fixtures/sglang_standin_server.py) serves /health and /generate on 127.0.0.1 and runs the
REAL hook (configured from the same environment the systemd unit sets) over a transformers model; SGLang itself
cannot run on this CPU-only machine. The client, the hook and the store are the real code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from eagle3ops.sglang import patch as sglang_patch
from eagle3ops.sglang.client import (
    SGLangClientError,
    http_call,
    run_sglang_extraction,
)
from eagle3ops.store import HiddenStateStore
from sglang_inputs import sglang_cfg, transformers_reference
from tinymodels import build_prepared_dataset

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from sglang_standin import pristine_deepseek_v2
from sglang_standin import standin_server as _standin_server

LENGTHS = [5, 17, 33, 9, 12, 2, 21, 40, 7, 26, 3, 15]
LAYERS = [2, 4, 5]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_target):
    return transformers_reference(tmp_path_factory, tiny_target, LENGTHS)


@pytest.fixture
def data_dir(tmp_path):
    return build_prepared_dataset(tmp_path / "data", LENGTHS)


def standin_server(tmp_path, data_dir, model, *args):
    return _standin_server(tmp_path, data_dir, model, LAYERS, *args)


def _cfg(data_dir, model, url, **kw):
    return sglang_cfg(data_dir, model, url, **{"concurrency": 3, "confirm_timeout": 30, **kw})


def _cli(data_dir, model, url, *extra) -> list[str]:
    """``eagle3ops extract-sglang`` as a process (the real CLI), with ``--json``."""
    return [sys.executable, "-m", "eagle3ops", "extract-sglang", "--data", str(data_dir), "--model", str(model),
            "--url", url, *extra, "--json"]  # fmt: skip


def _wait_for_rows(data_dir, n, writer) -> None:
    """Poll the manifests until ``n`` rows are recorded (2 min at most) while ``writer`` (the extraction: a
    process or a thread) still runs."""
    store = HiddenStateStore(data_dir)
    t0 = time.monotonic()
    while len(store.scan_manifest().entries) < n:
        if isinstance(writer, subprocess.Popen):
            assert writer.poll() is None, writer.communicate()
        else:
            assert writer.is_alive(), "the extraction ended before it was interrupted"
        assert time.monotonic() - t0 < 120
        time.sleep(0.05)


def _stats(url):
    return json.loads(http_call(url + "/standin/stats", None, 5)[1])


def _assert_equal_to_reference(data_dir, reference):
    got, ref = HiddenStateStore(data_dir), HiddenStateStore(reference)
    for i in range(len(LENGTHS)):
        assert got.path(i).read_bytes() == ref.path(i).read_bytes(), (
            f"row {i} differs from the transformers backend"
        )
    assert sorted(got.scan_manifest().entries) == list(range(len(LENGTHS)))


def test_full_run_bounded_concurrency_then_nothing_left(tmp_path, data_dir, tiny_target, reference):
    with standin_server(
        tmp_path, data_dir, tiny_target, "--load-seconds", "1", "--batch-delay", "0.05"
    ) as url:
        res = run_sglang_extraction(_cfg(data_dir, tiny_target, url, concurrency=3))
        assert res["written"] == len(LENGTHS) and res["failed"] == 0 and res["done_before"] == 0
        assert res["tokens"] == sum(LENGTHS) and res["health_wait_seconds"] > 0.5
        assert res["requests"] == len(LENGTHS) and res["retries"] == 0
        # where each row's time went: every forward of the stand-in sleeps 0.05 s, so a request takes at least
        # that; the wait for the hook's file is recorded apart
        rs = res["row_seconds"]
        assert rs["request_s"]["median"] >= 0.05 and rs["request_s"]["p90"] >= rs["request_s"]["median"]
        assert 0 <= rs["confirm_s"]["median"] <= rs["confirm_s"]["p90"] < 30
        assert rs["request_s"]["sum"] >= 0.05 * len(LENGTHS)
        st = _stats(url)
        assert 1 < st["max_inflight"] <= 3  # concurrent, but never more than asked
        assert st["max_batch_seen"] > 1  # several requests shared a forward batch
        _assert_equal_to_reference(data_dir, reference)
        again = run_sglang_extraction(_cfg(data_dir, tiny_target, url))
        assert again["written"] == 0 and again["done_before"] == len(LENGTHS)
        assert _stats(url)["calls"] == st["calls"]  # resume from the manifest sent nothing
    assert json.loads((data_dir / "hidden_states" / "extract_meta.json").read_text())["backend"] == "sglang"


def test_a_row_waiting_for_its_file_holds_no_request_slot(
    tmp_path, data_dir, tiny_target, reference, monkeypatch
):
    """``concurrency`` bounds the requests in flight, not the rows being confirmed: with concurrency 1, the next
    row's request reaches the server while the first row still waits for its file (before, the slot stayed taken
    until the file was confirmed, so the server idled through every confirmation: the capture-overhead figure of
    2026-12-02). The first confirmation waits (bounded) for the server to have seen a second request."""
    from eagle3ops.sglang import client as sc

    real_confirm = sc._Runner._confirm
    seen: list[int] = []

    def first_confirm_waits(self, index, ids, since):
        if not seen:
            t0 = time.monotonic()
            while _stats(url)["calls"] < 2 and time.monotonic() - t0 < 120:  # a guard
                time.sleep(0.02)
            seen.append(_stats(url)["calls"])
        return real_confirm(self, index, ids, since)

    monkeypatch.setattr(sc._Runner, "_confirm", first_confirm_waits)
    with standin_server(tmp_path, data_dir, tiny_target) as url:
        res = run_sglang_extraction(_cfg(data_dir, tiny_target, url, concurrency=1))
        assert seen and seen[0] >= 2, "no second request went out while the first row was being confirmed"
        assert _stats(url)["max_inflight"] == 1  # still never more requests in flight than asked
    assert res["written"] == len(LENGTHS) and res["failed"] == 0
    # the request loop's own rate (what the capture overhead is judged by) excludes the run's setup
    assert 0 < res["loop_seconds"] <= res["seconds"]
    assert res["loop_tokens_per_second"] >= res["tokens_per_second"]
    _assert_equal_to_reference(data_dir, reference)


def test_5xx_and_timeouts_are_retried_with_backoff(tmp_path, data_dir, tiny_target, reference):
    """503s and timed-out requests are retried with backoff, and the store ends equal to the transformers
    backend's. Nothing here depends on the machine's speed: the hung rows (7, 9) get no answer until the client
    itself gives up (the stand-in holds them until the client closes the connection), and the request timeout
    that decides when it gives up is derived from what an ordinary request costs on this machine right now,
    measured by a first run over rows 0-3 (the one that meets the 503s; its timeout is the default 600 s, only
    a guard against a hang). Before, a fixed 8 s timeout timed out ordinary rows too on a loaded machine."""
    sleeps = []
    with standin_server(tmp_path, data_dir, tiny_target, "--fail-first", "4", "--hang-rows", "7,9") as url:
        first = run_sglang_extraction(_cfg(data_dir, tiny_target, url, limit=4, sleep=sleeps.append))
        assert first["written"] == 4 and first["failed"] == 0, first["errors"]
        assert first["retries"] >= 4  # the four 503s
        # p90 of 4 rows is the slowest one; 10x that, and never under 5 s, is the ordinary request's bound
        timeout = max(5.0, 10 * first["row_seconds"]["request_s"]["p90"])
        res = run_sglang_extraction(
            _cfg(data_dir, tiny_target, url, request_timeout=timeout, sleep=sleeps.append)
        )
        abandoned = _stats(url)["hangs_abandoned"]
    assert res["done_before"] == 4 and res["written"] == len(LENGTHS) - 4 and res["failed"] == 0, res[
        "errors"
    ]
    assert sorted(abandoned) == [7, 9]  # both hung requests timed out on the client, and were retried:
    assert res["retries"] >= 2 and res["requests"] >= len(LENGTHS) - 4 + 2
    assert first["retries"] + res["retries"] >= 6
    assert sleeps and all(0 < s <= 60 for s in sleeps)
    _assert_equal_to_reference(data_dir, reference)


def test_a_permanent_error_fails_its_row_only(tmp_path, data_dir, tiny_target):
    with standin_server(tmp_path, data_dir, tiny_target, "--reject-rows", "3") as url:
        res = run_sglang_extraction(_cfg(data_dir, tiny_target, url))
    assert res["failed"] == 1 and res["written"] == len(LENGTHS) - 1
    (err,) = res["errors"]
    assert err["index"] == 3 and "HTTP 400" in err["error"] and "not retried" in err["error"]
    assert res["retries"] == 0


def test_a_row_with_non_finite_states_is_failed_once_and_written_by_a_sound_server(
    tmp_path, data_dir, tiny_target, reference
):
    """A row whose states the server computes with a NaN (``--nan-rows``: the real hook sees it) is failed by the
    hook, not written, and not sent again (the same input gives the same states); every other row is written.
    A later run against a sound server writes just that row, and the store ends equal to the transformers
    backend's: nothing of the failed row was left behind."""
    with standin_server(tmp_path, data_dir, tiny_target, "--nan-rows", "3") as url:
        res = run_sglang_extraction(_cfg(data_dir, tiny_target, url))
        calls = _stats(url)["calls"]
    assert res["failed"] == 1 and res["written"] == len(LENGTHS) - 1 and res["retries"] == 0
    (err,) = res["errors"]
    assert err["index"] == 3 and "non-finite hidden states" in err["error"] and "not retried" in err["error"]
    assert calls == len(LENGTHS)  # one request a row: the NaN row was not sent again
    store = HiddenStateStore(data_dir)
    assert 3 not in store.scan_manifest().entries and not store.path(3).exists()
    assert not [p for p in store.dir.rglob("*.tmp")]
    with standin_server(tmp_path, data_dir, tiny_target) as url:
        again = run_sglang_extraction(_cfg(data_dir, tiny_target, url))
        assert _stats(url)["calls"] == 1
    assert again["written"] == 1 and again["failed"] == 0 and again["done_before"] == len(LENGTHS) - 1
    _assert_equal_to_reference(data_dir, reference)


def test_kill_9_of_the_client_mid_run_then_resume(tmp_path, data_dir, tiny_target, reference):
    """The killed client's server holds the last row's request until the client gives up (its default timeout
    is 600 s), so the client cannot finish before it is killed, however slow the test's own polling is (with a
    slowed server alone, a loaded machine could let it finish first); the resumed run gets a new server."""
    args = ("--batch-delay", "0.2", "--max-batch", "1")
    with standin_server(tmp_path, data_dir, tiny_target, *args, "--hang-rows", str(len(LENGTHS) - 1)) as url:
        cmd = _cli(data_dir, tiny_target, url, "--concurrency", "1", "--no-progress")
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait_for_rows(data_dir, 3, client)
        store = HiddenStateStore(data_dir)
        os.kill(client.pid, signal.SIGKILL)
        client.wait()
        done_at_kill = len(store.scan_manifest().entries)
        assert done_at_kill < len(LENGTHS)
        for f in store.dir.glob("hs_*.safetensors"):  # whatever is under a final name is complete
            i = int(f.name.removeprefix("hs_").removesuffix(".safetensors"))
            assert store.validate_header(i, LENGTHS[i], len(LAYERS) + 1, 64, "bfloat16") is None
    with standin_server(tmp_path, data_dir, tiny_target, *args) as url:
        res = run_sglang_extraction(_cfg(data_dir, tiny_target, url))
    assert res["done_before"] + res["adopted"] >= done_at_kill
    assert res["done_before"] + res["adopted"] + res["written"] == len(LENGTHS) and res["failed"] == 0
    _assert_equal_to_reference(data_dir, reference)


def test_the_server_restarting_mid_run_is_waited_for(tmp_path, data_dir, tiny_target, reference, monkeypatch):
    """kill -9 of the SERVER mid-run, a new one on the same port: the client waits for /health and finishes. The
    new stand-in listens before it has loaded its model and answers 503 meanwhile: a request that meets it then
    waits for /health too instead of spending its retries (CI of 4be1f0a, under load: two rows gave up after 4
    attempts on "server is loading")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    args = ("--port", port, "--batch-delay", "0.3", "--max-batch", "1")
    box = {}
    from eagle3ops.sglang import client as sc

    waiting = threading.Event()
    real_wait = sc._Runner._wait_until_healthy

    def wait_until_healthy(self):
        waiting.set()
        return real_wait(self)

    monkeypatch.setattr(sc._Runner, "_wait_until_healthy", wait_until_healthy)
    with standin_server(tmp_path, data_dir, tiny_target, *args) as url:
        cfg = _cfg(data_dir, tiny_target, url, concurrency=2, retries=3, request_timeout=20)
        t = threading.Thread(target=lambda: box.update(res=run_sglang_extraction(cfg)))
        t.start()
        _wait_for_rows(data_dir, 3, t)
    assert t.is_alive()  # the server is gone, the client is waiting
    # nothing listens on the port until the client has met the closed port and waits for /health, as while a
    # real SGLang restarts (it loads the model for minutes before it binds). (A stand-in comes up in
    # milliseconds from its fork server: started at once, the client's retries could find it already back.)
    assert waiting.wait(timeout=120), "the client never noticed that the server was gone"
    with standin_server(
        tmp_path, data_dir, tiny_target, *args, "--load-seconds", "2"
    ):  # 503 "loading" for 2 s
        t.join(timeout=300)
    res = box["res"]
    assert res["failed"] == 0 and res["health_waits"] >= 1, res["errors"]
    assert res["written"] == len(LENGTHS)
    _assert_equal_to_reference(data_dir, reference)


def test_a_server_that_died_ends_the_run_at_once(tmp_path, data_dir, tiny_target):
    """Seen on the live box: the server crashed mid-run and the client waited for /health up to its 1800 s
    timeout. With the server's PID known (--server-pid; the role passes its systemd unit), a dead server ends the
    run within seconds, naming the PID; the rows already written stay."""
    args = ("--batch-delay", "0.3", "--max-batch", "1")
    box = {}
    with standin_server(tmp_path, data_dir, tiny_target, *args) as url:
        cfg = _cfg(
            data_dir, tiny_target, url, concurrency=2, retries=3, request_timeout=20, server_pid=url.pid
        )
        assert cfg.health_timeout == 180

        def run():
            try:
                box["res"] = run_sglang_extraction(cfg)
            except SGLangClientError as e:
                box["err"] = str(e)

        t = threading.Thread(target=run)
        t.start()
        _wait_for_rows(data_dir, 2, t)
    # the run ends on the server's PID, not at the health timeout (180 s): the message names the PID, and the
    # end comes well before that timeout (the bound a guard only: the PID is looked at every 2 s)
    died = time.monotonic()
    t.join(timeout=cfg.health_timeout - 30)
    assert not t.is_alive(), "the client still waits for a server that is gone"
    assert time.monotonic() - died < cfg.health_timeout - 30
    assert "res" not in box, box.get("res")
    assert f"its process (PID {url.pid}) is gone" in box["err"] and url in box["err"]
    assert len(HiddenStateStore(data_dir).scan_manifest().entries) >= 2


def test_an_fp8_store_through_the_cli_equals_the_transformers_backends_at_about_half_the_bytes(
    tmp_path, tmp_path_factory, data_dir, tiny_target, reference
):
    """``--dtype float8_e4m3fn`` end to end (client process, stand-in server, the real hook): every file equals
    the transformers backend's fp8 file for the row, the plan's byte estimate is fp8's, and the store takes a bit
    over half the bf16 store's bytes (e4m3 + a float32 scale a token and state)."""
    ref8 = transformers_reference(tmp_path_factory, tiny_target, LENGTHS, dtype="float8_e4m3fn")
    fp8 = ("--dtype", "float8_e4m3fn")
    plan = subprocess.run(
        _cli(data_dir, tiny_target, "http://127.0.0.1:9", *fp8, "--check"), capture_output=True
    )
    assert plan.returncode == 0, plan.stderr[-2000:]
    with standin_server(tmp_path, data_dir, tiny_target) as url:
        r = subprocess.run(
            _cli(data_dir, tiny_target, url, *fp8, "--no-progress"), capture_output=True, text=True
        )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["written"] == len(LENGTHS) and res["failed"] == 0
    _assert_equal_to_reference(data_dir, ref8)
    got, bf16 = HiddenStateStore(data_dir), HiddenStateStore(reference)
    size = sum(got.path(i).stat().st_size for i in range(len(LENGTHS)))
    size_bf16 = sum(bf16.path(i).stat().st_size for i in range(len(LENGTHS)))
    assert 0.5 < size / size_bf16 < 0.6, (size, size_bf16)
    planned = json.loads(plan.stdout.strip().splitlines()[-1])["bytes_needed"]
    assert size <= planned < size_bf16, (size, planned, size_bf16)
    assert (
        json.loads((data_dir / "hidden_states" / "extract_meta.json").read_text())["dtype"] == "float8_e4m3fn"
    )


def test_plan_contacts_no_server(data_dir, tiny_target):
    r = subprocess.run(
        _cli(data_dir, tiny_target, "http://127.0.0.1:9", "--check"), capture_output=True, text=True
    )
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and out["to_extract"] == len(LENGTHS) and out["changed"] is True
    assert not (data_dir / "hidden_states" / "extract_meta.json").exists()


def test_unreachable_server_is_reported(tmp_path, data_dir, tiny_target):
    with pytest.raises(SGLangClientError, match=r"did not become healthy within 1 s"):
        run_sglang_extraction(_cfg(data_dir, tiny_target, "http://127.0.0.1:9", health_timeout=1))


def test_restore_patch_at_the_end(tmp_path, data_dir, tiny_target):
    target = tmp_path / "site" / sglang_patch.TARGET_RELPATH
    target.parent.mkdir(parents=True)
    shutil.copy2(pristine_deepseek_v2(), target)
    sglang_patch.apply(target)
    with standin_server(tmp_path, data_dir, tiny_target) as url:
        res = run_sglang_extraction(_cfg(data_dir, tiny_target, url, limit=3, restore_patch=str(target)))
    assert res["written"] == 3 and res["patch"]["changed"] is True
    assert sglang_patch.sha256_file(target) == sglang_patch.SPECS["0.5.23"].pristine_sha256


def test_the_ansible_module_check_run_idempotent(tmp_path, data_dir, tiny_target, reference):
    """library/eagle3ops_extract_sglang.py through ansible-playbook: check mode predicts, a run writes, a re-run is changed=0."""
    repo = Path(__file__).resolve().parents[3]
    bindir = Path(sys.executable).parent
    out = tmp_path / "results"
    out.mkdir()
    with standin_server(tmp_path, data_dir, tiny_target) as url:
        play = tmp_path / "play.yml"
        play.write_text(
            json.dumps(
                [
                    {
                        "hosts": "localhost",
                        "gather_facts": False,
                        "tasks": [
                            {
                                "name": "extract",
                                "eagle3ops_extract_sglang": {
                                    "data_dir": str(data_dir),
                                    "model": str(tiny_target),
                                    "url": url,
                                    "concurrency": 2,
                                    "health_timeout": 180,
                                },
                                "register": "r",
                            },
                            {
                                "name": "keep",
                                "ansible.builtin.copy": {
                                    "content": "{{ r | to_json }}",
                                    "dest": str(out) + "/{{ run }}.json",
                                },
                                "check_mode": False,
                            },
                        ],
                    }
                ]
            )
        )
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
            "PATH": f"{bindir}:{os.environ['PATH']}",
        }

        def run(name, *extra):
            cmd = [
                str(bindir / "ansible-playbook"),
                "-i",
                "localhost,",
                "-c",
                "local",
                "-e",
                f"ansible_python_interpreter={sys.executable}",
                "-e",
                f"run={name}",
                str(play),
                *extra,
            ]
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, env=env, timeout=600)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
            return json.loads((out / f"{name}.json").read_text())

        check = run("check", "--check")
        assert check["changed"] is True and check["to_extract"] == len(LENGTHS)
        assert not HiddenStateStore(data_dir).meta_path.exists()
        first = run("first")
        assert first["changed"] is True and first["written"] == len(LENGTHS) and first["failed"] == 0
        second = run("second")
        assert second["changed"] is False and second["done_before"] == len(LENGTHS)
    _assert_equal_to_reference(data_dir, reference)


def test_the_run_ends_once_the_manifest_names_every_confirmed_row(tmp_path):
    """The server's writer names a row in the manifest just after its file is complete (what confirms the row):
    the run waits for the names, and names the rows still missing after its timeout (CI once saw a run end, and
    its server stop, between the two: 12 rows written, 11 in the manifest). STAND-IN: a store whose manifest
    scan is a set that a thread fills 0.3 s later, as the server's writer does."""
    from types import SimpleNamespace

    from eagle3ops.sglang import client as sc

    named: dict[int, object] = {0: None}
    store = SimpleNamespace(dir=tmp_path, scan_manifest=lambda: SimpleNamespace(entries=dict(named)))
    late = threading.Timer(0.3, lambda: named.update({1: None, 2: None}))
    late.start()
    t0 = time.monotonic()
    sc._await_manifest(store, [0, 1, 2], timeout=30)
    late.join()
    assert 0.3 <= time.monotonic() - t0 < 10
    with pytest.raises(
        sc.SGLangClientError, match=r"rows \[3, 4\] have complete files.*named 2 of them in no"
    ):
        sc._await_manifest(store, [0, 3, 4], timeout=0.2)
