#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_extract
short_description: Extract an EAGLE-3 target's hidden states for every prepared row (resumable, crash-safe)
description:
  - Runs C(eagle3ops extract) on the target host. For every row of the prepared Arrow dataset in O(data_dir)
    it writes C(hidden_states/hs_{i}.safetensors) (C(token_ids) [T] and C(hidden_states) [T, K+1, H] - the K aux
    layers, input-of-layer convention, then the pre-norm last layer), the speculators 0.9.0 offline format.
  - Files are written to a temp name, fsynced and renamed; an append-only manifest records finished rows, so a
    re-run after a crash extracts only what is missing. All rows present and valid means C(changed=false).
  - Before writing, the exact bytes still needed are compared with the free space of the data filesystem; the
    task refuses (and writes nothing) when they do not fit with a margin.
  - Check mode loads no weights and writes nothing; it reports how many rows would be extracted and the bytes needed.
  - Long runs work with C(async)/C(poll).
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.no_diff
  - eagle3ops.extract
options:
  model:
    description: Target model directory (transformers format, local).
    type: path
    required: true
  layer_ids:
    description:
      - Aux layer ids. Default C([2, N//2, N-3]) for an N-layer target (Kimi-K2.5 with 61 layers gets C([2, 30, 58])).
    type: list
    elements: int
  dtype:
    description:
      - Stored dtype of the hidden states.
      - C(float8_e4m3fn) halves the bytes; it stores e4m3 plus a float32 scale per token and state
        (C(hidden_states_scales)), which speculators 0.9.0 reads with C(data.hidden_states_backend=fp8).
    type: str
    choices: [bfloat16, float16, float32, float8_e4m3fn]
    default: bfloat16
  device:
    description: C(auto) (CUDA when present), C(cpu), C(cuda), C(cuda:N).
    type: str
    default: auto
  workers:
    description: C(auto) for one worker per visible GPU, or a number of workers (disjoint shards).
    type: str
    default: "1"
  world_size:
    description:
      - Several hosts share the rows (docs/scale.md) - the number of shards over all of them, the sum of every
        host's workers. Needs O(first_rank). Omitted - this host extracts every row (its O(workers) share them).
      - The extract role computes it from the inventory (C(extract_shard_hosts)).
    type: int
  first_rank:
    description:
      - With O(world_size) - this host's workers take the global ranks O(first_rank) ..
        O(first_rank) + workers - 1 (rows C(r), C(r + world_size), ... of each rank C(r)).
      - The store records them in C(hidden_states/shard.json); a later run with other ranks or another world size
        fails naming both (the shards would move and rows be extracted twice).
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
  max_batch_tokens:
    description: Padded tokens per forward batch.
    type: int
    default: 16384
  writer_threads:
    description:
      - Parallel file writers per worker; their fsyncs overlap (4 against 2 - docs/performance.md, "Extraction
        throughput"). Each adds one pinned host buffer of a batch's states.
    type: int
    default: 4
  fsync:
    description: fsync every file before its rename (power-loss safe). Kill-safety does not depend on it.
    type: bool
    default: true
  verify:
    description:
      - How finished files are checked against the disk before resuming. C(size) (cheap, no tensor bytes read)
        checks that each file exists, has the size its manifest line recorded and a safetensors header that
        matches its row. C(checksum) also re-reads every file and compares its content checksum (xxh3-64,
        recorded while writing), as many bytes as the store holds; the role's read-only plan reads them too.
      - Damaged or missing files are reported by row and file (RV(damaged), RV(damaged_files)), moved to
        C(hidden_states/damaged/) (never deleted), their manifest entries dropped, and extracted again.
    type: str
    choices: [size, checksum]
    default: size
  on_model_change:
    description:
      - What to do when the target's weights changed since the store was started (config, file names, sizes,
        modification times, safetensors headers; or content with O(model_hash)).
      - C(refuse) fails with what changed. C(discard) moves C(hidden_states/) aside to
        C(hidden_states.old-<time>) (never deleted) and extracts anew. C(accept) records the weights as they
        are now and resumes (only for changed timestamps/headers of same-named, same-sized files).
    type: str
    choices: [refuse, discard, accept]
    default: refuse
  model_hash:
    description:
      - Compare the target by a hash of every weight byte instead of sizes, mtimes and headers (reads the whole
        model once per run, slow for large models). A copy with new timestamps then resumes.
    type: bool
    default: false
notes:
  - Resume never loads tensors; it reads the manifests, checks every listed file's size and safetensors header
    (O(verify=size)), and reads the headers of files that are not in them.
  - C(changed=true) when rows were written, files adopted, damaged files redone (RV(damaged)) or duplicate
    manifest lines collapsed.
"""

EXAMPLES = r"""
- name: Extract hidden states on all GPUs
  eagle3ops_extract:
    data_dir: /data/eagle3/data
    model: /data/models/Kimi-K2.5
    workers: auto
  async: 172800
  poll: 60

- name: SpecForge-style layer ids (layer outputs)
  eagle3ops_extract:
    data_dir: /data/eagle3/data
    model: /data/models/Kimi-K2.5
    layer_ids: [1, 29, 57]
    layer_convention: output
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
  description: Rows already finished before this run (from the manifest).
  returned: always
  type: int
written:
  description: Rows written by this run (0 in check mode).
  returned: always
  type: int
to_extract:
  description: Rows that would be extracted (check mode).
  returned: check mode
  type: int
bytes_needed:
  description: Exact bytes the remaining rows need (check mode).
  returned: check mode
  type: int
failed:
  description: Rows that failed.
  returned: always
  type: int
tokens:
  description: Tokens written by this run.
  returned: success
  type: int
bytes:
  description: Bytes written by this run.
  returned: success
  type: int
seconds:
  description: Wall time of the run.
  returned: success
  type: float
damaged:
  description: Finished files found damaged or missing (moved aside and re-extracted; in check mode, would be).
  returned: always
  type: int
damaged_files:
  description: Row index -> C(file) and C(reason) of every damaged or missing file.
  returned: always
  type: dict
duplicate_manifest_lines:
  description: Surplus manifest lines (a row recorded more than once by an older run); a real run collapses them.
  returned: always
  type: int
ranks:
  description: The global ranks this host's run covers (with O(world_size)); C([0]) on one host.
  returned: success
  type: list
  elements: int
world_size:
  description: The number of shards over all hosts (1, or this host's workers, on one host).
  returned: success
  type: int
layer_ids:
  description: Aux layer ids used, input-of-layer convention (what the train phase reads).
  returned: always
  type: list
  elements: int
reassigned:
  description: With O(reassign_ranks) (check mode) - C(lost_ranks) and C(survivor_ranks) of the re-assignment.
  returned: check mode with reassign_ranks
  type: dict
importable:
  description: Check mode - rows taken over from a lost host that its readable part (O(reassign_from_data)) holds
    finished; a run copies them instead of extracting them (not counted in RV(to_extract)).
  returned: check mode
  type: int
imported:
  description: Rows taken over from a lost host that this run copied from its readable part, checked.
  returned: success with reassign_from_data
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner, fail_unless_it_fits, with_job_progress
from ansible.module_utils.eagle3ops_extract_options import EXTRACT


def main():
    module = AnsibleModule(
        argument_spec=EXTRACT.argument_spec(),
        supports_check_mode=True,
        required_together=[("world_size", "first_rank")],
    )
    result = with_job_progress(module, CliRunner(module, EXTRACT).run())
    if module.check_mode:
        result.setdefault("written", 0)
        result.setdefault("failed", 0)
        result.setdefault("damaged", 0)
        fail_unless_it_fits(module, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
