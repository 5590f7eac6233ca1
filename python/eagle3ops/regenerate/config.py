"""The settings of a regenerate run (:class:`RegenerateConfig`), their checks, and the phase's error."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import remote_code
from eagle3ops.errors import WithDetails
from eagle3ops.http_retry import RetrySettings
from eagle3ops.regenerate.options import REGENERATE

REGENERATE_FORMAT = 1


WORK_SUFFIX = ".regenerate"


FAILURES_SUFFIX = ".failures"


META_NAME = "meta"


DONE_NAME = "done.log"


MAX_ERRORS_SHOWN = 10


ASSISTANT = "assistant"


class RegenerateError(WithDetails, RuntimeError):
    """A problem the user must act on; the message says what and where. ``details`` go into the JSON result."""


# the settings' defaults are the definition's (python/eagle3ops/regenerate/options.py), written there once
_D = REGENERATE.defaults()


@dataclass
class RegenerateConfig(
    RetrySettings
):  # requests in flight and retries (openai backend); other defaults below
    model: str
    inputs: list[str]
    out: str
    backend: str = _D["backend"]  # transformers | openai
    urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:30000"])
    served_model: str | None = None  # the request's "model" field (openai); default: model
    max_new_tokens: int = _D["max_new_tokens"]
    temperature: float = _D["temperature"]  # 0: greedy
    top_p: float = _D["top_p"]
    seed: int = _D["seed"]
    system: str = _D["system"]  # keep | drop
    think: str = _D["think"]  # keep | strip
    retries: int = field(default=_D["retries"], kw_only=True)
    backoff_max: float = field(default=_D["backoff_max"], kw_only=True)
    health_timeout: float = field(default=_D["health_timeout"], kw_only=True)  # GET /v1/models
    abort_after: int = 0  # consecutive retryable conversation failures that stop the run (0: 2*concurrency+8)
    limit: int | None = _D["limit"]
    on_error: str = _D["on_error"]  # fail | skip
    force: bool = _D["force"]
    plan: bool = False
    device: str = _D["device"]  # transformers: auto | cpu | cuda | cuda:N
    dtype: str = _D["dtype"]  # transformers: auto | float32 | bfloat16 | float16
    # transformers: torch intra-op threads (0: torch's default; 1 is fastest for tiny models)
    threads: int = _D["threads"]
    trust_remote_code: bool = _D["trust_remote_code"]
    progress: bool = False
    log: Callable[[str], None] | None = field(default=None, repr=False)
    sleep: Callable[[float], None] = field(
        default=time.sleep, repr=False
    )  # the retry backoff (tests record it)

    def settings(self) -> dict:
        """What the output depends on (the fingerprint); not the backend, servers, concurrency or retries."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "system": self.system,
            "think": self.think,
        }


def validate(cfg: RegenerateConfig) -> None:
    checks = [
        (
            cfg.backend in ("transformers", "openai"),
            f"backend must be transformers or openai, not {cfg.backend!r}",
        ),
        (cfg.system in ("keep", "drop"), f"system must be keep or drop, not {cfg.system!r}"),
        (cfg.think in ("keep", "strip"), f"think must be keep or strip, not {cfg.think!r}"),
        (cfg.on_error in ("fail", "skip"), f"on_error must be fail or skip, not {cfg.on_error!r}"),
        (cfg.max_new_tokens >= 1, f"max_new_tokens {cfg.max_new_tokens} must be at least 1"),
        (cfg.concurrency >= 1, f"concurrency {cfg.concurrency} must be at least 1"),
        (cfg.retries >= 0, f"retries {cfg.retries} must be 0 or more"),
        (cfg.temperature >= 0, f"temperature {cfg.temperature} must be 0 (greedy) or more"),
        (0 < cfg.top_p <= 1, f"top_p {cfg.top_p} must be in (0, 1]"),
        (cfg.limit is None or cfg.limit >= 1, f"limit {cfg.limit} must be at least 1"),
        (cfg.request_timeout > 0, f"request_timeout {cfg.request_timeout} must be positive"),
        (cfg.threads >= 0, f"threads {cfg.threads} must be 0 (torch's default) or more"),
    ]
    for ok, msg in checks:
        if not ok:
            raise RegenerateError(msg)
    try:  # a local target whose tokenizer/config is remote code needs trust_remote_code (eagle3ops.remote_code)
        remote_code.check(cfg.model, cfg.trust_remote_code)
    except remote_code.RemoteCodeError as e:
        raise RegenerateError(str(e)) from None
    out = Path(cfg.out)
    if out.is_dir():
        raise RegenerateError(
            f"--out {out} is a directory: give the JSONL file to write (e.g. {out}/regenerated.jsonl)"
        )
    for s in cfg.inputs:
        if Path(s).absolute() == out.absolute():
            raise RegenerateError(
                f"--out {out} is also an --input: write the regenerated conversations elsewhere"
            )
