"""What an action plugin in action_plugins/ reads from Ansible, as plain Python values: a task's arguments and
hosts' variables arrive as Ansible's lazy containers and tagged strings, which the unit-tested functions the
plugins call should not see. Standard library only: the controller imports it (its venv may hold ansible-core
alone, the plugins then find this package in the checkout)."""

from __future__ import annotations

import json


def plain(value):
    """``value`` as plain JSON types (dict, list, str, int, float, bool, None); anything else as its string."""
    return json.loads(json.dumps(value, default=str))


def host_var(task_vars: dict, host: str, name: str, default=None):
    """The variable ``name`` of another host of the play (``task_vars["hostvars"][host]``, rendered there), plain;
    ``default`` when it has none, or when the host failed before it was set (its hostvars then raise)."""
    try:
        hv = task_vars["hostvars"][host]
        return plain(hv[name]) if name in hv else default
    except Exception:  # a host that failed before the variable was set
        return default


def run_step(result: dict, steps: dict, args: dict) -> dict:
    """An action plugin's ``result`` with what the step its task names returns (``steps``: name -> function of
    the task's arguments; ``changed`` false), or failed naming the steps there are."""
    step = steps.get(args.get("step"))
    if step is None:
        return {
            **result,
            "failed": True,
            "msg": f"step must be one of {', '.join(steps)}, not {args.get('step')!r}",
        }
    result.update(changed=False, **step(args))
    return result
