"""Flow-matching sampler of the reference model: Euler, ComfyUI's "simple" schedule.

Rectified flow: ``x_sigma = sigma * noise + (1 - sigma) * x0``. The denoiser predicts
the clean latent ``x0``; Euler steps ``x += (x - x0_hat) / sigma * (sigma_next - sigma)``
from sigma 1 down to 0, so the last step lands exactly on the last prediction.

The denoiser's prediction is a *target* plus a small attention residual:

- video target: the first-frame latent moved along the prompt's camera path (each
  latent frame at its pixel time, see :func:`.vae.pixel_position`),
  the seed jittering the camera speed by up to +-10%;
- a real multi-head self-attention block (8 heads x 8 dims, seeded fixed weights,
  output gain 0.01) over 2x2 latent patches, within each latent frame; it sees the
  noisy input, so the seed's noise leaves a small, deterministic trace in the result;
- latent frame 0 is pinned to the reference image's latent (image-to-video);
- audio target: the chord of the prompt's mood, pulsing, panned, seeded detail.

Attention runs sequence-parallel (:mod:`.ulysses`); everything else is
per token, so a rank only ever touches its own shard.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..layout import AUDIO_CHANNELS, AUDIO_LATENT_RATE, FPS, VIDEO_CHANNELS, audio_latent_steps, latent_frames
from .conditioning import Conditioning
from .denoiser import SAMPLER_ID, DenoiserConfig  # noqa: F401 - defined torch-free there
from .threads import threads_for
from .ulysses import ParallelContext, gather_sequence, heads_to_seq, padded_length, seq_to_heads
from .vae import channel_frequencies, pixel_position

TOKEN_PATCH = 2  # latent cells per token side (a DiT's patchify)
TOKEN_DIM = VIDEO_CHANNELS * TOKEN_PATCH * TOKEN_PATCH


def simple_sigmas(steps: int, shift: float = 1.0) -> torch.Tensor:
    """ComfyUI's "simple" scheduler over a 1000-entry flow sigma table, plus the final 0."""
    t = torch.arange(1, 1001, dtype=torch.float64) / 1000.0
    table = shift * t / (1 + (shift - 1) * t)
    stride = len(table) / steps
    sigmas = [float(table[-(1 + int(i * stride))]) for i in range(steps)] + [0.0]
    return torch.tensor(sigmas, dtype=torch.float32)


class AttentionBlock:
    """LayerNorm -> QKV -> per-frame multi-head attention (sequence-parallel) -> out * gain."""

    def __init__(self, config: DenoiserConfig, device: torch.device) -> None:
        self.config = config
        gen = torch.Generator().manual_seed(config.weight_seed)
        inner = config.heads * config.head_dim
        self.w_qkv = (torch.randn(3 * inner, TOKEN_DIM, generator=gen) / math.sqrt(TOKEN_DIM)).to(device)
        self.w_out = (torch.randn(TOKEN_DIM, inner, generator=gen) / math.sqrt(inner)).to(device)

    def __call__(self, ctx: ParallelContext, x: torch.Tensor, frames: int, per_frame: int) -> torch.Tensor:
        """``x``: this rank's token shard ``[L/P, 96]`` -> the residual for the same shard."""
        heads, dim = self.config.heads, self.config.head_dim
        qkv = F.linear(F.layer_norm(x, (TOKEN_DIM,)), self.w_qkv).reshape(-1, 3, heads, dim)
        qkv = seq_to_heads(ctx, qkv)[: frames * per_frame]  # all real tokens, my heads
        local_heads = qkv.shape[2]
        q, k, v = (qkv[:, i].reshape(frames, per_frame, local_heads, dim).transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(frames * per_frame, local_heads, dim)
        y = F.pad(y, (0, 0, 0, 0, 0, padded_length(frames * per_frame, ctx.world) - frames * per_frame))
        y = heads_to_seq(ctx, y).reshape(-1, heads * dim)
        return F.linear(y, self.w_out) * self.config.gain


def to_tokens(video: torch.Tensor) -> torch.Tensor:
    """``[1, 24, T, h, w]`` -> ``[T * (h/2) * (w/2), 96]`` (frame-major, then row, column)."""
    _, c, t, h, w = video.shape
    p = TOKEN_PATCH
    x = video[0].reshape(c, t, h // p, p, w // p, p).permute(1, 2, 4, 0, 3, 5)
    return x.reshape(t * (h // p) * (w // p), c * p * p)


def from_tokens(tokens: torch.Tensor, t: int, h: int, w: int) -> torch.Tensor:
    p = TOKEN_PATCH
    x = tokens.reshape(t, h // p, w // p, VIDEO_CHANNELS, p, p).permute(3, 0, 1, 4, 2, 5)
    return x.reshape(1, VIDEO_CHANNELS, t, h, w).contiguous()


def camera_target(
    first_frame: torch.Tensor, camera: torch.Tensor, latent_t: int, speed_factor: float = 1.0
) -> torch.Tensor:
    """The first-frame latent ``[1, 24, 1, h, w]`` seen along the camera path: ``[1, 24, T, h, w]``.

    Where the view leaves the picture it sees the picture mirrored. Mirroring a patch
    flips the sign of its odd DCT frequencies along that axis, so those channels are
    negated where the sample point was reflected an odd number of times.
    """
    _, c, _, h, w = first_frame.shape
    pan_x, pan_y, zoom = (float(v) * speed_factor for v in camera[:3])
    seconds = torch.tensor([pixel_position(t) / FPS for t in range(latent_t)], dtype=torch.float32)
    inv_zoom = torch.exp(-zoom * seconds)
    theta = torch.zeros(latent_t, 2, 3)
    theta[:, 0, 0] = inv_zoom
    theta[:, 1, 1] = inv_zoom
    theta[:, 0, 2] = 2.0 * pan_x * seconds  # normalised coordinates span 2
    theta[:, 1, 2] = 2.0 * pan_y * seconds
    src = first_frame[0, :, 0].to(torch.float32).cpu().expand(latent_t, c, h, w)
    grid = F.affine_grid(theta, [latent_t, c, h, w], align_corners=False)
    moved = F.grid_sample(src, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    flips = torch.remainder(torch.floor((grid + 1) / 2), 2)  # [T, h, w, (x, y)]: 1 where mirrored
    freqs = torch.tensor(channel_frequencies())  # [24, (u, v)]
    odd_v = (freqs[:, 1] % 2).float()[None, :, None, None]
    odd_u = (freqs[:, 0] % 2).float()[None, :, None, None]
    sign = (1 - 2 * flips[..., 0][:, None] * odd_v) * (1 - 2 * flips[..., 1][:, None] * odd_u)
    moved = moved * sign
    moved[0] = first_frame[0, :, 0]
    return moved.permute(1, 0, 2, 3)[None].contiguous()


def audio_target(notes: torch.Tensor, params: torch.Tensor, steps: int, gen: torch.Generator) -> torch.Tensor:
    """Oscillator amplitudes ``[1, 32, 2, T40]``: the chord, pulsing, panned, faded in and out."""
    pulse_hz, balance, level = (float(v) for v in params[:3])
    detail = 1.0 + 0.15 * (2 * torch.rand(AUDIO_CHANNELS, generator=gen) - 1)
    phase = float(torch.rand(1, generator=gen)) * math.pi
    t = torch.arange(steps, dtype=torch.float32) / AUDIO_LATENT_RATE
    pulse = 0.65 + 0.35 * torch.cos(math.pi * pulse_hz * t + phase) ** 2
    fade = torch.clamp(t / 0.25, max=1.0) * torch.clamp((t[-1] - t) / 0.25, max=1.0)
    angle = (balance + 1) * math.pi / 4  # constant-power pan, centre = 1/sqrt(2) each
    stereo = torch.tensor([math.cos(angle), math.sin(angle)]) * math.sqrt(2)
    amp = level * (notes * detail)[:, None, None] * stereo[None, :, None] * (pulse * fade)[None, None, :]
    return amp[None].contiguous()


def euler(
    x: torch.Tensor, sigmas: torch.Tensor, predict: Callable[[torch.Tensor, float], torch.Tensor]
) -> torch.Tensor:
    """Integrate the flow from ``sigmas[0]`` to ``sigmas[-1]`` with Euler steps."""
    for i in range(len(sigmas) - 1):
        sigma, nxt = float(sigmas[i]), float(sigmas[i + 1])
        denoised = predict(x, sigma)
        # The step to sigma 0 lands on the prediction; take it exactly (no rounding residue).
        x = denoised if nxt == 0.0 else x + (x - denoised) / sigma * (nxt - sigma)
    return x


def sample_shards(
    ctx: ParallelContext,
    cond: Conditioning,
    *,
    seed: int,
    steps: int,
    frames: int,
    config: DenoiserConfig = DenoiserConfig(),
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Sample this rank's shard; return ``(video, audio)`` on rank 0 (None elsewhere).

    Every rank draws the same full noise from ``seed`` on the CPU (so any degree and any
    device see identical randomness) and keeps its slice.
    """
    _, _, _, h, w = cond.first_frame.shape
    with threads_for(latent_frames(frames) * h * w * VIDEO_CHANNELS // ctx.world):
        return _sample_shards(ctx, cond, seed=seed, steps=steps, frames=frames, config=config)


def _sample_shards(
    ctx: ParallelContext,
    cond: Conditioning,
    *,
    seed: int,
    steps: int,
    frames: int,
    config: DenoiserConfig,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    first = cond.first_frame
    _, _, _, h, w = first.shape
    latent_t = latent_frames(frames)
    per_frame = (h // TOKEN_PATCH) * (w // TOKEN_PATCH)
    length = latent_t * per_frame
    gen = torch.Generator().manual_seed(seed)
    speed_factor = 1.0 + 0.1 * (2 * float(torch.rand(1, generator=gen)) - 1)
    noise = torch.randn((1, VIDEO_CHANNELS, latent_t, h, w), generator=gen)
    audio_noise = torch.randn((1, AUDIO_CHANNELS, 2, audio_latent_steps(frames)), generator=gen)

    start, stop = ctx.shard(length)
    pad = padded_length(length, ctx.world) - length

    def shard(tokens: torch.Tensor) -> torch.Tensor:
        return F.pad(tokens, (0, 0, 0, pad))[start:stop].to(ctx.device)

    target = shard(to_tokens(camera_target(first, cond.camera, latent_t, speed_factor)))
    pinned = shard(torch.arange(length)[:, None].lt(per_frame).float()).bool()  # frame 0's tokens
    block = AttentionBlock(config, ctx.device)
    sigmas = simple_sigmas(steps, config.shift)

    def predict_video(x: torch.Tensor, sigma: float) -> torch.Tensor:
        return torch.where(pinned, target, target + block(ctx, x, latent_t, per_frame))

    video_shard = euler(shard(to_tokens(noise)), sigmas, predict_video)
    tokens = gather_sequence(ctx, video_shard)
    if tokens is None:
        return None
    video = from_tokens(tokens[:length].cpu(), latent_t, h, w)
    a_target = audio_target(cond.audio_notes, cond.audio_params, audio_latent_steps(frames), gen)
    audio = euler(audio_noise, sigmas, lambda x, sigma: a_target)
    return video, audio


def sample_latent(
    cond: Conditioning,
    *,
    seed: int,
    steps: int = 6,
    frames: int | None = None,
    device: str = "cpu",
    config: DenoiserConfig = DenoiserConfig(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-process sampling (degree 1): ``(video [1,24,T,h,w], audio [1,32,2,T40])``."""
    frames = int(cond.meta["frames"]) if frames is None else frames
    out = sample_shards(
        ParallelContext(0, 1, torch.device(device)), cond, seed=seed, steps=steps, frames=frames, config=config
    )
    assert out is not None
    return out
