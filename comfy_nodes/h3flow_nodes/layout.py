"""MiniMax H3's latent layout and the output specs: the numbers every stage agrees on.

H3 runs at 24 fps and snaps the frame count up to 17k+5 (124 frames ~ 5.2 s). Its
video latent is ``[B, 24, T, H/16, W/16]`` with ``T = ((frames-5)//17)*5 + 2`` and its
audio latent ``[B, 32, 2, T40]`` with ``T40 = round(frames/24*40)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError

FPS = 24
VIDEO_CHANNELS = 24
AUDIO_CHANNELS = 32
PATCH = 16
AUDIO_RATE = 48_000
AUDIO_LATENT_RATE = 40  # audio latent steps per second


def snap_frames(frames: int) -> int:
    """The smallest 17k+5 frame count that is >= ``frames`` (and >= 5)."""
    if frames <= 5:
        return 5
    return 5 + 17 * math.ceil((frames - 5) / 17)


def frames_for_seconds(seconds: float) -> int:
    return snap_frames(math.ceil(seconds * FPS))


def latent_frames(frames: int) -> int:
    """T: latent frames of a (snapped) pixel frame count."""
    return ((frames - 5) // 17) * 5 + 2


def audio_latent_steps(frames: int) -> int:
    """T40: audio latent steps for a pixel frame count."""
    return round(frames / FPS * AUDIO_LATENT_RATE)


@dataclass(frozen=True)
class Spec:
    """A named output resolution. Height and width are in pixels, multiples of 16."""

    name: str
    height: int
    width: int

    def video_shape(self, frames: int, batch: int = 1) -> tuple[int, int, int, int, int]:
        return (batch, VIDEO_CHANNELS, latent_frames(frames), self.height // PATCH, self.width // PATCH)

    def audio_shape(self, frames: int, batch: int = 1) -> tuple[int, int, int, int]:
        return (batch, AUDIO_CHANNELS, 2, audio_latent_steps(frames))


SPECS: dict[str, Spec] = {
    "sd": Spec("sd", height=416, width=736),
    "hd": Spec("hd", height=736, width=1280),
    # The embedded default's small size: same layout, fast on a 2-core CPU.
    "tiny": Spec("tiny", height=128, width=224),
}


def get_spec(name: str) -> Spec:
    """The spec called ``name``, in any case (the README's tables say "SD")."""
    try:
        return SPECS[name.lower()]
    except (KeyError, AttributeError):
        raise ConfigError(f"unknown spec {name!r} (known: {', '.join(SPECS)})") from None
