"""The ComfyUI nodes, in ComfyUI's V3 schema (``comfy_api.latest``, as upstream's own
MiniMax H3 nodes are written): thin wrappers over :mod:`.common` and :mod:`.multigpu`.

Save nodes report what they wrote as the UI output ``h3flow_files`` (path, sha256,
size, kind), which h3flow's ``comfy`` engine reads from /history; the video save node
also returns a preview the UI plays. Load nodes verify the SHA-256 they are given and
fingerprint the file's content, so ComfyUI's cache follows the bytes, not the path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from comfy_api.latest import ComfyExtension, io, ui

from . import common
from .errors import H3FlowError
from .layout import FPS, SPECS

CATEGORY = "h3flow"
REFERENCE = "h3flow/reference"
PATH_TIP = "Relative to ComfyUI's output folder, or absolute inside its output, input or temp folder or a folder in $H3FLOW_NODES_ALLOWED_DIRS."
SHA_TIP = "Expected SHA-256 of the file (64 hex); empty: not checked. A mismatch fails the node."


def _text_encoder_files() -> list[str]:
    import folder_paths

    return list(folder_paths.get_filename_list("text_encoders"))


class _SaveNode(io.ComfyNode):
    """A node that writes a file: it always runs (its file may have been deleted since)."""

    @classmethod
    def fingerprint_inputs(cls, **_inputs: Any) -> float:
        return math.nan  # NaN never equals itself, so ComfyUI's cache never skips the save


def _saved(kind: str, path: Path, sha: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**(extra or {}), common.FILES_KEY: [common.file_ref(path, sha, kind)]}


# --------------------------------------------------------------------------- A6 text encoder
class H3MultiGPUCLIPLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3MultiGPUCLIPLoader",
            display_name="H3 Multi-GPU CLIP Loader (A6)",
            category=CATEGORY,
            description=(
                "Loads MiniMax H3's Qwen3-VL text encoder like CLIPLoader (type minimax), but spreads its vision "
                "tower, embeddings and decoder layers over several GPUs by free memory, so a 32B encoder fits on "
                "16 GB cards. Needs CUDA/ROCm GPUs; on one big GPU use CLIPLoader."
            ),
            inputs=[
                io.Combo.Input(
                    "clip_name", options=_text_encoder_files(), tooltip="The encoder file in models/text_encoders."
                ),
                io.Combo.Input(
                    "type", options=["minimax"], default="minimax", tooltip="CLIP type; MiniMax H3's is minimax."
                ),
                io.String.Input(
                    "gpus", default="0,1,2,3", tooltip="GPU indices to spread the encoder over (empty: all visible)."
                ),
                io.Int.Input(
                    "reserve_mb",
                    default=1536,
                    min=0,
                    max=65536,
                    tooltip="MiB kept free on each GPU for activations when placing layers.",
                ),
                io.Boolean.Input(
                    "offload_after_encode",
                    default=True,
                    tooltip=(
                        "Move the weights to CPU after each encode and empty the GPU caches; "
                        "H3_MP_RETAIN_CPU_WEIGHTS=1 keeps that copy for the next clip, else it is freed."
                    ),
                ),
            ],
            outputs=[io.Clip.Output(tooltip="The encoder, placed on the GPUs at its first encode.")],
        )

    @classmethod
    def execute(
        cls, clip_name: str, type: str, gpus: str, reserve_mb: int, offload_after_encode: bool
    ) -> io.NodeOutput:
        from .comfy_clip import load_multigpu_clip  # needs ComfyUI's comfy.sd and GPUs: imported only here

        return io.NodeOutput(load_multigpu_clip(clip_name, type, gpus, reserve_mb * (1 << 20), offload_after_encode))


# --------------------------------------------------------------------------- conditioning
class H3SaveConditioning(_SaveNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3SaveConditioning",
            display_name="H3 Save Conditioning",
            category=CATEGORY,
            description=(
                "Writes a CONDITIONING to a safetensors file (tensors as tensors, the structure as JSON metadata: "
                "no pickle; the same conditioning gives the same bytes), so another ComfyUI or host can sample it."
            ),
            inputs=[
                io.Conditioning.Input("conditioning", tooltip="The conditioning to save (any encoder's)."),
                io.String.Input("path", default="h3flow/conditioning.safetensors", tooltip=PATH_TIP),
            ],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, conditioning: Any, path: str) -> io.NodeOutput:
        target = common.resolve_path(path)
        return io.NodeOutput(ui=_saved("conditioning", target, common.save_conditioning_any(target, conditioning)))


class H3LoadConditioning(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3LoadConditioning",
            display_name="H3 Load Conditioning",
            category=CATEGORY,
            description="Reads a conditioning file written by H3 Save Conditioning, refusing one whose SHA-256 is not the expected one.",
            inputs=[
                io.String.Input("path", default="h3flow/conditioning.safetensors", tooltip=PATH_TIP),
                io.String.Input("sha256", default="", optional=True, tooltip=SHA_TIP),
            ],
            outputs=[io.Conditioning.Output(tooltip="The conditioning as it was saved.")],
        )

    @classmethod
    def fingerprint_inputs(cls, path: str, sha256: str = "") -> str:
        return common.file_fingerprint(path)

    @classmethod
    def execute(cls, path: str, sha256: str = "") -> io.NodeOutput:
        return io.NodeOutput(common.load_conditioning_any(common.resolve_path(path), sha256.strip() or None))


# --------------------------------------------------------------------------- latent handoff
class H3LatentHandoffSave(_SaveNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3LatentHandoffSave",
            display_name="H3 Latent Handoff Save",
            category=CATEGORY,
            description=(
                "Writes a LATENT to an .h3latent file: a plain latent, or MiniMax H3's nested (video, audio) pair that "
                "SaveLatent cannot store, with its noise mask (plain or nested) and metadata. Reports the file's "
                "SHA-256, which names it for the decoder."
            ),
            inputs=[
                io.Latent.Input("samples", tooltip="The latent to hand off (e.g. a sampler's output)."),
                io.String.Input("path", default="h3flow/latent.h3latent", tooltip=PATH_TIP),
                io.String.Input(
                    "meta",
                    default="{}",
                    multiline=True,
                    optional=True,
                    tooltip="A JSON object stored as the file's metadata (clip_id, seed, spec, frames ...).",
                ),
            ],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, samples: dict[str, Any], path: str, meta: str = "{}") -> io.NodeOutput:
        target = common.resolve_path(path)
        info = common.parse_meta(meta)
        info.setdefault("producer_node", "H3LatentHandoffSave")
        sha = common.save_handoff(samples["samples"], target, info, common.handoff_masks(samples))
        return io.NodeOutput(ui=_saved("latent", target, sha))


class H3LatentHandoffLoad(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3LatentHandoffLoad",
            display_name="H3 Latent Handoff Load",
            category=CATEGORY,
            description=(
                "Reads an .h3latent file into a LATENT (a nested video + audio latent where the file holds both), "
                "refusing one whose SHA-256 is not the expected one. VAEDecode takes its video, VAEDecodeAudio its audio."
            ),
            inputs=[
                io.String.Input("path", default="h3flow/latent.h3latent", tooltip=PATH_TIP),
                io.String.Input("sha256", default="", optional=True, tooltip=SHA_TIP),
            ],
            outputs=[io.Latent.Output(tooltip="The latent, its noise mask and metadata as saved.")],
        )

    @classmethod
    def fingerprint_inputs(cls, path: str, sha256: str = "") -> str:
        return common.file_fingerprint(path)

    @classmethod
    def execute(cls, path: str, sha256: str = "") -> io.NodeOutput:
        samples, meta, masks = common.load_handoff(common.resolve_path(path), sha256.strip() or None)
        return io.NodeOutput(common.latent_from_handoff(samples, meta, masks))


# --------------------------------------------------------------------------- video out
class H3SaveVideoAAC(_SaveNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3SaveVideoAAC",
            display_name="H3 Save Video (H.264 + AAC)",
            category=CATEGORY,
            description=(
                "Writes frames + audio as an MP4 (H.264 yuv420p, AAC 48 kHz stereo) with exact timestamps, atomically, "
                "and shows it in the UI when it lies under ComfyUI's output or temp folder."
            ),
            inputs=[
                io.Image.Input("images", tooltip="The frames (e.g. VAEDecode's IMAGE)."),
                io.Audio.Input("audio", tooltip="The soundtrack (e.g. VAEDecodeAudio's AUDIO), resampled to 48 kHz."),
                io.String.Input("path", default="h3flow/clip.mp4", tooltip=PATH_TIP),
                io.Float.Input(
                    "fps",
                    default=float(FPS),
                    min=1.0,
                    max=120.0,
                    step=1.0,
                    tooltip="Frames per second (whole numbers; MiniMax H3 makes 24).",
                ),
            ],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, images: torch.Tensor, audio: dict[str, Any], path: str, fps: float) -> io.NodeOutput:
        target = common.resolve_path(path)
        sha = common.save_video_aac(target, images, audio, fps)
        preview = _preview(target)
        return io.NodeOutput(ui=_saved("video", target, sha, preview.as_dict() if preview else None))


def _preview(path: Path) -> ui.PreviewVideo | None:
    """The UI's video player for ``path`` when ComfyUI serves it (under its output or temp folder)."""
    import folder_paths

    for folder, kind in (
        (folder_paths.get_output_directory(), io.FolderType.output),
        (folder_paths.get_temp_directory(), io.FolderType.temp),
    ):
        base = Path(folder).resolve()
        if base in path.resolve().parents:
            relative = path.resolve().relative_to(base)
            subfolder = "" if relative.parent == Path() else relative.parent.as_posix()
            return ui.PreviewVideo([ui.SavedResult(relative.name, subfolder, kind)])
    return None


# --------------------------------------------------------------------------- reference model
class H3ReferenceEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3ReferenceEncode",
            display_name="H3 Reference Encode",
            category=REFERENCE,
            description=(
                "The reference model's encoder (no weights needed): the reference image becomes the first-frame "
                "latent, words in the prompt pick the camera path (pan, tilt, zoom, speed) and the music. Same "
                "conditioning bytes as h3flow's local engine for the same picture."
            ),
            inputs=[
                io.Image.Input("image", tooltip="The reference image (the first frame); the first of a batch is used."),
                io.String.Input(
                    "prompt",
                    multiline=True,
                    default="slow pan left over a calm lake",
                    tooltip="What moves: e.g. 'slow pan left', 'zoom in', 'static'; mood words pick the music.",
                ),
                io.Combo.Input(
                    "spec",
                    options=list(SPECS),
                    default="sd",
                    tooltip="Output size: sd 736x416, hd 1280x736, tiny 224x128.",
                ),
                io.Int.Input(
                    "frames",
                    default=124,
                    min=5,
                    max=3600,
                    step=1,
                    tooltip="Frames at 24 fps, snapped up to 17k+5 (124 = 5.2 s).",
                ),
            ],
            outputs=[io.Conditioning.Output(tooltip="The reference model's conditioning (for H3 Reference Sample).")],
        )

    @classmethod
    def validate_inputs(cls, spec: str) -> bool | str:
        """Before the prompt is queued (ComfyUI 0.3.75 does not check a V3 combo's options itself)."""
        return True if spec in SPECS else f"spec {spec!r} is not one of {', '.join(SPECS)}"

    @classmethod
    def execute(cls, image: torch.Tensor, prompt: str, spec: str, frames: int) -> io.NodeOutput:
        return io.NodeOutput(common.reference_encode(image, prompt, spec, frames))


class H3ReferenceSample(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3ReferenceSample",
            display_name="H3 Reference Sample",
            category=REFERENCE,
            description=(
                "The reference model's flow-matching sampler (Euler, simple schedule, one real attention block): "
                "conditioning + seed -> a nested (video, audio) latent in MiniMax H3's exact layout."
            ),
            inputs=[
                io.Conditioning.Input("conditioning", tooltip="From H3 Reference Encode (or H3 Load Conditioning)."),
                io.Int.Input(
                    "seed",
                    default=0,
                    min=0,
                    max=0xFFFFFFFFFFFFFFFF,
                    control_after_generate=True,
                    tooltip="Noise seed: changes the fine detail and the camera speed by up to 10%.",
                ),
                io.Int.Input("steps", default=6, min=1, max=100, tooltip="Euler steps."),
            ],
            outputs=[io.Latent.Output(tooltip="Video [1,24,T,H/16,W/16] + audio [1,32,2,T40], nested.")],
        )

    @classmethod
    def execute(cls, conditioning: Any, seed: int, steps: int) -> io.NodeOutput:
        video, audio = common.reference_sample(conditioning, seed, steps, progress=_progress_bar(steps))
        return io.NodeOutput({"samples": common.make_samples(video, audio)})


class H3ReferenceDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3ReferenceDecode",
            display_name="H3 Reference Decode",
            category=REFERENCE,
            description="The reference model's decoders: the video latent to frames (INT8 patch decoder), the audio latent to a 48 kHz stereo waveform.",
            inputs=[
                io.Latent.Input("samples", tooltip="A nested (video, audio) latent, e.g. from H3 Reference Sample."),
                io.Boolean.Input(
                    "int8", default=True, tooltip="INT8 decoder weights (as production's INT8 VAE); off: fp32."
                ),
            ],
            outputs=[
                io.Image.Output(tooltip="The frames."),
                io.Audio.Output(tooltip="The soundtrack, 48 kHz stereo."),
            ],
        )

    @classmethod
    def execute(cls, samples: dict[str, Any], int8: bool) -> io.NodeOutput:
        video, audio = common.latent_streams(samples["samples"])
        if audio is None:
            raise H3FlowError("H3ReferenceDecode needs a (video, audio) latent")
        frames, waveform, rate = common.reference_decode(video, audio, samples.get("h3flow_meta") or {}, int8=int8)
        return io.NodeOutput(frames, {"waveform": waveform, "sample_rate": rate})


def _progress_bar(total: int) -> Any:
    """ComfyUI's progress bar (websocket ``progress`` events)."""
    import comfy.utils

    bar = comfy.utils.ProgressBar(total)
    return lambda done: bar.update_absolute(done, total)


NODES: list[type[io.ComfyNode]] = [
    H3MultiGPUCLIPLoader,
    H3SaveConditioning,
    H3LoadConditioning,
    H3LatentHandoffSave,
    H3LatentHandoffLoad,
    H3SaveVideoAAC,
    H3ReferenceEncode,
    H3ReferenceSample,
    H3ReferenceDecode,
]


class H3FlowExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return NODES
