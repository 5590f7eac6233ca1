"""The SGLang versions eagle3ops supports: one entry per version, everything that differs between them, in this
one file (adding a version is one :class:`SGLangVersion` in :data:`VERSIONS`; docs/architecture.md, "To add an
SGLang version").

Each entry is read from that version's own wheel and tested against it (tests/unit/sglang/test_sglang_versions.py,
tests/unit/sglang/test_sglang_patch.py, tests/unit/serve/test_convert.py, all parametrised over :data:`VERSIONS`):

- the capture patch (:attr:`SGLangVersion.patch`, a :class:`PatchSpec`: pristine and patched sha256 of
  ``sglang/srt/models/deepseek_v2.py``, the hunks; :mod:`eagle3ops.sglang.patch` applies and restores it);
- how a dump server turns on the aux-state capture without a draft (:attr:`SGLangVersion.capture_only_flag`):
  0.5.23 has ``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3
  --return-aux-hidden-state-layer-ids ...``; 0.5.17 has no such flag (aux capture exists there only with an
  EAGLE3 draft loaded), so its patch turns the capture on itself (``DumpHook.enable_capture``, from
  ``EAGLE3OPS_SGLANG_LAYER_IDS``); :func:`dump_capture_args` gives the flags, to the client and (through
  ``eagle3ops layer-ids --sglang-version``) to the sglang role's unit;
- the layer-id conventions of each target model file's ``set_eagle3_layers_to_capture``
  (:attr:`SGLangVersion.layer_id_rules`, used by the converter);
- the draft layout SGLang loads (``LlamaForCausalLMEagle3`` in ``llama_eagle3.py``; the same in both versions).

``sglang_version`` is one variable (roles ``sglang``, ``extract``, ``serve``; the CLI's ``--sglang-version``);
a version not in the table is refused with the list of known ones (:func:`get`). Standard library only: the
option definitions import it on the target, where Ansible ships it as module_utils/eagle3ops_sglang_versions.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TARGET_RELPATH = "sglang/srt/models/deepseek_v2.py"  # the one file the capture patch changes

# Target architecture -> (its model file, how that file's set_eagle3_layers_to_capture reads the ids):
#   as_is_unless_first_is_1: layers_to_capture = ids, but [v+1 for v in ids] when ids[0] == 1
#   plus_one:                layers_to_capture = [v+1 for v in ids]
# (what each rule means for eagle3ops' input-of-layer ids is coded once, in eagle3ops.layers.capture_ids)
# Read from the 0.5.17 and 0.5.23 wheels (identical rules in both; tests/unit/serve/test_convert.py checks each).
_LAYER_ID_RULES = {
    "DeepseekV3ForCausalLM": ("deepseek_v2.py", "as_is_unless_first_is_1"),
    "DeepseekV2ForCausalLM": ("deepseek_v2.py", "as_is_unless_first_is_1"),
    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite.py", "as_is_unless_first_is_1"),
    "LlamaForCausalLM": ("llama.py", "plus_one"),
    "Qwen2ForCausalLM": ("qwen2.py", "plus_one"),
    "Qwen3ForCausalLM": ("qwen3.py", "plus_one"),
    "Glm4MoeForCausalLM": ("glm4_moe.py", "plus_one"),
    # Kimi-K2.5's wrapper (kimi_k25.py) delegates to DeepseekV3ForCausalLM's method
    "KimiK25ForConditionalGeneration": ("deepseek_v2.py", "as_is_unless_first_is_1"),
}


@dataclass(frozen=True)
class PatchSpec:
    """The capture patch for one SGLang version: its ``deepseek_v2.py`` before and after (sha256), and the hunks
    ``(where, old text, new text)`` that turn one into the other (``old`` occurs exactly once in the pristine
    file)."""

    sglang_version: str
    pristine_sha256: str
    patched_sha256: str
    hunks: tuple


# ---------------------------------------------------------------------------------------------------------
# The capture patch's hunks: (where, old text, new text). ``old`` must occur exactly once in the pristine file.
# The patched text imports ``eagle3ops.sglang_hook`` (the thin module kept at that name): changing a byte of it
# changes every patched_sha256 below and orphans the files already patched on servers.
# ---------------------------------------------------------------------------------------------------------


def _import_hunk(version: str, line: int) -> tuple[str, str, str]:
    """The hook's import at module scope, after the file's imports (the same text in every version)."""
    return (
        f"module scope, after the imports (line {line})",
        "logger = logging.getLogger(__name__)\n",
        "logger = logging.getLogger(__name__)\n"
        "\n"
        f"# eagle3ops capture patch (sglang {version}): hidden-state dump for EAGLE-3 training.\n"
        "# All logic lives in eagle3ops.sglang_hook; _eagle3ops_hook is None unless\n"
        "# EAGLE3OPS_SGLANG_DUMP_DIR is set. Remove with: eagle3ops sglang-patch restore\n"
        "from eagle3ops.sglang_hook import active_hook as _eagle3ops_active_hook  # eagle3ops\n"
        "\n"
        "_eagle3ops_hook = _eagle3ops_active_hook()  # eagle3ops\n",
    )


_AUX_UNPACKED = "        if self.capture_aux_hidden_states:\n            hidden_states, aux_hidden_states = hidden_states\n"


def _on_forward_hunk(line: int) -> tuple[str, str, str]:
    """DeepseekV2ForCausalLM.forward hands the aux states to the hook once they are unpacked (every version)."""
    return (
        f"DeepseekV2ForCausalLM.forward, after the aux states are unpacked (line {line})",
        _AUX_UNPACKED,
        _AUX_UNPACKED + "        if _eagle3ops_hook is not None:  # eagle3ops\n"
        "            _eagle3ops_hook.on_forward(self, forward_batch, aux_hidden_states)  # eagle3ops\n",
    )


_HUNKS_0_5_23 = (
    _import_hunk("0.5.23", 272),
    (
        "DeepseekV2Model.forward, final norm (line 3239): capture the pre-norm last state",
        "                hidden_states = residual_batch.final_norm(\n"
        "                    hidden_states, forward_batch, self.norm\n"
        "                )\n",
        "                hidden_states = residual_batch.final_norm(\n"
        "                    hidden_states, forward_batch, self.norm,\n"
        "                    capture=_eagle3ops_hook.capture_last(forward_batch) if _eagle3ops_hook else None,  # eagle3ops\n"
        "                )\n",
    ),
    _on_forward_hunk(3419),
)

# SGLang 0.5.17: no residual_batch.final_norm (so no capture= callback) and no capture-only flag
# (--enable-return-aux-hidden-states came later): the patch enables the aux capture itself (hook.enable_capture,
# from EAGLE3OPS_SGLANG_LAYER_IDS) and hands the final norm's updated residual (the pre-norm last state) to the
# same capture callback.
_HUNKS_0_5_17 = (
    _import_hunk("0.5.17", 244),
    (
        "DeepseekV2Model.forward, final norm (line 2875): capture the pre-norm last state",
        "            if not forward_batch.forward_mode.is_idle():\n"
        "                if residual is None:\n"
        "                    hidden_states = self.norm(hidden_states)\n"
        "                else:\n"
        "                    hidden_states, _ = self.norm(hidden_states, residual)\n",
        "            if not forward_batch.forward_mode.is_idle():\n"
        "                _eagle3ops_capture = _eagle3ops_hook.capture_last(forward_batch) if _eagle3ops_hook else None  # eagle3ops\n"
        "                if residual is None:\n"
        "                    if _eagle3ops_capture is not None:  # eagle3ops\n"
        "                        _eagle3ops_capture(hidden_states)  # eagle3ops\n"
        "                    hidden_states = self.norm(hidden_states)\n"
        "                else:\n"
        "                    hidden_states, _ = self.norm(hidden_states, residual)\n"
        "                    if _eagle3ops_capture is not None:  # eagle3ops: _ is the updated residual (pre-norm)\n"
        "                        _eagle3ops_capture(_)  # eagle3ops\n",
    ),
    (
        "DeepseekV2ForCausalLM.__init__ (line 2955): turn the aux capture on for the dump (no draft needed)",
        "        self.capture_aux_hidden_states = False\n",
        "        self.capture_aux_hidden_states = False\n"
        "        if _eagle3ops_hook is not None:  # eagle3ops\n"
        "            _eagle3ops_hook.enable_capture(self)  # eagle3ops\n",
    ),
    _on_forward_hunk(3095),
)


@dataclass(frozen=True)
class SGLangVersion:
    version: str
    # True: the dump server passes --enable-return-aux-hidden-states --speculative-algorithm EAGLE3
    # --return-aux-hidden-state-layer-ids; False: the capture patch turns the capture on itself
    capture_only_flag: bool
    # where ServerArgs' fields are declared in the wheel (tests check every flag eagle3ops passes)
    server_args_files: tuple[str, ...]
    # the capture patch of this version's deepseek_v2.py (eagle3ops.sglang.patch applies and restores it)
    patch: PatchSpec
    layer_id_rules: dict = field(default_factory=lambda: dict(_LAYER_ID_RULES))
    # what the draft config must say (LlamaForCausalLMEagle3's EntryClass in llama_eagle3.py)
    draft_architecture: str = "LlamaForCausalLMEagle3"


def _version(
    version: str, capture_only_flag: bool, server_args_files: tuple, pristine: str, patched: str, hunks
):
    """One row of the table below: the version is named once, and its patch carries the same name."""
    patch = PatchSpec(version, pristine_sha256=pristine, patched_sha256=patched, hunks=hunks)
    return SGLangVersion(version, capture_only_flag, server_args_files=server_args_files, patch=patch)


# One row a version: version, capture_only_flag, server_args_files, then deepseek_v2.py's sha256 pristine and
# patched, and the capture patch's hunks.
# fmt: off
_ROWS = (
    _version("0.5.17", False, ("sglang/srt/server_args.py",),
             "e73c033416e8746bb435dd4e7d39ead521039c511182b5f8b536a40a3308d08a",
             "5882916012b84618fd75bd36dd1063715b5b7d339104ed504f04fb27fb2c9b12", _HUNKS_0_5_17),
    _version("0.5.23", True, ("sglang/srt/arg_groups/fields/",),
             "f61f93019bf1e7680f45a1fe227244433e1b22021cb955e53d25b9cf900473f9",
             "e24f567db45dbbff7baa6af2c6d061083df0b7e47f695f8fcd9f7f7f8d7d2e16", _HUNKS_0_5_23),
)
# fmt: on
VERSIONS: dict[str, SGLangVersion] = {row.version: row for row in _ROWS}
DEFAULT_VERSION = "0.5.23"
KNOWN = tuple(sorted(VERSIONS, key=lambda v: tuple(int(x) for x in v.split("."))))


class UnknownVersion(ValueError):
    """A SGLang version eagle3ops has no entry for; the message lists the known ones."""


def unknown_message(version) -> str:
    return (
        f"sglang version {version!r} is not supported by eagle3ops; known versions: {', '.join(KNOWN)}. "
        "Set eagle3ops_sglang_version (or --sglang-version) to one of those, or add an entry (capture patch "
        "hunks + sha256, capture flag, layer-id rules) in eagle3ops/sglang/versions.py."
    )


def get(version: str | None = None) -> SGLangVersion:
    v = DEFAULT_VERSION if version is None else str(version)
    try:
        return VERSIONS[v]
    except KeyError:
        raise UnknownVersion(unknown_message(version)) from None


def dump_capture_args(version: str | None, layer_ids) -> list[str]:
    """The server flags that make SGLang ``version`` capture the aux states without a draft (may be empty)."""
    if not get(version).capture_only_flag:
        return []  # the patch enables the capture from EAGLE3OPS_SGLANG_LAYER_IDS
    return [
        "--enable-return-aux-hidden-states",
        "--speculative-algorithm",
        "EAGLE3",
        "--return-aux-hidden-state-layer-ids",
        *[str(int(i)) for i in layer_ids],
    ]
