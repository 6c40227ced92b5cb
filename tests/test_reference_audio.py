"""The audio decoder: latent [1, 32, 2, T40] -> 48 kHz stereo waveform."""

from __future__ import annotations

import math

import pytest
import torch

from h3flow.core.specs import AUDIO_RATE, audio_latent_steps
from h3flow.reference.audio import BASE_NOTE_HZ, decode_audio, oscillator_hz


def dominant_hz(signal: torch.Tensor, rate: int = AUDIO_RATE) -> float:
    spectrum = torch.fft.rfft(signal.double() * torch.hann_window(len(signal), dtype=torch.float64)).abs()
    return float(torch.argmax(spectrum)) * rate / len(signal)


def test_one_oscillator_in_one_ear() -> None:
    steps = audio_latent_steps(124)
    latent = torch.zeros(1, 32, 2, steps)
    latent[0, 9, 0] = 0.3  # A3 in the left ear only
    wave = decode_audio(latent)
    assert wave.shape == (2, steps * 1200) and wave.dtype == torch.float32
    assert oscillator_hz()[9] == pytest.approx(220.0, abs=0.01) and oscillator_hz()[0] == BASE_NOTE_HZ
    assert dominant_hz(wave[0]) == pytest.approx(220.0, abs=1.0)
    assert float(wave[1].abs().max()) == 0.0
    rms = float(wave[0].pow(2).mean().sqrt())
    assert rms == pytest.approx(math.tanh(0.3) / math.sqrt(2), rel=0.1)  # a sine of amplitude ~0.3 (+ harmonic)


def test_chord_is_loud_bounded_and_silence_is_silent() -> None:
    steps = audio_latent_steps(124)
    latent = torch.zeros(1, 32, 2, steps)
    for note in (0, 4, 7, 12):
        latent[0, note] = 0.2
    wave = decode_audio(latent, 124 * 2000)
    assert wave.shape == (2, 248_000)
    assert float(wave.pow(2).mean().sqrt()) > 0.1 and float(wave.abs().max()) < 1.0
    assert float(decode_audio(torch.zeros(1, 32, 2, steps)).abs().max()) == 0.0
    assert float(decode_audio(-latent).abs().max()) == 0.0  # negative amplitudes count as zero


def test_amplitude_is_interpolated_between_steps_and_held_after_the_end() -> None:
    latent = torch.zeros(1, 32, 2, 3)
    latent[0, 12, :, 1:] = 0.4  # silent at step 0, 0.4 from step 1 on
    wave = decode_audio(latent, 6000)  # 5 steps' worth: the last value is held
    rms = wave[0].reshape(-1, 600).pow(2).mean(dim=1).sqrt()  # half-step windows
    # mean amplitude per window: 0.1 (ramp 0 -> 0.2), 0.3 (0.2 -> 0.4), then 0.4 held
    assert float(rms[0] / rms[2]) == pytest.approx(0.25, abs=0.05)
    assert float(rms[1] / rms[2]) == pytest.approx(0.75, abs=0.05)
    assert torch.allclose(rms[2:], rms[2:].mean(), rtol=0.05)


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="audio latent"):
        decode_audio(torch.zeros(1, 24, 2, 10))
    with pytest.raises(ValueError, match="multiple of 40"):
        decode_audio(torch.zeros(1, 32, 2, 10), rate=44_110)
