#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_extract_sglang
short_description: Extract EAGLE-3 hidden states through a patched SGLang server (resumable, crash-safe)
description:
  - Runs C(eagle3ops extract-sglang) on the target - the SGLang backend of the extract phase. The server, started
    from its systemd unit (I(server_unit)) or already running at I(url), carries the eagle3ops capture patch
    (module C(eagle3ops_sglang_patch), role C(sglang)); it writes C(hidden_states/hs_{i}.safetensors) through the
    same store as the transformers backend, byte-for-byte the same format.
  - The client sends every remaining row (from the manifest) to C(/generate) with C(max_new_tokens=1), at most
    I(concurrency) at a time, retries 5xx and timeouts with backoff, waits for C(/health) when the server is
    down, and confirms each row's file (header and token ids). All rows present means C(changed=false).
  - At the end it stops the unit it started and, with I(restore_patch), restores the pristine SGLang file
    byte-exact when no row failed (the extract role does the same with its own C(eagle3ops_sglang_patch) task).
  - Check mode contacts no server and writes nothing; it reports how many rows would be sent and the bytes needed.
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.no_diff
  - eagle3ops.extract
options:
  model:
    description: The target model directory the server serves (its config gives layers and hidden size).
    type: path
    required: true
  url:
    description:
      - Base URLs of this host's capture servers - one, or several (data parallel, e.g. two TP-4 servers on an
        8-GPU node) - the host's rows are split between them, each server with its own
        C(EAGLE3OPS_SGLANG_MANIFEST_RANK) (docs/sglang.md). A single string is one server.
    type: list
    elements: str
    default: [http://127.0.0.1:30000]
  world_size:
    description:
      - Several hosts share the rows (docs/scale.md) - the number of capture servers over all of them. Needs
        O(first_rank). Omitted - this host extracts every row (its servers share them).
      - The extract role computes it from the inventory (C(extract_shard_hosts), one rank per server).
    type: int
  first_rank:
    description:
      - With O(world_size) - this host's servers take the global ranks O(first_rank) .. O(first_rank) + servers - 1,
        in O(url) order (rows C(r), C(r + world_size), ... of each rank C(r)), the transformers backend's shares.
      - The store records them in C(hidden_states/shard.json); a later run with other ranks or another world size
        fails naming both.
    type: int
  reassign_ranks:
    description:
      - On request, the global ranks of lost hosts (docs/scale.md, "A host that stays lost") - their rows are dealt
        over the surviving ranks of O(world_size) (the j-th lost row to the j mod S-th survivor), so every row is
        still extracted exactly once. Needs O(world_size) and O(first_rank); this host's own ranks must not be
        among them.
      - The store records the re-assignment in C(hidden_states/shard.json); a later run with other lost ranks or
        none fails naming them. The extract role computes them from C(extract_reassign_from).
    type: list
    elements: int
  reassign_from_data:
    description:
      - With O(reassign_ranks) - the lost hosts' data directories as readable on this host (their disk mounted, a
        shared path, a copy). The finished rows this host takes over are copied from there into this store, each
        checked against its manifest line (size, content checksum, header), instead of extracted again; the lost
        part is only read.
    type: list
    elements: path
  server_unit:
    description: systemd unit to start before and stop after (role C(sglang) installs C(eagle3ops-sglang-extract)).
    type: str
  keep_server:
    description: Leave I(server_unit) running at the end.
    type: bool
    default: false
  layer_ids:
    description: Aux layer ids (default C([2, N//2, N-3])); must match the server's C(EAGLE3OPS_SGLANG_LAYER_IDS).
    type: list
    elements: int
  dtype:
    description: Stored dtype.
    type: str
    choices: [bfloat16, float16, float32]
    default: bfloat16
  concurrency:
    description: Requests in flight.
    type: int
    default: 8
  request_timeout:
    description: Seconds one C(/generate) may take before it is retried.
    type: float
    default: 600
  retries:
    description: Retries per row (5xx, 408, 429, timeouts, connection errors).
    type: int
    default: 5
  health_timeout:
    description: Seconds to wait for C(/health) (loading a large model takes minutes).
    type: float
    default: 1800
  restore_patch:
    description: The patched C(deepseek_v2.py) to restore when every row is done.
    type: path
  restore_patch_always:
    description: Restore even when rows failed.
    type: bool
    default: false
  sglang_version:
    description:
      - The server's SGLang version; I(restore_patch) is checked against its capture patch.
      - One of the versions in C(eagle3ops.sglang_versions) (0.5.17, 0.5.23); another is refused with that list.
    type: str
    default: "0.5.23"
"""

EXAMPLES = r"""
- name: Extract through SGLang on 8 GPUs, then restore SGLang
  eagle3ops_extract_sglang:
    data_dir: /data/eagle3/data
    model: /data/models/Kimi-K2.5
    server_unit: eagle3ops-sglang-extract
    restore_patch: "{{ eagle3ops_sglang_patch.path }}"
  async: 604800
  poll: 60
"""

RETURN = r"""
job_finished:
  description: With O(job_file) (check mode) - whether the async job running the extraction has ended.
  returned: check mode with job_file
  type: bool
progress:
  description:
    - "Check mode, while a run holds the data directory - how far it is. V(line) is what a poll prints, e.g.
      C(extract: 312/867 rows (35%), 4.1 rows/s, ETA 0:02:15; PID 4242 since ...; log: /data/eagle3/data.extract.log);
      also V(done), V(total), V(rate_per_s) (from the manifests' file times since the run started; null
      before two rows), V(eta_s), V(log) (the run's log beside the data directory)."
  returned: check mode, while a run holds the data directory
  type: dict
running:
  description: Check mode only; another extraction holds this data directory now (its lock).
  returned: check mode
  type: bool
holder:
  description:
    - The run that holds the data directory (pid, cmdline, host, started_at, what), or null; in check mode,
      and on a failure because another run holds it.
  returned: check mode or when running
  type: dict
stale_lock:
  description: The record of a dead run whose lock this run took over, or null.
  returned: success, not in check mode
  type: dict
total:
  description: Rows this run is responsible for.
  returned: always
  type: int
done_before:
  description: Rows finished before this run (manifest).
  returned: always
  type: int
written:
  description: Rows this run confirmed on disk.
  returned: always
  type: int
failed:
  description: Rows that failed (the task fails when any did; re-run to retry them).
  returned: always
  type: int
to_extract:
  description: Rows that would be sent (check mode).
  returned: check mode
  type: int
bytes_needed:
  description: Exact bytes the remaining rows need (check mode).
  returned: check mode
  type: int
tokens:
  description: Tokens written by this run.
  returned: success
  type: int
bytes:
  description: Bytes written by this run.
  returned: success
  type: int
retries:
  description: Requests retried.
  returned: success
  type: int
errors:
  description: Up to 50 failed rows with the reason.
  returned: success
  type: list
  elements: dict
patch:
  description: The restore's result when I(restore_patch) was given and applied.
  returned: when restored
  type: dict
layer_ids:
  description: Aux layer ids used (input-of-layer convention).
  returned: always
  type: list
  elements: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner, fail_unless_it_fits, with_job_progress
from ansible.module_utils.eagle3ops_extract_options import SGLANG_EXTRACT


def main():
    module = AnsibleModule(argument_spec=SGLANG_EXTRACT.argument_spec(), supports_check_mode=True)
    result = with_job_progress(module, CliRunner(module, SGLANG_EXTRACT).run())
    if module.check_mode:
        fail_unless_it_fits(module, result)
    result["changed"] = bool(result.get("changed"))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
