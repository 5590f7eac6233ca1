"""The serve-time tokenizer check (``eagle3ops.serve.tokcheck``) on the Kimi-K2.5-format fixture: the server's
``/v1/tokenize`` against rows ``eagle3ops prepare --trust-remote-code`` wrote.

The server is the STAND-IN of an SGLang server (tests/fixtures/sglang_standin_server.py, serve mode, started by the
real process launcher): SGLang needs CUDA. Its ``/v1/tokenize`` is not stood in where it matters: it loads the
tokenizer the way SGLang's server does (``AutoTokenizer`` with the server's ``--trust-remote-code``), so the
server started without the flag gets transformers' own Kimi tokenizer, which splits contractions otherwise than
the remote-code one (docs/kimi-k25.md): the check must refuse it naming the row and the first differing token.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from eagle3ops import cli
from eagle3ops.serve import process as sp
from eagle3ops.serve import tokcheck
from serve_standin import free_port, standin_argv


def _cli(*argv) -> tuple[int, dict]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main([*map(str, argv), "--json"])
    return rc, json.loads(buf.getvalue().splitlines()[-1])


@pytest.fixture(scope="module")
def prepared(kimi, tmp_path_factory):
    data = tmp_path_factory.mktemp("tokcheck") / "data"
    rc, out = _cli("prepare", "--model", kimi["model_path"], "--input", kimi["conversations_path"], "--out", data,
                   "--max-length", 100, "--trust-remote-code")  # fmt: skip
    assert rc == 0 and out["num_rows"] > 0, out
    return data


@contextlib.contextmanager
def _server(run_dir: Path, model, *flags):
    """A stand-in server with an EAGLE3 draft (the guard measures one; the stand-in only reads its config.json)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    draft = run_dir / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    sp.start(run_dir, "s", sp.make_spec(standin_argv(model, port, draft, *flags), {}, url), health_timeout=60,
             interval=0.1)  # fmt: skip
    try:
        yield url
    finally:
        sp.stop(run_dir, "s", grace=5)


def test_the_server_with_the_remote_tokenizer_agrees(kimi, prepared, tmp_path):
    with _server(tmp_path, kimi["model_path"], "--trust-remote-code") as url:
        res = tokcheck.check(url, prepared, kimi["model_path"], trust_remote_code=True)
        rc, out = _cli("benchmark-live", "--url", url, "--set", f"heldout={kimi['heldout_path']}", "--out",
                       tmp_path / "live.json", "--data", prepared, "--tokenizer-model", kimi["model_path"],
                       "--trust-remote-code", "--concurrency", 1, "--num-requests", 1, "--max-new-tokens", 4,
                       "--lossless-sample", 0)  # fmt: skip
    assert res["checked"] is True and res["conversations"] == tokcheck.SAMPLE
    assert (
        res["rows"] >= res["conversations"] and res["rows_cut"] > 0
    )  # rows cut at --max-length compared too
    assert rc == 0 and out["tokenizer_check"] == res, out
    assert json.loads((tmp_path / "live.json").read_text())["tokenizer_check"] == res  # measured after it


def test_a_server_without_trust_remote_code_is_refused_naming_the_token(kimi, prepared, tmp_path):
    """The guard and benchmark-live stop with exit 2 before anything is sent or written: the message names the
    conversation (file:line), the row of the prepared data, the position and both tokens."""
    with _server(tmp_path, kimi["model_path"]) as url:
        with pytest.raises(tokcheck.TokcheckError) as e:
            tokcheck.check(url, prepared, kimi["model_path"], trust_remote_code=True)
        rc, out = _cli("benchmark-spec-probe", "--url", url, "--data", prepared, "--tokenizer-model",
                       kimi["model_path"], "--trust-remote-code", "--min-accept-length", 1.0)  # fmt: skip
        live_rc, live = _cli("benchmark-live", "--url", url, "--set", f"heldout={kimi['heldout_path']}", "--out",
                             tmp_path / "live.json", "--data", prepared, "--tokenizer-model", kimi["model_path"],
                             "--trust-remote-code")  # fmt: skip
    msg = str(e.value)
    conv = Path(kimi["conversations_path"]).name
    assert f"{conv}:" in msg and e.value.details["loc"].startswith(str(kimi["conversations_path"]))
    assert f"row {e.value.details['row']} of {prepared}" in msg
    assert "first at token" in msg and "ours " in msg and "the server's " in msg and "'" in msg
    assert rc == 2 and out["failed"] and out["msg"] == msg and "acceptance_length" not in out
    assert live_rc == 2 and live["msg"] == msg and not (tmp_path / "live.json").exists()


def test_a_server_without_the_endpoint_is_reported_not_checked(kimi, prepared, tmp_path):
    with _server(tmp_path, kimi["model_path"], "--trust-remote-code", "--standin-no-tokenize") as url:
        res = tokcheck.check(url, prepared, kimi["model_path"], trust_remote_code=True)
        rc, out = _cli("benchmark-spec-probe", "--url", url, "--data", prepared, "--tokenizer-model",
                       kimi["model_path"], "--trust-remote-code", "--limit", 1, "--max-new-tokens", 4)  # fmt: skip
    assert res["checked"] is False and "no /v1/tokenize (404)" in res["reason"]
    assert rc == 0 and out["tokenizer_check"] == res, out
    # no prepared data: not checked either, and said so
    assert tokcheck.check(url, tmp_path / "none")["reason"].endswith("no prepared data to compare with")
