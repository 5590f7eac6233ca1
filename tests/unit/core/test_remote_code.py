"""A remote-code target (the Kimi-K2.5-format fixture: auto_map in tokenizer_config.json, config.json and
preprocessor_config.json) through every phase's command without --trust-remote-code (eagle3ops_trust_remote_code):
refused before any work, exit 2, the message naming the variable, nothing written. A tokenizer whose auto_map
file is missing is refused naming the file, with the flag or without it. Real files, the real CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from eagle3ops import remote_code
from eagle3ops.cli import main


@pytest.fixture(scope="module")
def model(kimi) -> str:
    return kimi["model_path"]


def _commands(model: str, conv: str, tmp: Path) -> dict[str, list[str]]:
    """Each phase's command that loads the target's tokenizer or config, with what it would write under ``tmp``."""
    prompts = tmp / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    w = tmp / "written"
    return {
        "prepare": ["prepare", "--model", model, "--input", conv, "--out", str(w)],
        "regenerate": ["regenerate", "--model", model, "--input", conv, "--out", str(w / "r.jsonl")],
        "extract": ["extract", "--data", str(w), "--model", model],
        "extract --check": ["extract", "--data", str(w), "--model", model, "--check"],
        "extract-sglang": ["extract-sglang", "--data", str(w), "--model", model],
        # the plan the extract and sglang roles ask first (check mode) refuses as the run does
        "extract-sglang --check": ["extract-sglang", "--data", str(w), "--model", model, "--check"],
        "train": ["train", "--data", str(w), "--verifier", model, "--run-dir", str(w / "run")],
        "serve-convert": [
            *("serve-convert", "--checkpoint", str(tmp), "--out", str(w / "draft"), "--target", model),
        ],
        "benchmark-spec-probe": [
            *("benchmark-spec-probe", "--url", "http://127.0.0.1:9", "--chat-template", model),
            *("--out", str(w / "probe.json")),
        ],
        # the serve phase's guard as the role calls it with serve_probe_chat_template off: only the tokenizer
        # check loads the target's tokenizer
        "guard": [
            *("benchmark-spec-probe", "--url", "http://127.0.0.1:9", "--tokenizer-model", model),
            *("--data", str(w / "data"), "--min-accept-length", "1.5", "--out", str(w / "guard.json")),
        ],
        "benchmark-live": [
            *("benchmark-live", "--url", "http://127.0.0.1:9", "--set", f"held={prompts}"),
            *("--template-model", model, "--out", str(w / "live.json")),
        ],
        "benchmark-acceptance": [
            *("benchmark-acceptance", "--checkpoint", str(tmp), "--target", model),
            *("--prompts", str(prompts), "--out", str(w / "acc.json")),
        ],
    }


def test_the_fixture_is_remote_code_and_a_plain_target_is_not(model, tmp_path):
    found = remote_code.remote_code(model)
    assert found["tokenizer_config.json"] == ["tokenization_kimi.py"]
    assert "configuration_kimi_k25.py" in found["config.json"]
    assert remote_code.check(model, True) == found
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (plain / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    assert remote_code.check(plain, False) == {}


@pytest.mark.parametrize(
    "name",
    [
        "prepare",
        "regenerate",
        "extract",
        "extract --check",
        "extract-sglang",
        "extract-sglang --check",
        "train",
        "serve-convert",
        "benchmark-spec-probe",
        "guard",
        "benchmark-live",
        "benchmark-acceptance",
    ],
)
def test_every_phase_refuses_a_remote_code_target_without_the_flag(name, model, kimi, tmp_path, capsys):
    argv = _commands(model, kimi["conversations_path"], tmp_path)[name]
    assert main([*argv, "--json"]) == 2
    msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
    assert "eagle3ops_trust_remote_code" in msg and "--trust-remote-code" in msg, msg
    assert "tokenization_kimi.py" in msg or "configuration_kimi_k25.py" in msg, msg
    assert not (tmp_path / "written").exists(), name


def test_a_missing_auto_map_file_is_named(model, kimi, tmp_path, capsys):
    broken = tmp_path / "model"
    shutil.copytree(model, broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "tokenization_kimi.py").unlink()
    out = tmp_path / "data"
    for flag in (["--trust-remote-code"], []):
        argv = ["prepare", "--model", str(broken), "--input", kimi["conversations_path"], "--out", str(out)]
        assert main([*argv, *flag, "--json"]) == 2
        msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
        assert f"{broken / 'tokenization_kimi.py'}: missing" in msg and "tokenizer_config.json" in msg, msg
        assert not out.exists()


def test_benchmark_renders_with_the_remote_template_or_fails_naming_the_model(model, tmp_path, capsys):
    """The benchmark's chat-template step: the remote-code template renders (trust_remote_code as served); a
    template that cannot be rendered is an error naming the model directory, never raw prompts sent instead."""
    from eagle3ops.benchmark import loadgen

    render = loadgen.chat_template_render(model, trust_remote_code=True)
    assert render([{"role": "user", "content": "hi"}]).endswith(
        "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    )
    broken = tmp_path / "model"
    shutil.copytree(model, broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "chat_template.jinja").write_text("{{ raise_exception('this template is broken') }}")
    with pytest.raises(loadgen.LiveError, match="this template is broken") as e:
        loadgen.chat_template_render(str(broken), trust_remote_code=True)
    assert str(broken) in str(e.value)
    probe = ["benchmark-spec-probe", "--url", "http://127.0.0.1:9", "--chat-template", str(broken)]
    out = tmp_path / "probe.json"
    assert main([*probe, "--trust-remote-code", "--out", str(out), "--json"]) == 2
    msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
    assert f"{broken}: the chat template cannot be rendered" in msg and "untemplated" in msg, msg
    assert not out.exists()


def test_serve_refuses_a_remote_code_target_before_converting(model, tmp_path, capsys):
    """serve-convert is the serve phase's first step (the role passes serve_model_path as --target): without
    --trust-remote-code it stops there, before the draft is converted or a server started."""
    out = tmp_path / "draft"
    argv = ["serve-convert", "--checkpoint", str(tmp_path), "--out", str(out), "--target", model, "--json"]
    assert main(argv) == 2
    msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
    assert "eagle3ops_trust_remote_code" in msg and "--trust-remote-code" in msg, msg
    assert not out.exists()
    assert (
        main([*argv[:-1], "--trust-remote-code", "--json"]) == 2
    )  # trusted: on to the checkpoint (none here)
    assert (
        "eagle3ops_trust_remote_code"
        not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
    )


# the benchmark module's actions that never load the target's tokenizer or config
_NO_TARGET = {("eagle3ops_benchmark", "report"), ("eagle3ops_benchmark", "contamination")}


def _module_calls(tasks, where: str):
    """(file, task name, module, its arguments) of every eagle3ops module call in ``tasks``, blocks included."""
    for t in tasks or []:
        if not isinstance(t, dict):
            continue
        for key in ("block", "rescue", "always"):
            yield from _module_calls(t.get(key), where)
        for name, args in t.items():
            if name.startswith("eagle3ops_") and isinstance(args, dict):
                yield where, t.get("name", "?"), name, args


def test_every_role_task_that_loads_the_target_passes_the_flag():
    """Each role's call of a module that has ``trust_remote_code`` (a module that loads the target's tokenizer or
    config) passes it from the role's variable (eagle3ops_trust_remote_code by default), plan and watch calls too:
    a plan run in check mode refuses a remote-code target like the run itself, so a call that leaves the flag out
    stops a Kimi-K2.5 run that set it. YAML merge keys (``<<: *anchor``) count as the task's own arguments."""
    import yaml

    repo = Path(__file__).resolve().parents[3]
    with_flag = {
        p.stem for p in (repo / "library").glob("eagle3ops_*.py") if "\n  trust_remote_code:" in p.read_text()
    }
    assert {"eagle3ops_prepare", "eagle3ops_extract_sglang", "eagle3ops_benchmark"} <= with_flag
    calls, missing = 0, []
    for f in sorted((repo / "roles").glob("*/tasks/*.yml")):
        for where, task, module, args in _module_calls(
            yaml.safe_load(f.read_text()), str(f.relative_to(repo))
        ):
            if module not in with_flag or (module, args.get("action")) in _NO_TARGET:
                continue
            calls += 1
            value = str(args.get("trust_remote_code", ""))
            if not re.fullmatch(r"\{\{ [a-z_]*trust_remote_code \}\}", value):
                missing.append(f"{where}: {task} ({module}): trust_remote_code {value or 'not passed'}")
    assert calls >= 15 and not missing, "\n".join(missing)
