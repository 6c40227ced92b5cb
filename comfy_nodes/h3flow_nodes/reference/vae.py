"""The reference VAE: a fixed orthonormal 16x16 patch basis with H3's 24 latent channels.

There are no trained weights. Each 16x16 RGB patch (768 numbers) is projected onto 24
orthonormal basis vectors, each a product of a 2-D DCT-II cosine (over the patch) and an
orthonormal colour direction:

- channels 0-15: luma ``(R+G+B)/sqrt(3)``, DCT frequencies ``(u, v)``, u, v in 0..3
  (row-major: channel = 4*u + v; u vertical, v horizontal);
- channels 16-19: red-blue opponent ``(R-B)/sqrt(2)``, frequencies u, v in 0..1;
- channels 20-23: green-magenta opponent ``(R-2G+B)/sqrt(6)``, frequencies u, v in 0..1.

Pixels in [0, 1] are mapped to [-1, 1] and the projection is divided by 16 (the RMS of a
patch's 256 pixels), so latents are of order one, like a trained VAE's:
``z = B (2x - 1) / 16``. The decoder is the transpose: ``x = (16 B^T z + 1) / 2``. Decoding
an encoding is the orthogonal projection of the patch onto the basis: a low-pass image
(4x4 luma and 2x2 chroma detail per 16-pixel patch), so a round trip is lossy by design.

:class:`Int8Decoder` stores the decoder matrix as int8 with one scale per output channel
(each of the 768 patch pixel components) and multiplies with ``torch._int_mm`` (int8 x
int8 -> int32, activations quantised per token) where that is fast: CUDA. On CPUs torch's
int8 GEMM is several times slower than fp32 without VNNI (measured 7x on the AVX2 build
machine), so there the int8 weights are dequantised once and multiplied in fp32; the
numerics are still those of int8 weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ..layout import PATCH, VIDEO_CHANNELS
from .threads import threads_for

PATCH_DIM = PATCH * PATCH * 3
SCALE = float(PATCH)  # latent = basis . (2x - 1) / SCALE

_LUMA = (1.0 / math.sqrt(3), 1.0 / math.sqrt(3), 1.0 / math.sqrt(3))
_RED_BLUE = (1.0 / math.sqrt(2), 0.0, -1.0 / math.sqrt(2))
_GREEN_MAGENTA = (1.0 / math.sqrt(6), -2.0 / math.sqrt(6), 1.0 / math.sqrt(6))
# (colour direction, DCT frequencies per axis) in channel order.
CHANNEL_PLAN: tuple[tuple[tuple[float, float, float], int], ...] = (
    (_LUMA, 4),
    (_RED_BLUE, 2),
    (_GREEN_MAGENTA, 2),
)


def channel_frequencies() -> list[tuple[int, int]]:
    """(vertical, horizontal) DCT frequency of each latent channel, in channel order."""
    return [(u, v) for _, freqs in CHANNEL_PLAN for u in range(freqs) for v in range(freqs)]


def dct_1d(n: int = PATCH) -> torch.Tensor:
    """Orthonormal DCT-II basis, rows are frequencies: ``[n, n]`` float64."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    basis[0] /= math.sqrt(2.0)
    return basis


def patch_basis() -> torch.Tensor:
    """The 24 x 768 orthonormal basis (float64); a patch vector is ``[py, px, rgb]`` flattened."""
    dct = dct_1d()
    rows: list[torch.Tensor] = []
    for colour, freqs in CHANNEL_PLAN:
        c = torch.tensor(colour, dtype=torch.float64)
        for u in range(freqs):
            for v in range(freqs):
                rows.append(torch.einsum("y,x,c->yxc", dct[u], dct[v], c).reshape(-1))
    basis = torch.stack(rows)
    assert basis.shape == (VIDEO_CHANNELS, PATCH_DIM)
    return basis


def image_to_patches(images: torch.Tensor) -> torch.Tensor:
    """``[N, H, W, 3]`` -> ``[N, H/16, W/16, 768]``."""
    n, h, w, _ = images.shape
    x = images.reshape(n, h // PATCH, PATCH, w // PATCH, PATCH, 3)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(n, h // PATCH, w // PATCH, PATCH_DIM)


def patches_to_image(patches: torch.Tensor) -> torch.Tensor:
    """``[N, h, w, 768]`` -> ``[N, 16h, 16w, 3]`` (a view permuted; contiguous on the next op)."""
    n, h, w, _ = patches.shape
    x = patches.reshape(n, h, w, PATCH, PATCH, 3).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h * PATCH, w * PATCH, 3)


class PatchEncoder:
    """The encoder: the basis, held on a device (what the local engine offloads)."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.basis = patch_basis().to(torch.float32).to(device)

    @property
    def nbytes(self) -> int:
        return self.basis.numel() * self.basis.element_size()

    def to(self, device: str | torch.device) -> PatchEncoder:
        self.basis = self.basis.to(device)
        return self

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """RGB ``[N, H, W, 3]`` in [0, 1] -> latent frames ``[N, 24, H/16, W/16]`` (float32)."""
        if images.shape[1] % PATCH or images.shape[2] % PATCH:
            raise ValueError(f"image size {tuple(images.shape[1:3])} is not a multiple of {PATCH}")
        patches = image_to_patches(images.to(self.basis.device, torch.float32) * 2.0 - 1.0)
        return (patches @ self.basis.T / SCALE).permute(0, 3, 1, 2).contiguous()


def encode_images(images: torch.Tensor) -> torch.Tensor:
    """RGB ``[N, H, W, 3]`` in [0, 1] -> latent frames ``[N, 24, H/16, W/16]`` (float32)."""
    return PatchEncoder(images.device).encode(images)


# Pixel frame <-> latent time: H3 pairs 17k+5 pixel frames with 5k+2 latent frames.
def latent_position(pixel_frame: int) -> float:
    """Where a pixel frame sits on the latent time axis.

    Latent frame 0 is pixel frame 0 (the reference image); latent frame 1 is pixel
    frame 4 (it covers pixels 1-4); from there every 5 latent frames cover 17 pixel
    frames (3.4 each), so latent frame 5k+1 is the last pixel frame 17k+4.
    """
    if pixel_frame <= 4:
        return pixel_frame / 4.0
    return 1.0 + (pixel_frame - 4) * 5.0 / 17.0


def pixel_position(latent_frame: int) -> float:
    """The inverse of :func:`latent_position`: latent frame t's time in pixel frames."""
    if latent_frame <= 1:
        return 4.0 * latent_frame
    return 4.0 + (latent_frame - 1) * 17.0 / 5.0


def interpolation_plan(frames: int, latent_t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each pixel frame: the two latent frames around it and the weight of the second."""
    pos = torch.tensor([min(latent_position(f), latent_t - 1.0) for f in range(frames)], dtype=torch.float64)
    lo = pos.floor().long().clamp(max=latent_t - 1)
    hi = (lo + 1).clamp(max=latent_t - 1)
    return lo, hi, (pos - lo).to(torch.float32)


class Fp32Decoder:
    """Latent frames -> uint8 RGB frames with the transposed basis in float32."""

    name = "fp32"

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        # Fold the affine output map and the uint8 rounding into weight and bias:
        # pixel = 255 * (16 B^T z + 1) / 2, +0.5 so that truncation rounds.
        self.weight = (patch_basis().T * (SCALE * 255.0 / 2.0)).to(torch.float32).to(self.device)  # [768, 24]
        self.bias = 255.0 / 2.0 + 0.5
        self._bias = torch.full((1,), self.bias, device=self.device)

    def matmul(self, z: torch.Tensor) -> torch.Tensor:
        """``[M, 24]`` -> ``[M, 768]`` float32 pixel values + 0.5 (bias included)."""
        return torch.addmm(self._bias, z, self.weight.T)

    def decode(self, latent_frames: torch.Tensor) -> torch.Tensor:
        """``[N, 24, h, w]`` -> uint8 ``[N, 16h, 16w, 3]``."""
        n, _, h, w = latent_frames.shape
        z = latent_frames.to(self.device, torch.float32).permute(0, 2, 3, 1).reshape(n * h * w, VIDEO_CHANNELS)
        out = self.matmul(z).clamp_(0.0, 255.0)
        return patches_to_image(out.reshape(n, h, w, PATCH_DIM)).to(torch.uint8)


class Int8Decoder(Fp32Decoder):
    """The same decoder with int8 weights and one float scale per output channel."""

    name = "int8"

    def __init__(self, device: str | torch.device = "cpu", *, int_mm: bool | None = None) -> None:
        super().__init__(device)
        w = self.weight  # [768, 24], quantised per output channel (row)
        self.w_scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)  # [768, 1]
        self.w_int8 = torch.round(w / self.w_scale).clamp_(-127, 127).to(torch.int8)
        # Dequantised once for devices where int8 GEMM is not the fast path.
        self.weight = self.w_int8.to(torch.float32) * self.w_scale
        self._w_int8_t = self.w_int8.T.contiguous()  # [24, 768]
        self._scale_row = self.w_scale.reshape(1, -1)
        self.int_mm = self._int_mm_works() if int_mm is None else int_mm

    def _int_mm_works(self) -> bool:
        """Auto mode: int8 GEMM on CUDA where this GPU and torch build run it (e.g. not before sm75)."""
        if self.device.type != "cuda":
            return False
        try:
            torch._int_mm(torch.zeros(32, VIDEO_CHANNELS, dtype=torch.int8, device=self.device), self._w_int8_t)
        except RuntimeError:
            return False
        return True

    @property
    def weight_bytes(self) -> int:
        return self.w_int8.numel() + self.w_scale.numel() * 4

    def matmul(self, z: torch.Tensor) -> torch.Tensor:
        if not self.int_mm:
            return torch.addmm(self._bias, z, self.weight.T)
        # Dynamic per-token activation quantisation, int8 x int8 -> int32, then rescale.
        a_scale = (z.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
        a_int8 = torch.round(z / a_scale).clamp_(-127, 127).to(torch.int8)
        rows = a_int8.shape[0]
        if rows <= 16:  # torch._int_mm needs more than 16 rows on CUDA
            a_int8 = torch.cat([a_int8, a_int8.new_zeros(17 - rows, a_int8.shape[1])])
        acc = torch._int_mm(a_int8, self._w_int8_t)[:rows]
        return acc.to(torch.float32).mul_(a_scale).mul_(self._scale_row).add_(self.bias)


def make_decoder(int8: bool, device: str | torch.device = "cpu", *, int_mm: bool | None = None) -> Fp32Decoder:
    return Int8Decoder(device, int_mm=int_mm) if int8 else Fp32Decoder(device)


def decode_video(video: torch.Tensor, frames: int, decoder: Fp32Decoder, *, chunk: int = 2) -> Iterator[torch.Tensor]:
    """A video latent ``[1, 24, T, h, w]`` -> uint8 RGB chunks ``[n, H, W, 3]``, ``frames`` in all.

    Each pixel frame decodes the linear interpolation of the two latent frames around its
    time (see :func:`latent_position`); the decoder is linear, so this equals
    interpolating decoded frames, at a fraction of the memory. Two frames a chunk keep
    the float intermediate (11 MB a frame at HD) in cache: HD decoded 2.5x faster than
    with eight on the build machine.
    """
    if video.dim() != 5 or video.shape[0] != 1 or video.shape[1] != VIDEO_CHANNELS:
        raise ValueError(f"video latent must be [1, {VIDEO_CHANNELS}, T, h, w], got {list(video.shape)}")
    lat = video[0].permute(1, 0, 2, 3).to(decoder.device, torch.float32)  # [T, 24, h, w]
    lo, hi, wt = interpolation_plan(frames, lat.shape[0])
    wt = wt.to(decoder.device)[:, None, None, None]
    for start in range(0, frames, chunk):
        sl = slice(start, min(start + chunk, frames))
        z = torch.lerp(lat[lo[sl]], lat[hi[sl]], wt[sl])
        with threads_for(z.numel() * PATCH_DIM // VIDEO_CHANNELS):
            pixels = decoder.decode(z)
        yield pixels


def decode_to_frames(
    video: torch.Tensor, frames: int, *, int8: bool = True, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """The whole clip as float RGB ``[frames, H, W, 3]`` in [0, 1] (ComfyUI's IMAGE layout)."""
    decoder = make_decoder(int8, device)
    return torch.cat([chunk.to(torch.float32).div_(255.0) for chunk in decode_video(video, frames, decoder)])


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB between two images or videos (inf if identical)."""
    mse = float(((a.to(torch.float64) - b.to(torch.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10.0 * math.log10(peak * peak / mse)
