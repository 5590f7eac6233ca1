"""What a training run is: its settings (:class:`TrainSpec`), the files of its run directory, the trainers it can
run, the speculators config keys the phase manages itself, and the phase's error."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from eagle3ops.errors import WithDetails

SHIM_MODULE = "eagle3ops.speculators_shim"


# what a run trains with: speculators (through the shim), SpecForge on the same extraction (eagle3ops.train.specforge:
# its offline trainer reading our store through pointer files), or the minimal DDP job of eagle3ops.ddp_probe, which
# goes through the same launcher, rendezvous, data and checkpoints (a cluster check; the multi-node trainer on CPU)
TRAINERS = {
    "speculators": SHIM_MODULE,
    "specforge": "eagle3ops.train.specforge_shim",
    "ddp_probe": "eagle3ops.ddp_probe",
}
# each trainer's own learning rate and test-time-training steps, used where the run sets none
TRAINER_DEFAULTS = {
    "speculators": {"lr": 1e-3, "ttt_steps": 3},
    "ddp_probe": {"lr": 1e-3, "ttt_steps": 3},
    "specforge": {"lr": 1e-4, "ttt_steps": 7},
}


TEMPLATE = "speculators_train.yaml.j2"


STATE = "state.json"


CONFIG = "config.yaml"


LOG = "train.log"


METRICS = "metrics.jsonl"


EXIT = "exit.json"


PIDFILE = "train.pid"


DEFAULT_DRAFT_VOCAB = 32000


# config keys the role manages itself; `extra` may not override them (set the role variable instead)
MANAGED_KEYS = {
    "verifier": {"verifier_name_or_path"},
    "draft": {
        "num_layers",
        "target_layer_ids",
        "draft_vocab_size",
        "d2t_path",
        "t2d_path",
        "norm_before_residual",
        "draft_attn_impl",
        "sliding_window",
        "full_attention_indices",
        "mask_token_id",
        "token_freq_path",
    },
    "data": {
        "data_path",
        "total_seq_len",
        "train_data_ratio",
        "hidden_states_dtype",
        "num_workers",
        "hidden_states_backend",
    },
    "loss": {"loss_implementation", "ttt_steps"},
    "optimizer": {"lr"},
    "scheduler": set(),
    "trainer": {"epochs", "save_path", "checkpoint_freq", "log_freq", "max_steps"},
}


class TrainError(WithDetails, Exception):
    """A problem the user must act on; the message names the file/PID and what to do."""


@dataclass
class TrainSpec:
    data_dir: str
    verifier_path: str
    run_dir: str
    save_path: str | None = None
    layer_ids: list[int] | None = None
    draft_vocab_size: int | None = None
    token_freq_path: str | None = None
    epochs: int = 3
    lr: float | None = None  # None: the trainer's own (TRAINER_DEFAULTS)
    ttt_steps: int | None = None
    num_layers: int = 1
    total_seq_len: int = 8192
    train_data_ratio: float = 0.9
    max_steps: int | None = None
    checkpoint_freq: float = 1.0
    log_freq: int = 1
    seed: int = 42
    norm_before_residual: bool = False
    attention: str = "full"  # full | sliding
    sliding_window: int = 2048
    on_missing: str = "raise"
    # checksum: every hidden-state file's content against its manifest checksum before a launch, once per file
    # (eagle3ops.store.verified); size: the size + header check only
    verify: str = "checksum"
    mask_token_id: int | None = None
    device: str = "auto"  # auto | cpu | gpu
    nproc: int | None = None
    num_workers: int | None = None
    draft_attn_impl: str | None = None
    loss_implementation: str | None = None
    extra: dict = field(default_factory=dict)
    restart_on_change: bool = False
    launcher: str = "auto"  # auto | systemd | setsid
    unit_name: str | None = None
    python: str | None = None
    gpu_free_check: bool = True
    gpu_free_timeout: float = 60
    env: dict = field(default_factory=dict)
    # several hosts (docs/scale.md): torchrun on each, one c10d rendezvous on ``rdzv_endpoint`` (the first host)
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT, the same on every node
    rdzv_id: str | None = None  # the same on every node; default from the run directory's path
    nic: str | None = None  # network interface for NCCL and gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
    trainer: str = "speculators"  # a key of TRAINERS


def spec_asdict(spec: TrainSpec) -> dict:
    return asdict(spec)
