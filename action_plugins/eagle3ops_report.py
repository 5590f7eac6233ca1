# Copyright: eagle3ops contributors
# Apache-2.0
"""A phase's report line for this host, in the words of the phase's report module (unit-tested): ``report``
names it, the other arguments are that function's (this host's registered results, the role's paths). The
check mode the words speak of is the play's. It runs on the controller (no connection to the host).

- ``prepare``: eagle3ops.prepare.report.line; ``train``: eagle3ops.train.report.line;
- ``extract``: eagle3ops.extract.report.transformers_line; ``extract_sglang``: its sglang_line;
- ``sglang_patch``: eagle3ops.sglang.patch_choice.auto, the capture patch's state under
  sglang_capture_patch_state auto (returns ``state`` too).

Returns ``msg``, printed as ansible.builtin.debug prints it.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from ansible.plugins.action import ActionBase

# the checkout's package: found after one installed in the controller's venv, for a venv with ansible-core
# alone (Ansible puts nothing of this repository on the controller's sys.path)
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))

from eagle3ops.extract import report as extract_report
from eagle3ops.plain_values import plain
from eagle3ops.prepare import report as prepare_report
from eagle3ops.sglang import patch_choice
from eagle3ops.train import report as train_report

REPORTS = {
    "prepare": prepare_report.line,
    "train": train_report.line,
    "extract": extract_report.transformers_line,
    "extract_sglang": extract_report.sglang_line,
    "sglang_patch": patch_choice.auto,
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = plain(dict(self._task.args))
        name = args.pop("report", None)
        words = REPORTS.get(name)
        if words is None:
            return {
                **result,
                "failed": True,
                "msg": f"report: {name!r} is none of {', '.join(sorted(REPORTS))}",
            }
        if "check_mode" in inspect.signature(words).parameters:
            args["check_mode"] = bool((task_vars or {}).get("ansible_check_mode"))
        try:
            out = words(**args)
        except TypeError as e:  # an argument the report does not take, or one it needs missing
            return {**result, "failed": True, "msg": f"report {name}: {e}"}
        if isinstance(out, dict):  # a decision: its fields, and its reason as the line
            result.update(out)
            out = out["reason"]
        return {**result, "changed": False, "msg": out, "_ansible_verbose_always": True}
