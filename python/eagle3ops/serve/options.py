"""The serve phase's options, once: ``eagle3ops serve-convert`` and ``eagle3ops serve-process``, the ``eagle3ops_serve_convert``
and ``eagle3ops_serve_process`` modules and the ``serve`` role's variables come from here (eagle3ops.options says
how; standard library only, shipped as module_utils/eagle3ops_serve_options.py)."""

from __future__ import annotations

try:
    from eagle3ops import options as _o
    from eagle3ops.sglang import versions as _versions
except ImportError:  # on a target without eagle3ops: the copies Ansible ships
    from ansible.module_utils import eagle3ops_options as _o
    from ansible.module_utils import eagle3ops_sglang_versions as _versions

Option, Command, EXECUTABLE = _o.Option, _o.Command, _o.EXECUTABLE
one_of = _o.one_of
count, seconds, work_path = _o.count, _o.seconds, _o.work_path

CONVERT = Command(
    "serve-convert",
    help="convert the trained draft (a speculators eagle3 checkpoint) for SGLang's EAGLE3 loader "
    "(LlamaForCausalLMEagle3)",
    description="Refuses drafts SGLang cannot serve as trained (norm_before_residual, a sliding window "
    "the server would not match, trained embeddings...). Idempotent: an up-to-date output is left alone.",
    check_help="check and predict; write nothing",
    module="eagle3ops_serve_convert",
    role="serve",
    options=[
        Option(
            "checkpoint",
            "path",
            required=True,
            help="a checkpoint dir, a speculators save path (checkpoint_best / newest epoch) or a train run dir",
            doc=(
                "A checkpoint directory, a speculators save path (C(checkpoint_best) or the "
                "newest epoch) or a train run directory."
            ),
            role_doc=(
                "The speculators checkpoint converted for SGLang: a checkpoint dir, a save path "
                "or the train run dir. Default the shared eagle3ops_checkpoint (the train run "
                "directory)."
            ),
            role_value="{{ eagle3ops_checkpoint }}",
        ),
        work_path(
            "out",
            "serve/draft",
            role="serve_draft_dir",
            help="output directory (--speculative-draft-model-path)",
            doc="Output directory (what C(--speculative-draft-model-path) gets).",
            role_doc=(
                "Where the SGLang draft (config.json + model.safetensors) is written; "
                "--speculative-draft-model-path. Default <eagle3ops_workdir>/serve/draft."
            ),
        ),
        count(
            "serve_window",
            role="serve_draft_window_size",
            help="the --speculative-draft-window-size the server will use (needed for a sliding-window draft)",
            doc=(
                "The C(--speculative-draft-window-size) the server will use; required for a "
                "sliding-window draft and must equal its window."
            ),
            role_doc=(
                "Speculative-draft-window-size; must equal the window of a draft trained with "
                "sliding attention, else null."
            ),
        ),
        Option(
            "target_arch",
            role_default="",  # empty: the checkpoint's verifier's
            help="the target's architecture (default: the checkpoint's verifier's)",
            doc=(
                "The target's architecture (default the checkpoint's verifier's); picks SGLang's "
                "layer-id convention."
            ),
            role_doc=(
                "The target's architecture (empty: the checkpoint's verifier's); picks SGLang's "
                "layer-id convention."
            ),
        ),
        Option(
            "sglang_layer_ids",
            "list",
            elements="int",
            role_default=[],  # empty: eagle3ops' convention table decides
            help="write these ids into eagle_config as is (for a target outside eagle3ops' convention table)",
            doc=("Ids to write as is into C(eagle_config) (targets outside eagle3ops' convention table)."),
            role_doc=(
                "Ids written as is into eagle_config (only for a target outside eagle3ops' convention table)."
            ),
        ),
        Option(
            "sglang_version",
            role_choices=list(_versions.KNOWN),
            help=f"the SGLang version that serves the draft, one of {', '.join(_versions.KNOWN)} (default: the "
            f"SGLang installed here when it is one of them, else {_versions.DEFAULT_VERSION}; it goes into the stamp)",
            doc=(
                "The SGLang version that serves the draft (its layer-id rules and draft layout); "
                f"one of the versions in C(eagle3ops.sglang.versions) ({', '.join(_versions.KNOWN)}); another "
                "is refused with that list. Unset, the SGLang installed on the host when it is "
                f"one of them, else {_versions.DEFAULT_VERSION}; the stamp records the one used."
            ),
            role_doc=(
                "The SGLang version served (one of eagle3ops' version table; unknown versions "
                "are refused). Default the shared eagle3ops_sglang_version."
            ),
            role_value="{{ eagle3ops_sglang_version }}",
            role_pass="",
        ),
        Option(
            "target",
            "path",
            role=False,  # the role passes serve_model_path
            help="the target model directory SGLang will serve: the draft config takes its token ids and "
            "records its architecture (default: the verifier the checkpoint names); a remote-code one is refused "
            "without --trust-remote-code, before anything is converted",
            doc=(
                "The target model directory SGLang will serve; the draft config takes its token ids "
                "(C(text_config) first) and records its architecture (default the verifier the checkpoint "
                "names). A remote-code one (an auto_map) is refused without O(trust_remote_code), before "
                "anything is converted or started."
            ),
        ),
        _o.trust_remote_code("tokenizer (its chat template) and config"),
        EXECUTABLE.but(role="serve_eagle3ops_bin", role_pass=" | default(omit, true)"),
    ],
)

SERVE_PROCESS = Command(
    "serve-process",
    help="start/stop/status of a server run as a detached process (where PID 1 is not systemd)",
    description=(
        "The server's spec (argv, environment, health URL) is given by --argv-json/--url/--env or read "
        "from --spec-file (a JSON object {NAME: {argv, env, url}}). start is idempotent: the same spec "
        "already running -> changed false; a different one -> restarted. State, PID and log files: "
        "RUN_DIR/NAME.{json,pid,log}."
    ),
    check_help="only say what would change",
    module="eagle3ops_serve_process",
    role="serve",
    options=[
        Option(
            "action", positional=True, choices=["start", "stop", "status"], param=False, help="what to do"
        ),
        # the module's state: started/stopped/status (it passes the action)
        one_of(
            "state",
            ["started", "stopped", "status"],
            cli=False,
            role_choices=["started", "stopped"],  # the role serves or stops; status is the module's own
            help="the state",
            doc="C(started), C(stopped), or C(status) (report only).",
            role_doc="Started: running + enabled at boot; stopped: installed but stopped.",
        ),
        Option(
            "run_dir",
            "path",
            required=True,
            help="directory of the state, PID and log files",
            role_doc=(
                "Directory of servers.json (both command lines, read by the benchmark phase) and "
                "the process launcher's PID, state and log files; default the shared "
                "eagle3ops_serve_run_dir."
            ),
            role_value="{{ eagle3ops_serve_run_dir }}",
        ),
        Option(
            "name",
            required=True,
            role=False,
            help="the server's name (file names in RUN_DIR)",
            doc="The server's name (its files in I(run_dir)).",
        ),
        Option(
            "spec_file",
            "path",
            role=False,
            help="JSON {NAME: {argv: [...], env: {...}, url: ...}}",
            doc=("JSON file of named specs C({name - {argv, env, url}}); the spec I(name) is used."),
        ),
        Option(
            "url",
            role=False,
            help="base URL; start waits for GET URL/health = 200",
            doc="The server's base URL; C(started) waits for C(GET url/health) = 200.",
        ),
        Option(
            "env",
            "list",
            elements="str",
            nargs="append",
            default=[],
            metavar="K=V",
            param=False,
            help="environment of the server",
        ),
        Option("cwd", param=False, help="working directory of the server"),
        Option(
            "stamp",
            role=False,
            help="free-form identity beyond argv/env (a changed stamp restarts the server)",
            doc=(
                "Free-form identity beyond the command line (the draft's conversion stamp); a "
                "change restarts."
            ),
        ),
        seconds(
            "health_timeout",
            default=600.0,
            role_default=3600,
            help="seconds to wait for /health",
            doc="Seconds to wait for C(/health).",
            role_doc=(
                "How long the health check waits for /health (a 1T-parameter model loads for many minutes)."
            ),
        ),
        Option(
            "interval",
            "float",
            default=2.0,
            role=False,
            above=0,
            help="seconds between /health polls",
            doc="Seconds between C(/health) polls.",
        ),
        seconds("stop_grace", default=60.0, role=False, help="seconds from SIGTERM to SIGKILL"),
        Option(
            "argv_json",
            param=False,
            help='the server command as a JSON list, e.g. \'["python3", "-m", "sglang.launch_server", ...]\'',
        ),
        Option("env_json", param=False, help="the server's environment as a JSON object (added to --env)"),
        # the module's form of the two above (it passes them as JSON)
        Option(
            "argv",
            "list",
            elements="str",
            cli=False,
            role=False,
            help="the server command line",
            doc="The server command line (a list); not with I(spec_file).",
        ),
        Option(
            "environment",
            "dict",
            default={},
            cli=False,
            role=False,
            help="environment of the server",
            doc=("Environment variables of the server (e.g. C(PYTHONPATH)), added to the module's own."),
        ),
        EXECUTABLE.but(role="serve_eagle3ops_bin", role_pass=" | default(omit, true)"),
    ],
)
