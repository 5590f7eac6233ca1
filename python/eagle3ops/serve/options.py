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
            doc=(
                "A checkpoint directory, a speculators save path (C(checkpoint_best) or the "
                "newest epoch) or a train run directory."
            ),
            role_value="{{ eagle3ops_checkpoint }}",
        ),
        work_path(
            "out",
            "serve/draft",
            role="serve_draft_dir",
            doc="Output directory (what C(--speculative-draft-model-path) gets).",
        ),
        count(
            "serve_window",
            role="serve_draft_window_size",
            doc=(
                "The C(--speculative-draft-window-size) the server will use; required for a "
                "sliding-window draft and must equal its window."
            ),
        ),
        Option(
            "target_arch",
            role_default="",  # empty: the served target's, else the checkpoint's verifier's
            doc=(
                "The target's architecture (default that of the target SGLang serves, else the checkpoint's "
                "verifier's); picks SGLang's layer-id convention."
            ),
        ),
        Option(
            "sglang_layer_ids",
            "list",
            elements="int",
            role_default=[],  # empty: eagle3ops' convention table decides
            doc=("Ids to write as is into C(eagle_config) (targets outside eagle3ops' convention table)."),
        ),
        Option(
            "sglang_version",
            role_choices=list(_versions.KNOWN),
            doc=(
                "The SGLang version that serves the draft (its layer-id rules and draft layout); "
                f"one of the versions in C(eagle3ops.sglang.versions) ({', '.join(_versions.KNOWN)}); another "
                "is refused with that list. Unset, the SGLang installed on the host when it is "
                f"one of them, else {_versions.DEFAULT_VERSION}; the stamp records the one used."
            ),
            role_value="{{ eagle3ops_sglang_version }}",
            role_pass="",
        ),
        Option(
            "target",
            "path",
            role=False,  # the role passes serve_model_path
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
        Option("action", positional=True, choices=["start", "stop", "status"], param=False, doc="what to do"),
        # the module's state: started/stopped/status (it passes the action)
        one_of(
            "state",
            ["started", "stopped", "status"],
            cli=False,
            role_choices=["started", "stopped"],  # the role serves or stops; status is the module's own
            doc="C(started), C(stopped), or C(status) (report only).",
        ),
        Option(
            "run_dir",
            "path",
            required=True,
            doc=(
                "Directory of the state, PID and log files; the serve role also writes C(servers.json) there "
                "(both servers' command lines, which the benchmark phase reads)."
            ),
            role_value="{{ eagle3ops_serve_run_dir }}",
        ),
        Option(
            "name",
            required=True,
            role=False,
            doc="The server's name (its files in I(run_dir)).",
        ),
        Option(
            "spec_file",
            "path",
            role=False,
            doc=("JSON file of named specs C({name - {argv, env, url}}); the spec I(name) is used."),
        ),
        Option(
            "url",
            role=False,
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
            doc="environment of the server",
        ),
        Option("cwd", param=False, doc="working directory of the server"),
        Option(
            "stamp",
            role=False,
            doc=(
                "Free-form identity beyond the command line (the draft's conversion stamp); a "
                "change restarts."
            ),
        ),
        seconds(
            "health_timeout",
            default=600.0,
            role_default=3600,
            doc="Seconds to wait for C(/health) (a 1T-parameter model loads for many minutes).",
        ),
        Option(
            "interval",
            "float",
            default=2.0,
            role=False,
            above=0,
            doc="Seconds between C(/health) polls.",
        ),
        seconds("stop_grace", default=60.0, role=False, doc="seconds from SIGTERM to SIGKILL"),
        Option(
            "argv_json",
            param=False,
            doc='the server command as a JSON list, e.g. \'["python3", "-m", "sglang.launch_server", ...]\'',
        ),
        Option("env_json", param=False, doc="the server's environment as a JSON object (added to --env)"),
        # the module's form of the two above (it passes them as JSON)
        Option(
            "argv",
            "list",
            elements="str",
            cli=False,
            role=False,
            doc="The server command line (a list); not with I(spec_file).",
        ),
        Option(
            "environment",
            "dict",
            default={},
            cli=False,
            role=False,
            doc=("Environment variables of the server (e.g. C(PYTHONPATH)), added to the module's own."),
        ),
        EXECUTABLE.but(role="serve_eagle3ops_bin", role_pass=" | default(omit, true)"),
    ],
)
