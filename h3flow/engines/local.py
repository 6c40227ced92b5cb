"""The ``local`` engine: the reference model in-process (the embedded default, no GPU needed).

Files in, files out, like every engine: encode writes a safetensors conditioning file,
sample an ``.h3latent``, decode an MP4. With ``degree > 1`` sampling runs Ulysses
sequence-parallel in ``degree`` processes (torch.multiprocessing, forkserver; gloo on
CPU, NCCL on CUDA) and rank 0 writes the latent. The module-level functions are what the ComfyUI node pack wraps.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from h3flow.core.batch import Clip
from h3flow.core.errors import H3FlowError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import sha256_file
from h3flow.core.specs import AUDIO_RATE, FPS, get_spec, latent_frames
from h3flow.engines.base import OffloadReport
from h3flow.handoff.format import H3Latent, frames_of, load_latent, save_latent
from h3flow.media.mux import mux_mp4
from h3flow.reference.audio import decode_audio
from h3flow.reference.conditioning import Conditioning, encode_conditioning, load_conditioning, save_conditioning
from h3flow.reference.meta import DenoiserConfig, latent_meta
from h3flow.reference.sampler import sample_shards
from h3flow.reference.ulysses import ParallelContext, check_degree, run_parallel
from h3flow.reference.vae import PatchEncoder, decode_video, make_decoder


def encode_clip(clip: Clip, *, encoder: PatchEncoder | None = None) -> Conditioning:
    """A clip's prompt + reference image -> conditioning (the seed plays no part)."""
    return encode_conditioning(clip.prompt, clip.image, clip.resolved_spec, clip.frames, encoder=encoder)


def sample_to_file(
    conditioning: Path,
    conditioning_sha256: str,
    out_path: Path,
    meta: dict[str, str],
    *,
    seed: int,
    steps: int,
    frames: int,
    degree: int = 1,
    device: str = "cpu",
) -> FileRef:
    """Sample a conditioning file into an ``.h3latent`` at ``out_path`` (``degree`` processes)."""
    args = (str(conditioning), conditioning_sha256, str(out_path), meta, seed, steps, frames)
    run_parallel(degree, _sample_worker, args, device=device)
    out = Path(out_path)
    return FileRef(out, sha256_file(out), out.stat().st_size)


def _sample_worker(
    ctx: ParallelContext,
    cond_path: str,
    cond_sha: str,
    out_path: str,
    meta: dict[str, str],
    seed: int,
    steps: int,
    frames: int,
) -> None:
    """One rank of sampling: every rank loads (and verifies) the conditioning; rank 0 writes."""
    cond = load_conditioning(cond_path, cond_sha)
    result = sample_shards(ctx, cond, seed=seed, steps=steps, frames=frames)
    if result is not None:
        video, audio = result
        save_latent(Path(out_path), H3Latent(video=video, audio=audio, meta=meta))


def decode_latent_to_mp4(latent: H3Latent, out_path: Path, *, int8: bool = True, device: str = "cpu") -> FileRef:
    """Video latent -> frames (INT8 or fp32 decoder), audio latent -> 48 kHz stereo; mux to MP4."""
    if latent.video.shape[0] != 1:
        raise H3FlowError(f"decode takes one clip per latent (batch 1), this one has {latent.video.shape[0]}")
    frames = frames_of(latent)
    if latent_frames(frames) != latent.video.shape[2]:
        raise H3FlowError(f"latent has T={latent.video.shape[2]} but {frames} frames need T={latent_frames(frames)}")
    samples = frames * AUDIO_RATE // FPS
    wave = decode_audio(latent.audio, samples) if latent.audio is not None else torch.zeros(2, samples)
    return mux_mp4(out_path, decode_video(latent.video, frames, make_decoder(int8, device)), wave)


def _free_bytes(device: str) -> dict[str, int]:
    dev = torch.device(device)
    if dev.type == "cuda":
        return {f"cuda:{i}": int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())}
    return {"cpu": os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")}


class LocalEngine:
    """The reference model behind the :class:`~h3flow.engines.base.Engine` interface."""

    name = "local"

    def __init__(
        self, *, degree: int = 1, int8_decode: bool = True, retain_cpu_weights: bool = True, device: str = "cpu"
    ) -> None:
        check_degree(degree, DenoiserConfig().heads)
        self.degree = degree
        self.int8_decode = int8_decode
        self.retain_cpu_weights = retain_cpu_weights
        self.device = device
        self._encoder: PatchEncoder | None = None

    def _loaded_encoder(self) -> PatchEncoder:
        """The encoder on the device: loaded once, reloaded from the CPU copy after an offload."""
        if self._encoder is None:
            self._encoder = PatchEncoder(self.device)
        elif self._encoder.basis.device != torch.device(self.device):
            self._encoder.to(self.device)
        return self._encoder

    def encode(self, clip: Clip, out_path: Path) -> FileRef:
        cond = encode_clip(clip, encoder=self._loaded_encoder())
        sha = save_conditioning(out_path, cond)
        return FileRef(Path(out_path), sha, Path(out_path).stat().st_size)

    def offload(self) -> OffloadReport:
        """Release the encoder from the device; keep a CPU copy if ``retain_cpu_weights``."""
        freed = 0
        if self._encoder is not None:
            on_device = self._encoder.basis.device.type != "cpu"
            if self.retain_cpu_weights:
                freed = self._encoder.nbytes if on_device else 0
                self._encoder.to("cpu")
            else:
                freed = self._encoder.nbytes
                self._encoder = None
            if on_device:
                torch.cuda.empty_cache()
        return OffloadReport(
            freed_bytes=freed, free_per_device=_free_bytes(self.device), kept_cpu_copy=self.retain_cpu_weights
        )

    def sample(self, clip: Clip, conditioning: FileRef, out_path: Path) -> FileRef:
        cond = load_conditioning(conditioning.path, conditioning.sha256)
        spec = get_spec(clip.spec)
        want = {"spec": spec.name, "frames": str(clip.frames)}
        got = {k: cond.meta.get(k) for k in want}
        if got != want:
            raise H3FlowError(f"conditioning {conditioning.path} was encoded for {got}, clip {clip.id!r} needs {want}")
        meta = latent_meta(clip, conditioning.sha256, degree=self.degree)
        return sample_to_file(
            Path(conditioning.path),
            conditioning.sha256,
            Path(out_path),
            meta,
            seed=clip.seed,
            steps=clip.steps,
            frames=clip.frames,
            degree=self.degree,
            device=self.device,
        )

    def decode(self, latent: FileRef, out_path: Path) -> FileRef:
        """Verify the latent's SHA-256 (a mismatch raises IntegrityError, nothing is written), decode, mux."""
        loaded = load_latent(Path(latent.path), expected_sha256=latent.sha256)
        return decode_latent_to_mp4(loaded, Path(out_path), int8=self.int8_decode, device=self.device)
