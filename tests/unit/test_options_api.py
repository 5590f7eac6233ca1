"""The Python API's defaults (issue 19, (g) of tests/unit/test_options.py): the functions and settings classes the
commands call (``prepare()``, ``ExtractConfig``, ``TrainSpec``, ``ensure_free()``, ...) have the definition's
defaults, or a reason beside the one that differs; named constants of the logic equal the definition's.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from options_defs import COMMANDS

# ---- (g) the Python API's defaults -------------------------------------------------------------------
# The functions and settings classes the commands call keep their own defaults (a caller from Python, a test, a
# bench script gets them); here they must equal the definition's (the CLI's), or differ for the reason given.
# ExtractConfig, TrainSpec, RegenerateConfig and prepare() read theirs from the definition (``_D =
# EXTRACT.defaults()``: issue 33), so for them the check holds by construction; it stays, for the fields that
# still write a value and for the other APIs.


def _api_defaults(api) -> dict:
    """{parameter: default} of a function, or of a dataclass's fields (factories called)."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(api):
        out = {}
        for f in dataclasses.fields(api):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    return {
        n: p.default
        for n, p in inspect.signature(api).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def _api(dotted: str):
    mod, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(mod), name)


# (API, command, {API name: option name} where they differ, {API name: why its default differs})
API_DEFAULTS = [
    ("eagle3ops.prepare.dataset.prepare", "prepare", {}, {}),
    (
        "eagle3ops.extract.session.ExtractConfig",
        "extract",
        {"data_dir": "data", "model_path": "model", "margin_frac": "margin"},
        {
            "world_size": "the option's None means one worker: the command passes world_size or 1",
            "rank": "the option's None means rank 0 (or --first-rank's ranks): the command passes rank or 0",
        },
    ),
    (
        "eagle3ops.sglang.client.SGLangExtractConfig",
        "extract-sglang",
        {"data_dir": "data", "model_path": "model", "margin_frac": "margin"},
        {},
    ),
    ("eagle3ops.regenerate.config.RegenerateConfig", "regenerate", {}, {}),
    (
        "eagle3ops.gpu_free.check.ensure_free",
        "gpu-free",
        {
            "timeout_s": "timeout",
            "poll_s": "poll_interval",
            "grace_s": "stop_grace",
            "v1_allowance_mib": "v1_reserved_allowance_mib",
        },
        {"gpus": "None selects every GPU, the option's ['all'] too"},
    ),
    ("eagle3ops.train.spec.TrainSpec", "train", {"extra": "extra_config"}, {}),
    ("eagle3ops.serve.convert.convert", "serve-convert", {}, {}),
    ("eagle3ops.benchmark.acceptance.run", "benchmark-acceptance", {}, {}),
    ("eagle3ops.host.storage.plan", "storage plan", {}, {}),
    ("eagle3ops.demo.build_demo", "demo", {}, {}),
]


@pytest.mark.parametrize(
    ("api", "name", "renamed", "differs"), API_DEFAULTS, ids=[a[0] for a in API_DEFAULTS]
)
def test_the_python_api_defaults_are_the_definitions(api, name, renamed, differs):
    cmd = COMMANDS[name]
    opts = {o.name: o for o in cmd.options}
    compared, problems = 0, []
    for param, default in _api_defaults(_api(api)).items():
        o = opts.get(renamed.get(param, param))
        if o is None or param in differs:
            continue
        compared += 1
        if default != o.default and not (isinstance(o.default, list) and list(default or ()) == o.default):
            problems.append(
                f"{api}({param}={default!r}): the definition's {o.name} defaults to {o.default!r}"
            )
    assert compared, f"{api}: no parameter maps to an option of {name}"
    assert not problems, "\n".join(problems)
    for param in differs:  # a documented difference must still be one (else the reason is stale)
        o = opts[renamed.get(param, param)]
        assert _api_defaults(_api(api))[param] != o.default, (
            f"{api}({param}): the same default now; drop the reason"
        )


def test_the_named_constants_are_the_definitions():
    """Constants the logic uses for a default the definition also states."""
    from eagle3ops.gpu_free import nvml
    from eagle3ops.train import options as train_options
    from eagle3ops.train import spec

    assert (
        COMMANDS["gpu-free"].option("v1_reserved_allowance_mib").default
        == nvml.DEFAULT_V1_RESERVED_ALLOWANCE_MIB
    )
    assert spec.DEFAULT_DRAFT_VOCAB == train_options.DEFAULT_DRAFT_VOCAB
    # the plan's loss kernel when none is given is the module's and the role's default
    assert COMMANDS["train"].option("loss_implementation").module_default == "eager"
