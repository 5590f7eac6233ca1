#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_serve_process
short_description: Run a server (SGLang) as a detached process where PID 1 is not systemd
description:
  - Wraps C(eagle3ops serve-process) (logic in C(python/eagle3ops/serve_process.py)). The server runs in its own
    session (setsid), with a PID file and a log file C(run_dir/name.{pid,log}) and its spec in
    C(run_dir/name.json).
  - C(state=started) is idempotent - the same command line and environment already running gives
    C(changed=false) (its health is still checked); a different one, or a dead process, is (re)started. Then it
    waits for C(GET url/health) = 200; a server that exits or stays unhealthy fails with the last lines of its
    log (a fresh start that never became healthy is stopped again).
  - C(state=stopped) sends SIGTERM to the process group, SIGKILL after I(stop_grace) seconds.
  - The spec comes from I(argv)/I(environment)/I(url), or from I(spec_file) (a JSON object of named specs, as the
    serve role writes it for the benchmark role).
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.diff
options:
  name:
    description: The server's name (its files in I(run_dir)).
    type: str
    required: true
  run_dir:
    description: Directory of the state, PID and log files.
    type: path
    required: true
  state:
    description: C(started), C(stopped), or C(status) (report only).
    type: str
    choices: [started, stopped, status]
    default: started
  argv:
    description: The server command line (a list); not with I(spec_file).
    type: list
    elements: str
  environment:
    description: Environment variables of the server (e.g. C(PYTHONPATH)), added to the module's own.
    type: dict
    default: {}
  url:
    description: The server's base URL; C(started) waits for C(GET url/health) = 200.
    type: str
  stamp:
    description: Free-form identity beyond the command line (the draft's conversion stamp); a change restarts.
    type: str
  spec_file:
    description: JSON file of named specs C({name - {argv, env, url}}); the spec I(name) is used.
    type: path
  health_timeout:
    description: Seconds to wait for C(/health).
    type: float
    default: 600
  interval:
    description: Seconds between C(/health) polls.
    type: float
    default: 2
  stop_grace:
    description: Seconds from SIGTERM to SIGKILL.
    type: float
    default: 60
"""

EXAMPLES = r"""
- name: SGLang with the draft, as a process
  eagle3ops_serve_process:
    name: serve
    run_dir: /data/eagle3/serve/run
    argv: [/usr/bin/python3, -m, sglang.launch_server, --model-path, /data/models/m, --port, "30000"]
    environment: {PYTHONPATH: /tmp/sglsite}
    url: http://127.0.0.1:30000
    health_timeout: 1800
- name: Stop it
  eagle3ops_serve_process:
    name: serve
    run_dir: /data/eagle3/serve/run
    state: stopped
"""

RETURN = r"""
action:
  description: C(none), C(start) or C(restart) (C(started) only).
  returned: when state is started
  type: str
pid:
  description: The server's PID (null when not running).
  returned: always
  type: int
log:
  description: The server's log file.
  returned: always
  type: str
healthy_after_s:
  description: Seconds until C(/health) answered 200.
  returned: when started and not in check mode
  type: float
running:
  description: Whether the server runs (C(status) only).
  returned: when state is status
  type: bool
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner
from ansible.module_utils.eagle3ops_serve_options import SERVE_PROCESS


def main():
    module = AnsibleModule(
        argument_spec=SERVE_PROCESS.argument_spec(),
        mutually_exclusive=[("argv", "spec_file")],
        required_if=[("state", "started", ("argv", "spec_file"), True)],
        supports_check_mode=True,
    )
    p = module.params
    runner = CliRunner(module, SERVE_PROCESS)
    action = {"started": "start", "stopped": "stop", "status": "status"}[p["state"]]
    cli = {"action": action}
    if action == "start" and not p["spec_file"]:
        cli["env_json"] = json.dumps({k: str(v) for k, v in p["environment"].items()})
        cli["argv_json"] = json.dumps(p["argv"])
    before = None
    if action != "status" and module._diff:
        before = runner.run(check=False, action="status")
    res = runner.run(**cli)
    if before is not None and res.get("changed"):
        old = before.get("spec") if before.get("running") else None
        new = res.get("spec") if action == "start" else None
        res["diff"] = {
            "before": (" ".join(old["argv"]) + "\n") if old else "(not running)\n",
            "after": (" ".join(new["argv"]) + "\n") if new else "(not running)\n",
            "before_header": f"{p['name']} (running)",
            "after_header": f"{p['name']} ({p['state']})",
        }
    module.exit_json(**res)


if __name__ == "__main__":
    main()
