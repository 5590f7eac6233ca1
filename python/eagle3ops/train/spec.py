"""What a training run is: its settings (:class:`TrainSpec`), the files of its run directory, the trainers it can
run, the speculators config keys the phase manages itself, and the phase's error."""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle3ops.errors import WithDetails
from eagle3ops.train.options import TRAIN

SHIM_MODULE = "eagle3ops.train.speculators_shim"


# what a run trains with: speculators (through the shim), SpecForge on the same extraction (eagle3ops.train.specforge:
# its offline trainer reading our store through pointer files), or the minimal DDP job of eagle3ops.train.ddp_probe,
# which goes through the same launcher, rendezvous, data and checkpoints (a cluster check; the multi-node trainer on CPU)
TRAINERS = {
    "speculators": SHIM_MODULE,
    "specforge": "eagle3ops.train.specforge_shim",
    "ddp_probe": "eagle3ops.train.ddp_probe",
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
        "from_pretrained",  # train_init_from (eagle3ops.train.warm_start)
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


# the spec's defaults are the definition's (python/eagle3ops/train/options.py), written there once
_D = TRAIN.defaults()


@dataclass
class TrainSpec:
    data_dir: str
    verifier_path: str
    run_dir: str
    trust_remote_code: bool = _D["trust_remote_code"]  # a remote-code verifier (eagle3ops.remote_code)
    save_path: str | None = _D["save_path"]
    layer_ids: list[int] | None = _D["layer_ids"]
    draft_vocab_size: int | None = _D["draft_vocab_size"]
    token_freq_path: str | None = _D["token_freq_path"]
    init_from: str | None = _D["init_from"]  # a speculators draft to fine-tune (eagle3ops.train.warm_start)
    epochs: int = _D["epochs"]
    lr: float | None = _D["lr"]  # None: the trainer's own (TRAINER_DEFAULTS)
    ttt_steps: int | None = _D["ttt_steps"]
    num_layers: int = _D["num_layers"]
    total_seq_len: int = _D["total_seq_len"]
    train_data_ratio: float = _D["train_data_ratio"]
    max_steps: int | None = _D["max_steps"]
    checkpoint_freq: float = _D["checkpoint_freq"]
    log_freq: int = _D["log_freq"]
    seed: int = _D["seed"]
    norm_before_residual: bool = _D["norm_before_residual"]
    specforge_fc_norm: bool = _D["specforge_fc_norm"]  # trainer specforge only (refused with another)
    attention: str = _D["attention"]  # full | sliding
    sliding_window: int = _D["sliding_window"]
    on_missing: str = _D["on_missing"]
    # checksum: every hidden-state file's content against its manifest checksum before a launch, once per file
    # (eagle3ops.store.verified); size: the size + header check only
    verify: str = _D["verify"]
    mask_token_id: int | None = _D["mask_token_id"]
    device: str = _D["device"]  # auto | cpu | gpu
    nproc: int | None = _D["nproc"]
    num_workers: int | None = _D["num_workers"]
    draft_attn_impl: str | None = _D["draft_attn_impl"]
    loss_implementation: str | None = _D["loss_implementation"]
    extra: dict = field(default_factory=dict)
    restart_on_change: bool = _D["restart_on_change"]
    launcher: str = _D["launcher"]  # auto | systemd | setsid
    unit_name: str | None = _D["unit_name"]
    python: str | None = _D["python"]
    gpu_free_check: bool = _D["gpu_free_check"]
    gpu_free_timeout: float = _D["gpu_free_timeout"]
    env: dict = field(default_factory=dict)
    # several hosts (docs/scale.md): torchrun on each, one c10d rendezvous on ``rdzv_endpoint`` (the first host)
    nnodes: int = _D["nnodes"]
    node_rank: int = _D["node_rank"]
    rdzv_endpoint: str | None = _D["rdzv_endpoint"]  # HOST:PORT, the same on every node
    rdzv_id: str | None = _D["rdzv_id"]  # the same on every node; default from the run directory's path
    # network interface for NCCL and gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
    nic: str | None = _D["nic"]
    trainer: str = _D["trainer"]  # a key of TRAINERS
