# The host wing's modules (storage, services: they run on a host without eagle3ops and call the wing directly)
# share one shape: the AnsibleModule from the module's options definition, one call into the wing, the wing's
# error as fail_json with its message and details. That shape lives here once.
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule


def run_host_module(definition, call, errors, context=None, **module_kwargs):
    """Build the module from ``definition`` (``argument_spec()``; every eagle3ops module supports check mode and
    predicts its change there), run ``call(module)`` and exit with the dict it returns; an exception of the
    classes ``errors`` fails the task with its message (prefixed by ``context(params)`` when given) and the
    error's ``details`` (what was found: the wing's errors carry them)."""
    module = AnsibleModule(
        argument_spec=definition.argument_spec(), supports_check_mode=True, **module_kwargs
    )
    refuse_bad_values(module, definition)
    try:
        result = call(module)
    except errors as e:
        msg = f"{context(module.params)}: {e}" if context else str(e)
        module.fail_json(msg=msg, **(getattr(e, "details", None) or {}))
    module.exit_json(**result)


def refuse_bad_values(module, definition):
    """Fail before anything runs on a value the definition does not allow (out of bounds, a relative path):
    ``Command.problems``, as CliRunner does for the modules that run the CLI."""
    problems = definition.problems(module.params)
    if problems:
        module.fail_json(msg=f"{definition.module}: " + "; ".join(problems), bad_values=problems)
