"""Test-only ComfyUI nodes for tests/test_upstream_h3.py (copied into custom_nodes, never shipped).

- ``H3TestTinyTextEncoder`` stands in for ``H3MultiGPUCLIPLoader`` + Qwen3-VL 32B, the one
  part of H3's encode stage that cannot run here. It takes the same inputs (so
  ``workflows/h3-encode.json`` runs with only that node's type changed) and returns a
  CLIP-like object for upstream's real ``MiniMaxH3ImageToVideo``: the real MiniMax H3
  tokenizer (``comfy.text_encoders.minimax.MiniMaxH3Tokenizer``, raw prompt text with
  ``<Picture 1>:`` and a vision block per keyframe), each image expanded to the number of
  merged patches Qwen3-VL's own preprocessing gives it
  (``comfy.text_encoders.qwen_vl.process_qwen2vl_images``, patch 16, merge 2), token tags
  from upstream's ``token_tags_from_embeds_info`` (0 for the vision block, 1 for text),
  and for hidden states a seeded random vector of the tiny DiT's text dim per token id
  (where the real encoder gives 5120-dim layer-50 states).
- ``H3TestLatentReport`` reports what a LATENT holds (type, nested, shapes, dtypes,
  whether finite, sums) as UI output.
"""

from __future__ import annotations

import math
from typing import Any

import torch

VISION_PAD = 151655  # Qwen's <|image_pad|>: the ids under a vision block
SEED = 5120


class TinyH3TextEncoder:
    """A CLIP-like stand-in for MiniMax H3's Qwen3-VL encoder (see the module docstring)."""

    def __init__(self, text_dim: int) -> None:
        from comfy.text_encoders.minimax import MiniMaxH3Tokenizer

        self.text_dim = text_dim
        self.tokenizer = MiniMaxH3Tokenizer()

    def tokenize(self, text: str, return_word_ids: bool = False, **kwargs: Any) -> dict[str, Any]:
        return self.tokenizer.tokenize_with_weights(text, return_word_ids, **kwargs)

    def _vector(self, token: int) -> torch.Tensor:
        return torch.randn(self.text_dim, generator=torch.Generator().manual_seed(SEED * 1_000_003 + token))

    def encode_from_tokens_scheduled(self, tokens: dict[str, Any], **_kwargs: Any) -> list[list[Any]]:
        from comfy.text_encoders.minimax import token_tags_from_embeds_info
        from comfy.text_encoders.qwen_vl import process_qwen2vl_images

        ids: list[int] = []
        embeds_info: list[dict[str, Any]] = []
        for entry in tokens["qwen3vl_32b"][0]:
            token = entry[0]
            if isinstance(token, dict):  # a vision block's image: as many rows as Qwen3-VL's merger gives it
                _, grid = process_qwen2vl_images(token["data"], patch_size=16)
                size = math.prod(int(v) for v in grid.reshape(-1)) // 4  # 2x2 merge
                embeds_info.append({"type": "image", "index": len(ids), "size": size})
                ids.extend([VISION_PAD] * size)
            else:
                ids.append(int(token))
        tags = token_tags_from_embeds_info(len(ids), embeds_info)
        cond = torch.stack([self._vector(t) for t in ids])[None]
        return [[cond, {"pooled_output": None, "minimax_token_tags": tags}]]


class H3TestTinyTextEncoder:
    """H3MultiGPUCLIPLoader's inputs, the stand-in encoder out."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "clip_name": ("STRING", {"default": ""}),
                "type": (["minimax"], {"default": "minimax"}),
                "gpus": ("STRING", {"default": "0,1,2,3"}),
                "reserve_mb": ("INT", {"default": 1536, "min": 0, "max": 65536}),
                "offload_after_encode": ("BOOLEAN", {"default": True}),
            },
            "optional": {"text_dim": ("INT", {"default": 48, "min": 1, "max": 8192})},
        }

    RETURN_TYPES = ("CLIP",)
    FUNCTION = "load"
    CATEGORY = "h3flow/test"

    def load(
        self, clip_name: str, type: str, gpus: str, reserve_mb: int, offload_after_encode: bool, text_dim: int = 48
    ):
        return (TinyH3TextEncoder(text_dim),)


class H3TestLatentReport:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"samples": ("LATENT",)}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "report"
    CATEGORY = "h3flow/test"

    @classmethod
    def IS_CHANGED(cls, **_kwargs: Any) -> float:
        return float("nan")

    def report(self, samples: dict[str, Any]):
        s = samples["samples"]
        parts = list(s.tensors) if getattr(s, "is_nested", False) else [s]
        info = {
            "type": type(s).__name__,
            "nested": bool(getattr(s, "is_nested", False)),
            "shapes": [list(t.shape) for t in parts],
            "dtypes": [str(t.dtype) for t in parts],
            "finite": [bool(torch.isfinite(t).all()) for t in parts],
            "sums": [float(t.double().sum()) for t in parts],
        }
        return {"ui": {"h3flow_test": [info]}}


NODE_CLASS_MAPPINGS = {
    "H3TestTinyTextEncoder": H3TestTinyTextEncoder,
    "H3TestLatentReport": H3TestLatentReport,
}
