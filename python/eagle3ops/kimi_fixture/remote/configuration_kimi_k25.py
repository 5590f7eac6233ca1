"""Remote-code config class of the eagle3ops Kimi-K2.5-format fixture (config.json's ``auto_map`` AutoConfig,
as the published checkpoint has one): the wrapper with the DeepSeek-V3 text model under ``text_config`` (its
``model_type`` ``kimi_k2`` read as ``deepseek_v3``) and the vision tower's settings under ``vision_config``.
A tool that needs only the language model reads ``text_config``; ``quantization_config`` is kept at both levels.
"""

from __future__ import annotations

from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, media_placeholder_token_id=None, **kwargs):
        if isinstance(text_config, dict):
            text_config = DeepseekV3Config(**{k: v for k, v in text_config.items() if k != "model_type"})
        self.text_config = text_config if text_config is not None else DeepseekV3Config()
        self.vision_config = dict(vision_config or {})
        self.media_placeholder_token_id = media_placeholder_token_id
        super().__init__(**kwargs)

    @property
    def hidden_size(self) -> int:
        return self.text_config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.text_config.vocab_size
