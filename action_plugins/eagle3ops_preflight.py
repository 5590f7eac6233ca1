# Copyright: eagle3ops contributors
# Apache-2.0
"""The shared role's checks of the play's variables, before anything runs (roles/eagle3ops/tasks/main.yml).

The rules are eagle3ops.preflight's (and eagle3ops.sglang.layout's for the servers' shape), which unit tests
reach; this plugin only reads the play's variables, runs the one check the task names and fails with its words.
It runs on the controller (no connection to the host).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

# the checkout's package: found after one installed in the controller's venv, for a venv with ansible-core
# alone (Ansible puts nothing of this repository on the controller's sys.path)
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))

from eagle3ops import preflight
from eagle3ops.plain_values import plain
from eagle3ops.sglang.layout import server_layout

NOTHING_RUN = "Nothing was run"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("check", "paths", "servers", "reassign_from", "reassign_data", "shard_hosts"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        self._vars = task_vars or {}
        check = self._task.args.get("check")
        checks = {
            "relative_paths": self._relative_paths,
            "bounds": self._bounds,
            "reassign": self._reassign,
            "sglang_servers": self._sglang_servers,
        }
        if check not in checks:
            return {
                **result,
                "failed": True,
                "msg": f"check must be one of {', '.join(checks)}, not {check!r}",
            }
        problem = checks[check]()
        result.update(changed=False, failed=bool(problem), msg=problem or "all right")
        return result

    def var(self, name, default=None):
        """The play's variable, rendered (``default`` when it is not set or cannot be rendered)."""
        if name not in self._vars:
            return default
        try:
            return plain(self._templar.template(self._vars[name]))
        except (
            Exception
        ):  # an undefined or broken template reads as "not set", as lookup('vars', errors=ignore)
            return default

    def _relative_paths(self):
        values = {name: self.var(name) for name in self._task.args.get("paths") or []}
        bad = preflight.relative_paths(values, program=self.var("eagle3ops_bin"))
        if bad:
            return (
                f'{"; ".join(bad)}. Allowed: an absolute path, or "" where the variable says it means "not set" '
                f"(eagle3ops_bin may also be a bare command name found on PATH). {NOTHING_RUN}."
            )
        return None

    def _bounds(self):
        table = self.var("eagle3ops_option_bounds", {})
        phases = preflight.run_phases(
            table,
            preflight=boolean(self.var("eagle3ops_preflight", False), strict=False),
            run_tags=self.var("ansible_run_tags", ["all"]),
            skip_tags=self.var("ansible_skip_tags", []),
            play_roles=self.var("ansible_play_role_names", []),
        )
        rows = {name: b for phase in phases for name, b in table[phase].items()}
        bad = preflight.out_of_bounds(rows, {name: self.var(name) for name in rows})
        if bad:
            return (
                f"{'; '.join(bad)}. {NOTHING_RUN}: set each to a value allowed (or leave it unset where the "
                "phase's README says null means none)."
            )
        return None

    def _reassign(self):
        a = self._task.args
        bad = preflight.reassign_problems(
            plain(a.get("reassign_from")), plain(a.get("reassign_data")), plain(a.get("shard_hosts") or [])
        )
        if bad:
            return f'{"; ".join(bad)}. {NOTHING_RUN} (docs/scale.md, "A host that stays lost").'
        return None

    def _sglang_servers(self):
        servers = plain(self._task.args.get("servers"))
        if server_layout(servers)["bad"]:
            return (
                f"eagle3ops_sglang_servers is {json.dumps(servers)} on {self._vars.get('inventory_hostname')}: it "
                "must be a count of capture servers (1 or more) or a non-empty list of GPU groups (lists of GPU "
                'indices, e.g. [[0, 1, 2, 3], [4, 5, 6, 7]]). Nothing was run (docs/scale.md, "Several capture '
                'servers on one host").'
            )
        return None
