"""An injected clock for code that waits: its time moves only when the code sleeps.

A test that asserts how long a wait took ("waited the timeout, not longer", "free at the first look") fails on
a loaded machine when it reads the wall clock: every step between two readings can take seconds there (issue
#32). Put a :class:`VirtualClock` where the code under test reads ``time`` (``monkeypatch.setattr(module,
"time", clock)``): ``monotonic()``/``time()`` then return the seconds the code has slept, and nothing else, so the
durations it reports and decides on are exactly its own sleeps, however slow the machine.

``at(t, action)`` runs ``action`` once the clock reaches ``t`` (a file that appears 2.5 s into a wait), at the
sleep that crosses it; ``real_sleep`` makes each sleep also yield that many real seconds, for code that waits
on a real process while counting virtual time (0 by default: sleeps return at once).
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable


class VirtualClock:
    def __init__(self, start: float = 1000.0, real_sleep: float = 0.0):
        self.start = self.now = start
        self._epoch = _time.time()
        self.real_sleep = real_sleep
        self.sleeps: list[float] = []
        self._events: list[tuple[float, Callable[[], None]]] = []
        self._lock = threading.Lock()

    # the parts of the ``time`` module that waiting code reads
    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:  # a real date, moving with the clock
        return self._epoch + self.now - self.start

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += max(0.0, seconds)
            due = [e for e in self._events if e[0] <= self.now - self.start]
            self._events = [e for e in self._events if e not in due]
        for _, action in sorted(due, key=lambda e: e[0]):
            action()
        if self.real_sleep:
            _time.sleep(self.real_sleep)

    def at(self, t: float, action: Callable[[], None]) -> None:
        """Run ``action`` at the first sleep that takes the clock to ``t`` s after its start or beyond."""
        self._events.append((t, action))

    @property
    def elapsed(self) -> float:
        return self.now - self.start

    def __getattr__(self, name):  # anything else of the time module (strftime, gmtime, ...) stays real
        return getattr(_time, name)
