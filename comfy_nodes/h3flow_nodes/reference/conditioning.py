"""Conditioning: reference image -> first-frame latent; prompt -> camera path + audio params.

The reference model reads a handful of words from the prompt (lower-cased, split on
anything that is not a letter). The lists below are the whole vocabulary.

Camera (the view moves; the picture moves the other way):
- pan: ``left`` / ``right``; tilt: ``up`` / ``down`` (also ``upward(s)``, ``downward(s)``,
  ``rise``/``rising``, ``descend``/``descending``);
- zoom: ``zoom in`` / ``push in`` / ``dolly in`` / ``closer`` / ``approach`` (in),
  ``zoom out`` / ``pull back`` / ``pull out`` / ``dolly out`` / ``wider`` (out);
- speed: ``slow`` words x0.5, ``fast`` words x2 (:data:`SPEED_WORDS`); ``static``,
  ``motionless``, ``locked``, ``tripod``, ``frozen`` and ``still shot`` / ``camera`` /
  ``frame`` / ``view`` stop the camera.
- no camera word at all: a slow push in.
At speed 1 a pan covers 6% of the frame width per second, a tilt 6% of the height, a
zoom scales by e^0.08 per second.

Audio: 32 oscillators a semitone apart from C3 (130.8 Hz). The mood word that occurs
most (ties: the order of :data:`MOODS`) picks a chord (root + intervals); no mood word
gives an open fifth on C. The pulse rate follows the speed words (1, 2 or 4 Hz) and the
stereo balance follows the pan direction.

The file is safetensors (never pickle): tensors ``first_frame`` [1,24,1,H/16,W/16],
``camera`` [4] (pan x, pan y, zoom per second; speed), ``audio_notes`` [32] (oscillator
weights) and ``audio_params`` [3] (pulse Hz, stereo balance -1..1, level), plus string
metadata (prompt, spec, frames, the SHA-256 of the image's pixels, encoder id, format
version). The seed is
not an encode input: conditioning depends only on (prompt, image bytes, spec, frames),
so one conditioning serves every seed.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..errors import H3FlowError, IntegrityError
from ..files import atomic_write_bytes, sha256_bytes
from ..layout import AUDIO_CHANNELS, Spec
from .vae import PatchEncoder

ENCODER_ID = "h3flow-reference-dct24-v1"
FORMAT = "h3flow-conditioning-v1"

PAN_PER_SECOND = 0.06  # fraction of the frame per second at speed 1
ZOOM_PER_SECOND = 0.08  # log-scale per second at speed 1

LEFT = {"left", "leftward", "leftwards"}
RIGHT = {"right", "rightward", "rightwards"}
UP = {"up", "upward", "upwards", "rise", "rising", "ascend", "ascending"}
DOWN = {"down", "downward", "downwards", "descend", "descending"}
ZOOM_VERBS = {"zoom", "zooms", "zooming", "push", "pushes", "pushing", "dolly", "dollies", "pull", "pulls", "pulling"}
ZOOM_IN_WORDS = {"closer", "approach", "approaching"}
ZOOM_OUT_WORDS = {"wider", "widening"}
STATIC_WORDS = {"static", "motionless", "locked", "tripod", "frozen"}
STILL_NOUNS = {"shot", "camera", "frame", "view"}  # "still shot" is static; "still lake" is not
SPEED_WORDS: dict[str, float] = {
    **dict.fromkeys(("slow", "slowly", "gentle", "gently", "leisurely", "drifting", "drift"), 0.5),
    **dict.fromkeys(("fast", "quick", "quickly", "rapid", "rapidly", "swift", "swiftly", "racing"), 2.0),
}
# mood -> (words, root semitone above C3, chord intervals in semitones)
MOODS: dict[str, tuple[frozenset[str], int, tuple[int, ...]]] = {
    "happy": (
        frozenset(
            ["happy", "bright", "sunny", "joyful", "cheerful", "summer", "morning", "sun", "playful", "energetic"]
        ),
        0,
        (0, 4, 7, 12),  # C major
    ),
    "calm": (
        frozenset(["calm", "peaceful", "serene", "quiet", "lake", "soft", "dreamy", "tranquil", "still"]),
        5,
        (0, 4, 7, 11),  # F major seventh
    ),
    "sad": (
        frozenset(
            ["sad", "dark", "night", "melancholy", "melancholic", "lonely", "rain", "rainy", "cold", "winter", "gloomy"]
        ),
        9,
        (0, 3, 7, 12),  # A minor
    ),
    "tense": (
        frozenset(["tense", "storm", "stormy", "danger", "scary", "ominous", "thunder", "fear"]),
        11,
        (0, 3, 6, 9),  # B diminished seventh
    ),
    "epic": (
        frozenset(["epic", "heroic", "mountain", "mountains", "vast", "grand", "triumphant", "sky"]),
        2,
        (0, 7, 12, 19),  # D open fifths
    ),
}
NEUTRAL_CHORD: tuple[int, tuple[int, ...]] = (0, (0, 7, 12))


@dataclass(frozen=True)
class CameraPath:
    pan_x: float  # fraction of frame width per second, + = view moves right
    pan_y: float  # fraction of frame height per second, + = view moves down
    zoom: float  # log scale per second, + = zoom in
    speed: float

    def to_tensor(self) -> torch.Tensor:
        return torch.tensor([self.pan_x, self.pan_y, self.zoom, self.speed], dtype=torch.float32)


@dataclass(frozen=True)
class AudioParams:
    mood: str
    notes: tuple[int, ...]  # oscillator indices
    pulse_hz: float
    balance: float  # -1 left .. +1 right
    level: float = 0.18

    def notes_tensor(self) -> torch.Tensor:
        weights = torch.zeros(AUDIO_CHANNELS, dtype=torch.float32)
        for i, k in enumerate(self.notes):
            weights[k] = 1.0 / (1.0 + 0.25 * i)  # the root loudest
        return weights

    def params_tensor(self) -> torch.Tensor:
        return torch.tensor([self.pulse_hz, self.balance, self.level], dtype=torch.float32)


@dataclass(frozen=True)
class Conditioning:
    """What encode hands to sample."""

    first_frame: torch.Tensor  # [1, 24, 1, h, w]
    camera: torch.Tensor  # [4]
    audio_notes: torch.Tensor  # [32]
    audio_params: torch.Tensor  # [3]
    meta: dict[str, str] = field(default_factory=dict)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "first_frame": self.first_frame,
            "camera": self.camera,
            "audio_notes": self.audio_notes,
            "audio_params": self.audio_params,
        }


def words(prompt: str) -> list[str]:
    return re.findall(r"[a-z]+", prompt.lower())


def parse_camera(prompt: str) -> CameraPath:
    """The camera path a prompt asks for (see the module docstring for the words)."""
    ws = words(prompt)
    speed = 1.0
    for w in ws:
        speed *= SPEED_WORDS.get(w, 1.0)
    if any(w in STATIC_WORDS for w in ws) or any(a == "still" and b in STILL_NOUNS for a, b in itertools.pairwise(ws)):
        return CameraPath(0.0, 0.0, 0.0, 0.0)
    pan_x = float(sum(w in RIGHT for w in ws) - sum(w in LEFT for w in ws))
    pan_y = float(sum(w in DOWN for w in ws) - sum(w in UP for w in ws))
    zoom = 0.0
    for prev, w in itertools.pairwise(ws):
        if prev in ZOOM_VERBS and w == "in":
            zoom += 1.0
        elif prev in ZOOM_VERBS and w in {"out", "back", "away"}:
            zoom -= 1.0
    zoom += sum(w in ZOOM_IN_WORDS for w in ws) - sum(w in ZOOM_OUT_WORDS for w in ws)
    pan_x, pan_y, zoom = (max(-1.0, min(1.0, v)) for v in (pan_x, pan_y, zoom))
    if pan_x == pan_y == zoom == 0.0:
        zoom, speed = 1.0, speed * 0.5  # the default: a slow push in
    return CameraPath(
        pan_x * PAN_PER_SECOND * speed, pan_y * PAN_PER_SECOND * speed, zoom * ZOOM_PER_SECOND * speed, speed
    )


def parse_audio(prompt: str) -> AudioParams:
    """The chord, pulse and balance a prompt asks for (see the module docstring)."""
    ws = words(prompt)
    counts = {mood: sum(w in vocab for w in ws) for mood, (vocab, _, _) in MOODS.items()}
    best = max(counts, key=lambda m: counts[m])  # first in MOODS order on ties
    if counts[best]:
        _, root, intervals = MOODS[best]
        mood = best
    else:
        (root, intervals), mood = NEUTRAL_CHORD, "neutral"
    camera = parse_camera(prompt)
    pulse = 2.0 * (camera.speed if camera.speed > 0 else 0.5)
    pulse = min(4.0, max(1.0, pulse))
    balance = max(-1.0, min(1.0, camera.pan_x / PAN_PER_SECOND * 0.5)) if camera.speed else 0.0
    notes = tuple(root + i for i in intervals)
    return AudioParams(mood, notes, pulse, balance)


def _read_image_bytes(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise H3FlowError(f"reference image {path}: no such file") from None
    except OSError as exc:
        raise H3FlowError(f"reference image {path}: cannot read it ({exc.strerror})") from None


def decode_image(data: bytes, *, name: str = "image") -> np.ndarray:
    """Image file bytes -> RGB ``uint8 [H, W, 3]``, the way ComfyUI's LoadImage reads them.

    EXIF orientation applied, the first frame of a multi-frame file, 16-bit greyscale
    scaled by 1/255: an image given as a file (h3flow's local engine) and the IMAGE that
    LoadImage makes of the same file (the ComfyUI nodes) are the same pixels.
    """
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            upright = ImageOps.exif_transpose(im) or im
            if upright.mode == "I":
                upright = upright.point(lambda v: v * (1 / 255))
            rgb = upright.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise H3FlowError(f"reference image {name}: cannot read it as an image ({exc})") from None
    return np.asarray(rgb, dtype=np.uint8)


def pixels_of(image: torch.Tensor) -> np.ndarray:
    """A ComfyUI IMAGE (float ``[B, H, W, C]`` in 0..1; the first of the batch) -> RGB ``uint8 [H, W, 3]``."""
    if image.dim() == 3:
        image = image[None]
    if image.dim() != 4 or image.shape[-1] not in (1, 3, 4) or image.shape[0] < 1:
        raise H3FlowError(f"reference image must be an IMAGE [batch, H, W, 3], got {list(image.shape)}")
    frame = image[0, :, :, :3] if image.shape[-1] != 1 else image[0].expand(-1, -1, 3)
    return frame.detach().float().cpu().mul(255.0).round().clamp(0, 255).to(torch.uint8).numpy()


def pixels_sha256(rgb: np.ndarray) -> str:
    """The identity of a picture: its size and RGB bytes (the same for a file and its IMAGE)."""
    height, width = rgb.shape[:2]
    return sha256_bytes(f"{height}x{width}x3:".encode() + np.ascontiguousarray(rgb).tobytes())


def fit_image(rgb: np.ndarray, height: int, width: int) -> torch.Tensor:
    """RGB pixels scaled to cover ``height x width`` and centre-cropped: ``[H, W, 3]`` in [0, 1].

    Aspect ratio is kept (no stretching): the image is resized (Lanczos) so it covers the
    frame, then the overflow is cut evenly from both sides.
    """
    picture = Image.fromarray(np.ascontiguousarray(rgb), mode="RGB")
    scale = max(height / picture.height, width / picture.width)
    size = (
        max(width, math.ceil(picture.width * scale - 1e-9)),
        max(height, math.ceil(picture.height * scale - 1e-9)),
    )
    if size != picture.size:
        picture = picture.resize(size, Image.Resampling.LANCZOS)
    left, top = (picture.width - width) // 2, (picture.height - height) // 2
    picture = picture.crop((left, top, left + width, top + height))
    return torch.from_numpy(np.asarray(picture, dtype=np.float32) / 255.0)


def load_reference_image(path: str | Path, height: int, width: int) -> torch.Tensor:
    """The reference image as the first frame should look: see :func:`fit_image`."""
    return fit_image(decode_image(_read_image_bytes(path), name=str(path)), height, width)


def encode_conditioning(
    prompt: str, image_path: str | Path, spec: Spec, frames: int, *, encoder: PatchEncoder | None = None
) -> Conditioning:
    """Prompt + reference image file -> :class:`Conditioning` (deterministic in its inputs)."""
    rgb = decode_image(_read_image_bytes(image_path), name=str(image_path))
    return encode_pixels(prompt, rgb, spec, frames, encoder=encoder)


def encode_pixels(
    prompt: str, rgb: np.ndarray, spec: Spec, frames: int, *, encoder: PatchEncoder | None = None
) -> Conditioning:
    """Prompt + reference pixels (RGB ``uint8 [H, W, 3]``) -> :class:`Conditioning`.

    Depends only on the prompt, the pixels, the spec and the frame count: a file and the
    IMAGE ComfyUI loads from it give byte-identical conditioning files.
    """
    pixels = fit_image(rgb, spec.height, spec.width)
    latent = (encoder or PatchEncoder()).encode(pixels[None])  # [1, 24, h, w]
    camera = parse_camera(prompt)
    audio = parse_audio(prompt)
    meta = {
        "format": FORMAT,
        "encoder": ENCODER_ID,
        "prompt": prompt,
        "spec": spec.name,
        "height": str(spec.height),
        "width": str(spec.width),
        "frames": str(frames),
        "image_pixels_sha256": pixels_sha256(rgb),
        "mood": audio.mood,
    }
    return Conditioning(
        first_frame=latent[:, :, None].cpu().contiguous(),
        camera=camera.to_tensor(),
        audio_notes=audio.notes_tensor(),
        audio_params=audio.params_tensor(),
        meta=meta,
    )


def _canonical(data: bytes) -> bytes:
    """The same safetensors file with its metadata keys sorted.

    safetensors writes ``__metadata__`` in hash-map order, which changes from call to
    call; sorting makes equal conditioning byte-identical, so its SHA-256 names it.
    """
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8-byte alignment
    return struct.pack("<Q", len(text)) + text + data[8 + length :]


def save_conditioning(path: str | Path, cond: Conditioning) -> str:
    """Write ``cond`` as safetensors, atomically; returns the file's SHA-256."""
    data = _canonical(
        st_save({k: v.detach().cpu().contiguous() for k, v in cond.tensors().items()}, metadata=dict(cond.meta))
    )
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def _metadata(data: bytes) -> dict[str, str]:
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    return dict(header.get("__metadata__") or {})


def load_conditioning(path: str | Path, expected_sha256: str | None = None) -> Conditioning:
    """Read a conditioning file (safetensors only), checking its SHA-256 when given."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise H3FlowError(f"conditioning {path}: no such file") from None
    if expected_sha256 is not None and sha256_bytes(data) != expected_sha256:
        raise IntegrityError(
            f"conditioning {path}: SHA-256 {sha256_bytes(data)[:12]}... != expected {expected_sha256[:12]}..."
        )
    try:
        tensors = st_load(data)
        meta = _metadata(data)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own, unexported error types
        raise H3FlowError(f"conditioning {path}: not a safetensors file ({str(exc).splitlines()[0]})") from None
    missing = {"first_frame", "camera", "audio_notes", "audio_params"} - tensors.keys()
    if missing or meta.get("format") != FORMAT:
        raise H3FlowError(
            f"conditioning {path}: not an h3flow conditioning file (missing {sorted(missing) or 'format'})"
        )
    return Conditioning(
        tensors["first_frame"], tensors["camera"], tensors["audio_notes"], tensors["audio_params"], meta
    )
