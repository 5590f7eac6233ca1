"""The one health wait (eagle3ops.sglang.server.poll_health) and its two callers' errors: the SGLang client's
wait_health and the serve phase's process wait (eagle3ops.serve.process.wait_healthy). Real sockets on 127.0.0.1:
a port nothing listens on, and a tiny HTTP server that answers /health; no clock is read by an assertion."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest
from eagle3ops.serve import process as serve_process
from eagle3ops.sglang.server import HealthWaitEnded, SGLangClientError, poll_health, wait_health


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def healthy_url():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_healthy_server_answers_at_once_and_nothing_sleeps(healthy_url):
    slept = []
    assert poll_health(healthy_url, 0, sleep=slept.append) >= 0
    assert slept == []


def test_a_gone_server_ends_the_wait_at_once_with_its_reason():
    url, asked, slept = f"http://127.0.0.1:{_closed_port()}", [], []

    def gone():
        asked.append(1)
        return "its process (PID 7) is gone" if len(asked) >= 2 else None

    with pytest.raises(HealthWaitEnded) as e:
        poll_health(url, 3600, sleep=slept.append, poll=0.0, gone=gone, gone_every=0)
    assert e.value.why == "its process (PID 7) is gone" and len(asked) == 2 and len(slept) == 1
    assert e.value.ended == "gone"
    assert e.value.last != "no answer", e.value.last  # the connection's own error is kept for the message


def test_the_timeout_names_the_last_answer():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(HealthWaitEnded) as e:
        poll_health(url, 0, sleep=lambda s: None)  # one try: past a 0 s timeout at once
    assert e.value.why is None and e.value.last != "no answer" and e.value.ended == "timeout"
    with pytest.raises(SGLangClientError, match=r"did not become healthy within 0 s \(last: "):
        wait_health(url, 0, sleep=lambda s: None)


def test_a_url_urllib_cannot_call_is_refused_without_waiting():
    with pytest.raises(HealthWaitEnded, match="not a usable URL") as e:
        poll_health("127.0.0.1:30000", 3600, sleep=lambda s: pytest.fail("it waited"))
    assert e.value.ended == "url"


def test_the_serve_phase_names_its_server_and_log(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(serve_process.ServeProcessError) as e:
        serve_process.wait_healthy(tmp_path, "draft", url, 0, interval=0)
    msg = str(e.value)
    assert msg.startswith("server 'draft' (PID None) gave no 200 on") and "serve_health_timeout" in msg, msg
    with pytest.raises(serve_process.ServeProcessError, match=r"server 'draft' \(PID 4242\) exited before"):
        serve_process.wait_healthy(tmp_path, "draft", url, 3600, interval=0, pid=4242)  # no state: gone
    with pytest.raises(serve_process.ServeProcessError, match=r"server 'draft' .*not a usable URL"):
        serve_process.wait_healthy(tmp_path, "draft", "localhost:1", 3600, interval=0)
