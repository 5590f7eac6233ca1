# Copyright: eagle3ops contributors
# Apache-2.0
"""Several hosts share the rows (roles/extract/tasks/shard.yml and main.yml): what the extract role works out
from every host's variables. The rules are eagle3ops.extract.hosts' (unit-tested); this plugin reads the hosts'
variables, runs the step the task names and fails with its words. It runs on the controller.

step share: ``world_size``, ``first_rank`` and ``reassign_ranks`` of this host (every host's worker count must be
known); step conflicts: fail when a host's store keeps another re-assignment than this run's; step summary: the lines
that sum up the extraction over every host (its ``msg``, printed as ansible.builtin.debug prints).
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

from ansible.plugins.action import ActionBase

# the checkout's package: found after one installed in the controller's venv, for a venv with ansible-core
# alone (Ansible puts nothing of this repository on the controller's sys.path)
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))

from eagle3ops.extract import hosts as shares
from eagle3ops.plain_values import host_var, plain, run_step


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("step", "hosts", "reassign_from", "reassign_ranks"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        self._vars = task_vars or {}
        args = plain(dict(self._task.args))
        self._hosts = list(args.get("hosts") or [])
        self._lost_hosts = list(args.get("reassign_from") or [])
        return run_step(
            result, {"share": self._share, "conflicts": self._conflicts, "summary": self._summary}, args
        )

    def host_var(self, host, name, default=None):
        return host_var(self._vars, host, name, default)

    def _share(self, args):
        counts = [
            shares.worker_count(self.host_var(h, "extract_host_workers", self.host_var(h, "extract_workers")))
            for h in self._hosts
        ]
        unknown = [h for h, n in zip(self._hosts, counts, strict=True) if n is None]
        if unknown:
            return {
                "failed": True,
                "msg": f"extract: the worker counts of {', '.join(unknown)} are unknown (failed or unreachable before "
                "this task), and every host's share depends on them. Bring them back and re-run, or set "
                "extract_workers to a number for them in the inventory (their ranks then wait for them while the "
                "others extract theirs, or, named in extract_reassign_from, go to the others). Taking a host out of "
                "extract_shard_hosts moves every share and is refused by the stores already started "
                "(docs/scale.md, 'Changing the hosts').",
            }
        here = shares.share(self._hosts, counts, self._vars["inventory_hostname"])
        lost = shares.lost_ranks(self._hosts, counts, self._lost_hosts)
        return {
            **here,
            "counts": counts,
            "reassign_ranks": lost,
            "msg": f"ranks from {here['first_rank']} of {here['world_size']}",
        }

    def _conflicts(self, args):
        records = {}
        for h in self._hosts:
            slurp = self.host_var(h, "extract_shard_slurp") or {}
            records[h] = json.loads(base64.b64decode(slurp["content"])) if "content" in slurp else None
        ranks = args.get("reassign_ranks") or []
        found = shares.reassign_conflicts(records, ranks)
        if found:
            return {
                "failed": True,
                "msg": f"{'; '.join(found)}, but this run re-assigns {sorted(ranks) if ranks else 'none'} "
                f"(extract_reassign_from: {', '.join(self._lost_hosts) or 'none'}): the lost host would extract "
                "those rows again, or they would move. Run with the same extract_reassign_from as then; after a "
                "further loss gather the stores into one and finish it with one host (docs/scale.md, 'Changing the "
                "hosts'). Nothing was extracted.",
            }
        return {"msg": "no store keeps another re-assignment"}

    def _summary(self, args):
        data_dir = self._vars.get("extract_data_dir")
        per_host = {
            h: {
                "result": self.host_var(h, "extract_result") or {},
                "waited": self.host_var(h, "extract_waited") or {},
                "plan": self.host_var(h, "extract_plan") or {},
                "world_size": self.host_var(h, "extract_shard_world_size", "?"),
                "data_dir": self.host_var(h, "extract_data_dir", plain(self._templar.template(data_dir))),
            }
            for h in self._hosts
        }
        lines = shares.run_summary(
            self._hosts,
            per_host,
            self._lost_hosts,
            args.get("reassign_ranks") or "?",
            reachable=plain(self._vars.get("ansible_play_hosts", [])),
            check_mode=bool(self._task.check_mode or self._play_context.check_mode),
        )
        return {"msg": lines, "_ansible_verbose_always": True}  # printed as ansible.builtin.debug prints
