#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_serve_convert
short_description: Convert a speculators EAGLE-3 draft checkpoint into the layout SGLang serves (0.5.17, 0.5.23)
description:
  - Writes C(config.json) (C(LlamaForCausalLMEagle3), C(draft_vocab_size), C(eagle_config.eagle_aux_hidden_state_layer_ids)
    in SGLang's convention for the target) and C(model.safetensors) (names SGLang's C(llama_eagle3.py) loads, C(d2t)
    as hot tokens) into I(out).
  - Refuses a draft SGLang cannot serve as trained (C(norm_before_residual), a sliding window the server would
    not match, trained embeddings, a draft decoder other than Llama) with a message naming what to change.
  - Idempotent. An output stamped with the same source checkpoint (sha256) and settings is left alone.
  - Runs C(eagle3ops serve-convert) (logic in C(eagle3ops.convert)).
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.no_diff
options:
  checkpoint:
    description: A checkpoint directory, a speculators save path (C(checkpoint_best) or the newest epoch) or a train run directory.
    type: path
    required: true
  out:
    description: Output directory (what C(--speculative-draft-model-path) gets).
    type: path
    required: true
  serve_window:
    description: The C(--speculative-draft-window-size) the server will use; required for a sliding-window draft and must equal its window.
    type: int
  target_arch:
    description: The target's architecture (default the checkpoint's verifier's); picks SGLang's layer-id convention.
    type: str
  sglang_layer_ids:
    description: Ids to write as is into C(eagle_config) (targets outside eagle3ops' convention table).
    type: list
    elements: int
  sglang_version:
    description:
      - The SGLang version that serves the draft (its layer-id rules and draft layout); one of the versions in
        C(eagle3ops.sglang_versions) (0.5.17, 0.5.23); another is refused with that list. Unset, the SGLang
        installed on the host when it is one of them, else 0.5.23; the stamp records the one used.
    type: str
"""

EXAMPLES = r"""
- name: Convert the trained draft
  eagle3ops_serve_convert:
    checkpoint: /data/eagle3/train/run
    out: /data/eagle3/serve/draft
"""

RETURN = r"""
out:
  description: The output directory.
  returned: always
  type: str
checkpoint:
  description: The checkpoint directory that was (or would be) converted.
  returned: always
  type: str
sglang_layer_ids:
  description: The ids written into C(eagle_config.eagle_aux_hidden_state_layer_ids).
  returned: always
  type: list
layer_ids:
  description: The ids the draft was trained on (input of layer i).
  returned: always
  type: list
draft_window_size:
  description: The sliding window the server must be started with, or null.
  returned: always
  type: int
serve_args:
  description: The SGLang flags that serve this draft.
  returned: always
  type: list
config:
  description: The config.json written for SGLang.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner
from ansible.module_utils.eagle3ops_serve_options import CONVERT


def main():
    module = AnsibleModule(argument_spec=CONVERT.argument_spec(), supports_check_mode=True)
    result = CliRunner(module, CONVERT).run()
    result.pop("stamp", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
