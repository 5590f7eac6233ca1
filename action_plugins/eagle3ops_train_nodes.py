# Copyright: eagle3ops contributors
# Apache-2.0
"""What the train role works out over every training node (roles/train/tasks/nodes.yml, main.yml, data.yml).
The rules and words are eagle3ops.train.nodes' (unit-tested); this plugin reads the nodes' variables and runs the
step the task names. It runs on the controller.

step newest: ``host``, the node holding the newest checkpoint ('' when none); step summary: the lines that sum
up the job over the nodes (its ``msg``, printed as ansible.builtin.debug prints); step kept_out: the
stores of ``hosts`` kept out of the gather, their rows re-assigned to ``names``; step sync_report: the gather's
report line from the rsync runs' messages (both as ``msg``, printed the same way).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

# the checkout's package: found after one installed in the controller's venv, for a venv with ansible-core
# alone (Ansible puts nothing of this repository on the controller's sys.path)
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))

from eagle3ops.plain_values import host_var, plain, run_step
from eagle3ops.train import nodes


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(
        ("step", "hosts", "job", "restart", "start_over", "resume", "source", "names", "messages", "data_dir",
         "rate_mbps")
    )  # fmt: skip

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        self._vars = task_vars or {}
        a = plain(dict(self._task.args))
        self._check_mode = bool(self._task.check_mode or self._play_context.check_mode)
        steps = {
            "newest": self._newest,
            "summary": self._summary,
            "kept_out": self._kept_out,
            "sync_report": self._sync_report,
        }
        return run_step(result, steps, a)

    def host_var(self, host, name, default=None):
        return host_var(self._vars, host, name, default)

    def _newest(self, a):
        found = {h: (self.host_var(h, "train_node") or {}).get("resume_from") for h in a["hosts"]}
        host = nodes.newest_checkpoint(found)
        return {"host": host, "msg": f"newest checkpoint: {host or 'none'}"}

    def _summary(self, a):
        lines = [
            nodes.node_line(h, self.host_var(h, "train_node") or {}, self.host_var(h, "train_result") or {},
                            self._check_mode)
            for h in a["hosts"]
        ]  # fmt: skip
        lines.append(
            nodes.job_line(
                a.get("job") or "",
                len(a["hosts"]),
                restart=boolean(a.get("restart", True), strict=False),
                start_over=boolean(a.get("start_over", False), strict=False),
                resume=a.get("resume") or None,
                source=a.get("source") or "",
                check_mode=self._check_mode,
            )
        )
        return {"msg": lines, "_ansible_verbose_always": True}

    def _kept_out(self, a):
        here = self._templar.template(self._vars.get("train_data_source_dir"))
        stores = {
            h: self.host_var(h, "train_data_source_path", self.host_var(h, "eagle3ops_data_dir", plain(here)))
            for h in a["hosts"]
        }
        return {"msg": nodes.kept_out_line(a["names"], stores), "_ansible_verbose_always": True}

    def _sync_report(self, a):
        line = nodes.sync_report(
            a["names"],
            a["messages"],
            a["data_dir"],
            check_mode=self._check_mode,
            rate_mbps=float(a["rate_mbps"]),
        )
        return {"msg": line, "_ansible_verbose_always": True}
