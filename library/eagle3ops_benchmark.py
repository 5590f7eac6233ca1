#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_benchmark
short_description: Offline acceptance length of an EAGLE-3 draft, and the benchmark report
description:
  - C(action=acceptance) runs C(eagle3ops benchmark-acceptance) - greedy chain drafting of I(k) tokens by the
    trained draft from the target's own hidden states, verified by the target (transformers), on held-out
    prompts - and writes the result JSON to I(out). Runs again only when the checkpoint, target, prompts or
    settings changed.
  - C(action=guard) runs C(eagle3ops benchmark-spec-probe --min-accept-length) against a running SGLang server
    with a draft - greedy probe prompts, acceptance length = completion tokens / C(spec_verify_ct) - and fails with
    the likely causes when it is below I(min_accept_length), or when C(spec_verify_ct) is missing or zero (the
    draft is not in use). Read-only (C(changed=false)); skipped in check mode.
  - C(action=live) runs C(eagle3ops benchmark-live) - eagle3ops' own load generator against a running SGLang
    server (I(url)), for every named prompt set (I(prompt_sets)) and every I(concurrency) - output tok/s,
    latencies, acceptance length per request and overall - into I(out); measures again only when the prompt
    files, settings or I(server_key) changed. I(plan=true) only predicts (no request is sent).
  - C(action=contamination) runs C(eagle3ops benchmark-contamination) - every prompt of I(prompt_sets) (MT-bench
    both turns) is compared, normalised, with the user turns of I(training_data); found ones fail the task
    (I(contamination_mode=fail)) or are only reported (C(warn)). Read-only apart from the result file I(out).
  - C(action=report) runs C(eagle3ops benchmark-report) - C(report.json), C(report.md) and C(report.png) in
    I(out) from the acceptance result and SGLang's bench results - written only when those inputs changed.
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.no_diff
options:
  action:
    description: What to run.
    type: str
    choices: [acceptance, report, guard, live, contamination]
    required: true
  prompt_sets:
    description: Named prompt files C({name - path}) (held-out JSONL, MT-bench question.jsonl); C(live), C(contamination).
    type: dict
  mtbench_turns:
    description: MT-bench C(first) turns only, or C(both) as a two-turn conversation; C(live) only.
    type: str
    choices: [first, both]
    default: first
  concurrency:
    description: Requests in flight, one run each; C(live) only.
    type: list
    elements: int
    default: [1, 8]
  num_requests:
    description:
      - Requests per prompt set and concurrency - the first N prompts, repeated when the set is smaller; default
        each prompt once. C(live) only.
    type: int
  time_budget:
    description: Seconds per run after which no new request starts; C(live) only.
    type: float
    default: 600
  request_timeout:
    description: Seconds per request; C(live) only.
    type: float
    default: 600
  ignore_eos:
    description: Always generate I(max_new_tokens) tokens; C(live) only.
    type: bool
    default: false
  template_model:
    description: Render prompts with this model's chat template; C(live) only.
    type: path
  label:
    description: C(with_draft) or C(without_draft); C(live) only.
    type: str
    default: with_draft
  server_key:
    description: Identity of the measured server (its command line); a new one measures again; C(live) only.
    type: str
    default: ""
  plan:
    description: Only predict whether I(action=live) would measure (C(changed)); nothing is sent or written.
    type: bool
    default: false
  training_data:
    description: Training conversations (JSONL files, directories, saved HF datasets); C(contamination) only.
    type: list
    elements: path
    default: []
  contamination_mode:
    description: C(fail) the task when a benchmark prompt is in the training data, or C(warn); C(contamination) only.
    type: str
    choices: [fail, warn]
    default: fail
  live_with:
    description: C(benchmark-live) result of the server with the draft; C(report) only.
    type: path
  live_without:
    description: C(benchmark-live) result of the server without the draft; C(report) only.
    type: path
  contamination:
    description: C(benchmark-contamination) result; C(report) only.
    type: path
  url:
    description: The SGLang server's base URL; C(guard) only.
    type: str
  min_accept_length:
    description: The guard's floor for the acceptance length; C(guard) only.
    type: float
    default: 1.3
  chat_template:
    description:
      - The target's model directory whose chat template formats each probe prompt; C(guard) only.
      - An instruct model given a raw prompt may answer EOS at once, and such an answer carries no acceptance
        (SGLang reports C(spec_verify_ct) only after a verify step). Unset, prompts are sent as they are.
    type: path
  out:
    description: The acceptance result file (C(acceptance)) or the report directory (C(report)); required there.
    type: path
  checkpoint:
    description: The speculators checkpoint (dir, save path or train run dir); C(acceptance) only.
    type: path
  target:
    description: The target model directory; C(acceptance) only.
    type: path
  prompts:
    description:
      - Held-out prompts JSONL, not used in training (C(acceptance)); the probe prompts (C(guard); default
        eagle3ops' built-in prompts).
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
  device:
    description:
      - Where the offline measurement runs the target and the draft (C(cuda) is the first visible GPU). C(acceptance)
        only.
    type: str
    choices: [cpu, cuda]
    default: cpu
  dtype:
    description:
      - The offline measurement's dtype; C(bfloat16) is what an SGLang server computes in. Set with I(device), it
        is recorded in the result's inputs (a change re-measures). C(acceptance) only.
    type: str
    choices: [float32, bfloat16]
    default: float32
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
"""

EXAMPLES = r"""
- name: Measure the draft offline
  eagle3ops_benchmark:
    action: acceptance
    checkpoint: /data/eagle3/train/run
    target: /data/models/demo
    prompts: /data/eagle3/demo/heldout.jsonl
    out: /data/eagle3/benchmark/acceptance.json
- name: Fail when the served draft is not accepted (acceptance length below 1.3)
  eagle3ops_benchmark:
    action: guard
    url: http://127.0.0.1:30000
    min_accept_length: 1.3
    limit: 4
- name: Write the report
  eagle3ops_benchmark:
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
measure:
  description: Whether the live benchmark measures (measured) this server - its inputs changed (C(live)).
  returned: when action is live
  type: bool
acceptance_length:
  description: Completion tokens / spec_verify_ct over the probe prompts (C(guard)).
  returned: when action is guard
  type: float
per_request:
  description: The acceptance length of each probe prompt (C(guard)).
  returned: when action is guard
  type: list
  elements: float
paths:
  description: report.json / report.md / report.png.
  returned: when action is report
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_benchmark_options import BENCHMARK
from ansible.module_utils.eagle3ops_cli import CliRunner

REPORT_INPUTS = ("acceptance", "sglang_with", "sglang_without", "live_with", "live_without")


def main():
    module = AnsibleModule(
        argument_spec=BENCHMARK.argument_spec(),
        required_if=[
            ("action", "acceptance", ("checkpoint", "target", "prompts", "out")),
            ("action", "guard", ("url",)),
            ("action", "live", ("url", "out", "prompt_sets")),
            ("action", "contamination", ("prompt_sets",)),
            ("action", "report", ("out",)),
        ],
        supports_check_mode=True,
    )
    p = module.params
    runner = CliRunner(module, BENCHMARK.actions[p["action"]])
    if p["action"] == "live":
        module.exit_json(**runner.run(check=p["plan"] or module.check_mode))
    elif p["action"] == "contamination":
        missing = [
            path
            for path in [*(p["prompt_sets"] or {}).values(), *p["training_data"]]
            if not os.path.exists(path)
        ]
        if module.check_mode and missing:  # the earlier phases of this (check) run would write them
            module.exit_json(
                changed=False,
                msg=f"contamination check after the earlier phases wrote {', '.join(missing)} (check mode)",
            )
        # the command has no check mode: it only reads, and writes its result only outside check mode
        module.exit_json(**runner.run(check=False, out=None if module.check_mode else p["out"]))
    elif p["action"] == "guard":
        if module.check_mode:
            module.exit_json(
                changed=False, skipped=True, msg="the guard probes a running server: not in check mode"
            )
        res = runner.run()
        res["changed"] = False  # read-only: it only sends requests
        module.exit_json(**res)
    elif p["action"] == "report" and not any(p[k] for k in REPORT_INPUTS):
        module.fail_json(
            msg="action=report needs acceptance and/or sglang_with/sglang_without or live_with/live_without result files"
        )
    module.exit_json(**runner.run())


if __name__ == "__main__":
    main()
