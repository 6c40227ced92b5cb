"""Plain functions behind the nodes: paths, latents <-> .h3latent, conditioning files,
the reference model's stages, MP4 out.

No ComfyUI import at module level: these run (and are tested) outside ComfyUI; where a
ComfyUI module helps (``folder_paths``, ``comfy.nested_tensor``) it is imported lazily.
Nothing here imports h3flow: the pack carries what it needs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .errors import H3FlowError, IntegrityError
from .files import atomic_write_bytes, sha256_bytes, sha256_file
from .h3latent import H3Latent, frames_of, load_latent, save_latent
from .layout import AUDIO_RATE, FPS, get_spec, latent_frames, snap_frames
from .mux import mux_mp4
from .paths import resolve_path
from .reference.conditioning import Conditioning, encode_pixels, load_conditioning, pixels_of, save_conditioning

COMFY_COND_FORMAT = "h3flow-comfy-conditioning-v1"
FILES_KEY = "h3flow_files"  # the key of a save node's UI output that the engine reads


def file_ref(path: Path, sha256: str, kind: str) -> dict[str, Any]:
    """What a save node reports (UI output ``h3flow_files``): the engine reads these."""
    return {"path": str(path), "sha256": sha256, "size": path.stat().st_size, "kind": kind}


def file_fingerprint(path: str) -> str:
    """IS_CHANGED for load nodes: the file's SHA-256 (content, not mtime), or a marker."""
    try:
        return sha256_file(resolve_path(path))
    except (OSError, H3FlowError) as exc:
        return f"unreadable:{exc}"


# --------------------------------------------------------------------------- latents
class NestedLatent:
    """A (video, audio) pair shaped like upstream ``comfy.nested_tensor.NestedTensor``.

    Used only where that module does not exist (ComfyUI before MiniMax H3 support).
    """

    is_nested = True

    def __init__(self, tensors: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> None:
        self.tensors = list(tensors)

    def unbind(self) -> list[torch.Tensor]:
        return list(self.tensors)

    @property
    def shape(self) -> torch.Size:
        return self.tensors[0].shape

    def __repr__(self) -> str:
        return f"NestedLatent({[tuple(t.shape) for t in self.tensors]})"


def latent_streams(samples: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(video, audio or None) of a LATENT's ``samples``: a plain tensor or a nested pair.

    Nested latents are duck-typed (``.is_nested`` + ``.tensors``), as upstream's
    NestedTensor is not importable on every ComfyUI.
    """
    if getattr(samples, "is_nested", False):
        parts = list(samples.tensors) if hasattr(samples, "tensors") else list(samples.unbind())
        if len(parts) != 2 or not all(isinstance(p, torch.Tensor) for p in parts):
            raise H3FlowError(f"a nested latent must be a (video, audio) pair of tensors, got {len(parts)} parts")
        return parts[0], parts[1]
    if isinstance(samples, torch.Tensor):
        return samples, None
    raise H3FlowError(f"not a latent: {type(samples).__name__}")


def make_samples(video: torch.Tensor, audio: torch.Tensor | None) -> Any:
    """A LATENT's ``samples`` again: upstream NestedTensor where it exists, else NestedLatent."""
    if audio is None:
        return video
    try:
        from comfy.nested_tensor import NestedTensor

        return NestedTensor((video, audio))
    except ImportError:
        return NestedLatent((video, audio))


def save_handoff(samples: Any, path: Path, meta: dict[str, str], masks: dict[str, torch.Tensor] | None = None) -> str:
    """A LATENT's samples → ``.h3latent`` at ``path`` (atomic); returns its SHA-256."""
    video, audio = latent_streams(samples)
    return save_latent(path, H3Latent(video=video, audio=audio, meta=meta, masks=dict(masks or {})))


def load_handoff(path: Path, expected_sha256: str | None) -> tuple[Any, dict[str, str], dict[str, torch.Tensor]]:
    """``.h3latent`` → (samples, meta, masks), the SHA-256 checked when one is given."""
    latent = load_latent(path, expected_sha256=expected_sha256 or None)
    return (
        make_samples(latent.video.float(), None if latent.audio is None else latent.audio.float()),
        latent.meta,
        latent.masks,
    )


def handoff_masks(latent: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The masks of a LATENT that travel in the .h3latent: its ``noise_mask``, plain or nested.

    A nested (video, audio) mask (upstream's NestedTensor, as H3's AV latents have) is
    kept as ``noise_video`` + ``noise_audio``; anything else is refused, never dropped.
    """
    mask = latent.get("noise_mask")
    if mask is None:
        return {}
    if isinstance(mask, torch.Tensor):
        return {"noise": mask}
    if getattr(mask, "is_nested", False):
        parts = list(mask.tensors) if hasattr(mask, "tensors") else list(mask.unbind())
        if len(parts) == 2 and all(isinstance(p, torch.Tensor) for p in parts):
            return {"noise_video": parts[0], "noise_audio": parts[1]}
    raise H3FlowError(
        f"noise_mask: a {type(mask).__name__} cannot be saved (a tensor, or a nested (video, audio) pair of tensors)"
    )


def latent_from_handoff(samples: Any, meta: dict[str, str], masks: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A LATENT dict from a loaded .h3latent: samples, the noise mask (rebuilt nested), the metadata."""
    out: dict[str, Any] = {"samples": samples, "h3flow_meta": meta}
    if "noise" in masks:
        out["noise_mask"] = masks["noise"]
    elif "noise_video" in masks and "noise_audio" in masks:
        out["noise_mask"] = make_samples(masks["noise_video"], masks["noise_audio"])
    return out


def parse_meta(text: str) -> dict[str, str]:
    """The ``meta`` input of H3LatentHandoffSave: a JSON object of strings."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise H3FlowError(f"meta must be a JSON object: {exc.msg} at column {exc.colno}") from None
    if not isinstance(data, dict):
        raise H3FlowError("meta must be a JSON object")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


# --------------------------------------------------------------------------- conditioning
def _flatten(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """A JSON tree for ``value`` with tensors replaced by references into ``tensors``."""
    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = value.detach().to("cpu").contiguous().clone()
        return {"__tensor__": name}
    if getattr(value, "is_nested", False) and hasattr(value, "tensors"):
        return {"__nested__": [_flatten(t, tensors, f"{where}[{i}]") for i, t in enumerate(value.tensors)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"__tuple__": [_flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise H3FlowError(f"conditioning {where}: only string keys can be saved")
        return {"__dict__": {k: _flatten(v, tensors, f"{where}.{k}") for k, v in value.items()}}
    raise H3FlowError(
        f"conditioning {where}: a {type(value).__name__} cannot be saved (tensors, numbers, strings only)"
    )


def _unflatten(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, list):
        return [_unflatten(v, tensors) for v in node]
    if isinstance(node, dict):
        if "__tensor__" in node:
            return tensors[node["__tensor__"]]
        if "__nested__" in node:
            parts = [_unflatten(v, tensors) for v in node["__nested__"]]
            return make_samples(parts[0], parts[1]) if len(parts) == 2 else NestedLatent(parts)
        if "__tuple__" in node:
            return tuple(_unflatten(v, tensors) for v in node["__tuple__"])
        if "__dict__" in node:
            return {k: _unflatten(v, tensors) for k, v in node["__dict__"].items()}
        raise H3FlowError("conditioning file: unknown structure entry")
    return node


def canonical_safetensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """safetensors bytes with a key-sorted header: same content, same bytes, same SHA-256.

    (safetensors writes ``__metadata__`` in a random order on every call.)
    """
    data = st_save(tensors, metadata=metadata)
    (length,) = struct.unpack("<Q", data[:8])
    header = json.dumps(json.loads(data[8 : 8 + length]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data[8 + length :]


def save_structured(path: Path, value: Any, meta: dict[str, str] | None = None) -> str:
    """Any tree of lists/tuples/dicts/tensors/scalars (ComfyUI CONDITIONING) → safetensors.

    Tensors are stored as tensors; the tree is JSON in the metadata, so loading needs
    no pickle. Returns the SHA-256 of the bytes written.
    """
    tensors: dict[str, torch.Tensor] = {}
    structure = _flatten(value, tensors, "conditioning")
    header = {**(meta or {}), "format": COMFY_COND_FORMAT, "structure": json.dumps(structure)}
    data = canonical_safetensors(tensors, header)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def file_format(data: bytes) -> str:
    """The ``format`` metadata of a safetensors file's bytes ('' when absent or unreadable)."""
    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        return str((header.get("__metadata__") or {}).get("format", ""))
    except (struct.error, ValueError, UnicodeDecodeError):
        return ""


def load_structured(data: bytes, path: Path) -> Any:
    try:
        tensors = st_load(data)
        (length,) = struct.unpack("<Q", data[:8])
        meta = json.loads(data[8 : 8 + length]).get("__metadata__") or {}
        return _unflatten(json.loads(meta["structure"]), tensors)
    except H3FlowError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' and json's own errors
        raise H3FlowError(
            f"conditioning {path}: not a readable h3flow conditioning file ({str(exc).splitlines()[0]})"
        ) from None


def save_conditioning_any(path: Path, cond: Any) -> str:
    """The reference model's Conditioning via its own writer; ComfyUI conditioning structured."""
    if isinstance(cond, Conditioning):
        return save_conditioning(path, cond)
    return save_structured(path, cond)


def load_conditioning_any(path: Path, expected_sha256: str | None) -> Any:
    """Either kind of conditioning file, the SHA-256 checked when one is given."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise H3FlowError(f"conditioning {path}: cannot read it ({exc.strerror or exc})") from None
    if expected_sha256 and sha256_bytes(data) != expected_sha256.lower():
        raise IntegrityError(f"conditioning {path} has SHA-256 {sha256_bytes(data)}, expected {expected_sha256}")
    if file_format(data) == COMFY_COND_FORMAT:
        return load_structured(data, path)
    return load_conditioning(path, expected_sha256 or None)


# --------------------------------------------------------------------------- reference model
def reference_encode(image: torch.Tensor, prompt: str, spec: str, frames: int) -> Conditioning:
    """The reference model's encode of an IMAGE: byte for byte what the local engine writes
    for the file LoadImage read it from (the conditioning depends on the pixels)."""
    return encode_pixels(prompt, pixels_of(image), get_spec(spec), snap_frames(frames))


def reference_sample(cond: Any, seed: int, steps: int, progress: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference model's sampler (degree 1, in-process)."""
    from .reference.sampler import sample_latent

    if not isinstance(cond, Conditioning):
        raise H3FlowError("H3ReferenceSample needs the reference model's conditioning (from H3ReferenceEncode)")
    video, audio = sample_latent(cond, seed=seed, steps=steps)
    if progress is not None:
        progress(steps)
    return video, audio


def reference_decode(
    video: torch.Tensor, audio: torch.Tensor, meta: dict[str, str], *, int8: bool = True
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Latents → (IMAGE float [F,H,W,3] in 0..1, waveform [1,2,N], sample rate), as the local engine decodes."""
    from .reference.audio import decode_audio
    from .reference.vae import decode_video, make_decoder

    frames = frames_of(H3Latent(video=video, audio=audio, meta=meta))
    if latent_frames(frames) != video.shape[2]:
        raise H3FlowError(f"latent has T={video.shape[2]} but {frames} frames need T={latent_frames(frames)}")
    chunks = list(decode_video(video[:1], frames, make_decoder(int8)))
    images = torch.cat(chunks).to(torch.float32).div_(255.0)
    waveform = decode_audio(audio[:1], frames * AUDIO_RATE // FPS)
    return images, waveform[None], AUDIO_RATE


# --------------------------------------------------------------------------- video out
def stereo_at(waveform: torch.Tensor, rate: int, target_rate: int) -> torch.Tensor:
    """``[C, N]`` float → ``[2, M]`` at ``target_rate`` (libswresample via PyAV)."""
    wave = waveform.detach().to("cpu", torch.float32)
    if wave.shape[0] == 1:
        wave = wave.repeat(2, 1)
    elif wave.shape[0] > 2:
        wave = wave[:2]
    if rate == target_rate:
        return wave.contiguous()
    import av
    import numpy as np

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(wave.numpy()), format="fltp", layout="stereo")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="fltp", layout="stereo", rate=target_rate)
    parts = [f.to_ndarray() for f in resampler.resample(frame)] + [f.to_ndarray() for f in resampler.resample(None)]
    return torch.from_numpy(np.concatenate(parts, axis=1)) if parts else torch.zeros(2, 0)


def save_video_aac(path: Path, images: torch.Tensor, audio: dict[str, Any], fps: float) -> str:
    """IMAGE [F,H,W,3] floats + AUDIO → MP4 through :func:`.mux.mux_mp4`; returns the SHA-256."""
    if images.dim() != 4 or images.shape[-1] != 3:
        raise H3FlowError(f"images must be [frames, H, W, 3], got {list(images.shape)}")
    if abs(fps - round(fps)) > 1e-6:
        raise H3FlowError(f"fps must be a whole number for exact AAC timestamps, got {fps}")
    waveform = audio["waveform"]
    waveform = waveform[0] if waveform.dim() == 3 else waveform
    wave = stereo_at(waveform, int(audio["sample_rate"]), AUDIO_RATE)

    def chunks(step: int = 8) -> Any:  # decode_video's chunk: the same MP4 bytes as the local engine
        for start in range(0, images.shape[0], step):
            yield images[start : start + step].mul(255.0).round_().clamp_(0, 255).to(torch.uint8)

    return mux_mp4(path, chunks(), wave, fps=round(fps), sample_rate=AUDIO_RATE).sha256
