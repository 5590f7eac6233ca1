"""The prepare phase's options, once: ``eagle3ops prepare``'s CLI, the ``eagle3ops_prepare`` module's parameters and
the ``prepare`` role's variables come from here (eagle3ops.options says how; standard library only, shipped to
targets as module_utils/eagle3ops_prepare_options.py)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, EXECUTABLE = _o.Option, _o.Command, _o.EXECUTABLE
conversation_inputs, one_of, target_model = _o.conversation_inputs, _o.one_of, _o.target_model
count, seconds, seed = _o.count, _o.seconds, _o.seed

PREPARE = Command(
    "prepare",
    help="tokenise conversations into speculators' offline training rows (input_ids, loss_mask)",
    description=(
        "Render conversations with the target's chat template, one row per assistant turn with the "
        "loss mask on that turn (speculators 0.9.0 semantics), and write DATA_DIR as an Arrow dataset "
        "plus token_freq.pt and prepare_meta.json. Idempotent; atomic; refuses to orphan extracted "
        "hidden states."
    ),
    module="eagle3ops_prepare",
    role="prepare",
    options=[
        target_model("model", "its tokenizer and chat template", metavar="PATH", role="prepare_model_path"),
        conversation_inputs("prepare_inputs"),
        Option(
            "out",
            "path",
            required=True,
            metavar="DATA_DIR",
            role="prepare_output_dir",
            help="output data directory",
        ),
        Option(
            "max_length", "int", default=2048, minimum=2, help="tokens per row (longer rows are truncated)"
        ),
        one_of(
            "on_error",
            ["fail", "skip"],
            help="bad input rows: fail (nothing is written) or skip (listed in the result)",
        ),
        count("max_samples", metavar="N", help="keep at most N rows"),
        seed(default=0, help="shuffle seed"),
        one_of(
            "rows",
            ["turn", "conversation"],
            help="turn: one row per assistant turn, its history repeated (speculators' layout); conversation: "
            "one row per conversation with every assistant turn supervised (less to extract, store and train "
            "on; a conversation whose template re-renders its history keeps per-turn rows)",
        ),
        count(
            "workers",
            default=1,
            metavar="N",
            help="render in N processes (the same rows; the tokenizer and chat template run on N cores)",
        ),
        Option(
            "force",
            "bool",
            default=False,
            help="replace a dataset whose hidden states were already extracted",
        ),
        seconds(
            "lock_wait",
            default=0,
            metavar="SECONDS",
            role_default=3600,  # the playbook waits for an interrupted run still holding the directory
            help="while another run holds DATA_DIR, wait up to this long for it (0: fail at once)",
        ),
        Option("trust_remote_code", "bool", default=False, help="allow the tokenizer's own code"),
        EXECUTABLE,
    ],
)
