#!/usr/bin/python
# Copyright: eagle3ops contributors
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3ops_train
short_description: Train an EAGLE-3 draft with speculators 0.9.0 as an idempotent, detached, resumable run
description:
  - Runs C(eagle3ops train) on the target host. It renders the speculators config (a jinja2 template) into
    O(run_dir)/config.yaml from the options and from the data itself, then starts the trainer detached
    (C(systemd-run --unit=...) where systemd is PID 1, else a C(setsid) process with a PID file), logging to
    O(run_dir)/train.log.
  - The aux layer ids are read from the data directory's C(hidden_states/extract_meta.json), never typed by hand;
    O(layer_ids), when given, must equal them. The draft vocabulary is built from C(token_freq.pt), capped at the
    number of distinct tokens. Defaults are SGLang-servable (C(norm_before_residual=false), full attention).
  - Idempotent by the run directory. A trainer still running (PID alive, command line matching) or a run that
    finished gives C(changed=false). A killed or crashed run is relaunched, and speculators resumes from its last
    checkpoint (an incomplete last checkpoint, cut by a kill during the save, is moved aside first), with C(changed=true).
    A configuration that differs from the run's fails, unless O(restart_on_change).
  - Over several hosts (O(nnodes) > 1) a node belongs to the job named by O(rdzv_id), recorded in its state; a node
    running or finished with another id is stopped if need be and relaunched into this one, resuming from the newest
    checkpoint in its save path. The train role decides the id for every node at once (docs/scale.md).
  - On GPUs it runs C(torchrun --nproc_per_node=<visible GPUs>), after the C(gpu_free) check of eagle3ops.gpu_free. On a
    host without GPUs it trains on CPU (the shim in C(eagle3ops.speculators_shim), pinned to speculators 0.9.0).
  - O(wait=true) blocks until the run ends (or O(timeout)) and returns the final metrics; O(wait=false) returns
    once the trainer is started.
version_added: "0.1.0"
author: eagle3ops developers (@eagle3ops)
extends_documentation_fragment:
  - eagle3ops.diff
options:
  data_dir:
    description: Data directory from prepare + extract (Arrow dataset, C(hidden_states/), C(token_freq.pt)).
    type: path
    required: true
  verifier_path:
    description: The target model directory the hidden states were extracted from.
    type: path
    required: true
  run_dir:
    description: Run directory (state file, rendered config, log, metrics, checkpoints by default).
    type: path
    required: true
  save_path:
    description: Checkpoint directory; default O(run_dir)/checkpoints.
    type: path
  layer_ids:
    description:
      - Only an assertion; the ids come from C(extract_meta.json). A different value fails the task.
    type: list
    elements: int
  draft_vocab_size:
    description: Draft vocabulary size (default 32000), capped at the distinct tokens counted in C(token_freq.pt).
    type: int
  token_freq_path:
    description: Token frequencies; default O(data_dir)/token_freq.pt.
    type: path
  epochs:
    description: Training epochs.
    type: int
    default: 3
  lr:
    description: Learning rate (unset - the trainer's own, speculators 0.001, specforge 0.0001).
    type: float
  ttt_steps:
    description:
      - Test-time-training steps, the draft positions trained (unset - the trainer's own, speculators 3, specforge
        7).
    type: int
  num_layers:
    description: Draft decoder layers.
    type: int
    default: 1
  total_seq_len:
    description: Tokens per packed batch (per process).
    type: int
    default: 8192
  max_steps:
    description: Stop after this many optimizer steps (smoke runs).
    type: int
  checkpoint_freq:
    description: Epochs between checkpoints; below 1 saves within epochs (e.g. 0.25).
    type: float
    default: 1.0
  norm_before_residual:
    description: speculators' own default is true, which SGLang 0.5.23 cannot serve.
    type: bool
    default: false
  attention:
    description:
      - C(full) attention in every draft layer (SGLang's default), or C(sliding) with O(sliding_window); serve a
        sliding-window draft with C(--speculative-draft-window-size) equal to it (returned as C(serve_window_size)).
    type: str
    choices: [full, sliding]
    default: full
  sliding_window:
    description: Window of C(sliding) attention.
    type: int
    default: 2048
  verify:
    description:
      - Before a trainer is launched, C(checksum) compares every hidden-state file's content with the checksum its
        writer recorded in the manifest and fails naming damaged files; only files not verified since they last
        changed are read (a record in C(hidden_states/verified.jsonl) keyed by inode, size, mtime and ctime), so a
        re-run on an unchanged store reads nothing. Check mode reads nothing and returns what would be read
        (C(content_check)).
      - C(size) - only the size + safetensors header check every run makes.
    type: str
    choices: [checksum, size]
    default: checksum
  on_missing:
    description: What the loader does for a sample without hidden states; C(raise) refuses incomplete extraction.
    type: str
    choices: [raise, skip, warn]
    default: raise
  loss_implementation:
    description:
      - speculators' loss kernel. C(eager) by default on every device - speculators 0.9.0's C(fused) KL loss
        failed under torch 2.11's dynamo on an H200 (C(ListVariable ... is already tracked for mutation)); choose
        C(fused) only on a torch where it is known to compile.
    type: str
    choices: [eager, fused]
    default: eager
  draft_attn_impl:
    description: Draft attention; default C(simple_flex_attention) (torch.compile) on GPUs, C(sdpa) on CPU.
    type: str
    choices: [simple_flex_attention, sdpa, eager]
  device:
    description: C(auto) (GPUs when visible), C(cpu) or C(gpu).
    type: str
    choices: [auto, cpu, gpu]
    default: auto
  nproc:
    description: Trainer processes on GPUs; default every visible GPU.
    type: int
  num_workers:
    description: Loader workers per process; default 0 on CPU, up to 12 on GPUs.
    type: int
  nnodes:
    description:
      - Hosts that train one draft together (docs/scale.md) - torchrun C(--nnodes) on each, meeting at a c10d
        rendezvous on O(rdzv_endpoint). The train role sets it from C(train_hosts).
      - Needs GPU hosts; speculators 0.9.0 cannot train over several nodes on CPU (the task fails saying why).
    type: int
    default: 1
  node_rank:
    description: This host's index among the O(nnodes) hosts (0 = the rendezvous host).
    type: int
    default: 0
  rdzv_endpoint:
    description: C(HOST:PORT) of the rendezvous (the first host, reachable from every node), with O(nnodes) > 1.
    type: str
  rdzv_id:
    description:
      - Rendezvous id, the same on every node; default from the path of O(run_dir). It names the job - a node
        that runs (or finished) a job with another id is stopped and relaunched into this one, resuming from the
        newest checkpoint. The train role passes a new id whenever one node has to be restarted.
    type: str
  nic:
    description: Network interface NCCL and gloo use between the nodes (C(NCCL_SOCKET_IFNAME), C(GLOO_SOCKET_IFNAME)).
    type: str
  trainer:
    description:
      - C(speculators); C(specforge) - SpecForge 0.2.0's offline EAGLE-3 trainer on the same extraction (it reads
        the store in place through one pointer file a row, with the same rows, draft vocabulary and layer ids;
        GPU hosts only; C(eagle3ops convert) exports its draft with SpecForge's own exporter); or C(ddp_probe) -
        the minimal DDP job of C(eagle3ops.ddp_probe) (a linear model on the same data, checkpoints and records)
        through the same launcher and rendezvous. It checks a cluster's launch, data and restart in seconds
        before a long run, and it is the only trainer that runs over several CPU hosts.
    type: str
    choices: [speculators, specforge, ddp_probe]
    default: speculators
  extra_config:
    description:
      - Other speculators settings as a mapping of group to a mapping of speculators keys and values (groups
        verifier, draft, data, loss, optimizer, scheduler, trainer). Keys the module manages are refused.
    type: dict
    default: {}
  env:
    description: Extra environment variables for the trainer.
    type: dict
    default: {}
  restart_on_change:
    description: When the configuration changed, stop the run, move its checkpoints aside and start over.
    type: bool
    default: false
  launcher:
    description: C(auto) (systemd when it is PID 1), C(systemd) or C(setsid).
    type: str
    choices: [auto, systemd, setsid]
    default: auto
  unit_name:
    description: Transient systemd unit name; default C(eagle3-train-<hash of run_dir>).
    type: str
  gpu_free_check:
    description: Assert free VRAM on every GPU (eagle3ops.gpu_free) before launching on GPUs.
    type: bool
    default: true
  wait:
    description: Block until the run ends and return its final metrics.
    type: bool
    default: false
  timeout:
    description: Seconds O(wait) waits; the run keeps going after a timeout.
    type: float
    default: 3600
notes:
  - Check mode reads the inputs and renders the config, and predicts launch/relaunch/nothing; it starts nothing.
  - A run stopped with SIGTERM (e.g. C(systemctl stop)) makes speculators save an C(interrupted) checkpoint it does
    not resume from; the relaunch resumes from the last numbered checkpoint.
"""

EXAMPLES = r"""
- name: Train on all GPUs, return at once
  eagle3ops_train:
    data_dir: /data/eagle3/data
    verifier_path: /data/models/Kimi-K2.5
    run_dir: /data/eagle3/train/kimi-k25
    epochs: 10
    draft_vocab_size: 32000

- name: A short smoke run on CPU; wait for it and return its metrics (accuracy per draft position)
  eagle3ops_train:
    data_dir: /data/eagle3/demo/data
    verifier_path: /data/eagle3/demo/model
    run_dir: /data/eagle3/train/smoke
    device: cpu
    max_steps: 30
    wait: true
    timeout: 3600
  register: train
"""

RETURN = r"""
status:
  description: C(running), C(finished), C(launched) or C(relaunched).
  returned: always
  type: str
pid:
  description: PID of the trainer (torchrun or the shim process).
  returned: always
  type: int
attempt:
  description: Launch count of this run directory.
  returned: always
  type: int
job:
  description:
    - The rendezvous id of the multi-node job this node is asked to run (null on one host). A node running or
      finished with another job is stopped and joins this one (C(other_job) says which it left).
  returned: always
  type: str
other_job:
  description:
    - When this node ran (or had finished) another job than O(rdzv_id) - C(previous_status), C(previous_job) and
      C(job) - and was stopped if still running and relaunched into this one (check mode - would be).
  returned: always
  type: dict
layer_ids:
  description: Aux layer ids used (from extract_meta.json).
  returned: always
  type: list
  elements: int
draft_vocab_size:
  description: Draft vocabulary size used; C(draft_vocab_capped) says whether it was capped.
  returned: always
  type: int
resume_from:
  description: The checkpoint a relaunch resumes from (epoch, global_step).
  returned: on relaunch
  type: dict
content_check:
  description:
    - With O(verify=checksum), what the content check before the launch did - C(verified) (files read and
      intact now), C(already_verified) (unchanged since verified - not read), C(bytes_read), C(unchecked) (files
      without a manifest checksum), C(seconds); in check mode C(to_verify) and C(bytes_to_verify), what a launch
      would read. A damaged file fails the task instead (C(damaged_files)).
  returned: on launch or relaunch, and in check mode when one is predicted
  type: dict
quarantined_checkpoints:
  description: Incomplete checkpoints moved aside before a relaunch.
  returned: on launch
  type: list
  elements: dict
metrics:
  description:
    - C(val_loss), C(val_cond_acc) and C(val_full_acc) (one per draft position), C(train_loss), C(global_step);
      C(attempts) with steps, steps/s, tokens/s and time to first step of every launch.
  returned: always
  type: dict
checkpoint:
  description: The final (best) checkpoint directory.
  returned: when finished
  type: str
serve_window_size:
  description: The window the serve phase must pass as C(--speculative-draft-window-size) (null for full attention).
  returned: always
  type: int
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3ops_cli import CliRunner
from ansible.module_utils.eagle3ops_train_options import TRAIN


def main():
    module = AnsibleModule(argument_spec=TRAIN.argument_spec(), supports_check_mode=True)
    p = module.params
    # check mode predicts and returns at once: it never waits for a run
    result = CliRunner(module, TRAIN).run(wait=p["wait"] and not module.check_mode)
    before, after = result.pop("before", None), result.pop("after", None)
    for warning in result.pop("warnings", None) or []:
        module.warn(warning)
    if result.get("changed") and module._diff:
        result["diff"] = {
            "before": json.dumps(before, indent=2, sort_keys=True) + "\n",
            "after": json.dumps(after, indent=2, sort_keys=True) + "\n",
            "before_header": f"{p['run_dir']} (run state)",
            "after_header": f"{p['run_dir']} (run state)",
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
