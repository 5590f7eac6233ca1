# Copyright: eagle3ops contributors
# Apache-2.0
"""The project's screen output: Ansible's default, except that a poll of a long run reads as progress."""

from __future__ import annotations

DOCUMENTATION = r"""
name: eagle3ops_screen
type: stdout
short_description: Ansible's default output, with a long run's polls printed as progress
description:
  - The long phases (extract, train, train's content check) run detached from the task that started them; a
    task then polls a read-only eagle3ops command with C(until)/C(retries)/C(delay). Ansible's default output
    prints each poll as C(FAILED - RETRYING ... (N retries left)), which reads as a failure. This callback prints
    such a poll as the progress its result carries instead (C([host] extract 312/867 rows (35%), 4.1 rows/s, ETA
    0:02:15; log /data/eagle3/data.extract.log)), which says what is done, the rate and the ETA.
  - A retry whose result carries no progress (a health wait, say) prints as in the default callback; so does
    everything else. The project's ansible.cfg sets it (C(stdout_callback = eagle3ops_screen)).
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout in configuration
"""

import importlib.util
from pathlib import Path

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback


def _beside(name: str):
    """A module of this directory (a plugin directory, not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"_eagle3ops_screen_{name}", Path(__file__).with_name(f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


progress_line = _beside("eagle3ops_progress").progress_line


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "eagle3ops_screen"

    def v2_runner_retry(self, result):
        line = progress_line(result.result)
        if line is None:
            return super().v2_runner_retry(result)
        self._display.display(f"  [{self.host_label(result)}] {line}", color=C.COLOR_OK)
        return None
