"""The reference audio decoder: an audio latent -> 48 kHz stereo waveform.

H3's audio latent is ``[B, 32, 2, T40]``: 32 channels, 2 (stereo), 40 steps per second.
The reference model reads channel k of side c as the amplitude of oscillator k in that
ear. Oscillator k sounds at ``BASE_NOTE_HZ * 2**(k/12)`` (C3 upward in semitones) with a
quarter-strength second harmonic and a fixed phase. Amplitudes (negative values count as
zero) are interpolated linearly from 40 Hz to the sample rate; the mix goes through a
``tanh`` soft limiter, so the output is always within (-1, 1).
"""

from __future__ import annotations

import math

import torch

from h3flow.specs import AUDIO_CHANNELS, AUDIO_LATENT_RATE, AUDIO_RATE

BASE_NOTE_HZ = 130.8128  # C3
GOLDEN_ANGLE = math.pi * (3 - math.sqrt(5))


def oscillator_hz() -> torch.Tensor:
    return BASE_NOTE_HZ * 2.0 ** (torch.arange(AUDIO_CHANNELS, dtype=torch.float64) / 12.0)


def decode_audio(audio: torch.Tensor, samples: int | None = None, *, rate: int = AUDIO_RATE, block: int = AUDIO_RATE) -> torch.Tensor:
    """``[1, 32, 2, T40]`` -> float32 ``[2, samples]`` (default: all of T40, 1200 samples a step)."""
    if audio.dim() != 4 or audio.shape[0] != 1 or audio.shape[1] != AUDIO_CHANNELS or audio.shape[2] != 2:
        raise ValueError(f"audio latent must be [1, {AUDIO_CHANNELS}, 2, T40], got {list(audio.shape)}")
    amps = audio[0].to(torch.float32).cpu().clamp_min(0.0)  # [32, 2, T40]
    steps = amps.shape[-1]
    per_step = rate / AUDIO_LATENT_RATE
    total = round(steps * per_step) if samples is None else samples
    hz = oscillator_hz()
    phase0 = torch.arange(AUDIO_CHANNELS, dtype=torch.float64) * GOLDEN_ANGLE
    out = torch.empty(2, total, dtype=torch.float32)
    for start in range(0, total, block):
        n = torch.arange(start, min(start + block, total), dtype=torch.float64)
        pos = (n / per_step).clamp(max=steps - 1)
        lo = pos.floor().long()
        hi = (lo + 1).clamp(max=steps - 1)
        w = (pos - lo).to(torch.float32)
        amp = torch.lerp(amps[..., lo], amps[..., hi], w)  # [32, 2, n]
        cycles = torch.remainder(hz[:, None] * n[None, :] / rate, 1.0)  # exact phase, then float32
        angle = (2 * math.pi * cycles + phase0[:, None]).to(torch.float32)
        tone = torch.sin(angle) + 0.25 * torch.sin(2 * angle)  # [32, n]
        out[:, start : start + len(n)] = torch.tanh(torch.einsum("kcn,kn->cn", amp, tone))
    return out
