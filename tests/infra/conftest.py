"""testinfra checks of deployed hosts, one file per phase. Run them against any inventory:

    pytest tests/infra --hosts=ansible://gpu_hosts --ansible-inventory=inventory/production

Without ``--hosts`` (the default ``make test`` run) they skip: they check a deployed machine, and the
harness proofs in tests/hosts run them against nspawn hosts they deployed (tests/hosts/test_services.py).
The checks read the phases' variables from the inventory (ansible backend), else the role defaults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = Path(__file__).resolve().parent


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
