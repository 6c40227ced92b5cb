"""The reference VAE: orthonormal basis, low-pass bound, INT8 decoder, latent time map."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from h3flow.core.specs import get_spec, latent_frames
from h3flow.reference import vae
from h3flow.reference.conditioning import load_reference_image

IMAGES = Path(__file__).resolve().parents[1] / "examples" / "images"
# First-frame PSNR of an encode/decode round trip against the resized reference, measured
# on examples/images (worst image: checker-sun, whose hard checker edges the 24 channels
# cannot hold): tiny 22.7 dB, SD 31.9 dB (HD 40.4 dB: see test_local_engine). The bounds
# leave ~1.5 dB margin.
ROUND_TRIP_BOUND_DB = {"tiny": 21.0, "sd": 30.0}


def reference_uint8(image: Path, spec: str) -> torch.Tensor:
    s = get_spec(spec)
    return (load_reference_image(image, s.height, s.width) * 255).round().to(torch.uint8)


def test_basis_is_orthonormal_24_by_768() -> None:
    basis = vae.patch_basis()
    assert basis.shape == (24, 16 * 16 * 3)
    assert torch.allclose(basis @ basis.T, torch.eye(24, dtype=torch.float64), atol=1e-12)
    # channel 0 is the patch's mean luma: a constant patch
    assert torch.allclose(basis[0], torch.full((768,), 1 / math.sqrt(768), dtype=torch.float64))
    assert vae.channel_frequencies()[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert vae.channel_frequencies()[16:24] == [(0, 0), (0, 1), (1, 0), (1, 1)] * 2


def test_decoder_is_the_transpose_encode_inverts_it() -> None:
    """An image built from the basis encodes back to its latent: decode then encode is identity."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(2, 24, 3, 5, generator=gen, dtype=torch.float64) * 0.1
    patches = z.permute(0, 2, 3, 1) @ vae.patch_basis() * vae.SCALE  # decoder: 16 B^T z, as patches
    images = (vae.patches_to_image(patches) + 1) / 2
    assert torch.allclose(vae.encode_images(images.float()).double(), z, atol=1e-5)


@pytest.mark.parametrize("spec", ["tiny", "sd"])
def test_round_trip_is_a_low_pass_of_the_reference(spec: str) -> None:
    worst = math.inf
    for image in sorted(IMAGES.glob("*.png")):
        ref = reference_uint8(image, spec)
        decoded = vae.Fp32Decoder().decode(vae.encode_images(ref[None].float() / 255))[0]
        worst = min(worst, vae.psnr(decoded, ref))
    assert ROUND_TRIP_BOUND_DB[spec] <= worst < 60  # lossy by design, but close


def test_int8_decoder_weights_and_psnr_against_fp32() -> None:
    ref = reference_uint8(IMAGES / "shapes.png", "sd")
    z = vae.encode_images(ref[None].float() / 255)
    z = torch.cat([z, z + 0.05 * torch.randn(z.shape, generator=torch.Generator().manual_seed(1))])
    fp32 = vae.Fp32Decoder().decode(z)
    dequant = vae.Int8Decoder(int_mm=False)
    assert dequant.w_int8.dtype == torch.int8 and dequant.w_int8.shape == (768, 24)
    assert dequant.w_scale.shape == (768, 1) and dequant.weight_bytes == 768 * 24 + 768 * 4
    int_mm = vae.Int8Decoder(int_mm=True)  # torch._int_mm: int8 x int8 -> int32
    for decoder in (dequant, int_mm):
        out = decoder.decode(z)
        assert out.dtype == torch.uint8 and out.shape == fp32.shape
        assert not torch.equal(out, fp32)  # really quantised
        assert vae.psnr(out, fp32) >= 40.0


def test_latent_time_map_17k_plus_5() -> None:
    frames = 124
    t = latent_frames(frames)
    assert t == 37
    assert vae.latent_position(0) == 0.0 and vae.latent_position(4) == 1.0
    assert vae.latent_position(21) == pytest.approx(6.0)  # 17 pixel frames -> 5 latent frames
    assert vae.latent_position(frames - 1) == pytest.approx(t - 1)
    for latent in range(t):
        assert vae.latent_position(round(vae.pixel_position(latent))) == pytest.approx(latent, abs=0.15)
    lo, hi, w = vae.interpolation_plan(frames, t)
    assert (lo[0], hi[0], float(w[0])) == (0, 1, 0.0)
    assert (int(lo[-1]), float(w[-1])) == (t - 1, 0.0)


def test_decode_video_interpolates_between_latent_frames() -> None:
    frames, t = 22, latent_frames(22)  # 22 = 17 + 5 -> T = 7
    video = torch.zeros(1, 24, t, 2, 3)
    video[0, 0] = torch.linspace(-1.0, 1.0, t)[:, None, None]  # mean luma ramps over latent time
    decoded = torch.cat(list(vae.decode_video(video, frames, vae.Fp32Decoder(), chunk=5)))
    assert decoded.shape == (frames, 32, 48, 3)
    grey = decoded.float().mean(dim=(1, 2, 3))
    expected = torch.tensor([vae.latent_position(f) for f in range(frames)]) / (t - 1)
    expected = 255 * (16 * (-1 + 2 * expected) / math.sqrt(768) + 1) / 2
    assert torch.allclose(grey, expected.float().clamp(0, 255), atol=1.0)
