"""What an action plugin in action_plugins/ reads from Ansible, as plain Python values: a task's arguments and
hosts' variables arrive as Ansible's lazy containers and tagged strings, which the unit-tested functions the
plugins call should not see. Standard library only: the controller imports it (its venv may hold ansible-core
alone, the plugins then find this package in the checkout)."""

from __future__ import annotations

import json


def plain(value):
    """``value`` as plain JSON types (dict, list, str, int, float, bool, None); anything else as its string."""
    return json.loads(json.dumps(value, default=str))
