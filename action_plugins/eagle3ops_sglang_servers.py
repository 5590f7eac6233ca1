# Copyright: eagle3ops contributors
# Apache-2.0
"""This host's capture servers (roles/sglang/tasks/servers.yml): sglang_servers checked against the TP size,
the ports and the environment, and each server's unit, port, GPUs and manifest rank. The rules are
eagle3ops.sglang.layout's (unit-tested); this plugin passes the task's arguments and fails with their words.
It runs on the controller (no connection to the host).

Returns ``count`` and ``groups`` (the GPU groups; empty for one server on the host's GPUs), and given ``unit``
(and ``manifest_rank``, which counts the servers of the hosts before, so asked once they are known) ``servers``
and, as ``msg``, their description for the phase's report.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.plugins.action import ActionBase

# the checkout's package: found after one installed in the controller's venv, for a venv with ansible-core
# alone (Ansible puts nothing of this repository on the controller's sys.path)
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))

from eagle3ops.plain_values import plain
from eagle3ops.sglang.layout import described, server_layout, servers_of


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("servers", "tp_size", "port", "environment", "unit", "manifest_rank"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        a = plain(dict(self._task.args))
        layout = server_layout(
            a.get("servers"), int(a["tp_size"]), int(a["port"]), a.get("environment") or {}
        )
        result.update(changed=False, count=layout["count"], groups=layout["groups"])
        if layout["bad"]:
            host = (task_vars or {}).get("inventory_hostname")
            result.update(
                failed=True,
                msg=f"sglang_servers (default eagle3ops_sglang_servers) on {host}: {'; '.join(layout['bad'])}. Give "
                "a count of servers (each sglang_tp_size GPUs, consecutive) or a list of disjoint GPU groups of "
                "sglang_tp_size GPUs each, e.g. [[0, 1, 2, 3], [4, 5, 6, 7]] (docs/scale.md). Nothing was "
                "installed.",
            )
            return result
        result["msg"] = (
            f"{layout['count']} capture server(s), GPU groups {layout['groups'] or 'none (the host)'}"
        )
        if a.get("unit"):  # with the unit's name and this host's first manifest rank: each server
            result["servers"] = servers_of(
                layout, a["unit"], int(a["port"]), int(a.get("manifest_rank") or 0)
            )
            result["msg"] = described(result["servers"])
        return result
