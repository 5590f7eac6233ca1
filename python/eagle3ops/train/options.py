"""The train phase's options, once: ``eagle3ops train``'s CLI (and ``train-status``, ``train-stop``), the
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
one_of, target_model = _o.one_of, _o.target_model
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
        Option(
            "data_dir",
            "path",
            required=True,
            flag="--data",
            help="data dir: Arrow dataset + hidden_states/ + token_freq.pt",
        ),
        target_model("verifier_path", "the one the states came from", flag="--verifier"),
        Option("run_dir", "path", required=True, help="run directory (state, rendered config, log, metrics)"),
        # the role's "" (and [] below) mean "not set": the CLI leaves the option out (Option.argv)
        Option("save_path", "path", role_default="", help="checkpoint directory (default RUN/checkpoints)"),
        Option(
            "layer_ids",
            "list",
            elements="int",
            role_default=[],
            help="only to assert: must equal extract_meta.json's",
        ),
        count(
            "draft_vocab_size",
            role_default=DEFAULT_DRAFT_VOCAB,  # the playbook says what the CLI leaves implicit
            help=f"default {DEFAULT_DRAFT_VOCAB}, capped at the distinct tokens seen",
        ),
        Option(
            "token_freq_path",
            "path",
            flag="--token-freq",
            role_default="",
            help="token frequencies (default DATA/token_freq.pt)",
        ),
        count("epochs", default=3, help="training epochs"),
        Option(
            "lr",
            "float",
            above=0,
            help="learning rate (default: the trainer's own: speculators 0.001, specforge 0.0001)",
        ),
        count(
            "ttt_steps",
            help="test-time-training steps, the draft positions trained (default: the trainer's own: speculators 3, "
            "specforge 7)",
        ),
        count("num_layers", default=1, help="draft decoder layers"),
        count("total_seq_len", default=8192, help="tokens per packed batch (per process)"),
        Option(
            "train_data_ratio",
            "float",
            default=0.9,
            param=False,
            above=0,
            maximum=1,
            help="share of the rows trained on",
        ),
        count("max_steps", help="stop after this many optimizer steps (smoke runs)"),
        Option(
            "checkpoint_freq", "float", default=1.0, above=0, help="epochs between checkpoints (<1: within)"
        ),
        count("log_freq", default=1, param=False, help="steps between metric records"),
        seed(default=42, param=False, help="the training seed"),
        Option(
            "norm_before_residual",
            "bool",
            default=False,
            help="speculators' default; SGLang 0.5.23 cannot serve it, so off unless asked",
        ),
        one_of("attention", ["full", "sliding"], help="draft attention"),
        count("sliding_window", default=2048, help="window of sliding attention"),
        one_of(
            "verify",
            ["checksum", "size"],
            help="before a trainer is launched: checksum = every hidden-state file's content against the checksum "
            "its writer recorded, reading only files not verified since they last changed (hidden_states/"
            "verified.jsonl; docs/performance.md has the cost); size = only the size + header check every run makes",
        ),
        one_of(
            "on_missing",
            ["raise", "skip", "warn"],
            help="a sample without hidden states: raise refuses incomplete extraction",
        ),
        Option(
            "mask_token_id",
            "int",
            param=False,
            minimum=0,
            help="speculators' mask token (default from the verifier)",
        ),
        one_of("device", ["auto", "cpu", "gpu"], help="auto: GPUs when visible"),
        count("nproc", help="trainer processes on GPUs (default: every visible GPU)"),
        # the role passes null as omitted (0 workers is a value): not a plain pass-through
        Option(
            "num_workers", "int", role=False, minimum=0, help="loader workers per process (default 0 on CPU)"
        ),
        # several hosts (docs/scale.md): the role computes these from train_hosts and the job it decides on
        count("nnodes", default=1, role=False, help="hosts training together (torchrun --nnodes)"),
        Option(
            "node_rank",
            "int",
            default=0,
            minimum=0,
            role=False,
            help="this host's index among them (0 = rendezvous host)",
        ),
        Option(
            "rdzv_endpoint",
            role=False,
            help="HOST:PORT of the c10d rendezvous (the first host), with --nnodes > 1",
        ),
        Option(
            "rdzv_id",
            role=False,
            help="rendezvous id, the same on every node (default from the run directory)",
        ),
        Option(
            "nic",
            role_default="",
            help="network interface for NCCL and gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)",
        ),
        one_of(
            "trainer",
            ["speculators", "specforge", "ddp_probe"],
            help="speculators; specforge: SpecForge's offline EAGLE-3 trainer on the same extraction (read in place; "
            "GPU hosts); or ddp_probe: the minimal DDP job through the same launcher (a cluster check; the "
            "multi-node trainer on CPU)",
        ),
        # the role's "auto" is the CLI's default (left out): not a plain pass-through
        Option(
            "draft_attn_impl",
            choices=["simple_flex_attention", "sdpa", "eager"],
            role=False,
            help="draft attention (default simple_flex_attention on GPUs, sdpa on CPU)",
        ),
        Option(
            "loss_implementation",
            choices=["eager", "fused"],
            # the module and the role ask for eager on every device (speculators 0.9.0's fused KL loss failed
            # under torch 2.11's dynamo on an H200, docs/performance.md); the CLI's None is eager too
            module_default="eager",
            help="speculators' loss kernel (default eager)",
        ),
        Option(
            "extra_config",
            "dict",
            default={},
            as_json=True,
            flag="--extra",
            help="{group: {speculators key: value}} for other settings",
        ),
        Option("env", "dict", default={}, as_json=True, help="extra environment variables for the trainer"),
        Option(
            "restart_on_change", "bool", default=False, help="a changed config: stop, set aside, start over"
        ),
        one_of("launcher", ["auto", "systemd", "setsid"], help="auto: systemd-run where systemd is PID 1"),
        Option(
            "unit_name", role_default="", help="systemd unit name (default eagle3-train-<hash of run dir>)"
        ),
        Option("python", param=False, help="interpreter for the trainer (default: this one)"),
        Option("gpu_free_check", "bool", default=True, help="assert free VRAM before launching on GPUs"),
        seconds("gpu_free_timeout", default=60, param=False, help="seconds the VRAM check waits"),
        # the role waits only once every node started (several hosts): computed, not a pass-through
        Option(
            "wait", "bool", default=False, role=False, help="block until the run ends; return its metrics"
        ),
        seconds(
            "timeout",
            default=3600,
            role="train_wait_timeout",
            role_default=86400,  # a playbook waiting for a training run waits a day; a CLI call an hour
            help="seconds --wait waits",
        ),
        EXECUTABLE,
    ],
)

TRAIN_STATUS = Command(
    "train-status",
    help="state, resume point and metrics of a training run dir",
    check=False,
    options=[Option("run_dir", "path", required=True, help="the run directory")],
)

TRAIN_STOP = Command(
    "train-stop",
    help="stop a running training run (SIGTERM: speculators saves 'interrupted')",
    options=[
        Option("run_dir", "path", required=True, help="the run directory"),
        seconds("grace", default=60, help="seconds between SIGTERM and SIGKILL"),
    ],
)
