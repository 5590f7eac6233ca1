# Shared by the modules in library/: run ``eagle3ops <command> ... --json`` on the target and
# return its result. The modules stay thin; the logic lives in python/eagle3ops.
from __future__ import annotations

import json
import os
import shutil

try:  # the controller's tests import the package; the target gets module_utils/eagle3ops_progress.py
    from eagle3ops.progress import async_job_finished
except ImportError:
    from ansible.module_utils.eagle3ops_progress import async_job_finished


def find_executable(module, executable=None):
    if executable and "/" not in executable:
        executable = shutil.which(executable) or executable
    if executable:
        if not os.access(executable, os.X_OK):
            module.fail_json(
                msg=f"{executable} is not an executable eagle3ops; run the runtime phase first "
                "(ansible-playbook site.yml --tags runtime) or fix the executable option."
            )
        return executable
    import sys

    beside = os.path.join(os.path.dirname(sys.executable), "eagle3ops")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("eagle3ops")
    if not found:
        module.fail_json(
            msg="eagle3ops is not installed on this host; run the runtime phase first "
            "(ansible-playbook site.yml --tags runtime) or set the executable option."
        )
    return found


def with_job_progress(module, result):
    """For a poll of a running extraction (the module's ``job_file``): add ``job_finished`` and, while the job runs
    but no extraction holds the data directory (it is starting, or it has released it and its result is being
    written), a progress line saying so. The line is ``progress.line``; the project's callback
    (callback_plugins/eagle3ops_progress.py) prints it at every retry of the polling task."""
    job = module.params.get("job_file")
    if not job:
        return result
    result["job_finished"] = async_job_finished(job)
    if not result["job_finished"] and not result.get("progress"):
        total = result.get("total")
        done = (
            (total or 0) - result.get("to_extract", 0) if total is not None else result.get("done_before", 0)
        )
        what = "every row is done, the job is ending" if total and done >= total else "the run is starting"
        result["progress"] = {
            "done": done,
            "total": total,
            "line": f"extract: {done}/{total} rows; {what} (no run holds the data directory now)",
        }
    result["msg"] = (result.get("progress") or {}).get("line", result.get("msg", ""))
    return result


def fail_unless_it_fits(module, result):
    """Check mode of an extraction (eagle3ops_extract, eagle3ops_extract_sglang): fail the task, with the plan,
    when the rows still to extract would not fit in the data directory's free space."""
    if result.get("to_extract") and not result.get("fits"):
        module.fail_json(
            msg=result.get(
                "does_not_fit"
            )  # the CLI's own reason: the filesystem's or the PVE storage's numbers
            or f"{module.params['data_dir']}: {result['bytes_needed']:,} bytes still to write but only "
            f"{result['free_bytes']:,} free; free space or move the data directory",
            **result,
        )


def run_cli(module, executable, argv, *, env=None, check_rc=True):
    """Run the CLI with --json; return the parsed result dict (fail_json on errors)."""
    exe = find_executable(module, executable)
    cmd = [exe, *argv, "--json"]
    environ = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if env:
        environ.update(env)
    rc, out, err = module.run_command(cmd, environ_update=environ)
    result = None
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
    if result is None:
        module.fail_json(
            msg=f"eagle3ops {argv[0]} exited {rc} without a result; see stderr",
            rc=rc,
            cmd=cmd,
            stderr=err[-4000:],
            stdout=out[-2000:],
        )
    if check_rc and (rc != 0 or result.get("failed")):
        module.fail_json(
            msg=result.get("msg") or f"eagle3ops {argv[0]} failed (exit {rc})",
            rc=rc,
            cmd=cmd,
            stderr=err[-4000:],
            **{k: v for k, v in result.items() if k not in ("msg", "failed")},
        )
    return result


class CliRunner:
    """Runs one ``eagle3ops`` command for a module, its argv built from the command's option definition
    (``eagle3ops.<phase>_options``, shipped as ``module_utils/eagle3ops_<phase>_options.py``): every module
    parameter the definition maps to a CLI option is passed with its value, in the definition's order and
    format (:meth:`eagle3ops.options.Option.argv`); check mode adds ``--check``. The module's own logic (what it
    reads back, diff, fail_json) stays in the module; what the command line is, is not written there.

        runner = CliRunner(module, PREPARE)
        module.exit_json(**runner.run())
    """

    def __init__(self, module, command, executable=None):
        self.module = module
        self.command = command
        self.executable = executable if executable is not None else module.params.get("executable")

    def argv(self, check=None, **overrides):
        """The argv for the module's params (``overrides`` replace some of them); check mode by default when
        the module runs in check mode."""
        params = dict(self.module.params, **overrides)
        self.refuse_bad_values(params)
        return self.command.argv(params, check=self.module.check_mode if check is None else check)

    def refuse_bad_values(self, params=None):
        """Fail the task, before anything runs (check mode too), on a value the definition does not allow: out of
        its option's bounds (``workers: banana``, ``epochs: -1``) or a relative path (``Command.problems``)."""
        problems = self.command.problems(self.module.params if params is None else params)
        if problems:
            self.module.fail_json(
                msg=f"eagle3ops {self.command.name}: " + "; ".join(problems), bad_values=problems
            )

    def run(self, check=None, env=None, check_rc=True, **overrides):
        """Run it; the parsed JSON result (fail_json on a failure, as run_cli)."""
        return run_cli(
            self.module, self.executable, self.argv(check, **overrides), env=env, check_rc=check_rc
        )
