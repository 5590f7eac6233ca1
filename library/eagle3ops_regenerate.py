#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_regenerate
short_description: Replace every assistant turn of the training conversations by the target model's own answer
description:
  - Runs C(eagle3ops regenerate) on the target host (the C(regenerate) phase, before C(prepare)). Each
    conversation's assistant turns are regenerated turn by turn; turn k is asked with the earlier assistant
    turns already replaced by the target's answers.
  - Backends - C(transformers) (the model in the eagle3ops process, left-padded batches, CPU or GPU) or
    C(openai) (an OpenAI-compatible C(/v1/chat/completions), e.g. the SGLang server; several I(urls) share the
    conversations).
  - Writes I(out) (JSONL, the inputs' schema and order, what C(prepare) reads), I(out)C(.failures) (every input
    row left out, as C(file:line), kind and reason) and the resume state I(out)C(.regenerate/). Resumable after a
    kill at any point, never a lost or doubled conversation. The same inputs and settings with I(out) complete
    means C(changed=false). Changed inputs or settings are refused unless I(force).
  - Its own files are never trusted blindly - I(out) is read back before it is put in place (I(num_readable));
    an existing I(out) with lines that are not exactly one record (an older eagle3ops wrote U+2028 raw) is
    rewritten, and unreadable C(done.log) lines are moved aside and their conversations regenerated; both are
    C(changed) with a warning and a count.
  - Check mode writes nothing and contacts no server; it predicts C(changed) and the conversations and answers left.
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.diff
options:
  model:
    description: The target - a local model directory (C(transformers)), or the path/name the server serves (C(openai)).
    type: str
    required: true
  inputs:
    description: Conversation sources (ShareGPT or OpenAI-style messages; JSONL/JSON files, directories of them, saved HF dataset directories).
    type: list
    elements: path
    required: true
  out:
    description: The regenerated conversations (a JSONL file).
    type: path
    required: true
  backend:
    description: Where the answers come from.
    type: str
    choices: [transformers, openai]
    default: transformers
  urls:
    description: C(openai) backend - base URLs of the servers (conversations are spread over them, round-robin).
    type: list
    elements: str
    default: [http://127.0.0.1:30000]
  served_model_name:
    description: C(openai) backend - the request's C(model) field (default I(model)).
    type: str
  max_new_tokens:
    description: Tokens per answer at most.
    type: int
    default: 512
  temperature:
    description: Sampling temperature; C(0) is greedy.
    type: float
    default: 0.0
  top_p:
    description: Nucleus sampling (with I(temperature) above 0).
    type: float
    default: 1.0
  seed:
    description: Sampling seed.
    type: int
    default: 0
  system:
    description: Keep the system turns, or drop them (from the prompts and the output).
    type: str
    choices: [keep, drop]
    default: keep
  think:
    description: Keep the answers' reasoning (C(<think>) blocks, a server's C(reasoning_content)) or strip it.
    type: str
    choices: [keep, strip]
    default: keep
  concurrency:
    description: Conversations in flight - requests (C(openai)) or the generation batch (C(transformers)).
    type: int
    default: 8
  retries:
    description: C(openai) - retries of a request that failed with 408/429/5xx, a connection error or a timeout.
    type: int
    default: 3
  backoff:
    description: C(openai) - the first retry's delay in seconds (doubled each retry, with jitter).
    type: float
    default: 1.0
  backoff_max:
    description: C(openai) - the longest retry delay in seconds.
    type: float
    default: 30.0
  request_timeout:
    description: C(openai) - seconds a request may take.
    type: float
    default: 600.0
  health_timeout:
    description: C(openai) - seconds to wait for every server to answer C(GET /v1/models).
    type: float
    default: 60.0
  limit:
    description: Regenerate only the first this many usable conversations.
    type: int
  on_error:
    description:
      - C(fail) - rows that cannot be regenerated refuse the run before any generation, and conversations whose
        generation failed fail it after the rest are done (kept for the re-run; I(out) is not written).
      - C(skip) - both are left out of I(out) and listed in the result and I(out)C(.failures).
    type: str
    choices: [fail, skip]
    default: fail
  force:
    description: Inputs or settings changed since the conversations in I(out)C(.regenerate/) were made - discard them and redo.
    type: bool
    default: false
  device:
    description: C(transformers) - C(auto), C(cpu), C(cuda), C(cuda:N).
    type: str
    default: auto
  dtype:
    description: C(transformers) - the model's dtype (C(auto) - bfloat16 on a GPU, float32 on the CPU).
    type: str
    choices: [auto, float32, bfloat16, float16]
    default: auto
  threads:
    description: C(transformers) on the CPU - torch's intra-op threads (C(0) - torch's default; C(1) is fastest for tiny models on a shared box).
    type: int
    default: 0
  trust_remote_code:
    description: Let the model run its own code. Only for trusted model directories.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Regenerate the answers with the SGLang server of the pipeline
  eagle3ops_regenerate:
    model: /data/models/Kimi-K2.5
    inputs: [/data/eagle3/conversations/sharegpt.jsonl]
    out: /data/eagle3/conversations/regenerated.jsonl
    backend: openai
    urls: [http://127.0.0.1:30000]
    max_new_tokens: 2048
    think: strip
    concurrency: 64
    on_error: skip

- name: Regenerate on the CPU with transformers (small models)
  eagle3ops_regenerate:
    model: /srv/models/SmolLM2-135M-Instruct
    inputs: [/srv/data/sharegpt.json]
    out: /srv/data/regenerated.jsonl
    limit: 200
    max_new_tokens: 128
"""

RETURN = r"""
num_written:
  description: Conversations in I(out).
  returned: success
  type: int
num_failed:
  description: Conversations whose generation failed (retried on the next run).
  returned: success
  type: int
num_skipped:
  description: Input rows that cannot be regenerated (C(num_written + num_failed + num_skipped == num_input)).
  returned: success
  type: int
num_input:
  description: Input rows read (up to the I(limit)-th usable one).
  returned: always
  type: int
failures:
  description: Every input row left out - C(index) (its position in the inputs), C(loc) (C(file:line)), C(kind) (C(skipped) or C(failed)), C(reason).
  returned: always
  type: list
  elements: dict
up_to_date:
  description: Check mode - I(out) is complete for these inputs and settings (nothing to do).
  returned: check mode
  type: bool
left:
  description: Check mode - conversations still to regenerate.
  returned: check mode
  type: int
turns_left:
  description: Check mode - answers still to generate.
  returned: check mode
  type: int
output_tokens:
  description: Tokens generated by this run.
  returned: success
  type: int
wall_seconds:
  description: Seconds this run spent generating.
  returned: success
  type: float
tok_per_s:
  description: I(output_tokens) / I(wall_seconds).
  returned: success
  type: float
num_readable:
  description: Records of I(out) read back, line by line, the strictest way (one JSON record per line, no raw line-break character such as U+2028 inside) - equal to I(num_written), or the run fails and I(out) is not replaced.
  returned: success
  type: int
unreadable_out_lines:
  description: Lines of an existing I(out) (written by an older eagle3ops, or damaged) that were not exactly one record; I(out) was rewritten from the resume state (C(changed), a warning).
  returned: always
  type: int
unreadable_done_lines:
  description: Lines of the resume state's C(done.log) whose checksum or JSON was wrong (not a kill's torn last line); moved to C(done.log.unreadable), their conversations regenerated (C(changed), a warning).
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner
from ansible.module_utils.eagle3ops_regenerate_options import REGENERATE


def main():
    module = AnsibleModule(argument_spec=REGENERATE.argument_spec(), supports_check_mode=True)
    p = module.params
    result = CliRunner(module, REGENERATE).run()
    for warning in result.pop("warnings", None) or []:
        module.warn(warning)
    if module._diff and result.get("changed"):
        if module.check_mode:
            before = f"{result.get('done', 0)} of {result.get('selected', 0)} conversations regenerated\n"
            after = f"{result.get('selected', 0)} of {result.get('selected', 0)} conversations regenerated\n"
        else:
            before = f"{result.get('resumed', 0)} conversations regenerated before this run\n"
            after = f"{result.get('num_written', 0)} conversations in {p['out']}\n"
            for what in ("unreadable_out_lines", "unreadable_done_lines"):
                if result.get(what):
                    before += f"{result[what]} {what.replace('_', ' ')}\n"
        result["diff"] = {
            "before": before,
            "after": after,
            "before_header": p["out"],
            "after_header": p["out"],
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
