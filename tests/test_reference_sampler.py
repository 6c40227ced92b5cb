"""The flow-matching sampler: schedule, determinism, seed variation, camera motion, attention."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from h3flow.core.errors import ConfigError
from h3flow.core.specs import get_spec
from h3flow.reference import conditioning as C
from h3flow.reference import sampler as S
from h3flow.reference.conditioning import Conditioning, encode_conditioning
from h3flow.reference.ulysses import ParallelContext, check_degree, heads_to_seq, padded_length, seq_to_heads

IMAGE = Path(__file__).resolve().parents[1] / "examples" / "images" / "shapes.png"


@lru_cache
def cond(prompt: str) -> Conditioning:
    return encode_conditioning(prompt, IMAGE, get_spec("tiny"), 124)


def best_shift(a: torch.Tensor, b: torch.Tensor, dim: int) -> int:
    """The integer shift of ``a`` along ``dim`` (interior only) that best matches ``b``."""
    errors = {}
    for shift in range(-8, 9):
        moved = torch.roll(a, shift, dims=dim)
        inner = [slice(None)] * a.dim()
        inner[dim] = slice(8, a.shape[dim] - 8)
        errors[shift] = float((moved[tuple(inner)] - b[tuple(inner)]).abs().mean())
    return min(errors, key=errors.__getitem__)


def test_simple_schedule_matches_comfyui() -> None:
    # ComfyUI simple_scheduler over a 1000-entry flow table (shift 1): sigmas[-(1 + int(i * 1000/6))]
    expected = [1.0, 0.834, 0.667, 0.5, 0.334, 0.167, 0.0]
    assert S.simple_sigmas(6).tolist() == pytest.approx(expected)
    assert S.simple_sigmas(1).tolist() == [1.0, 0.0]
    shifted = S.simple_sigmas(6, shift=3.0)
    assert shifted[0] == 1.0 and shifted[-1] == 0.0 and shifted[3] == pytest.approx(0.75)


def test_euler_lands_on_the_last_prediction() -> None:
    target = torch.full((4,), 2.0)
    out = S.euler(torch.randn(4), S.simple_sigmas(6), lambda x, sigma: target)
    assert torch.allclose(out, target, atol=1e-6)


def test_shapes_determinism_and_seed_variation() -> None:
    c = cond("pan right")
    video, audio = S.sample_latent(c, seed=7)
    assert video.shape == (1, 24, 37, 8, 14) and audio.shape == (1, 32, 2, 207)
    assert video.dtype == audio.dtype == torch.float32
    again, again_audio = S.sample_latent(c, seed=7)
    assert torch.equal(video, again) and torch.equal(audio, again_audio)
    other, other_audio = S.sample_latent(c, seed=8)
    assert not torch.equal(video, other) and not torch.equal(audio, other_audio)
    assert float((video - other).abs().mean()) < 0.1  # variation, not a different picture
    assert torch.equal(video[:, :, 0], c.first_frame[:, :, 0])  # latent frame 0 = the reference image


def test_attention_block_is_a_small_real_residual() -> None:
    c = cond("zoom in")
    target = S.camera_target(c.first_frame, c.camera, 37, speed_factor=1.0)
    no_attn, _ = S.sample_latent(c, seed=3, config=S.DenoiserConfig(gain=0.0))
    with_attn, _ = S.sample_latent(c, seed=3)
    gen = torch.Generator().manual_seed(3)
    speed = 1.0 + 0.1 * (2 * float(torch.rand(1, generator=gen)) - 1)
    assert torch.allclose(no_attn, S.camera_target(c.first_frame, c.camera, 37, speed), atol=1e-6)
    residual = (with_attn - no_attn)[:, :, 1:]
    assert 1e-3 < float(residual.abs().max()) < 0.2
    assert float((no_attn - target).abs().max()) > 0  # the seed jittered the camera speed


@pytest.mark.parametrize(
    ("prompt", "dim", "sign"), [("pan right", 1, -1), ("pan left", 1, 1), ("tilt down", 0, -1), ("tilt up", 0, 1)]
)
def test_camera_moves_the_picture(prompt: str, dim: int, sign: int) -> None:
    """The view moves with the camera, so the picture moves the other way (SD: 26 x 46 latent cells)."""
    c = encode_conditioning(prompt, IMAGE, get_spec("sd"), 124)
    luma = S.camera_target(c.first_frame, c.camera, 37)[0, 0]  # [T, h, w] mean-luma channel
    shift = best_shift(luma[0], luma[-1], dim)
    assert shift * sign >= 2  # 6% of the frame a second for 5 s: 30% = ~8 rows, ~14 columns at the end


def test_zoom_in_magnifies_the_centre() -> None:
    c = cond("zoom in")
    first = torch.zeros_like(c.first_frame)
    first[0, 0, 0, 2:6, 8:10] = 1.0  # a bright patch right of the centre (column 6.5)
    centre = float((first[0, 0, 0].sum(dim=0) * torch.arange(14)).sum() / first[0, 0, 0].sum())

    def column(camera: torch.Tensor) -> float:
        cols = S.camera_target(first, camera, 37)[0, 0, -1].sum(dim=0)
        return float((cols * torch.arange(14)).sum() / cols.sum())

    assert column(c.camera) > centre + 0.5  # zoom in pushes it outward
    assert column(torch.tensor([0.0, 0.0, -C.ZOOM_PER_SECOND, 1.0])) < centre - 0.5  # zoom out pulls it in


def test_audio_target_is_the_chord_panned() -> None:
    c = cond("fast pan left, happy")
    _, audio = S.sample_latent(c, seed=1)
    per_note = audio[0].abs().amax(dim=(1, 2))
    assert set(torch.nonzero(per_note > 1e-3).flatten().tolist()) == set(
        torch.nonzero(c.audio_notes).flatten().tolist()
    )
    assert float(audio[0, :, 0].sum()) > float(audio[0, :, 1].sum())  # left ear louder


def test_ulysses_helpers_at_degree_one_and_degree_checks() -> None:
    ctx = ParallelContext()
    x = torch.randn(10, 3, 8, 4)
    assert seq_to_heads(ctx, x) is x and heads_to_seq(ctx, x[:, 0]) is not None
    assert padded_length(1196, 8) == 1200 and ParallelContext(3, 8).shard(1196) == (450, 600)
    for degree in (1, 2, 4, 8):
        check_degree(degree, 8)
    for degree in (3, 16):
        with pytest.raises(ConfigError, match="degree"):
            check_degree(degree, 8)
    with pytest.raises(ConfigError, match="does not divide"):
        check_degree(8, 4)


def test_config_is_part_of_the_model_id() -> None:
    base = S.DenoiserConfig()
    assert base.model_id != replace(base, gain=0.02).model_id
