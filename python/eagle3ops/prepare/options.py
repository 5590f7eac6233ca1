"""The prepare phase's options, once: ``eagle3ops prepare``'s CLI, the ``eagle3ops_prepare`` module's parameters and
the ``prepare`` role's variables come from here (eagle3ops.options says how; standard library only, shipped to
targets as module_utils/eagle3ops_prepare_options.py)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, EXECUTABLE = _o.Option, _o.Command, _o.EXECUTABLE
conversation_inputs, data_dir, one_of, target_model = (
    _o.conversation_inputs,
    _o.data_dir,
    _o.one_of,
    _o.target_model,
)
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
        target_model(
            "model",
            "its tokenizer and chat template",
            metavar="PATH",
            role="prepare_model_path",
            doc="Target model directory whose tokenizer and chat template are used.",
            role_value="{{ eagle3ops_model_path }}",
        ),
        conversation_inputs(
            "prepare_inputs",
            doc=(
                "Conversation sources (JSONL file, directory of .json/.jsonl, or a saved HF "
                "dataset directory)."
            ),
            role_value="{{ eagle3ops_conversations }}",
        ),
        data_dir(
            "out",
            metavar="DATA_DIR",
            role="prepare_output_dir",
            doc="The output data directory (an Arrow dataset; extract writes C(hidden_states/) inside it).",
        ),
        Option(
            "max_length",
            "int",
            default=2048,
            minimum=2,
            doc=(
                "Maximum tokens per row (longer rows are truncated; rows left without supervised "
                "tokens are dropped)."
            ),
        ),
        one_of(
            "on_error",
            ["fail", "skip"],
            doc=(
                "C(fail) stops at the first malformed input row (reported as C(file:line)) and writes nothing; "
                "C(skip) skips and lists them."
            ),
        ),
        count(
            "max_samples",
            metavar="N",
            doc="Keep at most this many rows.",
        ),
        seed(
            default=0,
            doc="Shuffle seed (speculators splits train/val contiguously, so rows are shuffled).",
        ),
        one_of(
            "rows",
            ["turn", "conversation"],
            doc=[
                (
                    "C(turn) writes one row per assistant turn, the turn's history repeated in it "
                    "(speculators' own layout)."
                ),
                (
                    "C(conversation) writes one row per conversation with every assistant turn "
                    "supervised, so the history is extracted, stored and trained on once; the "
                    "supervised tokens are the same. A conversation whose chat template renders its "
                    "history differently from the turns themselves (one that drops earlier "
                    "reasoning) keeps its per-turn rows; RV(rows) counts both kinds."
                ),
            ],
        ),
        count(
            "workers",
            default=1,
            metavar="N",
            doc=(
                "Processes that render the conversations (chat template and tokenizer); the rows "
                "do not depend on it."
            ),
        ),
        Option(
            "force",
            "bool",
            default=False,
            doc="Replace a dataset even when hidden states were extracted for it.",
        ),
        seconds(
            "lock_wait",
            default=0,
            metavar="SECONDS",
            role_default=3600,  # the playbook waits for an interrupted run still holding the directory
            doc=(
                "Seconds to wait while another run (an interrupted playbook's prepare or "
                "extract) holds O(out); it then re-plans, so a finished identical run gives "
                "C(changed=false). 0 fails at once, naming the holder."
            ),
        ),
        _o.trust_remote_code("tokenizer"),
        EXECUTABLE,
    ],
)
