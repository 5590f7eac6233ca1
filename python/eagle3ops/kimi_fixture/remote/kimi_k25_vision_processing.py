"""Remote-code image processor of the eagle3ops Kimi-K2.5-format fixture (``AutoImageProcessor`` through
preprocessor_config.json's ``auto_map``): NaViT-style patches as the published processor makes them.

An image is scaled down (never up) until it holds at most ``in_patch_limit`` patches and at most
``patch_limit_on_one_side`` patches on either side, padded to a multiple of ``merge_kernel_size * patch_size``,
normalised with ``image_mean``/``image_std`` and cut into ``patch_size`` squares: ``pixel_values``
``[patches, 3, p, p]`` and ``grid_thws`` ``[images, 3]`` (1, rows, columns). One image takes
rows * columns / merge_kernel_size**2 placeholder tokens (:meth:`media_tokens_calculator`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature


class KimiK25VisionProcessor(BaseImageProcessor):
    model_input_names: ClassVar[list[str]] = ["pixel_values", "grid_thws"]

    def __init__(self, media_proc_cfg: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.media_proc_cfg = dict(media_proc_cfg or {})

    def _plan(self, width: int, height: int) -> dict:
        cfg = self.media_proc_cfg
        patch, merge = int(cfg["patch_size"]), int(cfg["merge_kernel_size"])
        side_limit = int(cfg["patch_limit_on_one_side"])
        area = max(1.0, width // patch) * max(1.0, height // patch)
        scale = min(
            1.0,
            math.sqrt(int(cfg["in_patch_limit"]) / area),
            side_limit * patch / width,
            side_limit * patch / height,
        )
        new_w = min(max(1, int(width * scale)), side_limit * patch)
        new_h = min(max(1, int(height * scale)), side_limit * patch)
        unit = merge * patch
        pad_w, pad_h = -new_w % unit, -new_h % unit
        tokens = ((new_w + pad_w) // unit) * ((new_h + pad_h) // unit)
        return {"width": new_w, "height": new_h, "pad_width": pad_w, "pad_height": pad_h, "tokens": tokens}

    def media_tokens_calculator(self, media: dict) -> int:
        """Placeholder tokens one ``{"type": "image", "image": PIL image}`` takes."""
        fixed = self.media_proc_cfg.get("fixed_output_tokens")
        if fixed is not None:
            return int(fixed)
        width, height = media["image"].size
        return self._plan(width, height)["tokens"]

    def _patches(self, image) -> tuple[np.ndarray, list[int]]:
        from PIL import Image

        cfg = self.media_proc_cfg
        patch = int(cfg["patch_size"])
        plan = self._plan(*image.size)
        resized = image.convert("RGB").resize((plan["width"], plan["height"]), Image.BICUBIC)
        pixels = np.zeros(
            (plan["height"] + plan["pad_height"], plan["width"] + plan["pad_width"], 3), np.float32
        )
        pixels[: plan["height"], : plan["width"]] = np.asarray(resized, np.float32) / 255.0
        pixels = (pixels - np.asarray(cfg["image_mean"], np.float32)) / np.asarray(
            cfg["image_std"], np.float32
        )
        rows, cols = pixels.shape[0] // patch, pixels.shape[1] // patch
        chw = pixels.transpose(2, 0, 1).reshape(3, rows, patch, cols, patch)
        return chw.transpose(1, 3, 0, 2, 4).reshape(rows * cols, 3, patch, patch), [1, rows, cols]

    def preprocess(self, images, return_tensors=None, **kwargs) -> BatchFeature:
        images = images if isinstance(images, list | tuple) else [images]
        cut = [self._patches(im) for im in images]
        data = {
            "pixel_values": np.concatenate([p for p, _ in cut]),
            "grid_thws": np.asarray([g for _, g in cut], dtype=np.int64),
        }
        return BatchFeature(data=data, tensor_type=return_tensors)
