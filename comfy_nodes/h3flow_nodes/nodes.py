"""The ComfyUI node classes: thin wrappers over :mod:`.common`, :mod:`.multigpu` and h3flow.

Save nodes report what they wrote as UI output ``h3flow_files`` (path, sha256, size,
kind), which the ``comfy`` engine reads from /history. Load nodes verify the SHA-256
they are given and use the file's hash as IS_CHANGED, so ComfyUI's cache follows the
content, not the path.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from h3flow.core.errors import H3FlowError
from h3flow.core.specs import FPS, SPECS

from . import common

CATEGORY = "h3flow"
MINIMAX_CLIP_TYPES = ["minimax"]


def _text_encoder_files() -> list[str]:
    try:
        import folder_paths

        return list(folder_paths.get_filename_list("text_encoders"))
    except ImportError:
        return []


def _input_file(name: str) -> str:
    """A file in ComfyUI's input folder (``subfolder/name`` as LoadImage takes it), or a path."""
    try:
        import folder_paths

        if folder_paths.exists_annotated_filepath(name):
            return str(folder_paths.get_annotated_filepath(name))
    except ImportError:
        pass
    return str(common.resolve_path(name))


def _always(*_args: Any, **_kwargs: Any) -> float:
    """IS_CHANGED of save nodes: NaN never equals itself, so a save always runs (its file may be gone)."""
    return float("nan")


def _saved(kind: str, path: Any, sha: str, result: tuple[Any, ...] = ()) -> dict[str, Any]:
    return {"ui": {common.FILES_KEY: [common.file_ref(path, sha, kind)]}, "result": result}


# --------------------------------------------------------------------------- A6 text encoder
class H3MultiGPUCLIPLoader:
    """Upstream CLIPLoader (type "minimax") whose encoder is spread over N GPUs by memory."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "clip_name": (_text_encoder_files(),),
                "type": (MINIMAX_CLIP_TYPES, {"default": "minimax"}),
                "gpus": (
                    "STRING",
                    {"default": "0,1,2,3", "tooltip": "GPU indices to spread the encoder over (empty: all)."},
                ),
                "reserve_mb": (
                    "INT",
                    {"default": 1536, "min": 0, "max": 65536, "tooltip": "Kept free on each GPU for activations."},
                ),
                "offload_after_encode": (
                    "BOOLEAN",
                    {
                        "default": True,
                        "tooltip": "Weights to CPU after encoding; H3_MP_RETAIN_CPU_WEIGHTS=1 keeps that copy, else it is freed.",
                    },
                ),
            }
        }

    RETURN_TYPES = ("CLIP",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, clip_name: str, type: str, gpus: str, reserve_mb: int, offload_after_encode: bool) -> tuple[Any]:
        from .comfy_clip import load_multigpu_clip  # needs ComfyUI + CUDA: imported only here

        return (load_multigpu_clip(clip_name, type, gpus, reserve_mb * (1 << 20), offload_after_encode),)


# --------------------------------------------------------------------------- conditioning
class H3SaveConditioning:
    """CONDITIONING (upstream's list structure, or the reference model's) → safetensors file."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "conditioning": ("CONDITIONING",),
                "path": ("STRING", {"default": "h3flow/conditioning.safetensors"}),
            }
        }

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    IS_CHANGED = classmethod(_always)
    CATEGORY = CATEGORY

    def save(self, conditioning: Any, path: str) -> dict[str, Any]:
        target = common.resolve_path(path)
        return _saved("conditioning", target, common.save_conditioning_any(target, conditioning))


class H3LoadConditioning:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"path": ("STRING", {"default": "h3flow/conditioning.safetensors"})},
            "optional": {"sha256": ("STRING", {"default": "", "tooltip": "Expected SHA-256; empty: not checked."})},
        }

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, path: str, sha256: str = "") -> tuple[Any]:
        return (common.load_conditioning_any(common.resolve_path(path), sha256.strip() or None),)

    @classmethod
    def IS_CHANGED(cls, path: str, sha256: str = "") -> str:
        return common.file_fingerprint(path)


# --------------------------------------------------------------------------- latent handoff
class H3LatentHandoffSave:
    """LATENT (plain or nested video+audio) → .h3latent; reports path + SHA-256."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "samples": ("LATENT",),
                "path": ("STRING", {"default": "h3flow/latent.h3latent"}),
            },
            "optional": {
                "meta": (
                    "STRING",
                    {"default": "{}", "multiline": True, "tooltip": "JSON object: clip_id, seed, spec ..."},
                )
            },
        }

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    IS_CHANGED = classmethod(_always)
    CATEGORY = CATEGORY

    def save(self, samples: dict[str, Any], path: str, meta: str = "{}") -> dict[str, Any]:
        target = common.resolve_path(path)
        info = common.parse_meta(meta)
        info.setdefault("producer_node", "H3LatentHandoffSave")
        masks = {}
        if isinstance(samples.get("noise_mask"), torch.Tensor):
            masks["noise"] = samples["noise_mask"]
        sha = common.save_handoff(samples["samples"], target, info, masks)
        return _saved("latent", target, sha)


class H3LatentHandoffLoad:
    """.h3latent → LATENT, refusing a file whose SHA-256 is not the expected one."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"path": ("STRING", {"default": "h3flow/latent.h3latent"})},
            "optional": {"sha256": ("STRING", {"default": "", "tooltip": "Expected SHA-256; empty: not checked."})},
        }

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, path: str, sha256: str = "") -> tuple[dict[str, Any]]:
        samples, meta, masks = common.load_handoff(common.resolve_path(path), sha256.strip() or None)
        out: dict[str, Any] = {"samples": samples, "h3flow_meta": meta}
        if "noise" in masks:
            out["noise_mask"] = masks["noise"]
        return (out,)

    @classmethod
    def IS_CHANGED(cls, path: str, sha256: str = "") -> str:
        return common.file_fingerprint(path)


# --------------------------------------------------------------------------- video out
class H3SaveVideoAAC:
    """IMAGE frames + AUDIO → MP4 (H.264 yuv420p + AAC), written atomically."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "images": ("IMAGE",),
                "audio": ("AUDIO",),
                "path": ("STRING", {"default": "h3flow/clip.mp4"}),
                "fps": ("FLOAT", {"default": float(FPS), "min": 1.0, "max": 120.0, "step": 0.001}),
            }
        }

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    IS_CHANGED = classmethod(_always)
    CATEGORY = CATEGORY

    def save(self, images: torch.Tensor, audio: dict[str, Any], path: str, fps: float) -> dict[str, Any]:
        target = common.resolve_path(path)
        sha = common.save_video_aac(target, images, audio, fps)
        return _saved("video", target, sha)


# --------------------------------------------------------------------------- reference model
class H3ReferenceEncode:
    """Reference model encode: prompt + image file → conditioning (same bytes as the local engine)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": (
                    "STRING",
                    {"default": "", "tooltip": "Input-folder name (subfolder/name, as LoadImage) or a path."},
                ),
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "spec": (list(SPECS), {"default": "sd"}),
                "frames": ("INT", {"default": 124, "min": 5, "max": 3600, "step": 1}),
            }
        }

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "encode"
    CATEGORY = CATEGORY + "/reference"

    def encode(self, image: str, prompt: str, spec: str, frames: int) -> tuple[Any]:
        return (common.reference_encode(_input_file(image), prompt, spec, frames),)

    @classmethod
    def IS_CHANGED(cls, image: str, prompt: str, spec: str, frames: int) -> str:
        return json.dumps([common.file_fingerprint(_input_file(image)), prompt, spec, frames])


class H3ReferenceSample:
    """Reference model sampling: conditioning + seed → nested (video, audio) LATENT."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "conditioning": ("CONDITIONING",),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF}),
                "steps": ("INT", {"default": 6, "min": 1, "max": 100}),
            }
        }

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "sample"
    CATEGORY = CATEGORY + "/reference"

    def sample(self, conditioning: Any, seed: int, steps: int) -> tuple[dict[str, Any]]:
        video, audio = common.reference_sample(conditioning, seed, steps, progress=_progress_bar(steps))
        return ({"samples": common.make_samples(video, audio)},)


class H3ReferenceDecode:
    """Reference model decode: LATENT → IMAGE frames + AUDIO (INT8 patch decoder)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "samples": ("LATENT",),
                "int8": ("BOOLEAN", {"default": True}),
            }
        }

    RETURN_TYPES = ("IMAGE", "AUDIO")
    FUNCTION = "decode"
    CATEGORY = CATEGORY + "/reference"

    def decode(self, samples: dict[str, Any], int8: bool) -> tuple[torch.Tensor, dict[str, Any]]:
        video, audio = common.latent_streams(samples["samples"])
        if audio is None:
            raise H3FlowError("H3ReferenceDecode needs a (video, audio) latent")
        frames, waveform, rate = common.reference_decode(video, audio, samples.get("h3flow_meta") or {}, int8=int8)
        return (frames, {"waveform": waveform, "sample_rate": rate})


def _progress_bar(total: int) -> Any:
    """ComfyUI's progress bar (websocket ``progress`` events) where available."""
    try:
        import comfy.utils

        bar = comfy.utils.ProgressBar(total)
        return lambda done: bar.update_absolute(done, total)
    except ImportError:
        return None


NODE_CLASS_MAPPINGS = {
    "H3MultiGPUCLIPLoader": H3MultiGPUCLIPLoader,
    "H3SaveConditioning": H3SaveConditioning,
    "H3LoadConditioning": H3LoadConditioning,
    "H3LatentHandoffSave": H3LatentHandoffSave,
    "H3LatentHandoffLoad": H3LatentHandoffLoad,
    "H3SaveVideoAAC": H3SaveVideoAAC,
    "H3ReferenceEncode": H3ReferenceEncode,
    "H3ReferenceSample": H3ReferenceSample,
    "H3ReferenceDecode": H3ReferenceDecode,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "H3MultiGPUCLIPLoader": "H3 Multi-GPU CLIP Loader (A6)",
    "H3SaveConditioning": "H3 Save Conditioning",
    "H3LoadConditioning": "H3 Load Conditioning",
    "H3LatentHandoffSave": "H3 Latent Handoff Save",
    "H3LatentHandoffLoad": "H3 Latent Handoff Load",
    "H3SaveVideoAAC": "H3 Save Video (H.264 + AAC)",
    "H3ReferenceEncode": "H3 Reference Encode",
    "H3ReferenceSample": "H3 Reference Sample",
    "H3ReferenceDecode": "H3 Reference Decode",
}
