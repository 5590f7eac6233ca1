"""The train phase's options, once: ``eagle3ops train``'s CLI (and ``train-status``, ``train-stop``,
``train-verify``), the
``eagle3ops_train`` module's parameters and the ``train`` role's variables come from here (eagle3ops.options says
how; standard library only, shipped as module_utils/eagle3ops_train_options.py).

The CLI keeps its short flags: ``--data`` (``data_dir``), ``--verifier`` (``verifier_path``), ``--token-freq``
(``token_freq_path``), ``--extra`` (``extra_config``) and ``--env`` as one JSON object each. A few settings are
the CLI's alone (``train_data_ratio``, ``log_freq``, ``seed``, ``mask_token_id``, ``python``,
``gpu_free_timeout``): the module never had them, the defaults serve every playbook run.
"""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, EXECUTABLE = _o.Option, _o.Command, _o.EXECUTABLE
data_dir, one_of, target_model = _o.data_dir, _o.one_of, _o.target_model
count, seconds, seed = _o.count, _o.seconds, _o.seed

DEFAULT_DRAFT_VOCAB = (
    32000  # the draft vocabulary asked for when none is given (capped at the distinct tokens)
)

TRAIN = Command(
    "train",
    help="start (or find running/finished, or resume) the detached speculators training run of a run dir",
    description=(
        "Idempotent: a running or finished run with the same config is left alone (changed=false); "
        "a killed/crashed one is relaunched and resumes from its last checkpoint."
    ),
    check_help="predict what would happen; change nothing",
    module="eagle3ops_train",
    role="train",
    options=[
        data_dir(
            "data_dir",
            flag="--data",
            doc=(
                "Data directory from prepare + extract (Arrow dataset, C(hidden_states/), C(token_freq.pt))."
            ),
            role_value=(
                "{{ eagle3ops_workdir ~ '/train/data' if train_data_gather else train_data_source_dir }}"
            ),
        ),
        target_model(
            "verifier_path",
            "the one the states came from",
            flag="--verifier",
            doc="The target model directory the hidden states were extracted from.",
            role_value="{{ eagle3ops_model_path }}",
        ),
        _o.trust_remote_code("config (the verifier's)"),
        Option(
            "run_dir",
            "path",
            required=True,
            doc=("Run directory (state file, rendered config, log, metrics, checkpoints by default)."),
            role_value="{{ eagle3ops_train_run_dir }}",
        ),
        # the role's "" (and [] below) mean "not set": the CLI leaves the option out (Option.argv)
        Option(
            "save_path",
            "path",
            role_default="",
            doc="Checkpoint directory; default O(run_dir)/checkpoints.",
        ),
        Option(
            "layer_ids",
            "list",
            elements="int",
            role_default=[],
            doc=(
                "Only an assertion; the ids come from C(extract_meta.json). A different value fails the task."
            ),
            role_value="{{ eagle3ops_layer_ids or [] }}",
        ),
        count(
            "draft_vocab_size",
            role_default=DEFAULT_DRAFT_VOCAB,  # the playbook says what the CLI leaves implicit
            doc=(
                "Draft vocabulary size (default 32000), capped at the distinct tokens counted in "
                "C(token_freq.pt)."
            ),
        ),
        Option(
            "token_freq_path",
            "path",
            flag="--token-freq",
            role_default="",
            doc="Token frequencies; default O(data_dir)/token_freq.pt.",
        ),
        Option(
            "init_from",
            "path",
            role_default="",
            doc=[
                "Warm start - fine-tune this speculators EAGLE-3 draft (a checkpoint directory, a speculators save "
                "directory or a train run directory) instead of a new one.",
                "Its own vocabulary maps (C(d2t)/C(t2d) in its C(model.safetensors)) are the run's, unchanged, "
                "and its shape is kept (O(num_layers), O(attention), O(draft_vocab_size) do not apply). Refused "
                "before launch when its aux layer ids differ from the store's or it was made for another target.",
            ],
        ),
        count(
            "epochs",
            default=3,
            doc="training epochs",
        ),
        Option(
            "lr",
            "float",
            above=0,
            doc="Learning rate (unset - the trainer's own, speculators 0.001, specforge 0.0001).",
        ),
        count(
            "ttt_steps",
            doc=(
                "Test-time-training steps, the draft positions trained (unset - the trainer's "
                "own, speculators 3, specforge 7)."
            ),
        ),
        count("num_layers", default=1, doc="draft decoder layers"),
        count(
            "total_seq_len",
            default=8192,
            doc="tokens per packed batch (per process)",
        ),
        Option(
            "train_data_ratio",
            "float",
            default=0.9,
            param=False,
            above=0,
            maximum=1,
            doc="share of the rows trained on",
        ),
        count(
            "max_steps",
            doc="Stop after this many optimizer steps (smoke runs); unset, every epoch runs.",
        ),
        Option(
            "checkpoint_freq",
            "float",
            default=1.0,
            above=0,
            doc="Epochs between checkpoints; below 1 saves within epochs (e.g. 0.25).",
        ),
        count("log_freq", default=1, param=False, doc="steps between metric records"),
        seed(default=42, param=False, doc="the training seed"),
        Option(
            "norm_before_residual",
            "bool",
            default=False,
            doc="Off unless asked: speculators' own default is true, which SGLang 0.5.23 cannot serve.",
        ),
        Option(
            "specforge_fc_norm",
            "bool",
            default=False,
            doc=(
                "Trainer C(specforge) only: an RMSNorm on each of the target's aux hidden states before the "
                "draft's first projection (SpecForge 0.2.0's C(fc_norm), which SGLang serves). Off in "
                "SpecForge's own recipe; speculators normalises the concatenated states there "
                "(C(norm_before_fc)). Refused with another trainer."
            ),
        ),
        one_of(
            "attention",
            ["full", "sliding"],
            doc=(
                "C(full) attention in every draft layer (SGLang's default), or C(sliding) with "
                "O(sliding_window); serve a sliding-window draft with "
                "C(--speculative-draft-window-size) equal to it (returned as "
                "C(serve_window_size))."
            ),
        ),
        count(
            "sliding_window",
            default=2048,
            doc="Window of C(sliding) attention.",
        ),
        one_of(
            "verify",
            ["checksum", "size", "overlapped"],
            doc=[
                (
                    "Before a trainer is launched, C(checksum) compares every hidden-state file's "
                    "content with the checksum its writer recorded in the manifest and fails naming "
                    "damaged files; only files not verified since they last changed are read (a "
                    "record in C(hidden_states/verified.jsonl) keyed by inode, size, mtime and "
                    "ctime), so a re-run on an unchanged store reads nothing (docs/performance.md has the "
                    "cost). Check mode reads nothing and returns what would be read (C(content_check))."
                ),
                "C(size) - only the size + safetensors header check every run makes.",
                (
                    "C(overlapped) - no up-front content check: training starts at once and the data loader's "
                    "workers compare each file with its checksum on its first read (the same record); a damaged "
                    "file is skipped, logged and queued in C(hidden_states/requeue.jsonl), which the next extract "
                    "run redoes. The default stays C(checksum): with C(overlapped) the steps before a damaged "
                    "file is found have trained without that one sample, never on its bad bytes (docs/reliability.md)."
                ),
            ],
        ),
        one_of(
            "on_missing",
            ["raise", "skip", "warn"],
            doc=(
                "What the loader does for a sample without hidden states; C(raise) refuses "
                "incomplete extraction."
            ),
        ),
        Option(
            "mask_token_id",
            "int",
            param=False,
            minimum=0,
            doc="speculators' mask token (default from the verifier)",
        ),
        one_of(
            "device",
            ["auto", "cpu", "gpu"],
            doc="C(auto) (every visible GPU through torchrun, else the CPU), C(cpu) or C(gpu).",
        ),
        count(
            "nproc",
            doc="Trainer processes on GPUs; default every visible GPU.",
        ),
        # the role passes null as omitted (0 workers is a value): not a plain pass-through
        Option(
            "num_workers",
            "int",
            role=False,
            minimum=0,
            doc="Loader workers per process; default 0 on CPU, up to 12 on GPUs.",
        ),
        # several hosts (docs/scale.md): the role computes these from train_hosts and the job it decides on
        count(
            "nnodes",
            default=1,
            role=False,
            doc=[
                (
                    "Hosts that train one draft together (docs/scale.md) - torchrun C(--nnodes) on "
                    "each, meeting at a c10d rendezvous on O(rdzv_endpoint). The train role sets it "
                    "from C(train_hosts)."
                ),
                (
                    "Needs GPU hosts; speculators 0.9.0 cannot train over several nodes on CPU (the "
                    "task fails saying why)."
                ),
            ],
        ),
        Option(
            "node_rank",
            "int",
            default=0,
            minimum=0,
            role=False,
            doc="This host's index among the O(nnodes) hosts (0 = the rendezvous host).",
        ),
        Option(
            "rdzv_endpoint",
            role=False,
            doc=(
                "C(HOST:PORT) of the rendezvous (the first host, reachable from every node), "
                "with O(nnodes) > 1."
            ),
        ),
        Option(
            "rdzv_id",
            role=False,
            doc=(
                "Rendezvous id, the same on every node; default from the path of O(run_dir). It "
                "names the job - a node that runs (or finished) a job with another id is stopped "
                "and relaunched into this one, resuming from the newest checkpoint. The train "
                "role passes a new id whenever one node has to be restarted."
            ),
        ),
        Option(
            "nic",
            role_default="",
            doc=(
                "Network interface NCCL and gloo use between the nodes (C(NCCL_SOCKET_IFNAME), "
                "C(GLOO_SOCKET_IFNAME))."
            ),
        ),
        one_of(
            "trainer",
            ["speculators", "specforge", "ddp_probe"],
            doc=(
                "C(speculators); C(specforge) - SpecForge 0.2.0's offline EAGLE-3 trainer on the "
                "same extraction (it reads the store in place through one pointer file a row, "
                "with the same rows, draft vocabulary and layer ids; GPU hosts only; C(eagle3ops "
                "serve-convert) exports its draft with SpecForge's own exporter); or C(ddp_probe) - "
                "the minimal DDP job of C(eagle3ops.train.ddp_probe) (a linear model on the same data, "
                "checkpoints and records) through the same launcher and rendezvous. It checks a "
                "cluster's launch, data and restart in seconds before a long run, and it is the "
                "only trainer that runs over several CPU hosts."
            ),
        ),
        # the role's "auto" is the CLI's default (left out): not a plain pass-through
        Option(
            "draft_attn_impl",
            choices=["simple_flex_attention", "sdpa", "eager"],
            role=False,
            doc=(
                "Draft attention; default C(simple_flex_attention) (torch.compile) on GPUs, C(sdpa) on CPU."
            ),
        ),
        Option(
            "loss_implementation",
            choices=["eager", "fused"],
            # the module and the role ask for eager on every device (speculators 0.9.0's fused KL loss failed
            # under torch 2.11's dynamo on an H200, docs/performance.md); the CLI's None is eager too
            module_default="eager",
            doc=(
                "The speculators loss kernel. C(eager) by default on every device - speculators "
                "0.9.0's C(fused) KL loss failed under torch 2.11's dynamo on an H200 "
                "(C(ListVariable ... is already tracked for mutation)); choose C(fused) only on "
                "a torch where it is known to compile."
            ),
        ),
        Option(
            "extra_config",
            "dict",
            default={},
            as_json=True,
            flag="--extra",
            doc=(
                "Other speculators settings as a mapping of group to a mapping of speculators "
                "keys and values (groups verifier, draft, data, loss, optimizer, scheduler, "
                "trainer). Keys the module manages are refused."
            ),
        ),
        Option(
            "env",
            "dict",
            default={},
            as_json=True,
            doc="extra environment variables for the trainer",
        ),
        Option(
            "restart_on_change",
            "bool",
            default=False,
            doc=(
                "When the configuration changed, stop the run, move its checkpoints aside and start over; "
                "without it a changed configuration fails."
            ),
        ),
        one_of(
            "launcher",
            ["auto", "systemd", "setsid"],
            doc="C(auto) (C(systemd-run) when systemd is PID 1, else C(setsid) with a PID file), C(systemd) or C(setsid).",
        ),
        Option(
            "unit_name",
            role_default="",
            doc="Transient systemd unit name; default C(eagle3-train-<hash of run_dir>).",
        ),
        Option("python", param=False, doc="interpreter for the trainer (default: this one)"),
        Option(
            "gpu_free_check",
            "bool",
            default=True,
            doc="Assert free VRAM on every GPU (eagle3ops.gpu_free) before launching on GPUs.",
        ),
        seconds("gpu_free_timeout", default=60, param=False, doc="seconds the VRAM check waits"),
        # the role waits only once every node started (several hosts): computed, not a pass-through
        Option(
            "wait",
            "bool",
            default=False,
            role=False,
            doc="Block until the run ends and return its final metrics.",
        ),
        seconds(
            "timeout",
            default=3600,
            role="train_wait_timeout",
            role_default=86400,  # a playbook waiting for a training run waits a day; a CLI call an hour
            doc="Seconds O(wait) waits; the run keeps going after a timeout.",
        ),
        EXECUTABLE.but(role_pass=" | default(omit, true)"),
    ],
)

TRAIN_STATUS = Command(
    "train-status",
    help="state, resume point and metrics of a training run dir",
    check=False,
    options=[Option("run_dir", "path", required=True, doc="the run directory")],
)

TRAIN_STOP = Command(
    "train-stop",
    help="stop a running training run (SIGTERM: speculators saves 'interrupted')",
    options=[
        Option("run_dir", "path", required=True, doc="the run directory"),
        seconds("grace", default=60, doc="seconds between SIGTERM and SIGKILL"),
    ],
)

TRAIN_VERIFY = Command(
    "train-verify",
    help=(
        "check the content of every hidden-state file not verified since it last changed (what train_verify: "
        "checksum does before a launch), recording each; --check: how far it is, reading nothing"
    ),
    description=(
        "The train role runs it detached before the launch and polls it with --check --job-file, so a first check "
        "of a large store shows its progress; the launch then reads only what changed since. A damaged file is "
        "refused by name (exit 2)."
    ),
    check_help="read nothing: say what a check would read and how far a running one is",
    options=[
        data_dir("data_dir", flag="--data", doc="data dir holding hidden_states/"),
        Option(
            "job_file",
            "path",
            doc="with --check: the results file of the Ansible async job running the check; the result's "
            "job_finished says whether it has ended",
        ),
    ],
)
