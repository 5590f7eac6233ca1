"""How the HTTP clients of a model server retry (the SGLang extraction client, regenerate's OpenAI-compatible
backend): the answers worth another attempt, and the settings and delays of the attempts. Standard library only;
imports nothing of eagle3ops."""

from __future__ import annotations

import random
from dataclasses import dataclass

# answered by a server that is busy, restarting or overloaded: another attempt may succeed (connection errors and
# timeouts are retried too); any other 4xx fails at once
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(kw_only=True)
class RetrySettings:
    """A client's requests in flight and its retries; a phase's settings dataclass inherits them (keyword-only)
    and may give other defaults."""

    concurrency: int = 8
    request_timeout: float = 600.0  # seconds one request may take
    retries: int = 5  # attempts after the first
    backoff: float = 1.0  # the first retry's delay (s), doubled for each later one
    backoff_max: float = 60.0  # the longest delay (s)
    health_timeout: float = 1800.0  # seconds to wait for the server to answer its health check

    def retry_delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt`` (1 for the first retry): ``backoff`` doubled per attempt up
        to ``backoff_max``, times a jitter in [0.5, 1) so that clients that failed together do not retry together."""
        return min(self.backoff_max, self.backoff * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
