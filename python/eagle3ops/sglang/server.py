"""The SGLang capture server as the extraction client sees it: its HTTP answers (``/health``), whether its process
or systemd unit can still come back, the end of its unit's journal for an error message, and ``systemctl`` on its
units. :mod:`eagle3ops.sglang.client` drives the rows; this module only asks the server and its host."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from eagle3ops.sglang import hook as sglang_hook


class SGLangClientError(RuntimeError):
    """A user-actionable failure of the SGLang backend (server unreachable, misconfigured...)."""


def http_call(url: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
    """One HTTP call (GET without a body, else a JSON POST): its status and body; an HTTP error is an answer too."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method="GET" if body is None else "POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() or b""


def server_gone(pid: int | None = None, unit: str | None = None) -> str | None:
    """Why the server cannot come back (its process is dead, its unit failed or stopped), or None.

    A unit that is restarting (``activating``) or a live process is not gone: waiting for it is right."""
    if pid:
        from eagle3ops.runlock import pid_alive

        if not pid_alive(int(pid)):
            return f"its process (PID {pid}) is gone (exited, or a zombie its parent has not reaped)"
    if unit:
        try:
            r = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None  # cannot tell: keep waiting, the timeout still bounds it
        state = r.stdout.strip()
        if state in ("failed", "inactive"):
            return f"its systemd unit {unit} is {state}; {unit_log_tail(unit)}"
    return None


def unit_log_tail(unit: str, lines: int = 12) -> str:
    """The last ``lines`` lines of ``unit``'s journal as one clause of an error message (what the server printed
    before it stopped: a traceback, an out-of-memory kill), or where to look when the journal cannot be read."""
    try:
        r = subprocess.run(
            ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        r = None
    tail = r.stdout.strip() if r is not None and r.returncode == 0 else ""
    if not tail:
        return f"journalctl -u {unit} says why"
    return f"the end of its journal (journalctl -u {unit}):\n{tail}\n"


class HealthWaitEnded(Exception):
    """:func:`poll_health` ended without a 200: ``why`` the server cannot come back (None: the timeout), its
    ``last`` answer, the seconds ``waited``, and what ended the wait, ``ended``: ``"gone"`` (the caller's ``gone``
    said why), ``"url"`` (the URL cannot be used) or ``"timeout"``. Each caller says it in its own error."""

    def __init__(self, why: str | None, last: str, waited: float, ended: str = "timeout"):
        super().__init__(why or f"no 200 within {waited:.0f} s (last: {last})")
        self.why, self.last, self.waited, self.ended = why, last, waited, ended


def poll_health(
    url: str,
    timeout: float,
    *,
    sleep=time.sleep,
    poll: float = 1.0,
    gone: Callable[[], str | None] | None = None,
    gone_every: float = 2.0,
    request_timeout: float = 10.0,
) -> float:
    """Poll ``GET url/health`` until it answers 200; returns the seconds waited. ``gone`` (asked at most every
    ``gone_every`` s) says whether the server can still come back; when it says why not, or ``timeout`` passes, or
    the URL cannot be used, :class:`HealthWaitEnded`. The one health wait of the SGLang client and the serve
    phase's processes (:func:`eagle3ops.serve.process.wait_healthy`)."""
    t0 = time.monotonic()
    last = "no answer"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:  # waiting cannot help
        raise HealthWaitEnded(f"{url!r} is not a usable URL (http://HOST:PORT)", last, 0.0, "url")
    checked = None
    while True:
        try:
            code, body = http_call(url.rstrip("/") + "/health", None, timeout=request_timeout)
            if code == 200:
                return time.monotonic() - t0
            last = f"HTTP {code} {body[:200]!r}"
        except (OSError, urllib.error.URLError) as e:
            last = str(getattr(e, "reason", e))
        if gone is not None and (checked is None or time.monotonic() - checked >= gone_every):
            checked = time.monotonic()
            why = gone()
            if why:
                raise HealthWaitEnded(why, last, time.monotonic() - t0, "gone")
        if time.monotonic() - t0 > timeout:
            raise HealthWaitEnded(None, last, time.monotonic() - t0)
        sleep(poll)


def wait_health(url: str, timeout: float, **poll_args) -> float:
    """Wait until the capture server's ``GET /health`` answers 200: :func:`poll_health` with the same arguments
    (``gone``: whether the server can still come back; when it says why not, the wait ends at once instead of at
    ``timeout``); returns the seconds waited, or the SGLang backend's error."""
    try:
        return poll_health(url, timeout, **poll_args)
    except HealthWaitEnded as e:
        if e.why:
            raise SGLangClientError(
                f"the SGLang server at {url} stopped answering and cannot come back: {e.why} (last: {e.last}). "
                "Its log says why (a crash of the capture hook is in hidden_states/"
                f"{sglang_hook.ERRORS_NAME}); start it again and re-run: finished rows are kept."
            ) from None
        raise SGLangClientError(
            f"the SGLang server at {url} did not become healthy within {timeout:.0f} s (last: {e.last}). "
            "Check its log (journalctl -u <unit>), the model path and GPU memory; a large model can need "
            "more time (sglang_health_timeout)."
        ) from None


def systemctl(*args: str) -> None:
    """``systemctl ARGS`` on the server units; a failure is the backend's error, naming the command."""
    r = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SGLangClientError(
            f"systemctl {' '.join(args)} failed (exit {r.returncode}): {r.stderr.strip()}; "
            "see journalctl -u for the unit"
        )
