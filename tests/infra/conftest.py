"""testinfra checks of deployed hosts, one file per phase. Run them against any inventory:

    pytest tests/infra --hosts=ansible://gpu_hosts --ansible-inventory=inventory/production

Without ``--hosts`` (the default ``make test`` run) they skip: they check a deployed machine, and the
harness proofs in tests/hosts run them against nspawn hosts they deployed (tests/hosts/test_services.py).
The checks read the phases' variables from the inventory (ansible backend), else the role defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from testinfra.utils import ansible_runner as _ar

REPO = Path(__file__).resolve().parents[2]
INFRA = Path(__file__).resolve().parent


def _run_module_json(self, host, module_name, module_args, get_encoding=None, **options):
    """testinfra's ``AnsibleRunner.run_module`` without ``ansible --tree`` (deprecated, removed in ansible-core
    2.23): the same ad-hoc call, with the ``ansible.posix.json`` stdout callback, read from stdout. testinfra uses
    it for every connection it has no backend of its own for (here: ``proxmox_pct_remote``)."""
    cmd, args = "ANSIBLE_LOAD_CALLBACK_PLUGINS=1 ANSIBLE_STDOUT_CALLBACK=ansible.posix.json ansible", []
    if self.inventory_file:
        cmd += " -i %s"
        args.append(self.inventory_file)
    cmd += " -m %s"
    args.append(module_name)
    if module_args:
        cmd += " --args %s"
        args.append(module_args)
    options_cli, options_args = self.options_to_cli(options)
    if options_cli:
        cmd += " " + options_cli
        args += options_args
    cmd += " %s"
    args.append(host)
    out = _ar.local.run_expect([0, 2, 4, 8], cmd, *args)
    try:
        result = json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"][host]
    except (ValueError, KeyError, IndexError) as e:
        raise RuntimeError(
            f"ansible -m {module_name} on {host}: no JSON result ({e}): {out.stdout[-2000:]}"
        ) from e
    if result.get("skipped"):
        return {"failed": True, "skipped": True, "msg": "Skipped. You might want to try check=False"}
    return result


_ar.AnsibleRunner.run_module = _run_module_json


def pytest_collection_modifyitems(config, items):
    if config.getoption("hosts", default=None):
        return
    skip = pytest.mark.skip(
        reason="tests/infra checks deployed hosts: run `pytest tests/infra --hosts=ansible://<group> "
        "--ansible-inventory=<inventory>` (tests/hosts drives them against nspawn hosts)"
    )
    for item in items:
        if INFRA in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


def role_default(role: str, name: str):
    data = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    return data.get(name)


@pytest.fixture
def phase_var(host):
    """``phase_var("services", "services_units")``: the host's inventory value, else the role default."""
    inv = {}
    if host.backend.NAME == "ansible":
        inv = host.ansible.get_variables()

    def get(role: str, name: str):
        return inv[name] if name in inv else role_default(role, name)

    return get
