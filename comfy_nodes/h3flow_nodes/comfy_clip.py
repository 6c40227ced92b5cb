"""ComfyUI glue of H3MultiGPUCLIPLoader: upstream's CLIP object, its encoder over N GPUs.

Upstream's CLIPLoader (type "minimax") builds a ``comfy.sd.CLIP`` whose ModelPatcher
loads the whole encoder onto one device before each encode. Here the CLIP is loaded
with CPU as its load and offload device (so ComfyUI's model management leaves it
alone) and its ``load_model`` is replaced by :meth:`MultiGPUEncoder.ensure_placed`,
which spreads the encoder's units over the GPUs; after each encode the weights are
offloaded when ``offload_after_encode`` is set.

Needs ComfyUI with MiniMax H3 support and CUDA/ROCm GPUs: it cannot run on the CPU
test machine (see docs/comfyui.md for what was and was not run).
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import H3FlowError
from .multigpu import MultiGPUEncoder, parse_gpus


def load_multigpu_clip(
    clip_name: str, clip_type: str, gpus: str, reserve_bytes: int, offload_after_encode: bool
) -> Any:
    import comfy.sd
    import folder_paths

    if not torch.cuda.is_available():
        raise H3FlowError("H3MultiGPUCLIPLoader needs CUDA/ROCm GPUs; use CLIPLoader on a CPU-only ComfyUI")
    devices = parse_gpus(gpus, torch.cuda.device_count())
    path = folder_paths.get_full_path_or_raise("text_encoders", clip_name)
    ctype = clip_type_of(comfy.sd.CLIPType, clip_type)
    cpu = torch.device("cpu")
    options = {"load_device": cpu, "offload_device": cpu}

    def load_clip() -> Any:
        return comfy.sd.load_clip(
            ckpt_paths=[path],
            embedding_directory=folder_paths.get_folder_paths("embeddings"),
            clip_type=ctype,
            model_options=options,
        )

    clip = load_clip()
    encoder = MultiGPUEncoder(lambda: load_clip().cond_stage_model, devices, reserve_bytes=reserve_bytes)
    encoder.module = clip.cond_stage_model  # the first load is the one just made
    encoder.loads = 1
    return _wrap(clip, encoder, offload_after_encode)


def clip_type_of(types: Any, name: str) -> Any:
    """``comfy.sd.CLIPType`` member for ``name`` ("minimax"): by member name, then by value.

    Upstream's CLIPLoader falls back to STABLE_DIFFUSION for an unknown name; for H3's
    Qwen3-VL encoder that would load the wrong text model without a word, so a ComfyUI
    without the type is a one-line error that says to update it.
    """
    wanted = name.strip()
    found = getattr(types, wanted.upper(), None)
    if found is None:
        found = next((m for m in types if str(getattr(m, "value", "")).lower() == wanted.lower()), None)
    if found is None:
        known = ", ".join(m.name.lower() for m in types)
        raise H3FlowError(
            f"this ComfyUI has no CLIP type {wanted!r} (it knows: {known}); update ComfyUI to a version with MiniMax H3"
        )
    return found


def _wrap(clip: Any, encoder: MultiGPUEncoder, offload_after_encode: bool) -> Any:
    """Give ``clip`` a subclass that places before encoding and offloads after."""
    base = type(clip)

    class MultiGPUCLIP(base):  # type: ignore[misc, valid-type]
        def load_model(self) -> Any:
            self.cond_stage_model = encoder.ensure_placed()
            return self.patcher

        def _after(self) -> None:
            if offload_after_encode:
                encoder.offload()

        def encode_from_tokens(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().encode_from_tokens(*args, **kwargs)
            finally:
                self._after()

        def encode_from_tokens_scheduled(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().encode_from_tokens_scheduled(*args, **kwargs)
            finally:
                self._after()

        def clone(self) -> Any:
            copy = super().clone()
            copy.__class__ = MultiGPUCLIP
            return copy

    clip.__class__ = MultiGPUCLIP
    return clip
