#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3_benchmark
short_description: Offline acceptance length of an EAGLE-3 draft, and the benchmark report
description:
  - C(action=acceptance) runs C(eagle3ops benchmark-acceptance) - greedy chain drafting of I(k) tokens by the
    trained draft from the target's own hidden states, verified by the target (transformers), on held-out
    prompts - and writes the result JSON to I(out). Runs again only when the checkpoint, target, prompts or
    settings changed.
  - C(action=report) runs C(eagle3ops benchmark-report) - C(report.json), C(report.md) and C(report.png) in
    I(out) from the acceptance result and SGLang's bench results - written only when those inputs changed.
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
options:
  action:
    description: What to run.
    type: str
    choices: [acceptance, report]
    required: true
  out:
    description: The acceptance result file (C(acceptance)) or the report directory (C(report)).
    type: path
    required: true
  checkpoint:
    description: The speculators checkpoint (dir, save path or train run dir); C(acceptance) only.
    type: path
  target:
    description: The target model directory; C(acceptance) only.
    type: path
  prompts:
    description: Held-out prompts JSONL, not used in training; C(acceptance) only.
    type: path
  k:
    description: Draft tokens per verify step.
    type: int
    default: 3
  max_new_tokens:
    description: Tokens generated per prompt.
    type: int
    default: 64
  limit:
    description: Use only the first N prompts.
    type: int
  baseline:
    description: Also measure a random-token draft (the floor, about 1).
    type: bool
    default: true
  max_target_gb:
    description:
      - Skip the offline measurement (C(too_large) in the result, not a failure) when the target's weights exceed
        this many GiB; it runs the target in float32. C(acceptance) only.
    type: float
  acceptance:
    description: The acceptance result JSON; C(report) only.
    type: path
  sglang_with:
    description: SGLang bench JSONL of the server with the draft; C(report) only.
    type: path
  sglang_without:
    description: SGLang bench JSONL of the server without the draft; C(report) only.
    type: path
  spec_probe:
    description: C(eagle3ops benchmark-spec-probe) result (completion tokens / spec_verify_ct); C(report) only.
    type: path
  executable:
    description: The C(eagle3ops) command (default next to the module's Python, then on E(PATH)).
    type: path
attributes:
  check_mode:
    support: full
    description: Check mode predicts whether the task would change anything, and writes nothing.
  diff_mode:
    support: none
    description: No diff is returned; the result's fields say what changed.
"""

EXAMPLES = r"""
- name: Measure the draft offline
  eagle3_benchmark:
    action: acceptance
    checkpoint: /data/eagle3/train/run
    target: /data/models/demo
    prompts: /data/eagle3/demo/heldout.jsonl
    out: /data/eagle3/benchmark/acceptance.json
- name: Write the report
  eagle3_benchmark:
    action: report
    acceptance: /data/eagle3/benchmark/acceptance.json
    out: /data/eagle3/benchmark
"""

RETURN = r"""
too_large:
  description: True when the offline measurement was skipped for the target's size (see I(max_target_gb)); I(msg) says why.
  returned: when skipped for size
  type: bool
result:
  description: The acceptance result (C(acceptance), when measured or up to date).
  returned: when action is acceptance and not predicted in check mode
  type: dict
report:
  description: The report dict (C(report)).
  returned: when action is report
  type: dict
markdown:
  description: The report's markdown table.
  returned: when action is report
  type: str
paths:
  description: report.json / report.md / report.png.
  returned: when action is report
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import run_cli


def main():
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["acceptance", "report"], "required": True},
            "out": {"type": "path", "required": True},
            "checkpoint": {"type": "path"},
            "target": {"type": "path"},
            "prompts": {"type": "path"},
            "k": {"type": "int", "default": 3},
            "max_new_tokens": {"type": "int", "default": 64, "no_log": False},
            "limit": {"type": "int"},
            "baseline": {"type": "bool", "default": True},
            "max_target_gb": {"type": "float"},
            "acceptance": {"type": "path"},
            "sglang_with": {"type": "path"},
            "sglang_without": {"type": "path"},
            "spec_probe": {"type": "path"},
            "executable": {"type": "path"},
        },
        required_if=[("action", "acceptance", ("checkpoint", "target", "prompts"))],
        supports_check_mode=True,
    )
    p = module.params
    if p["action"] == "acceptance":
        argv = [
            "benchmark-acceptance",
            "--checkpoint",
            p["checkpoint"],
            "--target",
            p["target"],
            "--prompts",
            p["prompts"],
            "--out",
            p["out"],
            "--k",
            str(p["k"]),
            "--max-new-tokens",
            str(p["max_new_tokens"]),
        ]
        if p["limit"]:
            argv += ["--limit", str(p["limit"])]
        if not p["baseline"]:
            argv.append("--no-baseline")
        if p["max_target_gb"]:
            argv += ["--max-target-gb", str(p["max_target_gb"])]
    else:
        argv = ["benchmark-report", "--out-dir", p["out"]]
        for opt in ("acceptance", "sglang_with", "sglang_without", "spec_probe"):
            if p[opt]:
                argv += [f"--{opt.replace('_', '-')}", p[opt]]
        if not (p["acceptance"] or p["sglang_with"] or p["sglang_without"]):
            module.fail_json(
                msg="action=report needs acceptance and/or sglang_with/sglang_without result files"
            )
    if module.check_mode:
        argv.append("--check")
    module.exit_json(**run_cli(module, p["executable"], argv))


if __name__ == "__main__":
    main()
