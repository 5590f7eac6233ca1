"""The SGLang versions eagle3ops supports: one entry per version, everything that differs between them.

Each entry is read from that version's own wheel and tested against it (tests/unit/test_sglang_versions.py,
tests/unit/test_sglang_patch.py, tests/unit/test_convert.py, all parametrised over :data:`VERSIONS`):

- the capture patch (``sglang_patch.SPECS[version]``: pristine and patched sha256 of
  ``sglang/srt/models/deepseek_v2.py``, the hunks);
- how a dump server turns on the aux-state capture without a draft (:attr:`SGLangVersion.capture_only_flag`):
  0.5.23 has ``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3
  --return-aux-hidden-state-layer-ids ...``; 0.5.17 has no such flag (aux capture exists there only with an
  EAGLE3 draft loaded), so its patch turns the capture on itself (``DumpHook.enable_capture``, from
  ``EAGLE3OPS_SGLANG_LAYER_IDS``);
- the layer-id conventions of each target model file's ``set_eagle3_layers_to_capture``
  (:attr:`SGLangVersion.layer_id_rules`, used by the converter);
- the draft layout SGLang loads (``LlamaForCausalLMEagle3`` in ``llama_eagle3.py``; the same in both versions).

``sglang_version`` is one variable (roles ``sglang``, ``extract``, ``serve``; the CLI's ``--sglang-version``);
a version not in the table is refused with the list of known ones (:func:`get`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Target architecture -> (its model file, how that file's set_eagle3_layers_to_capture reads the ids):
#   as_is_unless_first_is_1: layers_to_capture = ids, but [v+1 for v in ids] when ids[0] == 1
#   plus_one:                layers_to_capture = [v+1 for v in ids]
# (what each rule means for eagle3ops' input-of-layer ids is coded once, in eagle3ops.layers.capture_ids)
# Read from the 0.5.17 and 0.5.23 wheels (identical rules in both; tests/unit/test_convert.py checks each).
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
class SGLangVersion:
    version: str
    # True: the dump server passes --enable-return-aux-hidden-states --speculative-algorithm EAGLE3
    # --return-aux-hidden-state-layer-ids; False: the capture patch turns the capture on itself
    capture_only_flag: bool
    # where ServerArgs' fields are declared in the wheel (tests check every flag eagle3ops passes)
    server_args_files: tuple[str, ...]
    layer_id_rules: dict = field(default_factory=lambda: dict(_LAYER_ID_RULES))
    # what the draft config must say (LlamaForCausalLMEagle3's EntryClass in llama_eagle3.py)
    draft_architecture: str = "LlamaForCausalLMEagle3"


VERSIONS: dict[str, SGLangVersion] = {
    "0.5.17": SGLangVersion(
        version="0.5.17",
        capture_only_flag=False,
        server_args_files=("sglang/srt/server_args.py",),
    ),
    "0.5.23": SGLangVersion(
        version="0.5.23",
        capture_only_flag=True,
        server_args_files=("sglang/srt/arg_groups/fields/",),
    ),
}
DEFAULT_VERSION = "0.5.23"
KNOWN = tuple(sorted(VERSIONS, key=lambda v: tuple(int(x) for x in v.split("."))))


class UnknownVersion(ValueError):
    """A SGLang version eagle3ops has no entry for; the message lists the known ones."""


def unknown_message(version) -> str:
    return (
        f"sglang version {version!r} is not supported by eagle3ops; known versions: {', '.join(KNOWN)}. "
        "Set eagle3ops_sglang_version (or --sglang-version) to one of those, or add an entry (capture patch "
        "hunks + sha256, layer-id rules) in eagle3ops/sglang_versions.py and eagle3ops/extract/sglang_patch.py."
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
