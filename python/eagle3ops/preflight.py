"""The shared role's checks of a play's variables, before any phase runs (roles/eagle3ops/tasks/main.yml, through
the ``eagle3ops_preflight`` action plugin): a relative path in a shared path variable, a number outside its
option's bounds in the phases of this run, a re-assignment of lost hosts that cannot be done.

Each function takes plain values (what the play's variables render to) and returns the problems, one line each
(empty: all right), so a unit test reaches every rule. A bound is the option definition's: the value is read as
the CLI reads it and judged by :meth:`eagle3ops.option_def.Option.problem`, the same rule and words as the CLI's
parser and the modules' (``module_utils/eagle3ops_cli.CliRunner``).

**Standard library only** (the action plugin runs it on the controller, whose venv may hold ansible-core alone).
"""

from __future__ import annotations

import contextlib

from eagle3ops.option_def import _ARG_TYPES, Option


def relative_paths(values: dict, program: str | None = None) -> list:
    """What is wrong with each value (a path or a list of paths) that is not absolute, by the modules' rule
    (:meth:`eagle3ops.option_def.Option.path_problem`); "" and None mean "not set". ``program`` (eagle3ops_bin) may
    also be a bare command name found on PATH."""
    options = {
        name: Option(name, "list", elements="path")
        if isinstance(value, (list, tuple))
        else Option(name, "path")
        for name, value in values.items()
    }
    options["eagle3ops_bin"] = Option("eagle3ops_bin", "path", command=True)
    values = {**values, "eagle3ops_bin": program}
    return [f"{name}: {why}" for name, o in options.items() if (why := o.path_problem(values[name]))]


def run_phases(phases, *, preflight: bool, run_tags, skip_tags, play_roles) -> list:
    """The phases whose variables this play checks: in site.yml's preflight play every phase of the run (by its
    tags: all of them for 'all', those named else, less the skipped ones); in a phase's play, its own roles."""
    phases = list(phases)
    if preflight:
        chosen = phases if "all" in run_tags else [p for p in phases if p in run_tags]
        return [p for p in chosen if p not in skip_tags]
    return [p for p in dict.fromkeys(play_roles) if p in phases]


def bound_option(variable: str, bounds: dict) -> Option:
    """The option a row of the bounds table (roles/eagle3ops/vars/main.yml, written from the definitions by
    ``make options``) stands for."""
    return Option(
        variable,
        bounds["type"],
        minimum=bounds.get("minimum"),
        maximum=bounds.get("maximum"),
        above=bounds.get("above"),
        words=bounds.get("words", ()),
    )


def bound_problem(variable: str, bounds: dict, value) -> str | None:
    """What is wrong with ``value`` of the role variable (None: all right, or not set: "" or null). A string (an
    extra var, ``-e train_epochs=-1``) is read as the CLI reads its flag's text."""
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    option = bound_option(variable, bounds)
    if isinstance(value, str) and option.type != "str":
        with contextlib.suppress(ValueError):  # not a number: the rule below names it
            value = _ARG_TYPES[option.type](value.strip())
    why = option.problem(value)
    return f"{variable}: {why}" if why else None


def out_of_bounds(table: dict, values: dict) -> list:
    """The problems of ``values`` ({variable: value}, those the play sets) against ``table`` ({variable: bounds}
    of the phases checked)."""
    return [why for name in sorted(table) if (why := bound_problem(name, table[name], values.get(name)))]


def reassign_problems(reassign_from, reassign_data, shard_hosts) -> list:
    """What makes a re-assignment of lost hosts' rows (docs/scale.md, "A host that stays lost") impossible: a name
    not among the hosts sharing the rows, every one of them named, a single host, a readable part given for a host
    that is not re-assigned or at a relative path."""
    bad = []
    hosts = list(shard_hosts)
    lost = []
    if isinstance(reassign_from, (str, dict)) or reassign_from is None:
        bad.append(f"extract_reassign_from must be a list of host names, not {_shown(reassign_from)}")
    else:
        lost = list(reassign_from)
        unknown = [h for h in lost if h not in hosts]
        if unknown:
            bad.append(
                f"extract_reassign_from names {', '.join(unknown)}, not among the hosts that share the rows "
                f"(extract_shard_hosts: {', '.join(hosts)})"
            )
        elif lost and all(h in lost for h in hosts):
            bad.append(
                f"extract_reassign_from names every host that shares the rows ({', '.join(hosts)}): nobody would "
                "be left to take them; re-assign only the lost ones, the others resume when back"
            )
        elif lost and len(hosts) < 2:
            bad.append("extract_reassign_from needs several hosts sharing the rows (extract_shard_hosts)")
    if not isinstance(reassign_data, dict):
        bad.append(
            f"extract_reassign_data must map a lost host to its data directory, not {_shown(reassign_data)}"
        )
    else:
        extra = [h for h in reassign_data if h not in lost]
        if extra:
            bad.append(
                f"extract_reassign_data names {', '.join(extra)}, not re-assigned (extract_reassign_from: "
                f"{', '.join(lost) or 'none'})"
            )
        bad += [
            f"extract_reassign_data[{h}] = {d} is not an absolute path"
            for h, d in reassign_data.items()
            if not str(d).startswith("/")
        ]
    return bad


def _shown(value) -> str:
    import json

    return json.dumps(value, default=str)
