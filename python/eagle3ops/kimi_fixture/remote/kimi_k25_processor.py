"""Remote-code processor of the eagle3ops Kimi-K2.5-format fixture (``AutoProcessor`` through
preprocessor_config.json's ``auto_map``): the remote tokenizer and the image processor, the latter also
reachable as ``media_processor`` with its ``media_proc_cfg`` (what SGLang's Kimi-K2.5 multimodal processor
reads at start-up).

``__call__(text, medias=[{"type": "image", "image": PIL image}, ...])`` tokenises the text as given (a caller
has already repeated ``<|media_pad|>`` as many times as :meth:`media_tokens_calculator` says, as SGLang does)
and adds ``pixel_values`` and ``grid_thws`` for the images.
"""

from __future__ import annotations

from transformers.feature_extraction_utils import BatchFeature
from transformers.processing_utils import ProcessorMixin


class KimiK25Processor(ProcessorMixin):
    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template)

    @property
    def media_processor(self):
        return self.image_processor

    def __call__(self, text=None, medias=None, return_tensors=None, **kwargs) -> BatchFeature:
        data = dict(self.tokenizer(text, return_tensors=return_tensors, **kwargs)) if text is not None else {}
        images = [m["image"] for m in medias or [] if m.get("type") == "image"]
        if images:
            data.update(self.image_processor.preprocess(images, return_tensors=return_tensors))
        return BatchFeature(data=data, tensor_type=return_tensors)

    @property
    def model_input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "pixel_values", "grid_thws"]
