"""Frames + waveform -> MP4 (H.264 yuv420p + AAC 48 kHz stereo), written atomically.

Timestamps are exact integers: video pts count frames in a 1/fps time base, audio pts
count samples in a 1/48000 time base, audio goes in 1024-sample frames (AAC's frame
size; the last one may be shorter). The audio is trimmed or zero-padded to exactly the
video's duration, both encoders are flushed, and ``movflags=+faststart`` moves the index
to the front so players can start before the download ends.

FFmpeg's faststart pass re-opens the output by name, so the muxer writes to a temporary
sibling file (not a Python file object) that is fsynced and renamed over the target.
"""

from __future__ import annotations

import itertools
import math
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch

from .files import FileRef, atomic_path, sha256_file
from .layout import AUDIO_RATE, FPS

AAC_FRAME = 1024


def _x264_asm() -> str:
    """x264's SIMD level, pinned: its AVX-512 kernels make re-encodes of identical frames
    differ (measured: 3 hashes in 18 runs, none with AVX-512 off), and its SSE4+ kernels
    pick other bytes than its C code. SSE2 is on every x86-64 CPU and gives the C code's
    bytes, so every x86-64 host writes the same MP4; elsewhere x264 runs its C code."""
    return "SSE2" if platform.machine().lower() in ("x86_64", "amd64") else "0"


# One thread and a pinned SIMD level: the same frames give the same bytes, on any host
# (measured on this 2-core machine: one thread costs nothing next to two, 0.9 s an SD clip).
X264_OPTIONS = {"crf": "18", "preset": "veryfast", "threads": "1", "x264-params": f"asm={_x264_asm()}"}


def _as_uint8_frames(chunk: np.ndarray | torch.Tensor) -> np.ndarray:
    arr = chunk.cpu().numpy() if isinstance(chunk, torch.Tensor) else np.asarray(chunk)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [n, H, W, 3], got {arr.dtype} {list(arr.shape)}")
    return arr


class _AudioFeed:
    """Hands the waveform to the AAC encoder in 1024-sample frames, pts in samples."""

    def __init__(
        self, container: av.container.OutputContainer, stream: av.AudioStream, waveform: np.ndarray, rate: int
    ) -> None:
        self.container, self.stream, self.wave, self.rate = container, stream, waveform, rate
        self.sent = 0

    def until(self, samples: int, *, final: bool = False) -> None:
        """Encode samples up to ``samples`` (whole frames only, unless ``final``)."""
        while self.sent < samples and (final or samples - self.sent >= AAC_FRAME):
            n = min(AAC_FRAME, samples - self.sent)
            block = np.zeros((2, n), dtype=np.float32)
            have = max(0, min(n, self.wave.shape[1] - self.sent))
            block[:, :have] = self.wave[:, self.sent : self.sent + have]  # zero-pad past the end
            frame = av.AudioFrame.from_ndarray(block, format="fltp", layout="stereo")
            frame.sample_rate = self.rate
            frame.time_base = Fraction(1, self.rate)
            frame.pts = self.sent
            self.container.mux(self.stream.encode(frame))
            self.sent += n


def mux_mp4(
    out_path: str | os.PathLike[str],
    frames: Iterable[np.ndarray | torch.Tensor],
    waveform: np.ndarray | torch.Tensor,
    *,
    fps: int = FPS,
    sample_rate: int = AUDIO_RATE,
    x264_options: dict[str, str] | None = None,
) -> FileRef:
    """Encode uint8 RGB frames (chunks ``[n, H, W, 3]``) and a ``[2, N]`` float waveform to an MP4.

    The audio track ends exactly where the video does (trimmed or zero-padded). Muxer and AAC
    encoder run bit-exact: neither writes its FFmpeg version into the file, so the same frames
    and audio give the same bytes under any patch release of PyAV's FFmpeg (two wheels apart
    by one, in ComfyUI's venv and h3flow's, differed in those version strings alone).
    """
    wave = waveform.detach().cpu().numpy() if isinstance(waveform, torch.Tensor) else np.asarray(waveform)
    wave = np.ascontiguousarray(wave, dtype=np.float32)
    if wave.ndim != 2 or wave.shape[0] != 2:
        raise ValueError(f"waveform must be [2, samples] (stereo), got {list(wave.shape)}")
    if fps <= 0 or sample_rate % fps:
        raise ValueError(f"sample rate {sample_rate} must be a whole number of samples per frame at {fps} fps")
    per_frame = sample_rate // fps
    chunks = iter(frames)
    first = next(chunks, None)
    if first is None:
        raise ValueError("no frames to encode")
    first = _as_uint8_frames(first)
    if first.shape[1] % 2 or first.shape[2] % 2:
        raise ValueError(f"yuv420p needs an even frame size, got {first.shape[2]}x{first.shape[1]}")
    out = Path(out_path)
    with (
        atomic_path(out) as tmp,
        av.open(str(tmp), "w", format="mp4", options={"movflags": "+faststart", "fflags": "+bitexact"}) as container,
    ):
        video = container.add_stream("libx264", rate=fps, options=dict(x264_options or X264_OPTIONS))
        video.height, video.width = int(first.shape[1]), int(first.shape[2])
        video.pix_fmt = "yuv420p"
        video.time_base = Fraction(1, fps)
        audio = container.add_stream("aac", rate=sample_rate, layout="stereo", options={"flags": "+bitexact"})
        audio.time_base = Fraction(1, sample_rate)
        feed = _AudioFeed(container, audio, wave, sample_rate)
        count = 0
        for chunk in itertools.chain([first], chunks):
            arr = _as_uint8_frames(chunk)
            if arr.shape[1:3] != first.shape[1:3]:
                raise ValueError(f"frame size changed from {first.shape[1:3]} to {arr.shape[1:3]}")
            for image in arr:
                # converted here, not inside encode(): PyAV's conversion there gave differing bytes under load
                frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
                frame.pts = count
                container.mux(video.encode(frame))
                count += 1
                feed.until(count * per_frame)  # interleave per frame: the bytes do not depend on chunking
        container.mux(video.encode())
        feed.until(count * per_frame, final=True)
        container.mux(audio.encode())
    return FileRef(out, sha256_file(out), out.stat().st_size)


@dataclass(frozen=True)
class Mp4Info:
    """What an MP4 holds, read back with PyAV (for checks, preflight and reports)."""

    video_codec: str
    pix_fmt: str
    width: int
    height: int
    frames: int
    fps: Fraction
    video_seconds: float
    audio_codec: str | None
    sample_rate: int
    channels: int
    audio_seconds: float
    audio_samples: int  # decoded (priming skipped; the last AAC frame comes out whole)
    audio_rms: float
    audio_peak: float
    faststart: bool  # the index (moov) precedes the media data (mdat)


def _top_level_boxes(path: Path) -> list[bytes]:
    names: list[bytes] = []
    with open(path, "rb") as handle:
        while header := handle.read(8):
            if len(header) < 8:
                break
            size, name = int.from_bytes(header[:4], "big"), header[4:]
            if size == 1:
                size = int.from_bytes(handle.read(8), "big") - 8
            elif size == 0:
                names.append(name)
                break
            names.append(name)
            handle.seek(size - 8, os.SEEK_CUR)
    return names


def probe_mp4(path: str | os.PathLike[str]) -> Mp4Info:
    """Stream facts of an MP4 plus its decoded audio level."""
    path = Path(path)
    boxes = _top_level_boxes(path)
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        vctx = video.codec_context
        v_seconds = float(video.duration * video.time_base) if video.duration and video.time_base else 0.0
        audio_codec, rate, channels, a_seconds = None, 0, 0, 0.0
        samples, sum_sq, peak = 0, 0.0, 0.0
        if container.streams.audio:
            audio = container.streams.audio[0]
            audio_codec, rate = audio.codec_context.name, audio.codec_context.sample_rate
            channels = audio.codec_context.layout.nb_channels
            a_seconds = float(audio.duration * audio.time_base) if audio.duration and audio.time_base else 0.0
            for frame in container.decode(audio=0):
                data = frame.to_ndarray().astype(np.float64)
                samples += frame.samples
                sum_sq += float((data**2).sum()) / max(1, data.shape[0] if frame.format.is_planar else channels)
                peak = max(peak, float(np.abs(data).max(initial=0.0)))
        return Mp4Info(
            video_codec=vctx.name,
            pix_fmt=vctx.format.name if vctx.format else "",
            width=vctx.width,
            height=vctx.height,
            frames=video.frames,
            fps=Fraction(video.average_rate or 0),
            video_seconds=v_seconds,
            audio_codec=audio_codec,
            sample_rate=rate,
            channels=channels,
            audio_seconds=a_seconds,
            audio_samples=samples,
            audio_rms=math.sqrt(sum_sq / samples) if samples else 0.0,
            audio_peak=peak,
            faststart=b"moov" in boxes and b"mdat" in boxes and boxes.index(b"moov") < boxes.index(b"mdat"),
        )
