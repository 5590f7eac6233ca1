"""``eagle3ops --help`` as a new user reads it: the commands by phase in site.yml's order, each with a one-line
description, no reStructuredText markup, clear names, one name a command.

Real: the parser ``eagle3ops`` builds (every command module registered), the console script as a process.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from eagle3ops import cli
from tinymodels import build_prepared_dataset

REPO = Path(__file__).resolve().parents[3]
EAGLE3OPS = str(Path(sys.executable).parent / "eagle3ops")
RST = re.compile(r"``|:\w+:`|\.\. \w+::")


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _current_names() -> list[str]:
    return [a.dest for a in _subcommands(cli.build_parser())._choices_actions]


def _every_parser():
    """(words, parser, one-line help) of every command, a group's commands included."""
    todo = [((), cli.build_parser(), None)]
    while todo:
        words, parser, line = todo.pop()
        yield words, parser, line
        sub = _subcommands(parser)
        if sub:
            todo += [((*words, a.dest), sub.choices[a.dest], a.help) for a in sub._choices_actions]


def _help() -> str:
    r = subprocess.run([EAGLE3OPS, "--help"], capture_output=True, text=True, env={"COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_help_lists_every_command_once_under_its_phase_in_pipeline_order():
    text = _help()
    names = _current_names()
    listed = re.findall(r"^    (\S+)", text, flags=re.M)
    assert sorted(listed) == sorted(names), "each command once, none missing, no alias"
    assert sorted(_subcommands(cli.build_parser()).choices) == sorted(names), "a command has a second name"
    headings = re.findall(r"^  (\w+): ", text, flags=re.M)
    tags = [t for play in yaml.safe_load((REPO / "site.yml").read_text()) for t in play["tags"]]
    phases = [h for h in headings if h != "tools"]
    assert phases == [t for t in tags if t in phases], "phases out of site.yml's order"
    assert "other" not in headings and headings[-1] == "tools"
    # the table the help is built from names only commands that exist, each once
    in_table = [n for _, _, ns in cli.PHASES for n in ns]
    assert sorted(in_table) == sorted(names)
    # a command sits under the phase whose role runs it
    where = {n: p for p, _, ns in cli.PHASES for n in ns}
    assert (
        where["extract-status"] == where["extract-sglang"] == "extract" and where["serve-convert"] == "serve"
    )
    assert (
        where["assets"] == "runtime"
        and where["sglang-patch"] == "sglang"
        and where["train-status"] == "train"
    )


def test_every_command_has_a_one_line_help_and_a_description_without_markup():
    seen = 0
    for words, parser, line in _every_parser():
        name = " ".join(("eagle3ops", *words))
        if words:
            assert line and "\n" not in line, f"{name}: no one-line help in the command list"
        assert parser.description, f"{name}: its --help has no description"
        texts = [parser.description, line or ""] + [a.help or "" for a in parser._actions]
        for t in texts:
            assert not RST.search(t), f"{name}: reStructuredText markup in {t!r}"
        seen += 1
    # the groups' commands (storage plan, assets fetch, ...) were walked too
    assert seen > len(_current_names())
    assert not RST.search(_help())


def test_an_option_names_no_choice_it_refuses():
    """``extract-sglang --dtype`` once said float8_e4m3fn in its help, which its choices refused (the SGLang hook
    wrote three dtypes then): an option's help names none of the values the same option takes elsewhere but not
    here."""
    by_dest: dict[str, set] = {}
    options = []
    for words, parser, _ in _every_parser():
        for a in parser._actions:
            if a.choices and not isinstance(a, argparse._SubParsersAction):
                by_dest.setdefault(a.dest, set()).update(map(str, a.choices))
                options.append((words, a))
    assert "float8_e4m3fn" in by_dest["dtype"]  # the transformers backend takes it
    for words, a in options:
        refused = by_dest[a.dest] - set(map(str, a.choices))
        named = sorted(v for v in refused if re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", a.help or ""))
        assert not named, (
            f"eagle3ops {' '.join(words)} {a.option_strings}: its help names {named}, refused here"
        )


def test_a_command_answers_and_an_unknown_one_lists_current_names(tmp_path):
    """Real processes: ``eagle3ops extract-status`` answers; a mistyped command lists the current names."""
    data = build_prepared_dataset(tmp_path / "data", [5, 7, 3])
    r = subprocess.run(
        [EAGLE3OPS, "extract-status", "--data", str(data), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["done"], out["rows"]) == (0, 3), out
    r = subprocess.run([EAGLE3OPS, "extract-stats"], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "invalid choice: 'extract-stats'" in r.stderr, r.stderr
    choices = [c.strip() for c in r.stderr.split("choose from", 1)[1].strip().rstrip(")").split(",")]
    assert sorted(choices) == sorted(_current_names()), choices
