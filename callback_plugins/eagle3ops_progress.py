# Copyright: eagle3ops contributors
# Apache-2.0
"""Print a long run's progress at every poll of the task that waits for it (issue #32)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: eagle3ops_progress
type: notification
short_description: Show how far a long eagle3ops run is at each poll
description:
  - The long phases (extract, train) run detached from the task that started them; a task then polls a
    read-only eagle3ops command with C(until)/C(retries)/C(delay). Ansible's own retry line names only the task
    (C(FAILED - RETRYING ... (N retries left))); this callback adds, under it, the progress the polled result
    carries in its C(progress) key, or the JSON object a polled C(eagle3ops ... --json) command printed last
    (its C(line), e.g. C(extract 312/867 rows (35%), 4.1 rows/s, ETA 0:02:15; log
    /data/eagle3/data.extract.log)).
  - Results without a C(progress) key print nothing more. Enabled in the project's ansible.cfg
    (C(callbacks_enabled = eagle3ops_progress), C(callback_plugins = callback_plugins)); it prints nothing when the
    screen output is the project's own (C(stdout_callback = eagle3ops_screen), callback_plugins/eagle3ops_screen.py), which
    prints the progress line in place of the retry line. It serves other outputs (ansible-runner's, say).
requirements:
  - enabled in ansible.cfg (callbacks_enabled)
"""

import json

from ansible import constants as C
from ansible.plugins.callback import CallbackBase


def progress_line(result: dict) -> str | None:
    """The progress line a polled result carries: ``progress.line`` (or ``progress`` itself when a string) of the
    module's result, or of the JSON object an ``eagle3ops ... --json`` command printed last (a polled
    ``ansible.builtin.command``, e.g. ``eagle3ops train-status``)."""
    if not isinstance(result, dict):
        return None
    p = result.get("progress")
    if p is None and result.get("stdout_lines"):
        try:
            p = json.loads(result["stdout_lines"][-1]).get("progress")
        except (ValueError, AttributeError):
            p = None
    if isinstance(p, dict):
        p = p.get("line")
    return p if isinstance(p, str) and p else None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "eagle3ops_progress"
    CALLBACK_NEEDS_ENABLED = True

    def v2_runner_retry(self, result):
        if C.config.get_config_value("DEFAULT_STDOUT_CALLBACK") == "eagle3ops_screen":
            return  # the project's screen output prints the line in place of the retry line
        line = progress_line(result.result)
        if line:
            self._display.display(f"  [{result._host.get_name()}] {line}")
