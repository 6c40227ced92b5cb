"""The reference audio decoder: an audio latent -> 48 kHz stereo waveform.

H3's audio latent is ``[B, 32, 2, T40]``: 32 channels, 2 (stereo), 40 steps per second.
The reference model reads channel k of side c as the amplitude of oscillator k in that
ear. Oscillator k sounds at ``BASE_NOTE_HZ * 2**(k/12)`` (C3 upward in semitones) with a
quarter-strength second harmonic and a fixed phase (k times the golden angle).
Amplitudes (negative values count as zero) are interpolated linearly from 40 Hz to the
sample rate (step s sits at sample s * rate/40; past the last step they hold); the mix
goes through a ``tanh`` soft limiter, so the output is always within (-1, 1).
"""

from __future__ import annotations

import math

import torch

from ..layout import AUDIO_CHANNELS, AUDIO_LATENT_RATE, AUDIO_RATE
from .threads import threads_for

BASE_NOTE_HZ = 130.8128  # C3
GOLDEN_ANGLE = math.pi * (3 - math.sqrt(5))


def oscillator_hz() -> torch.Tensor:
    return BASE_NOTE_HZ * 2.0 ** (torch.arange(AUDIO_CHANNELS, dtype=torch.float64) / 12.0)


def decode_audio(audio: torch.Tensor, samples: int | None = None, *, rate: int = AUDIO_RATE) -> torch.Tensor:
    """``[1, 32, 2, T40]`` -> float32 ``[2, samples]`` (default: all of T40, rate/40 samples a step).

    Within one latent step (rate/40 samples) the amplitudes are a line ``A + frac * dA``
    and each oscillator is ``sin(theta_start + omega * m)``; by the angle-addition rule
    the whole step is a few small matrix products against fixed cos/sin tables of one
    step, so no per-sample ``sin`` is evaluated.
    """
    with threads_for(0):  # a few small matrix products
        return _decode_audio(audio, samples, rate=rate)


def _decode_audio(audio: torch.Tensor, samples: int | None, *, rate: int) -> torch.Tensor:
    if audio.dim() != 4 or audio.shape[0] != 1 or audio.shape[1] != AUDIO_CHANNELS or audio.shape[2] != 2:
        raise ValueError(f"audio latent must be [1, {AUDIO_CHANNELS}, 2, T40], got {list(audio.shape)}")
    if rate % AUDIO_LATENT_RATE:
        raise ValueError(f"sample rate {rate} is not a multiple of {AUDIO_LATENT_RATE}")
    per_step = rate // AUDIO_LATENT_RATE
    amps = audio[0].to(torch.float64).cpu().clamp_min(0.0)  # [32, 2, T40]
    steps = amps.shape[-1]
    total = steps * per_step if samples is None else samples
    segments = max(1, -(-total // per_step))
    idx = torch.arange(segments).clamp(max=steps - 1)
    level = amps[..., idx]  # [32, 2, S]: amplitude at each step's start
    slope = amps[..., (idx + 1).clamp(max=steps - 1)] - level  # to the next step's value; 0 past the end

    omega = 2 * math.pi * oscillator_hz() / rate  # [32] radians per sample
    start = torch.arange(segments, dtype=torch.float64) * per_step
    theta = (
        torch.remainder(omega[:, None] * start[None, :], 2 * math.pi)
        + torch.arange(AUDIO_CHANNELS)[:, None] * GOLDEN_ANGLE
    )
    m = torch.arange(per_step, dtype=torch.float64)
    # tone = sin(a) + 1/4 sin(2a); sin(t + w m) = sin t cos(w m) + cos t sin(w m)
    tables = torch.cat(
        [
            torch.cos(omega[:, None] * m),
            torch.sin(omega[:, None] * m),
            torch.cos(2 * omega[:, None] * m),
            torch.sin(2 * omega[:, None] * m),
        ]
    )  # [128, per_step]
    phase = torch.cat(
        [torch.sin(theta), torch.cos(theta), 0.25 * torch.sin(2 * theta), 0.25 * torch.cos(2 * theta)]
    )  # [128, S]

    def mix(amp: torch.Tensor) -> torch.Tensor:  # [32, 2, S] -> [2, S, per_step]
        coef = amp.repeat(4, 1, 1) * phase[:, None, :]  # [128, 2, S]
        return (coef.permute(1, 2, 0) @ tables).to(torch.float32)

    frac = (m / per_step).to(torch.float32)
    wave = mix(level) + frac * mix(slope)
    return torch.tanh(wave.reshape(2, segments * per_step)[:, :total]).contiguous()
