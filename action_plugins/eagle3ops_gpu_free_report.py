# Copyright: eagle3ops contributors
# Apache-2.0
"""The gpu_free role's report (roles/gpu_free/tasks/main.yml): this host's GPUs as a line (``hosts`` not given),
or the verdict over every host of the play (``hosts``: every host's ``gpu_free_result``). The words are
eagle3ops.gpu_free.report's (unit-tested); this plugin reads the hosts' results. It runs on the controller.

Prints its ``msg`` as ansible.builtin.debug does: this host's line, or the verdict's lines (``bad``: the hosts that
are not free, and the task fails when there is one).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.plugins.action import ActionBase

# the checkout's package: found after one installed in the controller's venv, for a venv with ansible-core
# alone (Ansible puts nothing of this repository on the controller's sys.path)
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))

from eagle3ops.gpu_free import report
from eagle3ops.plain_values import plain


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("result", "hosts"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        hosts = self._task.args.get("hosts")
        if hosts is None:
            line = report.gpus_line(plain(self._task.args.get("result") or {}))
            return {**result, "changed": False, "msg": line, "_ansible_verbose_always": True}
        hostvars = (task_vars or {})["hostvars"]
        results = {}
        for h in plain(hosts):
            try:
                results[h] = (
                    plain(hostvars[h]["gpu_free_result"]) if "gpu_free_result" in hostvars[h] else None
                )
            except Exception:  # a host that failed before the check
                results[h] = None
        out = report.verdict(results)
        failed = bool(out["bad"])
        return {
            **result,
            "changed": False,
            "failed": failed,
            "msg": out["lines"],
            "bad": out["bad"],
            "_ansible_verbose_always": True,
        }
