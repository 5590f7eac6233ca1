#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_sglang_patch
short_description: Apply or restore (byte-exact) the eagle3ops hidden-state capture patch in SGLang
description:
  - Manages the few lines eagle3ops adds to SGLang's C(sglang/srt/models/deepseek_v2.py) so that a server started
    with C(EAGLE3OPS_SGLANG_DUMP_DIR) writes EAGLE-3 training hidden states (all logic lives in
    C(eagle3ops.sglang_hook)); the same model class serves DeepSeek-V3/R1 and Kimi-K2/K2.5.
  - Before changing anything it checks the file's sha256 against the SGLang version the patch was written for,
    and refuses any other file with a message naming the file, the found and the expected sha256.
  - C(state=present) keeps a verified copy of the pristine file next to it (C(deepseek_v2.py.eagle3ops-pristine));
    C(state=absent) puts the pristine file back byte-exact (sha256 checked; from the copy, or by reversing the
    hunks when the copy is gone). Both are idempotent.
  - The patch state is always returned as the fact C(eagle3ops_sglang_patch).
  - Runs C(eagle3ops sglang-patch) on the target (installed by the C(runtime) phase).
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.diff
options:
  state:
    description:
      - C(present) applies the patch, C(absent) restores the pristine file, C(query) only reports.
    type: str
    choices: [present, absent, query]
    default: present
  path:
    description:
      - The C(deepseek_v2.py) to manage. Give this, I(python) or I(site_packages).
    type: path
  python:
    description:
      - The SGLang venv's interpreter; the file is found through it without importing SGLang (no GPU needed).
    type: path
  site_packages:
    description: A directory that holds C(sglang/).
    type: path
  sglang_version:
    description: The SGLang version the patch entry is for.
    type: str
    default: "0.5.23"
notes:
  - The C(extract) phase (C(extract_backend=sglang)) restores the file with this module (C(state=absent)) when
    extraction finishes; the C(sglang) phase applies it only while extraction has rows left. Serving a draft needs
    the pristine file.
  - Ansible overwrites a top-level C(state) with file information whenever a result has C(path); read the patch
    state from I(patch_state) or the fact C(eagle3ops_sglang_patch.state).
"""

EXAMPLES = r"""
- name: Apply the capture patch in the SGLang venv
  eagle3ops_sglang_patch:
    python: /opt/eagle3ops/sglang-venv/bin/python
    state: present

- name: Restore SGLang byte-exact
  eagle3ops_sglang_patch:
    python: /opt/eagle3ops/sglang-venv/bin/python
    state: absent

- name: Only read the state
  eagle3ops_sglang_patch:
    path: /opt/eagle3ops/sglang-venv/lib/python3.11/site-packages/sglang/srt/models/deepseek_v2.py
    state: query
"""

RETURN = r"""
path:
  description: The managed file.
  returned: always
  type: str
state:
  description:
    - Ansible's file information for I(path) (C(file)), which AnsibleModule writes over the patch state; the patch
      state (C(pristine), C(applied) or C(unknown) after the task, predicted in check mode) is
      I(patch_state) (and C(ansible_facts.eagle3ops_sglang_patch.state)).
  returned: always
  type: str
patch_state:
  description: The patch state after the task (predicted in check mode) - C(pristine), C(applied) or C(unknown).
  returned: always
  type: str
  sample: applied
applied:
  description: Whether the capture patch is in the file after the task (predicted in check mode).
  returned: always
  type: bool
sha256:
  description: The file's sha256 after the task (in check mode, its current sha256).
  returned: always
  type: str
pristine_sha256:
  description: The upstream file's sha256 for I(sglang_version).
  returned: always
  type: str
patched_sha256:
  description: The patched file's sha256 for I(sglang_version).
  returned: always
  type: str
backup:
  description: The kept pristine copy, when present and verified.
  returned: always
  type: str
ansible_facts:
  description: C(eagle3ops_sglang_patch) with I(path), I(state), I(applied), I(sha256), I(sglang_version).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner
from ansible.module_utils.eagle3ops_extract_options import SGLANG_PATCH


def main():
    module = AnsibleModule(
        argument_spec=SGLANG_PATCH.argument_spec(),
        required_one_of=SGLANG_PATCH.one_of(),
        mutually_exclusive=SGLANG_PATCH.one_of(),
        supports_check_mode=True,
    )
    p = module.params
    action = {"present": "apply", "absent": "restore", "query": "status"}[p["state"]]
    # status writes nothing: no --check, no diff
    writes = action != "status"
    result = CliRunner(module, SGLANG_PATCH).run(
        check=module.check_mode and writes, action=action, diff=bool(module._diff and writes)
    )
    changed = bool(result.pop("changed", False))
    diff_text = result.pop("diff", None)
    sha_before = result.get("sha256")
    if changed and module.check_mode:  # report the state the task would leave
        result["state"] = "applied" if action == "apply" else "pristine"
        result["sha256"] = sha_before
    fact = {k: result.get(k) for k in ("path", "state", "applied", "sha256", "sglang_version", "backup")}
    fact["applied"] = result["state"] == "applied"
    out = {
        "changed": changed,
        "ansible_facts": {"eagle3ops_sglang_patch": fact},
        **{k: v for k, v in result.items() if k not in ("check_mode", "action")},
        # `state` itself is overwritten by AnsibleModule's file info (the result has `path`)
        "patch_state": result["state"],
        "applied": fact["applied"],
    }
    if changed and diff_text:
        out["diff"] = {"prepared": diff_text}
    module.exit_json(**out)


if __name__ == "__main__":
    main()
