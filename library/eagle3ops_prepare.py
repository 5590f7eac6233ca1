#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_prepare
short_description: Tokenise conversations into speculators' offline training rows (input_ids, loss_mask, seq_len)
description:
  - Runs C(eagle3ops prepare) on the target host. Conversations (JSONL files, a directory of them, or a local
    HF dataset directory) are rendered with the target's chat template into one row per assistant turn with a
    loss mask over that turn, saved as an Arrow dataset in O(out) with C(token_freq.pt) and C(prepare_meta.json).
  - Idempotent by fingerprint (inputs, tokenizer, parameters) - the same fingerprint already in O(out) means
    C(changed=false) and nothing is rewritten. Built in a temp directory and renamed into place.
  - Refuses to replace a dataset whose rows already have extracted hidden states (they would no longer match)
    unless O(force=true).
  - Check mode writes nothing and predicts C(changed).
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.no_diff
options:
  model:
    description: Target model directory whose tokenizer and chat template are used.
    type: path
    required: true
  inputs:
    description: Conversation sources (JSONL file, directory of .json/.jsonl, or a saved HF dataset directory).
    type: list
    elements: path
    required: true
  out:
    description: Output data directory.
    type: path
    required: true
  max_length:
    description: Maximum tokens per row (longer rows are truncated; rows left without supervised tokens are dropped).
    type: int
    default: 2048
  on_error:
    description: C(fail) stops at the first malformed input row (reported as C(file:line)); C(skip) skips and lists them.
    type: str
    choices: [fail, skip]
    default: fail
  max_samples:
    description: Keep at most this many rows.
    type: int
  seed:
    description: Shuffle seed (speculators splits train/val contiguously, so rows are shuffled).
    type: int
    default: 0
  rows:
    description:
      - C(turn) writes one row per assistant turn, the turn's history repeated in it (speculators' own layout).
      - C(conversation) writes one row per conversation with every assistant turn supervised, so the history is
        extracted, stored and trained on once; the supervised tokens are the same. A conversation whose chat
        template renders its history differently from the turns themselves (one that drops earlier reasoning)
        keeps its per-turn rows; RV(rows) counts both kinds.
    type: str
    choices: [turn, conversation]
    default: turn
  workers:
    description: Processes that render the conversations (chat template and tokenizer); the rows do not depend on it.
    type: int
    default: 1
  force:
    description: Replace a dataset even when hidden states were extracted for it.
    type: bool
    default: false
  trust_remote_code:
    description: Let the tokenizer run its own code (Kimi-K2.5's tokenizer needs it). Only for trusted model directories.
    type: bool
    default: false
  lock_wait:
    description:
      - Seconds to wait while another run (an interrupted playbook's prepare or extract) holds O(out); it then
        re-plans, so a finished identical run gives C(changed=false). 0 fails at once, naming the holder.
    type: float
    default: 0
"""

EXAMPLES = r"""
- name: Prepare training rows
  eagle3ops_prepare:
    model: /data/models/Kimi-K2.5
    inputs: [/data/eagle3/conversations/regenerated.jsonl]
    out: /data/eagle3/data
    max_length: 4096
"""

RETURN = r"""
num_rows:
  description: Rows in the prepared dataset.
  returned: success
  type: int
num_tokens:
  description: Tokens over all rows.
  returned: success
  type: int
rows:
  description:
    - The row layout (C(layout)); for C(conversation), C(conversations_merged) (one row) and
      C(conversations_kept_per_turn) (the template re-renders their history).
  returned: success
  type: dict
  sample: {layout: conversation, conversations_merged: 7997, conversations_kept_per_turn: 0}
summary:
  description:
    - One line - the rows, their tokens, how many input conversations gave them, and what was left out on the way
      (assistant turns over O(max_length), rows left without a supervised token, skipped bad rows, rows over
      O(max_samples)). Also the task's C(msg).
  returned: success
  type: str
  sample: "37 rows (7468 tokens, 3310 supervised) from 40 input conversations (31 gave rows); left out: 110
    assistant turns whose context exceeds max_length 256, 0 rows with no supervised token left after truncation,
    0 bad input rows skipped (on_error skip)"
dropped:
  description:
    - What rendering left out - C(turns_context_over_max_length), C(rows_unsupervised_after_truncation).
  returned: success
  type: dict
num_input_rows:
  description: Input conversations read (bad ones included).
  returned: success
  type: int
num_conversations:
  description: Input conversations that gave at least one row.
  returned: success
  type: int
rows_cut_by_max_samples:
  description: Rows left out by O(max_samples).
  returned: success
  type: int
skipped:
  description: Skipped input rows as C(file:line - reason) (C(on_error=skip)).
  returned: success
  type: list
  elements: str
running:
  description: Check mode only; another run (prepare or extract) holds O(out) now.
  returned: check mode
  type: bool
holder:
  description: That run's record (pid, cmdline, host, started_at, what), or null.
  returned: check mode
  type: dict
stale_lock:
  description: The record of a dead run whose lock this run took over, or null.
  returned: success, not in check mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner
from ansible.module_utils.eagle3ops_prepare_options import PREPARE


def main():
    module = AnsibleModule(argument_spec=PREPARE.argument_spec(), supports_check_mode=True)
    result = CliRunner(module, PREPARE).run()
    if result.get("summary"):
        result["msg"] = result["summary"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
